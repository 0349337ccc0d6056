"""Ownership safety: adopt nothing, overwrite nothing, delete nothing that is not ours."""

from __future__ import annotations

import kubernetes_validate
import pytest
from eventfleet_operator import builders, model, naming, reconcile
from eventfleet_operator.reconcilers import deletion
from op_pass import LOG, Harness

FOREIGN = [
    ("StatefulSet", "demo", "apps/v1"),
    ("Service", "demo", "v1"),
    ("Service", "demo-peers", "v1"),
    ("ConfigMap", "demo-config", "v1"),
    ("Secret", "demo-token", "v1"),
    ("Secret", "demo-peer-token", "v1"),
    ("PodDisruptionBudget", "demo", "policy/v1"),
    ("NetworkPolicy", "demo", "networking.k8s.io/v1"),
]


def foreign(kind, name, api_version, owner_uid=None):
    meta = {"name": name, "namespace": "ns", "labels": {"app": "someone-else"}}
    if owner_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "eventfleet.io/v1", "kind": "EventServer", "name": "demo",
             "uid": owner_uid, "controller": True}
        ]  # fmt: skip
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "data": {"x": "eA=="}}


@pytest.mark.parametrize(
    ("kind", "name", "api_version"), FOREIGN, ids=[f[0] + f[1] for f in FOREIGN]
)
async def test_a_foreign_object_with_a_childs_name_is_never_overwritten(kind, name, api_version):
    h = Harness({"replicas": 3})
    theirs = h.kube.put(foreign(kind, name, api_version))
    status = await h.run()
    # Not touched, not adopted.
    assert h.kube.obj(kind, name) == theirs
    ready = h.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ChildNotOwned")
    assert f"{kind} {name}" in ready["message"]
    assert status["phase"] == "Failed"
    # Nothing else was written either: no half-built fleet next to someone's object.
    assert [w for w in h.kube.writes if w[0] != "patch/status"] == []
    assert ("Warning", "ChildNotOwned") in [(t, r) for t, r, _ in h.events]
    # Once theirs is gone, the fleet is built.
    await h.kube.delete(reconcile.kube.BY_KIND[kind], "ns", name)
    await h.run()
    assert h.condition("Ready")["reason"] != "ChildNotOwned"
    assert naming.owned_by(h.kube.obj(kind, name), h.uid)


async def test_an_object_of_a_previous_eventserver_of_that_name_is_not_adopted():
    h = Harness({"replicas": 1})
    h.kube.put(foreign("ConfigMap", "demo-config", "v1", owner_uid="an-older-uid"))
    await h.run()
    assert h.condition("Ready")["reason"] == "ChildNotOwned"


async def test_cleanup_deletes_only_what_it_owns():
    h = Harness({"replicas": 2, "storage": {"retentionPolicy": {"whenDeleted": "Delete"}}})
    await h.run()
    # Someone replaced the peer Service with their own; a claim-like PVC of someone else.
    await h.kube.delete(reconcile.kube.SERVICES, "ns", "demo-peers")
    h.kube.put(foreign("Service", "demo-peers", "v1"))
    labels = naming.selector_labels("demo")
    for claim in ("data-demo-0", "data-demo-backup"):
        h.kube.put(
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": claim, "namespace": "ns", "labels": labels}}
        )  # fmt: skip
    deleted = await deletion.cleanup(h.ctx, h.body, LOG)
    assert "Service/demo-peers" not in deleted
    assert h.kube.obj("Service", "demo-peers") is not None
    assert "PersistentVolumeClaim/data-demo-0" in deleted
    assert h.kube.obj("PersistentVolumeClaim", "data-demo-backup") is not None
    for kind, name in [
        ("StatefulSet", "demo"),
        ("NetworkPolicy", "demo"),
        ("Secret", "demo-token"),
        ("Secret", "demo-peer-token"),
    ]:
        assert h.kube.obj(kind, name) is None, (kind, name)


