"""TLS: the fleet certificate (``spec.tls``) and the ``CertificateReady`` verdict.

Who issues the certificate (cert-manager or the operator's own CA) and when it is
re-issued are :mod:`eventfleet_operator.certificates` and :mod:`eventfleet_operator.pki`;
this room applies what they ask through the pass's child writes and tells the replica
client which CA to trust.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import certificates, model, naming
from eventfleet_operator import status as status_mod
from eventfleet_operator.constants import ConditionStatus, ConditionType, Reason
from eventfleet_operator.reconcilers.children import Context, Emit, apply_child, remove_child


async def reconcile(
    ctx: Context,
    spec: model.FleetSpec,
    previous: Mapping[str, Any],
    log: logging.Logger,
    emit: Emit,
) -> status_mod.TlsReport:
    """The fleet certificate (spec.tls) in place and valid, before the pods that mount
    it; the operator's own calls to the replicas trust its CA from here on."""
    off = (ConditionStatus.FALSE, Reason.TLS_DISABLED, "spec.tls is off")
    last = status_mod.find_condition(previous.get("conditions"), ConditionType.CERTIFICATE_READY)
    if not spec.tls.enabled and last.get("reason") == off[1]:
        # Off, and the last pass removed what TLS had left: no reads for nothing on
        # every pass of every plain fleet.
        ctx.endpoints.trust(spec.namespace, spec.name, None, https=False)
        return status_mod.TlsReport(off)
    state = await certificates.ensure(
        ctx.kube,
        spec,
        apply=lambda manifest, version: apply_child(ctx, manifest, log, emit, version),
        delete_owned=lambda resource, name: remove_child(
            ctx, resource, spec, name, log, emit, "spec.tls is off"
        ),
        log=log,
        emit=emit,
        now=datetime.datetime.now(datetime.UTC),
    )
    ctx.endpoints.trust(
        spec.namespace,
        spec.name,
        state.ca_pem if state else None,
        https=spec.tls.enabled and spec.tls.http,
    )
    if state is None:
        return status_mod.TlsReport(off)
    verdict = (
        ConditionStatus.TRUE if state.ready else ConditionStatus.FALSE,
        state.reason,
        state.message,
    )
    return status_mod.TlsReport(verdict, state.as_status(naming.tls_secret(spec.name)))
