"""Event BUS CURVE: the server key pair Secret ``<name>-bus-curve`` (``spec.protocols.bus.curve``).

Issued like the fleet certificate, before the pods that mount it: generated once and
then kept. A key pair someone wrote into the Secret (their own, or a rotation) is kept
as long as its secret key is valid; ``server.pub`` is always rewritten from it, so it
never disagrees. Rotation goes through the Secret: write a new ``server.key`` (or
delete the Secret and the operator issues a new pair); the kubelet swaps the mounted
file and every replica serves the new key to new connections without a restart, while
established sessions keep theirs (docs/security.md, "Event BUS CURVE").
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from typing import Any

from eventfleet_operator import builders, buskeys, kube, model, naming
from eventfleet_operator import status as status_mod
from eventfleet_operator.reconcilers.children import Context, Emit, apply_child, remove_child


async def reconcile(
    ctx: Context, spec: model.FleetSpec, log: logging.Logger, emit: Emit
) -> dict[str, str] | None:
    """The key pair Secret in place when CURVE is on; removed (if ours) when it is off.

    Returns ``status.busCurve`` (the Secret's name and the public key clients need, so
    that they never need read access to the Secret holding the secret key), or None.
    """
    name = naming.bus_curve_secret(spec.name)
    if not (spec.bus_curve.enabled and "bus" in spec.enabled_protocols):
        await remove_child(
            ctx, kube.SECRETS, spec, name, log, emit, "spec.protocols.bus.curve is off"
        )
        return None
    live = await ctx.kube.get(kube.SECRETS, spec.namespace, name)
    version = str(((live or {}).get("metadata") or {}).get("resourceVersion") or "") or None
    pair, why = stored_pair(live)
    if pair is None:
        pair = buskeys.new_keypair()
        log.info("issued a new Event BUS CURVE key pair in Secret %s (%s)", name, why)
    await apply_child(
        ctx, builders.bus_curve_secret(spec, pair.secret_z85, pair.public_z85), log, emit, version
    )
    return {"secretName": name, "publicKey": pair.public_z85}


def serving(
    bus_curve: dict[str, str] | None, peers: Sequence[status_mod.PeerReport]
) -> dict[str, Any] | None:
    """``status.busCurve`` with ``replicasServing``: how many of the replicas that
    answered serve its public key to new connections. After a rotation it climbs to
    ``spec.replicas`` as the kubelet delivers the new key file to each pod; until then
    some replicas still refuse clients that already use the new key."""
    if bus_curve is None:
        return None
    key = bus_curve["publicKey"]
    count = sum(1 for p in peers if p.status is not None and p.status.bus_curve_key == key)
    return {**bus_curve, "replicasServing": count}


def stored_pair(live: dict | None) -> tuple[buskeys.KeyPair | None, str]:
    """The key pair the live Secret holds, or None and why it cannot be kept."""
    if live is None:
        return None, "no Secret yet"
    data = (live.get("data") or {}).get("server.key")
    if not data:
        return None, "the Secret has no server.key"
    try:
        return buskeys.from_secret(base64.b64decode(data).decode()), ""
    except (binascii.Error, UnicodeDecodeError, buskeys.BusKeyError, ValueError) as e:
        return None, f"server.key unusable: {e}"
