"""docs/eventserver-reference.md is generated from the CRD and must not be stale."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.unit.chart.chartlib import REPO

SCRIPT = REPO / "scripts" / "gen-crd-docs"
REFERENCE = REPO / "docs" / "eventserver-reference.md"


def test_reference_is_generated_from_the_current_crd():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def _fields(node, path=""):
    for name, child in node.get("properties", {}).items():
        yield f"{path}.{name}" if path else name, name
        yield from _fields(child, f"{path}.{name}" if path else name)
    if "items" in node:
        yield from _fields(node["items"], f"{path}[]")


def test_reference_names_every_field_of_the_schema():
    crd = yaml.safe_load((REPO / "crds" / "eventfleet.io_eventservers.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    text = REFERENCE.read_text()
    schema = version["schema"]["openAPIV3Schema"]
    for top in ("spec", "status"):
        for path, name in _fields(schema["properties"][top], top):
            assert f"`{name}`" in text, f"{path} is missing from the reference"
