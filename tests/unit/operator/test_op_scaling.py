"""Safe scale-down decisions against a scripted fleet."""

from __future__ import annotations

import pytest
from eventfleet_operator import model, scaling
from op_fakes import FakeEndpoints, FakeReplicas, status_doc


def spec(replicas):
    return model.parse("demo", "ns", {"replicas": replicas})


async def plan(replicas, current, fleet, claims=(), force=False, token=None):
    async def claim_exists(ordinal):
        return ordinal in claims

    return await scaling.plan(
        spec(replicas),
        current,
        scaling.Reach(FakeEndpoints(), fleet, claim_exists, token),
        force=force,
    )


def synced_fleet(n, instances):
    """n replicas; replica i created `instances[i]` events; everyone holds everything."""
    fleet = FakeReplicas()
    held = {i + 1: (1, instances[i]) for i in range(n)}
    for i in range(n):
        fleet.docs[i] = status_doc(i + 1, held)
    return fleet


@pytest.mark.parametrize(("desired", "current"), [(3, None), (3, 3), (5, 3)])
async def test_not_scaling_down_needs_no_checks(desired, current):
    fleet = FakeReplicas()
    decision = await plan(desired, current, fleet)
    assert decision == scaling.Decision(target=desired)
    assert fleet.calls == []


async def test_safe_scale_down_flushes_then_lowers():
    fleet = synced_fleet(3, [5, 7, 9])
    decision = await plan(2, 3, fleet)
    assert decision.target == 2
    assert not decision.held
    assert decision.reason == "ScaleDownVerified"
    # The leaving replica flushed to each remaining one before their status was read.
    assert fleet.calls == [
        ("status", 2),
        ("flush", 2, "demo-0"),
        ("status", 0),
        ("flush", 2, "demo-1"),
        ("status", 1),
    ]


async def test_every_replica_call_of_a_scale_down_carries_the_fleet_token():
    # The replicas refuse POST /flush without the fleet's credential (docs/security.md).
    fleet = synced_fleet(3, [5, 7, 9])
    decision = await plan(2, 3, fleet, token="fleet-token")
    assert decision.target == 2
    assert len(fleet.tokens) == 5 and set(fleet.tokens) == {"fleet-token"}


async def test_lagging_remaining_replica_holds_the_statefulset():
    fleet = synced_fleet(3, [5, 7, 9])
    fleet.docs[1] = status_doc(2, {1: (1, 5), 2: (1, 7), 3: (1, 4)})  # has server 3 up to 4 of 9
    decision = await plan(2, 3, fleet)
    assert decision.held
    assert decision.target == 3
    assert decision.reason == "EventsNotReplicated"
    assert "demo-1" in decision.message and "demo-2" in decision.message
    assert "instance 4" in decision.message and "instance 9" in decision.message


async def test_session_order_counts_too():
    fleet = synced_fleet(2, [5, 9])
    fleet.docs[1] = status_doc(2, {1: (1, 5), 2: (3, 9)})  # own: session 3
    fleet.docs[0] = status_doc(1, {1: (1, 5), 2: (2, 9)})
    decision = await plan(1, 2, fleet)
    assert decision.held


async def test_partial_scale_down_goes_as_far_as_is_safe():
    fleet = synced_fleet(4, [1, 1, 5, 1])
    # Replica 3 (ordinal 3) is everywhere; replica ordinal 2 is missing on demo-0.
    fleet.docs[0] = status_doc(1, {1: (1, 1), 2: (1, 1), 3: (1, 2), 4: (1, 1)})
    decision = await plan(2, 4, fleet)
    assert decision.held
    assert decision.target == 3


async def test_unreachable_leaving_replica_holds_if_it_has_a_volume():
    fleet = synced_fleet(3, [1, 1, 1])
    fleet.down.add(2)
    decision = await plan(2, 3, fleet, claims={2})
    assert decision.held and decision.reason == "ReplicaUnreachable"


async def test_unreachable_leaving_replica_without_volume_never_stored_anything():
    fleet = synced_fleet(3, [1, 1, 1])
    fleet.down.add(2)
    decision = await plan(2, 3, fleet, claims=set())
    assert not decision.held and decision.target == 2


async def test_flush_failure_holds():
    fleet = synced_fleet(3, [1, 1, 1])
    fleet.flush_fails.add(2)
    decision = await plan(2, 3, fleet)
    assert decision.held and decision.reason == "FlushFailed"


async def test_unreachable_remaining_replica_holds():
    fleet = synced_fleet(3, [1, 1, 1])
    fleet.down.add(0)
    decision = await plan(2, 3, fleet)
    assert decision.held and decision.reason == "ReplicaUnreachable"
    assert "demo-0" in decision.message


async def test_replica_without_own_events_leaves_at_once():
    fleet = synced_fleet(3, [1, 1, 1])
    fleet.docs[2] = status_doc(3, {1: (1, 1), 2: (1, 1)})
    decision = await plan(2, 3, fleet)
    assert not decision.held
    assert ("flush", 2, "demo-0") not in fleet.calls


async def test_wrong_replica_behind_the_url_holds():
    fleet = synced_fleet(3, [1, 1, 1])
    fleet.docs[2] = status_doc(1, {1: (1, 1)})
    decision = await plan(2, 3, fleet)
    assert decision.held and decision.reason == "WrongReplica"


async def test_force_annotation_skips_checks():
    fleet = FakeReplicas()
    decision = await plan(1, 3, fleet, force=True)
    assert decision.target == 1 and not decision.held and decision.reason == "ScaleDownForced"
    assert fleet.calls == []
