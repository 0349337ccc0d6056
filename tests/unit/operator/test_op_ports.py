"""The protocol port table drives the parser, validation and every builder.

The last tests add a protocol by changing nothing but the table (the Event BUS entry
switched to implemented) and check that it reaches the container, the right Service
and the replica config, valid for Kubernetes 1.33.
"""

from __future__ import annotations

import dataclasses

import kubernetes_validate
import op_k8s_schema as k8s_schema
import pytest
from eventfleet_operator import builders, constants, model
from eventfleet_operator.constants import PROTOCOL_PORTS, ProtocolPort, Service

SPEC_SCHEMA = k8s_schema.crd_schema(k8s_schema.load_crd(), "v1")["properties"]["spec"]


def fleet(spec):
    return model.parse("demo", "events", spec, uid="0b8a7d5e-5c1e-4b7e-9d6f-3a2c1b0e9f8d")


def test_crd_ports_match_the_table():
    # The CRD is the API; a table entry without its spec.ports key (or with another
    # default or range) would be a port nobody can configure.
    props = SPEC_SCHEMA["properties"]["ports"]["properties"]
    assert set(props) == {e.protocol for e in PROTOCOL_PORTS}
    for entry in PROTOCOL_PORTS:
        prop = props[entry.protocol]
        assert (prop["default"], prop["minimum"], prop["maximum"]) == (
            entry.default,
            constants.MIN_PORT,
            entry.max_base,
        ), entry.protocol


def test_crd_has_a_switch_for_every_optional_protocol():
    protocols = SPEC_SCHEMA["properties"]["protocols"]["properties"]
    for entry in PROTOCOL_PORTS:
        if entry.optional:
            assert protocols[entry.protocol]["properties"]["enabled"]["type"] == "boolean"


def test_port_names_are_unique_and_short():
    names = [n for e in PROTOCOL_PORTS for n in e.names]
    assert len(names) == len(set(names))
    assert all(len(n) <= 15 for n in names)  # IANA_SVC_NAME
    with pytest.raises(ValueError, match="port name 'a-very-long-port-name'"):
        ProtocolPort("x", "a-very-long-port-name", 30000)
    with pytest.raises(ValueError, match="2 port names for width 3"):
        ProtocolPort("x", "x", 30000, width=3, port_names=("a", "b"))


def test_defaults_come_from_the_table():
    spec = fleet({})
    for entry in PROTOCOL_PORTS:
        assert spec.ports[entry.protocol] == entry.default
        assert getattr(spec.ports, entry.protocol) == entry.default
    with pytest.raises(KeyError, match="nope"):
        spec.ports["nope"]


def test_a_block_reserves_every_port_even_disabled():
    # bus is 23030..23032 and off: eventer on 23032 still collides.
    with pytest.raises(model.SpecError) as err:
        fleet({"ports": {"eventer": 23032}})
    assert err.value.field == "spec.ports.bus"
    assert "spec.ports.bus is a block of 3 ports" in err.value.message
    with pytest.raises(model.SpecError, match=r"port 23013 collides with spec\.ports\.syncer"):
        fleet({"ports": {"http": 23013}})
    fleet({"ports": {"eventer": 23033}})  # just past the block


def test_block_must_fit_below_65536():
    with pytest.raises(model.SpecError, match=r"between 1024 and 65533, got 65534"):
        fleet({"ports": {"bus": 65534}})


def _ports(doc):
    return [(p["name"], p.get("port", p.get("containerPort"))) for p in doc["spec"]["ports"]]


def test_services_and_container_follow_the_table():
    spec = fleet({"ports": {"eventer": 24012, "http": 24080}})
    bus = [("bus-snapshot", 23030), ("bus-publisher", 23031), ("bus-collector", 23032)]
    assert _ports(builders.client_service(spec)) == [("eventer", 24012), *bus, ("http", 24080)]
    assert _ports(builders.peer_service(spec)) == [("syncer", 23013), ("http", 24080)]
    sts = builders.statefulset(spec, replicas=3, config_hash="x")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [
        ("eventer", 24012),
        ("syncer", 23013),
        *bus,
        ("http", 24080),
    ]


@pytest.fixture
def bus_unimplemented(monkeypatch):
    """The table with the Event BUS marked unimplemented: the path a future optional
    protocol takes before it lands (one entry changed, nothing else)."""
    table = tuple(
        dataclasses.replace(e, implemented=False, enabled_by_default=False)
        if e.protocol == "bus"
        else e
        for e in PROTOCOL_PORTS
    )
    monkeypatch.setattr(constants, "PROTOCOL_PORTS", table)


@pytest.mark.usefixtures("bus_unimplemented")
def test_unimplemented_protocol_is_reported_and_not_rendered():
    spec = fleet({"protocols": {"bus": {"enabled": True}}})
    assert spec.not_implemented == ("spec.protocols.bus.enabled",)
    assert spec.enabled_protocols == ()
    assert all(e.protocol != "bus" for e, _, _ in spec.served_ports())
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=False)
    assert config["bus"] == {"port": 23030, "enabled": False}


def test_enabling_a_table_protocol_renders_it_everywhere():
    spec = fleet({"protocols": {"bus": {"enabled": True}}, "ports": {"bus": 25000}})
    assert spec.not_implemented == ()
    assert spec.enabled_protocols == ("bus",)
    bus = [("bus-snapshot", 25000), ("bus-publisher", 25001), ("bus-collector", 25002)]
    assert _ports(builders.client_service(spec)) == [("eventer", 23012), *bus, ("http", 23080)]
    assert _ports(builders.peer_service(spec)) == [("syncer", 23013), ("http", 23080)]
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=False)
    assert config["bus"] == {"port": 25000, "enabled": True}
    digest = builders.config_hash(spec, config)
    sts = builders.statefulset(spec, replicas=3, config_hash=digest)
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]][1:4] == [
        ("syncer", 23013),
        *bus[:2],
    ]
    for doc in (builders.client_service(spec), builders.peer_service(spec), sts):
        kubernetes_validate.validate(doc, "1.33.0", strict=True)
    # Enabling it changes the config hash (a restart is needed to open the ports).
    off = fleet({"ports": {"bus": 25000}, "protocols": {"bus": {"enabled": False}}})
    off_config = builders.replica_config(off, peer_count=3, allow_empty_start=False)
    assert builders.config_hash(off, off_config) != digest


def test_disabled_table_protocol_is_not_served():
    spec = fleet({"protocols": {"bus": {"enabled": False}}})
    assert Service.CLIENT in constants.protocol_port("bus").services
    assert [n for _, n, _ in spec.served_ports(Service.CLIENT)] == ["eventer", "http"]
