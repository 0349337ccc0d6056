"""``spec.tls`` on Kubernetes: who issues the fleet certificate, and keeping it valid.

* **cert-manager** (``provider: CertManager``, or ``Auto`` when its CRDs are installed):
  the operator applies a ``Certificate`` per fleet (and, without ``issuerRef``, a
  per-fleet CA inside cert-manager: a self-signed Issuer, a CA Certificate, a CA
  Issuer). cert-manager writes and renews the Secret ``<name>-tls``; the operator only
  reads the Certificate's ``Ready`` condition and the Secret's ``ca.crt``.
* **The operator's own CA** (``Operator``, or ``Auto`` without cert-manager): a CA per
  fleet in the Secret ``<name>-ca`` (never mounted) signs the certificate in
  ``<name>-tls``; it is re-issued when a third of its life is left, when the names it
  must carry change, or when the Secret is damaged.

Either way the replicas mount ``<name>-tls`` as a directory and reload changed files
without a restart (``eventfleet_server.listener.tls``), so renewal costs no downtime.
The operator also trusts ``ca.crt`` for its own HTTPS calls to the replicas.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from eventfleet_operator import builders, kube, naming, pki
from eventfleet_operator.constants import EventType, Operation, Reason
from eventfleet_operator.model import FleetSpec
from eventfleet_operator.replicas import Endpoints
from eventfleet_operator.status import find_condition

Emit = Callable[[EventType, str, str], None]
# (manifest, resourceVersion it was built from or None) -> what was done; the caller's
# apply and delete log, count and post an Event for each write.
Apply = Callable[[Mapping[str, Any], str | None], Awaitable[Operation | None]]
DeleteOwned = Callable[[kube.Resource, str], Awaitable[bool]]


@dataclasses.dataclass(frozen=True)
class TlsState:
    """What the status says about the fleet certificate (``status.tls`` and the
    ``CertificateReady`` condition)."""

    provider: str
    ready: bool
    reason: Reason
    message: str
    not_after: str | None = None
    fingerprint: str | None = None
    ca_pem: str | None = None  # trusted by the operator's HTTPS calls to the replicas

    def as_status(self, secret_name: str) -> dict[str, Any]:
        """``status.tls``: where clients find ``ca.crt``, and what is served."""
        return {
            "provider": self.provider,
            "secretName": secret_name,
            "notAfter": self.not_after,
            "fingerprint": self.fingerprint,
        }


def _decode(secret: Mapping[str, Any] | None, key: str) -> str | None:
    value = ((secret or {}).get("data") or {}).get(key)
    if not value:
        return None
    try:
        return base64.b64decode(value).decode()
    except (ValueError, UnicodeDecodeError):
        return None


async def trust_fleet(client: kube.KubeClient, endpoints: Endpoints, spec: FleetSpec) -> None:
    """Make ``endpoints`` call this fleet over HTTPS trusting the ``ca.crt`` of its
    certificate Secret (plain HTTP without ``spec.tls.http``). For callers outside the
    fleet's reconciliation (backups), which only read: the Secret is the reconciler's."""
    https = spec.tls.enabled and spec.tls.http
    ca_pem = None
    if https:
        secret = await client.get(kube.SECRETS, spec.namespace, naming.tls_secret(spec.name))
        ca_pem = _decode(secret, "ca.crt")
    endpoints.trust(spec.namespace, spec.name, ca_pem, https=https)


async def provider_of(client: kube.KubeClient, spec: FleetSpec) -> str:
    """``CertManager`` or ``Operator`` for this fleet (``Auto`` resolved)."""
    if spec.tls.provider != "Auto":
        return spec.tls.provider
    return "CertManager" if await client.has_resource(kube.CERTIFICATES) else "Operator"


async def ensure(
    client: kube.KubeClient,
    spec: FleetSpec,
    *,
    apply: Apply,
    delete_owned: DeleteOwned,
    log: logging.Logger,
    emit: Emit,
    now: datetime.datetime,
) -> TlsState | None:
    """Make the fleet certificate exist and stay valid; None when ``spec.tls`` is off
    (the operator's own certificate Secrets and cert-manager objects then go)."""
    if not spec.tls.enabled:
        await _remove(client, spec, delete_owned)
        return None
    provider = await provider_of(client, spec)
    if provider == "CertManager":
        return await _cert_manager(client, spec, apply)
    return await _own_ca(client, spec, apply, log, emit, now)


async def _remove(client: kube.KubeClient, spec: FleetSpec, delete_owned: DeleteOwned) -> None:
    for name in (naming.tls_secret(spec.name), naming.ca_secret(spec.name)):
        await delete_owned(kube.SECRETS, name)
    if await client.has_resource(kube.CERTIFICATES):
        # Users before what they use; only what this EventServer owns goes.
        for resource, name in (
            (kube.CERTIFICATES, naming.tls_secret(spec.name)),
            (kube.ISSUERS, naming.ca_issuer(spec.name)),
            (kube.CERTIFICATES, naming.ca_secret(spec.name)),
            (kube.ISSUERS, naming.selfsigned_issuer(spec.name)),
        ):
            await delete_owned(resource, name)


async def _own_ca(
    client: kube.KubeClient,
    spec: FleetSpec,
    apply: Apply,
    log: logging.Logger,
    emit: Emit,
    now: datetime.datetime,
) -> TlsState:
    ca_live = await client.get(kube.SECRETS, spec.namespace, naming.ca_secret(spec.name))
    ca = pki.KeyPair(_decode(ca_live, "tls.crt") or "", _decode(ca_live, "tls.key") or "")
    problem = pki.ca_problem(ca, now) if ca_live is not None else "no CA yet"
    if problem is not None:
        if ca_live is not None:
            log.warning("fleet CA %s replaced: %s", naming.ca_secret(spec.name), problem)
        ca = pki.issue_ca(f"{spec.name}.{spec.namespace} eventfleet CA", now)
        version = (ca_live or {}).get("metadata", {}).get("resourceVersion")
        if await apply(builders.ca_secret(spec, ca.cert_pem, ca.key_pem), version) is None:
            # Changed by someone since it was read: decide again on the next pass.
            return TlsState("Operator", False, Reason.CERTIFICATE_PENDING, "CA being written")
        emit(EventType.NORMAL, Reason.CERTIFICATE_ISSUED, f"fleet CA issued ({problem})")
    names = naming.tls_names(spec.name, spec.namespace)
    live = await client.get(kube.SECRETS, spec.namespace, naming.tls_secret(spec.name))
    pair = pki.KeyPair(_decode(live, "tls.crt") or "", _decode(live, "tls.key") or "")
    reason = pki.renewal_reason(pair, ca.cert_pem, names, now) if live else "no certificate yet"
    if reason is None and _decode(live, "ca.crt") != ca.cert_pem:
        reason = "ca.crt differs from the fleet CA"
    if reason is not None:
        pair = pki.issue_certificate(ca, f"{spec.name}.{spec.namespace}.svc", names, now)
        version = (live or {}).get("metadata", {}).get("resourceVersion")
        manifest = builders.tls_secret(spec, pair.cert_pem, pair.key_pem, ca.cert_pem)
        if await apply(manifest, version) is None:
            return TlsState(
                "Operator", False, Reason.CERTIFICATE_PENDING, "certificate being written"
            )
        message = (
            f"certificate {pki.fingerprint(pair.cert_pem)} issued into Secret "
            f"{naming.tls_secret(spec.name)}, valid until {pki.not_after(pair.cert_pem):%Y-%m-%d} "
            f"({reason}); replicas reload it without a restart"
        )
        log.info("%s", message)
        emit(EventType.NORMAL, Reason.CERTIFICATE_ISSUED, message)
    end = pki.not_after(pair.cert_pem)
    return TlsState(
        "Operator",
        True,
        Reason.CERTIFICATE_VALID,
        f"issued by the operator's fleet CA; valid until {end.isoformat()}",
        not_after=end.isoformat(),
        fingerprint=pki.fingerprint(pair.cert_pem),
        ca_pem=ca.cert_pem,
    )


async def _cert_manager(client: kube.KubeClient, spec: FleetSpec, apply: Apply) -> TlsState:
    if not await client.has_resource(kube.CERTIFICATES):
        return TlsState(
            "CertManager",
            False,
            Reason.CERTIFICATE_FAILED,
            "spec.tls.provider is CertManager but cert-manager's CRDs "
            "(certificates.cert-manager.io) are not installed",
        )
    for manifest in builders.cm_manifests(spec):
        await apply(manifest, None)  # the caller's apply posts an Event per write
    cert = await client.get(kube.CERTIFICATES, spec.namespace, naming.tls_secret(spec.name)) or {}
    status = cert.get("status") or {}
    ready = find_condition(status.get("conditions"), "Ready")
    secret = await client.get(kube.SECRETS, spec.namespace, naming.tls_secret(spec.name))
    ca_pem = _decode(secret, "ca.crt")
    cert_pem = _decode(secret, "tls.crt")
    if not ready or ready.get("status") != "True" or not cert_pem:
        why = (ready or {}).get("message") or "cert-manager has not issued it yet"
        return TlsState(
            "CertManager",
            False,
            Reason.CERTIFICATE_PENDING,
            f"Certificate {naming.tls_secret(spec.name)}: {why}",
        )
    if not ca_pem:
        return TlsState(
            "CertManager",
            False,
            Reason.CERTIFICATE_FAILED,
            f"Secret {naming.tls_secret(spec.name)} has no ca.crt: the issuer must provide "
            "the CA (CA, Vault and self-signed issuers do); replicas need it to verify peers",
        )
    return TlsState(
        "CertManager",
        True,
        Reason.CERTIFICATE_VALID,
        f"issued by cert-manager; valid until {status.get('notAfter')}",
        not_after=status.get("notAfter"),
        fingerprint=pki.fingerprint(cert_pem),
        ca_pem=ca_pem,
    )
