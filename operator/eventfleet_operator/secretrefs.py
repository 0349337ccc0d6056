"""Which Secrets a fleet's pass reads, so that a change to one of them runs the pass at
once instead of at the next resync (the handlers' Secret watch, docs/operator.md).

A token rotation is a Secret change: the operator must notice it (``status.tokensDigest``
moves, ``TokensLoaded`` follows the replicas' reload, the next step of a peer-token
rotation is written) within seconds, not within ``--resync-seconds``. The EventServers
are indexed by the Secrets they reference; a Secret event looks its key up. Pure: no
Kopf, no API calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from eventfleet_operator import model, naming
from eventfleet_operator import tokens as tokens_mod
from eventfleet_operator.constants import ConditionStatus, ConditionType, Reason
from eventfleet_operator.status import find_condition

# An index key: (namespace, Secret name). Secrets are namespaced and a fleet only
# references Secrets of its own namespace.
Key = tuple[str, str]


def of_spec(spec: model.FleetSpec) -> frozenset[str]:
    """The names of the Secrets whose content the pass reads and reports on.

    The client and peer token Secrets (generated or referenced); the Event BUS CURVE key
    pair (``status.busCurve.publicKey``) when CURVE is on; the fleet certificate and its
    CA when ``spec.tls`` is on. Secrets that are only mounted into the pods (backup
    credentials, BUS allowed keys, Replication users) are not read by the pass: their
    changes reach the replicas through the kubelet alone.
    """
    names = {spec.token_ref.secret_name, spec.peer_token_ref.secret_name}
    if spec.bus_curve.enabled and "bus" in spec.enabled_protocols:
        names.add(naming.bus_curve_secret(spec.name))
    if spec.tls.enabled:
        names.update((naming.tls_secret(spec.name), naming.ca_secret(spec.name)))
    return frozenset(names)


def index_entries(body: Mapping[str, Any]) -> dict[Key, str]:
    """An EventServer's entries in the Secret index: (namespace, Secret) -> its name.

    A spec that does not parse references nothing: its pass only reports the spec error,
    which no Secret change can fix (the spec change that fixes it runs a pass itself).
    An EventServer being deleted references nothing either (its cleanup is running).
    """
    meta = body.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not name or not namespace or meta.get("deletionTimestamp"):
        return {}
    try:
        spec = model.parse(name, namespace, body.get("spec"), uid=meta.get("uid", ""))
    except model.SpecError:
        return {}
    return {(namespace, secret): name for secret in of_spec(spec)}


def fleets_for(index: Mapping[Key, Iterable[str]], namespace: str, secret: str) -> list[str]:
    """The EventServers (names, sorted, once each) referencing Secret ``namespace/secret``."""
    return sorted(set(index.get((namespace, secret), ())))


def tokens_settling(status: Mapping[str, Any] | None) -> bool:
    """Is a token change still on its way to the replicas, per the last written status?

    True while ``TokensLoaded`` is False because replicas still run other tokens
    (TokensReloading), or while a peer-token rotation waits for its next step: the
    operator then re-reads the replicas every few seconds (the handlers' reload timer)
    so that TokensLoaded, and each rotation step, follow the replicas' reload within
    seconds instead of within the resync interval.
    """
    status = status or {}
    loaded = find_condition(status.get("conditions"), ConditionType.TOKENS_LOADED)
    if (
        loaded.get("status") == ConditionStatus.FALSE
        and loaded.get("reason") == Reason.TOKENS_RELOADING
    ):
        return True
    step = (status.get("peerTokenRotation") or {}).get("step")
    return bool(step) and step not in (tokens_mod.DONE, tokens_mod.REFUSED)
