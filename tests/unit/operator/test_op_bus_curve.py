"""spec.protocols.bus.curve: the key pair the operator issues (checked against libzmq's
own CURVE arithmetic), the spec checks, the manifests (replica config valid for the
replica's schema, the mounts, the Secret against the Kubernetes schema), and passes
that issue, keep, accept a rotation through and remove the key pair Secret."""

from __future__ import annotations

import base64

import jsonschema
import kubernetes_validate
import pytest
import yaml
import zmq
from eventfleet_operator import builders, buskeys, model, naming
from eventfleet_operator.model import SpecError
from eventfleet_operator.reconcilers.buscurve import stored_pair
from op_fakes import status_doc
from op_pass import Harness

CURVE = {"protocols": {"bus": {"curve": {"enabled": True}}}}


def fleet(spec):
    return model.parse("demo", "events", spec, uid="0b8a7d5e-5c1e-4b7e-9d6f-3a2c1b0e9f8d")


def curve_status(server_id, public_key):
    """A replica's /status serving `public_key` on its CURVE BUS."""
    doc = status_doc(server_id, {server_id: (1, 1)})
    doc["protocols"] = {"bus": {"auth": "curve", "curve": {"public_key": public_key}}}
    return doc


def _data(secret, key):
    return base64.b64decode(secret["data"][key]).decode()


# -- keys ---------------------------------------------------------------------------------


def test_issued_pairs_are_the_pairs_libzmq_computes():
    assert buskeys.z85_encode(bytes.fromhex("864FD26FB559F75B")) == "HelloWorld"  # RFC 32
    pair = buskeys.new_keypair()
    assert zmq.curve_public(pair.secret_z85.encode()).decode() == pair.public_z85
    public, secret = zmq.curve_keypair()
    assert buskeys.from_secret(secret.decode() + "\n").public_z85 == public.decode()
    assert buskeys.z85_decode(public.decode()) == zmq.utils.z85.decode(public)


@pytest.mark.parametrize("text", ["", "x" * 39, "%" * 40, "~" * 40])
def test_a_bad_stored_key_is_refused_without_echoing_it(text):
    with pytest.raises(buskeys.BusKeyError) as e:
        buskeys.from_secret(text)
    assert not text or text not in str(e.value)


# -- spec and manifests ---------------------------------------------------------------------


def test_spec_defaults_and_checks():
    assert not fleet({}).bus_curve.enabled
    spec = fleet(
        {
            "protocols": {
                "bus": {"curve": {"enabled": True, "allowedKeysSecretRef": {"name": "clients"}}}
            }
        }
    )
    assert spec.bus_curve == model.BusCurveSpec(True, True, "clients")
    with pytest.raises(SpecError, match="no client could connect"):
        fleet({"protocols": {"bus": {"curve": {"enabled": True, "tokens": False}}}})
    with pytest.raises(SpecError, match="'Bad_Name'"):
        fleet({"protocols": {"bus": {"curve": {"allowedKeysSecretRef": {"name": "Bad_Name"}}}}})


def test_config_mounts_and_secret():
    from eventfleet_server.config import SCHEMA as schema

    spec = fleet(
        {
            "protocols": {
                "bus": {"curve": {"enabled": True, "allowedKeysSecretRef": {"name": "clients"}}}
            }
        }
    )
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=True)
    jsonschema.Draft202012Validator(schema).validate(config)
    assert config["bus"]["curve"] == {
        "enabled": True,
        "secret_key_file": naming.BUS_CURVE_KEY_PATH,
        "allowed_keys": naming.BUS_CLIENT_KEYS_DIR,
        "tokens": True,
    }
    pod = builders.statefulset(spec, replicas=3, config_hash="h")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["bus-curve"]["secret"]["secretName"] == "demo-bus-curve"
    # Only the secret key goes into the pod; a directory mount (never subPath) so a
    # rotated Secret reaches the running replica.
    assert volumes["bus-curve"]["secret"]["items"] == [{"key": "server.key", "path": "server.key"}]
    assert volumes["bus-clients"]["secret"]["secretName"] == "clients"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["bus-curve"]["mountPath"] == naming.BUS_CURVE_DIR
    assert "subPath" not in mounts["bus-curve"] and "subPath" not in mounts["bus-clients"]
    pair = buskeys.new_keypair()
    secret = builders.bus_curve_secret(spec, pair.secret_z85, pair.public_z85)
    kubernetes_validate.validate(secret, "1.33.0", strict=True)
    assert stored_pair(secret) == (pair, "")
    # The BUS off: nothing of CURVE is rendered even with curve.enabled.
    off = fleet({"protocols": {"bus": {"enabled": False, "curve": {"enabled": True}}}})
    config = builders.replica_config(off, peer_count=3, allow_empty_start=True)
    assert "curve" not in config.get("bus", {})
    pod = builders.statefulset(off, replicas=3, config_hash="h")["spec"]["template"]["spec"]
    assert "bus-curve" not in {v["name"] for v in pod["volumes"]}


