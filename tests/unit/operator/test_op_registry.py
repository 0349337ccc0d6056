"""The protocol registry (`eventfleet_server.registry`) is the one list of protocols:
the replica's sections, the operator's port table and the CRD must agree with it.

The CRD is hand-written (the API), so it cannot be generated from the registry; these
tests fail when the two drift. The chart's and the operator package's CRD copies are
kept byte-equal to crds/ by scripts/sync-chart-files (tests/unit/chart/test_chart_sync.py),
so checking crds/ checks every copy.
"""

from __future__ import annotations

import importlib
import importlib.resources
import json

import op_k8s_schema as k8s_schema
import pytest
from eventfleet_operator import constants, model
from eventfleet_server import registry
from eventfleet_server.config import loader

SPEC = k8s_schema.crd_schema(k8s_schema.load_crd(), "v1")["properties"]["spec"]["properties"]
ENTRIES = [pytest.param(e, id=e.name) for e in registry.PROTOCOLS]


def section_schema(entry: registry.ProtocolEntry) -> dict:
    return json.loads((importlib.resources.files(entry.package) / "schema.json").read_text())


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_is_a_plugin_with_its_own_section(entry):
    module = importlib.import_module(entry.plugin)
    assert callable(module.create) and module.CONFIG is not None
    assert loader.SCHEMA["properties"][entry.name] == {
        k: v for k, v in section_schema(entry).items() if k != "$schema"
    }


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_sections_defaults_are_the_registrys(entry):
    props = section_schema(entry)["properties"]
    if entry.port is None:
        assert "port" not in props, f"{entry.name} has a port: say so in the registry"
    else:
        assert props["port"]["default"] == entry.port
    # An optional protocol has an `enabled` switch defaulting to the registry's value; a
    # protocol that is always served has none.
    if entry.optional:
        assert props["enabled"]["default"] is entry.enabled_by_default
    else:
        assert "enabled" not in props


def test_the_crd_ports_are_the_registrys_plus_http():
    with_ports = [e for e in registry.PROTOCOLS if e.port is not None]
    ports = SPEC["ports"]["properties"]
    assert list(ports) == [e.name for e in with_ports] + ["http"]
    for e in with_ports:
        assert ports[e.name]["default"] == e.port, e.name


def test_the_crd_switches_the_registrys_optional_protocols():
    switches = SPEC["protocols"]["properties"]
    optional = {e.name: e.enabled_by_default for e in registry.PROTOCOLS if e.optional}
    assert {name: s["properties"]["enabled"]["default"] for name, s in switches.items()} == (
        optional
    )


def test_the_operator_port_table_is_built_from_the_registry():
    table = {p.protocol: p for p in constants.PROTOCOL_PORTS}
    for e in registry.PROTOCOLS:
        if e.port is None:
            assert e.name not in table
            continue
        port = table[e.name]
        assert (port.default, port.width, port.optional) == (e.port, e.width, e.optional)
        assert [s.value for s in port.services] == list(e.services)
    assert list(table) == [e.name for e in registry.PROTOCOLS if e.port is not None] + ["http"]


def test_entry_names_a_missing_protocol():
    with pytest.raises(KeyError, match="'nope'"):
        registry.entry("nope")


def test_the_spec_model_defaults_protocol_switches_from_the_registry():
    spec = model.parse("demo", "events", {}, uid="0b8a7d5e-5c1e-4b7e-9d6f-3a2c1b0e9f8d")
    assert spec.jetstream.enabled is registry.entry("jetstream").enabled_by_default
    assert spec.replication.enabled is registry.entry("replication").enabled_by_default
    for e in registry.PROTOCOLS:
        if e.optional and e.port is not None:
            assert (e.name in spec.enabled_protocols) is e.enabled_by_default
