"""docs/hat.md's Kubernetes blocks name what the operator really creates.

The page's local blocks run against a real fleet (e2e/test_docs_hat.py); its Kubernetes
steps need a cluster, so here each name and value they rely on is checked against the
operator's own pure builders: the EventServer is valid for the CRD and turns into the
replicas' hat-compatible Eventer settings, and the Service, port, Secret and key the
commands use are the ones the operator writes for a fleet named ``demo``.
"""

from __future__ import annotations

import base64
import pathlib
import re

import op_k8s_schema as k8s_schema
import yaml
from eventfleet_operator import builders, model, naming
from eventfleet_operator.constants import Service

PAGE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "hat.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)


def blocks(info: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(PAGE.read_text()) if m.group(1) == info]


def the_eventserver() -> dict:
    (doc,) = [d for b in blocks("yaml") if (d := yaml.safe_load(b)).get("kind") == "EventServer"]
    return doc


def kubernetes_commands() -> str:
    (body,) = [b for b in blocks("sh") if "kubectl get secret" in b]
    return body


def test_the_eventserver_is_valid_for_the_crd():
    schema = k8s_schema.crd_schema(k8s_schema.load_crd(), "v1")
    assert k8s_schema.errors(schema, the_eventserver()) == []


def test_the_eventserver_admits_tokenless_clients_only_from_the_listed_network():
    doc = the_eventserver()
    spec = model.parse(doc["metadata"]["name"], "events", doc["spec"], uid="u-1")
    eventer = builders.replica_config(spec, peer_count=3, allow_empty_start=True)["eventer"]
    assert eventer["allow_tokenless_clients"] is True
    assert eventer["tokenless_client_networks"] == doc["spec"]["clients"]["tokenlessNetworks"]
    # The NetworkPolicy lets the same network reach the Eventer port.
    policy = builders.network_policy(spec, builders.operator_peer("op", {"a": "b"}))
    eventer_port = spec.ports["eventer"]
    eventer_rules = [
        rule
        for rule in policy["spec"]["ingress"]
        if any(p["port"] == eventer_port for p in rule.get("ports", []))
    ]
    assert {"ipBlock": {"cidr": "10.1.0.0/16"}} in [f for r in eventer_rules for f in r["from"]]


def test_the_commands_use_the_client_service_port_and_token_secret_the_operator_writes():
    body = kubernetes_commands()
    doc = the_eventserver()
    name = doc["metadata"]["name"]
    spec = model.parse(name, "events", doc["spec"], uid="u-1")
    service = builders.client_service(spec)
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert service["metadata"]["name"] == naming.client_service(name) == "demo"
    assert ports["eventer"] == 23012
    assert f"service/{service['metadata']['name']} {ports['eventer']}" in body  # port-forward
    assert f"EVENTER_HOST={service['metadata']['name']} EVENTER_PORT={ports['eventer']}" in body
    secret = builders.token_secret(spec, "t0k3n")
    (key,) = secret["data"]
    assert base64.b64decode(secret["data"][key]) == b"t0k3n"
    assert f"kubectl get secret {secret['metadata']['name']} -o jsonpath='{{.data.{key}}}'" in body
    # Only the client Service carries Eventer (the peer Service is for the replicas).
    assert [n for _, n, _ in spec.served_ports(Service.CLIENT)].count("eventer") == 1


def test_the_page_table_names_the_same_service_port_and_secret():
    text = PAGE.read_text()
    assert "Service `demo`, port `23012`" in text
    assert "Secret `demo-token`, key `token`" in text
