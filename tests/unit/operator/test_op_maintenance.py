"""Maintenance: pause, hibernate and wake, the disruption budget, topology spread."""

from __future__ import annotations

import kubernetes_validate
import pytest
from eventfleet_operator import builders, model
from op_fakes import status_doc
from op_pass import Harness


def synced(h, n, instances):
    held = {i + 1: (1, instances[i]) for i in range(n)}
    for i in range(n):
        h.replicas.docs[i] = status_doc(i + 1, held)


async def test_paused_fleet_writes_nothing_but_status():
    h = Harness({"replicas": 3})
    await h.run()
    h.annotate(reconcile="paused")
    h.set_spec({"replicas": 5, "podLabels": {"team": "x"}})
    before = len(h.kube.writes)
    await h.run()
    assert [w for w in h.kube.writes[before:] if w[0] != "patch/status"] == []
    paused = h.condition("ReconcilePaused")
    assert (paused["status"], paused["reason"]) == ("True", "Paused")
    assert h.sts()["spec"]["replicas"] == 3
    # A hand-deleted child stays deleted while paused...
    del h.kube.objects[("ConfigMap", "ns", "demo-config")]
    await h.run()
    assert h.kube.obj("ConfigMap", "demo-config") is None
    # ... and resuming applies everything that waited.
    h.annotate(reconcile=None)
    await h.run()
    assert h.condition("ReconcilePaused")["status"] == "False"
    assert h.kube.obj("ConfigMap", "demo-config") is not None
    assert h.sts()["spec"]["replicas"] == 5
    assert h.sts()["spec"]["template"]["metadata"]["labels"]["team"] == "x"


async def test_hibernate_flushes_every_pair_then_scales_to_zero_and_wake_restores():
    h = Harness({"replicas": 3})
    await h.run()
    synced(h, 3, [5, 7, 9])
    h.kube.objects[("StatefulSet", "ns", "demo")]["status"] = {"replicas": 3, "readyReplicas": 3}
    h.set_spec({"replicas": 3, "hibernate": True})
    status = await h.run()
    flushes = {(c[1], c[2]) for c in h.replicas.calls if c[0] == "flush"}
    assert flushes == {(i, f"demo-{j}") for i in range(3) for j in range(3) if i != j}
    assert h.sts()["spec"]["replicas"] == 0
    h.kube.objects[("StatefulSet", "ns", "demo")]["status"] = {
        "replicas": 0,
        "readyReplicas": 0,
        "observedGeneration": h.sts()["metadata"]["generation"],
    }
    status = await h.run()
    assert status["phase"] == "Hibernated"
    assert h.condition("Hibernated")["status"] == "True"
    assert h.condition("Ready")["reason"] == "Hibernated"
    # The peer list keeps the whole mesh, so waking rewrites nothing there.
    config = h.kube.obj("ConfigMap", "demo-config")["data"]["config.yaml"]
    assert "demo-2" in config
    h.set_spec({"replicas": 3, "hibernate": False})
    await h.run()
    assert h.sts()["spec"]["replicas"] == 3
    assert h.condition("Hibernated")["reason"] == "NotHibernating"


async def test_hibernation_is_held_while_a_replica_lacks_events():
    h = Harness({"replicas": 2})
    await h.run()
    h.replicas.docs[0] = status_doc(1, {1: (1, 5), 2: (1, 3)})  # misses 4..7 of server 2
    h.replicas.docs[1] = status_doc(2, {1: (1, 5), 2: (1, 7)})
    h.set_spec({"replicas": 2, "hibernate": True})
    status = await h.run()
    assert h.sts()["spec"]["replicas"] == 2
    assert h.condition("Hibernated")["reason"] == "Hibernating"
    assert "EventsNotReplicated" == h.condition("ScaleDownHeld")["reason"]
    assert status["phase"] != "Hibernated"


