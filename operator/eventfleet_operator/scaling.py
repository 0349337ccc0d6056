"""Safe scale-down: lower the StatefulSet only when no event can be lost.

A leaving replica (ordinal >= the new replica count) may hold events that no other
replica has yet. For each leaving replica, highest ordinal first (the order in which a
StatefulSet removes pods), the operator:

1. reads the leaving replica's ``/status`` for the last id of its own server id;
2. asks it to ``POST /flush?peer=<remaining pod>`` for every remaining replica (the
   Syncer's MsgFlushReq/Res: the peer confirms everything is committed there);
3. reads each remaining replica's ``/status`` and requires
   ``last_ids[leaving server id]`` to cover the leaving replica's own last id.

The StatefulSet may go down to the lowest ordinal above which every replica passed;
until all passed the operator holds and says why. A leaving replica that does not
answer holds the scale-down, unless its volume claim does not exist (it never stored
anything). The ``eventfleet.io/force-scale-down: "true"`` annotation skips the checks
(for a replica whose volume is known to be lost).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from eventfleet_operator import GROUP, naming
from eventfleet_operator.constants import Reason
from eventfleet_operator.model import FleetSpec
from eventfleet_operator.replicas import Endpoints, ReplicaClient, ReplicaStatus, ReplicaUnreachable

FORCE_ANNOTATION = f"{GROUP}/force-scale-down"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the StatefulSet may be set to now, and whether a scale-down is held."""

    target: int
    held: bool = False
    reason: Reason = Reason.NOT_SCALING_DOWN
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Reach:
    """How the checks reach one fleet's replicas: where each answers, the client, the
    token to present, and whether a replica that does not answer ever had a volume."""

    endpoints: Endpoints
    client: ReplicaClient
    claim_exists: Callable[[int], Awaitable[bool]]
    token: str | None = None


@dataclasses.dataclass(frozen=True)
class Problem:
    reason: Reason
    message: str


async def check_leaving(
    spec: FleetSpec,
    ordinal: int,
    reach: Reach,
    *,
    remaining: Sequence[int] | None = None,
) -> Problem | None:
    """``None`` if every remaining replica holds replica ``ordinal``'s events.

    ``remaining`` defaults to the ordinals below ``spec.replicas`` (a scale-down); a
    hibernation or a pod replacement checks against every other replica instead.
    """
    endpoints, client, token = reach.endpoints, reach.client, reach.token
    pod = naming.pod(spec.name, ordinal)
    server_id = naming.server_id(ordinal)
    url = endpoints.url(spec.namespace, spec.name, ordinal, spec.ports.http)
    try:
        own_status = await client.status(url, token)
    except ReplicaUnreachable as e:
        if not await reach.claim_exists(ordinal):
            return None  # no volume: the replica never stored an event
        return Problem(Reason.REPLICA_UNREACHABLE, f"cannot verify leaving replica {pod}: {e}")
    if own_status.server_id != server_id:
        return Problem(
            Reason.WRONG_REPLICA,
            f"{url} answers as server {own_status.server_id}, expected {pod} (server {server_id})",
        )
    own = own_status.own_last_id()
    if own is None:
        return None  # it never created an event of its own

    others = range(spec.replicas) if remaining is None else remaining
    for remaining_ordinal in others:
        if remaining_ordinal == ordinal:
            continue
        peer = naming.pod(spec.name, remaining_ordinal)
        try:
            await client.flush(url, peer, token)
        except ReplicaUnreachable as e:
            return Problem(Reason.FLUSH_FAILED, f"{pod} could not flush its events to {peer}: {e}")
        peer_url = endpoints.url(spec.namespace, spec.name, remaining_ordinal, spec.ports.http)
        try:
            peer_status: ReplicaStatus = await client.status(peer_url, token)
        except ReplicaUnreachable as e:
            return Problem(Reason.REPLICA_UNREACHABLE, f"cannot read remaining replica {peer}: {e}")
        held = peer_status.last_ids.get(server_id)
        if held is None or not held.covers(own):
            upto = f"instance {held.instance} (session {held.session})" if held else "nothing"
            return Problem(
                Reason.EVENTS_NOT_REPLICATED,
                f"{peer} holds events of server {server_id} up to {upto}, "
                f"but leaving replica {pod} has up to instance {own.instance} "
                f"(session {own.session})",
            )
    return None


async def plan(
    spec: FleetSpec, current: int | None, reach: Reach, *, force: bool = False
) -> Decision:
    """Decide the StatefulSet's replica count for this pass (never below what is safe)."""
    desired = spec.replicas
    if current is None or desired >= current:
        return Decision(target=desired)
    if force:
        return Decision(
            target=desired,
            reason=Reason.SCALE_DOWN_FORCED,
            message=f"{FORCE_ANNOTATION} is set: scaled {current} -> {desired} without checks",
        )
    target = current
    for ordinal in reversed(range(desired, current)):
        problem = await check_leaving(spec, ordinal, reach)
        if problem is not None:
            return Decision(
                target=target,
                held=True,
                reason=problem.reason,
                message=f"holding the StatefulSet at {target} replicas (want {desired}): "
                f"{problem.message}",
            )
        target = ordinal
    return Decision(
        target=desired,
        reason=Reason.SCALE_DOWN_VERIFIED,
        message=f"remaining replicas hold every event of replicas {desired}..{current - 1}; "
        f"scaled to {desired}",
    )


async def verify_all(spec: FleetSpec, count: int, reach: Reach) -> Problem | None:
    """Flush every replica to every other one and verify each holds each other's events.

    The first problem found (highest ordinal first), or None when all pairs hold.
    """
    everyone = range(count)
    for ordinal in reversed(everyone):
        problem = await check_leaving(spec, ordinal, reach, remaining=everyone)
        if problem is not None:
            return problem
    return None


async def plan_hibernation(
    spec: FleetSpec, current: int | None, reach: Reach, *, force: bool = False
) -> Decision:
    """Scale to 0 only once every running replica's events are on every other one.

    The claims stay, so nothing is lost either way; the check makes any subset of the
    replicas that wakes up first hold every event.
    """
    if not current:
        return Decision(target=0, reason=Reason.NOT_SCALING_DOWN, message="hibernated")
    if force:
        return Decision(
            target=0,
            reason=Reason.SCALE_DOWN_FORCED,
            message=f"{FORCE_ANNOTATION} is set: hibernated without checks",
        )
    problem = await verify_all(spec, current, reach)
    if problem is not None:
        return Decision(
            target=current,
            held=True,
            reason=problem.reason,
            message=f"hibernation held at {current} replicas: {problem.message}",
        )
    return Decision(
        target=0,
        reason=Reason.SCALE_DOWN_VERIFIED,
        message=f"all {current} replicas hold each other's events; hibernating (claims kept)",
    )