async def test_network_policy_is_on_by_default_and_the_switch_deletes_it():
    h = Harness({"replicas": 3})
    await h.run()
    np = h.kube.obj("NetworkPolicy", "demo")
    assert np is not None and naming.owned_by(np, h.uid)
    h.set_spec({"replicas": 3, "networkPolicy": {"enabled": False}})
    await h.run()
    assert h.kube.obj("NetworkPolicy", "demo") is None
    assert any(r == "Deleted" and "NetworkPolicy" in m for _, r, m in h.events)


def _rules(doc):
    return {
        tuple(p["port"] for p in rule["ports"]): rule.get("from") for rule in doc["spec"]["ingress"]
    }


def test_network_policy_rules():
    spec = model.parse("demo", "ns", {}, uid="u1")
    operator = builders.operator_peer("eventfleet-system", {"app.kubernetes.io/name": "op"})
    doc = builders.network_policy(spec, operator)
    kubernetes_validate.validate(doc, "1.33.0", strict=True)
    rules = _rules(doc)
    own = [{"podSelector": {"matchLabels": naming.selector_labels("demo")}}]
    assert rules[(23013,)] == own  # Syncer: the fleet only
    http = rules[(23080,)]
    assert http[0] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "eventfleet-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "op"}},
    }
    assert http[1]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert len(http) == 2
    # Client ports (Eventer, and the Event BUS block when served): from anywhere by default.
    client = next(k for k in rules if 23012 in k)
    assert rules[client] is None
    assert set(client) == {port for _, _, port in spec.served_ports() if port not in (23013, 23080)}
    assert doc["spec"]["policyTypes"] == ["Ingress"]


def test_network_policy_admits_the_spark_job_to_the_http_port_when_aggregating():
    spec = model.parse("demo", "ns", {"aggregation": {"enabled": True}}, uid="u1")
    doc = builders.network_policy(spec, builders.operator_peer("eventfleet-system", {"a": "b"}))
    kubernetes_validate.validate(doc, "1.33.0", strict=True)
    http = _rules(doc)[(23080,)]
    spark = builders.scheduled_spark_application(spec)
    driver_labels = spark["spec"]["template"]["driver"]["labels"]
    assert {"podSelector": {"matchLabels": driver_labels}} in http
    assert spark["spec"]["template"]["executor"]["labels"] == driver_labels
    args = spark["spec"]["template"]["arguments"]
    assert args[args.index("--http") + 1] == "demo.ns.svc:23080"


def test_network_policy_restricted_clients_and_custom_monitoring():
    spec = model.parse(
        "demo",
        "ns",
        {
            "networkPolicy": {
                "clients": {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]},
                "monitoring": {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
                "http": {"from": [{"podSelector": {"matchLabels": {"role": "web"}}}]},
            }
        },
        uid="u1",
    )
    doc = builders.network_policy(spec, builders.operator_peer(None, {"a": "b"}))
    kubernetes_validate.validate(doc, "1.33.0", strict=True)
    rules = _rules(doc)
    client = next(k for k in rules if 23012 in k)
    assert rules[client] == [{"podSelector": {"matchLabels": {"role": "client"}}}]
    http = rules[(23080,)]
    assert http[0]["namespaceSelector"] == {}  # operator namespace unknown: any
    assert http[1:] == [
        {"ipBlock": {"cidr": "10.0.0.0/8"}},
        {"podSelector": {"matchLabels": {"role": "web"}}},
    ]


@pytest.mark.parametrize(
    ("np", "field"),
    [
        ({"clients": {"from": [{}]}}, "spec.networkPolicy.clients.from[0]"),
        ({"http": {"from": [{"pods": {}}]}}, "spec.networkPolicy.http.from[0]"),
        ({"enabled": "yes"}, "spec.networkPolicy.enabled"),
    ],
)
def test_bad_network_policy_names_the_field(np, field):
    with pytest.raises(model.SpecError) as e:
        model.parse("demo", "ns", {"networkPolicy": np})
    assert e.value.field == field