def test_pdb_defaults_and_settings():
    doc = builders.pod_disruption_budget(model.parse("demo", "ns", {}))
    assert doc["spec"]["maxUnavailable"] == 1
    assert doc["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    kubernetes_validate.validate(doc, "1.33.0", strict=True)
    spec = {"podDisruptionBudget": {"maxUnavailable": "50%"}}
    doc = builders.pod_disruption_budget(model.parse("demo", "ns", spec))
    assert doc["spec"]["maxUnavailable"] == "50%"
    kubernetes_validate.validate(doc, "1.33.0", strict=True)


async def test_pdb_can_be_turned_off():
    h = Harness({"replicas": 3})
    await h.run()
    assert h.kube.obj("PodDisruptionBudget", "demo") is not None
    h.set_spec({"replicas": 3, "podDisruptionBudget": {"enabled": False}})
    await h.run()
    assert h.kube.obj("PodDisruptionBudget", "demo") is None


@pytest.mark.parametrize(
    ("pdb", "field"),
    [
        ({"maxUnavailable": "half"}, "spec.podDisruptionBudget.maxUnavailable"),
        ({"maxUnavailable": -1}, "spec.podDisruptionBudget.maxUnavailable"),
        (
            {"unhealthyPodEvictionPolicy": "Never"},
            "spec.podDisruptionBudget.unhealthyPodEvictionPolicy",
        ),
    ],
)
def test_bad_pdb_names_the_field(pdb, field):
    with pytest.raises(model.SpecError) as e:
        model.parse("demo", "ns", {"podDisruptionBudget": pdb})
    assert e.value.field == field


def _spread(spec):
    sts = builders.statefulset(model.parse("demo", "ns", spec), replicas=3, config_hash="h")
    kubernetes_validate.validate(sts, "1.33.0", strict=True)
    pod = sts["spec"]["template"]["spec"]
    return pod.get("topologySpreadConstraints"), pod["affinity"]


def test_default_zone_spread_next_to_the_hostname_anti_affinity():
    spread, affinity = _spread({})
    assert spread == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": builders.naming.selector_labels("demo")},
        }
    ]
    term = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_own_spread_constraints_or_none():
    own = {"maxSkew": 2, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule"}
    spread, _ = _spread({"topologySpreadConstraints": [own]})
    assert spread == [
        {**own, "labelSelector": {"matchLabels": builders.naming.selector_labels("demo")}}
    ]
    spread, _ = _spread({"topologySpreadConstraints": []})
    assert spread is None


async def test_removing_the_spread_constraints_removes_them():
    h = Harness({"replicas": 1})
    await h.run()
    assert h.sts()["spec"]["template"]["spec"]["topologySpreadConstraints"]
    h.set_spec({"replicas": 1, "topologySpreadConstraints": []})
    await h.run()
    assert "topologySpreadConstraints" not in h.sts()["spec"]["template"]["spec"]


async def test_pause_and_hibernation_post_events_once():
    h = Harness({"replicas": 1})
    await h.run()
    h.annotate(reconcile="paused")
    await h.run()
    await h.run()
    assert [r for _, r, _ in h.events].count("Paused") == 1
    h.annotate(reconcile=None)
    await h.run()
    assert "NotPaused" in [r for _, r, _ in h.events]


async def test_flush_annotation_is_answered_once_in_the_status():
    h = Harness({"replicas": 2})
    await h.run()
    synced(h, 2, [3, 4])
    h.annotate(flush="t1")
    status = await h.run()
    assert (status["lastFlush"]["requested"], status["lastFlush"]["result"]) == ("t1", "Verified")
    flushes = [c for c in h.replicas.calls if c[0] == "flush"]
    assert {(c[1], c[2]) for c in flushes} == {(0, "demo-1"), (1, "demo-0")}
    await h.run()
    assert len([c for c in h.replicas.calls if c[0] == "flush"]) == len(flushes)  # once
    h.replicas.flush_fails.add(1)
    h.annotate(flush="t2")
    status = await h.run()
    assert (status["lastFlush"]["requested"], status["lastFlush"]["result"]) == (
        "t2",
        "FlushFailed",
    )
    assert ("Warning", "FlushFailed") in [(t, r) for t, r, _ in h.events]


async def test_the_requested_flush_presents_the_peer_token_not_the_client_token():
    h = Harness({"replicas": 2})
    await h.run()
    synced(h, 2, [3, 4])
    h.replicas.tokens.clear()
    h.annotate(flush="t1")
    await h.run()
    import base64

    peer = base64.b64decode(h.kube.obj("Secret", "demo-peer-token")["data"]["token"]).decode()
    client = base64.b64decode(h.kube.obj("Secret", "demo-token")["data"]["token"]).decode()
    assert peer.strip() and peer != client
    assert h.replicas.tokens and set(h.replicas.tokens) == {peer.strip()}