# -- passes -----------------------------------------------------------------------------------


async def test_passes_issue_keep_accept_a_rotation_and_remove_the_key_pair():
    h = Harness(CURVE)
    await h.run()
    secret = h.kube.obj("Secret", "demo-bus-curve")
    assert secret is not None and naming.owned_by(secret, h.uid)
    first = buskeys.from_secret(_data(secret, "server.key"))
    assert _data(secret, "server.pub").strip() == first.public_z85
    # Clients learn the public key from the status, without access to the Secret; no
    # replica answered yet, so none is counted as serving it.
    assert h.body["status"]["busCurve"] == {
        "secretName": "demo-bus-curve",
        "publicKey": first.public_z85,
        "replicasServing": 0,
    }
    version = secret["metadata"]["resourceVersion"]
    await h.run()  # kept: a new pair would lock every client out
    assert h.kube.obj("Secret", "demo-bus-curve")["metadata"]["resourceVersion"] == version

    # Rotation through the Secret: an administrator writes a new server.key (and a
    # stale server.pub); the operator keeps the key and corrects server.pub.
    public, new_secret = zmq.curve_keypair()
    secret = h.kube.obj("Secret", "demo-bus-curve")
    secret["data"]["server.key"] = base64.b64encode(new_secret).decode()
    h.kube.put(secret)
    await h.run()
    secret = h.kube.obj("Secret", "demo-bus-curve")
    assert _data(secret, "server.key").strip() == new_secret.decode()
    assert _data(secret, "server.pub").strip() == public.decode()
    assert h.body["status"]["busCurve"]["publicKey"] == public.decode()
    # replicasServing counts the replicas whose /status shows that key: one still on
    # the old key (the kubelet has not refreshed its volume yet), one down.
    for ordinal, key in ((0, public.decode()), (1, first.public_z85), (2, public.decode())):
        h.replicas.docs[ordinal] = curve_status(ordinal + 1, key)
    h.replicas.down.add(2)
    await h.run()
    assert h.body["status"]["busCurve"]["replicasServing"] == 1
    h.replicas.docs[1] = curve_status(2, public.decode())
    h.replicas.down.clear()
    await h.run()
    assert h.body["status"]["busCurve"]["replicasServing"] == 3

    # A broken key (or a deleted Secret) gets a fresh pair.
    secret["data"]["server.key"] = base64.b64encode(b"broken").decode()
    h.kube.put(secret)
    await h.run()
    fresh = buskeys.from_secret(_data(h.kube.obj("Secret", "demo-bus-curve"), "server.key"))
    assert fresh.secret_z85 not in (first.secret_z85, new_secret.decode())

    h.set_spec({})
    await h.run()
    assert h.kube.obj("Secret", "demo-bus-curve") is None
    assert "busCurve" not in h.body["status"]


# -- PLAIN listeners beside CURVE (plainPort, plainNetworks) ----------------------------------

PLAIN = {
    "protocols": {
        "bus": {
            "curve": {
                "enabled": True,
                "plainPort": 23040,
                "plainNetworks": ["10.1.2.3/16", "fd00::1", "192.0.2.7"],
            }
        }
    }
}


