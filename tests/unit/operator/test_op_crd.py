"""The CRD: valid for Kubernetes 1.33, structural, and its schema against good and bad examples."""

from __future__ import annotations

import copy

import kubernetes_validate
import op_k8s_schema as k8s_schema
import pytest
from eventfleet_operator import model
from op_fakes import FULL_SPEC

CRD = k8s_schema.load_crd()
SCHEMA = k8s_schema.crd_schema(CRD, "v1")


def es(spec, name="demo"):
    return {
        "apiVersion": "eventfleet.io/v1",
        "kind": "EventServer",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_crd_is_a_valid_v1_crd():
    kubernetes_validate.validate(CRD, "1.33.0", strict=True)
    assert CRD["spec"]["group"] == "eventfleet.io"
    assert CRD["spec"]["names"]["kind"] == "EventServer"
    assert CRD["spec"]["names"]["shortNames"]


def test_crd_has_status_scale_and_printer_columns():
    (v1,) = CRD["spec"]["versions"]
    assert v1["served"] and v1["storage"]
    assert v1["subresources"]["status"] == {}
    assert v1["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c["jsonPath"] for c in v1["additionalPrinterColumns"]}
    assert columns["Replicas"] == ".spec.replicas"
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["Phase"] == ".status.phase"
    assert columns["Age"] == ".metadata.creationTimestamp"


def _walk(schema, path="$"):
    yield path, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    # Structural: every node has a type (or is int-or-string / preserve-unknown),
    # and defaults only where no other rule forbids them.
    for path, node in _walk(SCHEMA):
        if path == "$.metadata":
            continue
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"


def test_full_example_is_valid():
    assert k8s_schema.errors(SCHEMA, es(FULL_SPEC)) == []


def test_minimal_example_is_valid():
    assert k8s_schema.errors(SCHEMA, es({})) == []


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"replicas": 0}, "spec.replicas"),
        ({"replicas": 65}, "spec.replicas"),
        ({"replicas": "3"}, "spec.replicas"),
        ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
        ({"storage": {"size": "lots"}}, "spec.storage.size"),
        (
            {"storage": {"retentionPolicy": {"whenDeleted": "Keep"}}},
            "spec.storage.retentionPolicy.whenDeleted",
        ),
        ({"storage": {"synchronous": "SOMETIMES"}}, "spec.storage.synchronous"),
        ({"ports": {"eventer": 80}}, "spec.ports.eventer"),
        ({"ports": {"bus": 65534}}, "spec.ports.bus"),
        ({"token": {"secretRef": {}}}, "spec.token.secretRef"),
        ({"syncer": {"subscriptions": []}}, "spec.syncer.subscriptions"),
        ({"syncer": {"subscriptions": [[]]}}, "spec.syncer.subscriptions.0"),
        (
            {"monitoring": {"serviceMonitor": {"interval": "soon"}}},
            "spec.monitoring.serviceMonitor.interval",
        ),
        ({"aggregation": {"concurrencyPolicy": "Sometimes"}}, "spec.aggregation.concurrencyPolicy"),
        ({"aggregation": {"driver": {"memory": "1 GB"}}}, "spec.aggregation.driver.memory"),
        ({"resources": {"limits": {"cpu": "lots"}}}, "spec.resources.limits.cpu"),
        ({"tolerations": [{"operator": "Maybe"}]}, "spec.tolerations.0.operator"),
        ({"unknownField": 1}, "spec"),
        ({"clients": {"allowTokenless": "yes"}}, "spec.clients.allowTokenless"),
        ({"clients": {"tokenlessNetworks": "10.0.0.0/8"}}, "spec.clients.tokenlessNetworks"),
        ({"storage": {"sizee": "1Gi"}}, "spec.storage"),
    ],
)
def test_bad_examples_are_rejected_naming_the_field(patch, field):
    errors = k8s_schema.errors(SCHEMA, es(patch))
    assert errors, f"{patch} was accepted"
    assert any(e.startswith(field + ":") for e in errors), errors


def test_spec_is_required():
    doc = es({})
    del doc["spec"]
    assert k8s_schema.errors(SCHEMA, doc)


def test_cel_rules_are_declared_for_what_openapi_cannot_say():
    rules = [r["rule"] for r in SCHEMA["x-kubernetes-validations"]]
    assert any("metadata.name.size()" in r for r in rules)
    agg = SCHEMA["properties"]["spec"]["properties"]["aggregation"]
    assert any("windowSeconds" in r["rule"] for r in agg["x-kubernetes-validations"])


def test_the_hat_compatible_mode_has_cel_rules_for_its_networks():
    # CEL is evaluated by the API server (e2e/test_operator.py on the real control plane).
    clients = SCHEMA["properties"]["spec"]["properties"]["clients"]
    assert "allowTokenless" in clients["x-kubernetes-validations"][0]["rule"]
    item = clients["properties"]["tokenlessNetworks"]["items"]
    assert item["x-kubernetes-validations"][0]["rule"] == "isCIDR(self) || isIP(self)"
    assert item["maxLength"] <= 64  # bounds the rule's CEL cost


def test_crd_defaults_agree_with_the_operator():
    # The API server applies the CRD defaults; the operator applies its own (objects
    # stored before a CRD upgrade). Both must give the same fleet.
    spec_schema = SCHEMA["properties"]["spec"]
    for raw in ({}, {"aggregation": {"enabled": True}}, copy.deepcopy(FULL_SPEC)):
        defaulted = k8s_schema.apply_defaults(spec_schema, raw)
        assert k8s_schema.errors(SCHEMA, es(defaulted)) == []
        assert model.parse("demo", "ns", defaulted) == model.parse("demo", "ns", raw)


def test_status_schema_accepts_what_the_operator_writes():
    from eventfleet_operator import status as st
    from eventfleet_operator.replicas import ReplicaStatus
    from eventfleet_operator.scaling import Decision

    report = st.PeerReport(
        0,
        "demo-0",
        1,
        status=ReplicaStatus.parse(
            {
                "version": 1,
                "server_id": 1,
                "status": "operational",
                "ready": True,
                "last_ids": {"1": {"server": 1, "session": 2, "instance": 3}},
                "peers": [],
                "storage": {"events": 3, "db_bytes": 4096},
            }
        ),
    )
    obs = st.Observation(
        name="demo",
        generation=2,
        desired=1,
        selector="a=b",
        statefulset={"spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": 1}},
        decision=Decision(target=1),
        peers=[report, st.PeerReport(1, "demo-1", 2, error="refused")],
        config_hash="abc",
    )
    doc = es({})
    doc["status"] = st.build(obs, None)
    assert k8s_schema.errors(SCHEMA, doc) == []
