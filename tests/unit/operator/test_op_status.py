"""Conditions, phase and peers from observations."""

from __future__ import annotations

import dataclasses

from eventfleet_operator import status as st
from eventfleet_operator.replicas import ReplicaStatus
from eventfleet_operator.scaling import Decision
from op_fakes import status_doc


def link(name, sid, state="synced", lag=0):
    return {
        "name": name,
        "server_id": sid,
        "state": state,
        "last_event_id": None,
        "lag_events": lag,
        "lag_seconds": 0.0,
    }


def report(ordinal, peers, ready=True):
    sid = ordinal + 1
    doc = status_doc(sid, {sid: (1, 10)}, peers=peers, ready=ready)
    return st.PeerReport(ordinal, f"demo-{ordinal}", sid, status=ReplicaStatus.parse(doc))


def mesh(n, state="synced"):
    return [
        report(i, [link(f"demo-{j}", j + 1, state) for j in range(n) if j != i]) for i in range(n)
    ]


def obs(**kw):
    base = dict(
        name="demo",
        generation=3,
        desired=3,
        selector="s",
        statefulset={"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 3}},
        decision=Decision(target=3),
        peers=mesh(3),
    )
    base.update(kw)
    return st.Observation(**base)


def cond(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_all_good():
    s = st.build(obs(), None, now="T0")
    assert s["phase"] == "Running"
    assert s["observedGeneration"] == 3
    assert (s["replicas"], s["readyReplicas"], s["statefulSetReplicas"]) == (3, 3, 3)
    assert cond(s, "Ready")["status"] == "True"
    assert cond(s, "PeersSynced")["status"] == "True"
    assert cond(s, "ScaleDownHeld")["status"] == "False"
    assert cond(s, "AggregationScheduled")["reason"] == "Disabled"
    assert s["initialized"] is True
    assert [p["syncState"] for p in s["peers"]] == ["synced"] * 3
    assert s["peers"][0]["lastEventId"] == {"server": 1, "session": 1, "instance": 10}


def test_transition_time_is_kept_while_status_is_unchanged():
    first = st.build(obs(), None, now="T0")
    second = st.build(obs(generation=4), first, now="T1")
    assert cond(second, "Ready")["lastTransitionTime"] == "T0"
    assert cond(second, "Ready")["observedGeneration"] == 4
    held = st.build(
        obs(decision=Decision(3, True, "EventsNotReplicated", "holding")), second, now="T2"
    )
    assert cond(held, "Ready")["lastTransitionTime"] == "T2"
    assert cond(held, "Ready")["reason"] == "ScaleDownHeld"
    assert cond(held, "ScaleDownHeld")["status"] == "True"
    assert [c["type"] for c in st.transitions(second, held)] == ["Ready", "ScaleDownHeld"]
    assert st.transitions(held, held) == []


def test_invalid_spec_is_failed_with_the_field():
    s = st.build(obs(spec_error=("spec.ports.bus", "collides")), None)
    assert s["phase"] == "Failed"
    ready = cond(s, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith("spec.ports.bus")


def test_unimplemented_protocol_is_not_ready_with_the_field():
    s = st.build(obs(not_implemented=("spec.protocols.bus.enabled",)), None)
    ready = cond(s, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ProtocolNotImplemented")
    assert ready["message"].startswith("spec.protocols.bus.enabled: ")
    assert "not implemented in this version" in ready["message"]
    assert s["phase"] != "Running"


def test_not_ready_and_scaling_phases():
    sts = {"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 1}}
    s = st.build(obs(statefulset=sts), None)
    assert s["phase"] == "Degraded"
    assert cond(s, "Ready")["reason"] == "ReplicasNotReady"
    s = st.build(obs(statefulset={"spec": {"replicas": 3}}), None)
    assert s["phase"] == "Pending"
    s = st.build(obs(desired=5), None)
    assert s["phase"] == "Scaling"
    assert cond(s, "Ready")["reason"] == "Scaling"


def test_peer_states():
    peers = mesh(3)
    peers[1] = report(1, [link("demo-0", 1, "syncing", lag=5), link("demo-2", 3)])
    peers[2] = st.PeerReport(2, "demo-2", 3, error="refused")
    s = st.build(obs(peers=peers), None)
    assert [p["syncState"] for p in s["peers"]] == ["synced", "syncing", "unknown"]
    assert s["peers"][1]["lagEvents"] == 5
    assert s["peers"][2]["reachable"] is False
    assert cond(s, "PeersSynced")["status"] == "Unknown"
    peers[2] = report(2, [link("demo-0", 1)])  # no link to demo-1 at all
    s = st.build(obs(peers=peers), None)
    assert s["peers"][2]["syncState"] == "disconnected"
    assert cond(s, "PeersSynced")["status"] == "False"


def test_optional_children_conditions():
    s = st.build(obs(aggregation=st.OptionalChild(enabled=True, available=False)), None)
    c = cond(s, "AggregationScheduled")
    assert (c["status"], c["reason"]) == ("False", "SparkOperatorNotInstalled")
    assert cond(s, "Ready")["status"] == "True"  # optional parts never block the fleet
    s = st.build(obs(monitoring=st.OptionalChild(enabled=True, applied=True)), None)
    assert cond(s, "MonitoringConfigured")["status"] == "True"


def test_the_outcome_of_the_last_scale_down_stays_until_the_next_one():
    base = st.Observation(
        name="demo",
        generation=1,
        desired=2,
        selector="a=b",
        statefulset={"spec": {"replicas": 2}, "status": {"replicas": 2, "readyReplicas": 2}},
    )
    verified = st.build(
        dataclasses.replace(
            base, decision=Decision(target=2, reason="ScaleDownVerified", message="scaled to 2")
        ),
        None,
    )
    later = st.build(dataclasses.replace(base, decision=Decision(target=2)), verified)
    held = next(c for c in later["conditions"] if c["type"] == "ScaleDownHeld")
    assert (held["status"], held["reason"], held["message"]) == (
        "False",
        "ScaleDownVerified",
        "scaled to 2",
    )


def pod(ready=True, terminating=False):
    meta = {"deletionTimestamp": "2026-11-26T18:39:29Z"} if terminating else {}
    return {
        "metadata": meta,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_ready_is_false_while_the_statefulset_status_is_of_an_older_generation():
    # Right after a wake (0 -> 3) the StatefulSet still shows the counts of before.
    sts = {
        "metadata": {"generation": 7},
        "spec": {"replicas": 3},
        "status": {"replicas": 3, "readyReplicas": 3, "observedGeneration": 6},
    }
    s = st.build(obs(statefulset=sts), None, now="T0")
    ready = cond(s, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "StatefulSetStatusStale")
    assert "generation 7" in ready["message"] and "generation 6" in ready["message"]
    sts["status"]["observedGeneration"] = 7
    assert cond(st.build(obs(statefulset=sts), None, now="T1"), "Ready")["status"] == "True"


def test_terminating_or_unready_pods_do_not_count_as_ready():
    # The StatefulSet's readyReplicas still counts pods that are shutting down.
    pods = {0: pod(terminating=True), 1: pod(), 2: pod(ready=False)}
    s = st.build(obs(pods=st.PodCounts.of(pods, 3)), None, now="T0")
    assert s["readyReplicas"] == 1
    ready = cond(s, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReplicasNotReady")
    assert s["phase"] == "Degraded"
    pods = {i: pod() for i in range(3)}
    s = st.build(obs(pods=st.PodCounts.of(pods, 3)), None, now="T1")
    assert (s["readyReplicas"], cond(s, "Ready")["status"]) == (3, "True")


def test_hibernated_only_once_no_pod_is_left():
    sts = {
        "metadata": {"generation": 4},
        "spec": {"replicas": 0},
        "status": {"replicas": 0, "observedGeneration": 4},
    }
    still = st.PodCounts.of({0: pod(terminating=True)}, 0)
    s = st.build(obs(statefulset=sts, hibernate=True, pods=still), None, now="T0")
    assert cond(s, "Hibernated")["status"] == "False"
    assert s["phase"] != "Hibernated"
    s = st.build(obs(statefulset=sts, hibernate=True, pods=st.PodCounts.of({}, 0)), None, "T1")
    assert cond(s, "Hibernated")["status"] == "True"
    assert s["phase"] == "Hibernated"