def test_plain_listeners_reach_the_config_the_ports_and_the_policy(tmp_path):
    from eventfleet_server import config as replica_config
    from eventfleet_server.bus.config import BusConfig
    from eventfleet_server.config.typed import build

    spec = fleet(PLAIN)
    assert spec.bus_curve.plain_port == 23040
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=True)
    curve = config["bus"]["curve"]
    assert curve["plain_port"] == 23040
    assert curve["plain_networks"] == ["10.1.2.3/16", "fd00::1", "192.0.2.7"]
    # The replica loads it and its own checks (overlap, networks) pass.
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = replica_config.load(path, environ={"EVENTFLEET_POD_NAME": "demo-0"})
    bus = build(BusConfig, loaded["bus"])
    assert bus.curve.plain_port == 23040 and bus.port == 23030
    plain = {"plain-snapshot": 23040, "plain-publisher": 23041, "plain-collector": 23042}

    pod = builders.statefulset(spec, replicas=3, config_hash="h")
    container = pod["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {k: ports[k] for k in plain} == plain and ports["bus-snapshot"] == 23030
    client = builders.client_service(spec)
    by_name = {p["name"]: p for p in client["spec"]["ports"]}
    assert {k: by_name[k]["port"] for k in plain} == plain
    assert all(by_name[k]["targetPort"] == k for k in plain)
    assert not set(plain) & {p["name"] for p in builders.peer_service(spec)["spec"]["ports"]}

    # PLAIN only from the listed networks (canonical CIDRs); the CURVE ports as before.
    operator = builders.operator_peer("op", {"a": "b"})
    policy = builders.network_policy(spec, operator)
    rules = policy["spec"]["ingress"]
    plain_rules = [r for r in rules if {p["port"] for p in r["ports"]} & set(plain.values())]
    assert plain_rules == [
        {
            "from": [
                {"ipBlock": {"cidr": "10.1.0.0/16"}},
                {"ipBlock": {"cidr": "fd00::1/128"}},
                {"ipBlock": {"cidr": "192.0.2.7/32"}},
            ],
            "ports": [{"protocol": "TCP", "port": p} for p in plain.values()],
        }
    ]
    curve_rule = next(r for r in rules if {"protocol": "TCP", "port": 23030} in r["ports"])
    assert "from" not in curve_rule  # clients.from empty: every source, as before
    for doc in (pod, client, policy, builders.peer_service(spec)):
        kubernetes_validate.validate(doc, "1.33.0", strict=True)

    # Without plainNetworks the PLAIN ports admit whom the other client ports admit.
    spec = fleet(
        {
            "protocols": {"bus": {"curve": {"enabled": True, "plainPort": 23040}}},
            "networkPolicy": {"clients": {"from": [{"podSelector": {"matchLabels": {"c": "1"}}}]}},
        }
    )
    rules = builders.network_policy(spec, operator)["spec"]["ingress"]
    (clients,) = [r for r in rules if {"protocol": "TCP", "port": 23040} in r["ports"]]
    assert {"protocol": "TCP", "port": 23030} in clients["ports"]
    assert clients["from"] == [{"podSelector": {"matchLabels": {"c": "1"}}}]
    config = builders.replica_config(spec, peer_count=1, allow_empty_start=True)
    assert config["bus"]["curve"]["plain_networks"] == []


def test_no_plain_listeners_unless_asked_or_without_the_bus():
    curve = PLAIN["protocols"]["bus"]["curve"]
    bus_off = {"protocols": {"bus": {"enabled": False, "curve": curve}}}
    for doc in (CURVE, bus_off):
        spec = fleet(doc)
        config = builders.replica_config(spec, peer_count=1, allow_empty_start=True)
        assert "plain_port" not in config["bus"].get("curve", {})
        names = {p["name"] for p in builders.client_service(spec)["spec"]["ports"]}
        assert not {n for n in names if n.startswith("plain-")}
        policy = builders.network_policy(spec, builders.operator_peer("op", {"a": "b"}))
        assert len(policy["spec"]["ingress"]) == 3


@pytest.mark.parametrize(
    ("curve", "ports", "field", "message"),
    [
        # Each block of spec.ports, the BUS's own CURVE block included, and its edges.
        ({"plainPort": 23028}, {}, "plainPort", "port 23030 of spec.ports.bus (a block of 3"),
        ({"plainPort": 23032}, {}, "plainPort", "23032..23034 overlap port 23032 of"),
        ({"plainPort": 23011}, {}, "plainPort", "overlap port 23012 of spec.ports.eventer"),
        ({"plainPort": 23080}, {}, "plainPort", "port 23080 of spec.ports.http"),
        ({"plainPort": 25000}, {"syncer": 25002}, "plainPort", "of spec.ports.syncer"),
        ({"plainPort": 1023}, {}, "plainPort", "between 1024 and 65533, got 1023"),
        ({"plainPort": 65534}, {}, "plainPort", "between 1024 and 65533, got 65534"),
        ({"plainPort": "23040"}, {}, "plainPort", "expected"),
        ({"plainNetworks": ["10.1/16"], "plainPort": 23040}, {}, "plainNetworks[0]", "'10.1/16'"),
        ({"plainNetworks": [10], "plainPort": 23040}, {}, "plainNetworks[0]", "got 10"),
        ({"plainNetworks": ["10.0.0.0/8"]}, {}, "plainNetworks", "only with spec.protocols.bus"),
    ],
)
def test_plain_listener_errors_name_the_field_and_the_value(curve, ports, field, message):
    spec = {"protocols": {"bus": {"curve": {"enabled": True, **curve}}}, "ports": ports}
    with pytest.raises(SpecError) as e:
        fleet(spec)
    assert e.value.field == f"spec.protocols.bus.curve.{field}", e.value
    assert message in str(e.value)


def test_plain_listeners_need_curve():
    # Without CURVE the BUS ports speak PLAIN already: a second PLAIN block is a mistake.
    with pytest.raises(SpecError, match=r"23040: PLAIN listeners beside CURVE need"):
        fleet({"protocols": {"bus": {"curve": {"plainPort": 23040}}}})
    # Adjacent blocks are fine: 23033 is the first port after the CURVE block.
    assert fleet({"protocols": {"bus": {"curve": {"enabled": True, "plainPort": 23033}}}})
