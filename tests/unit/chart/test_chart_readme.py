"""The chart README's parameters table is generated from values.yaml and up to date."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import yaml

from tests.unit.chart.chartlib import CHART, REPO

SCRIPT = REPO / "scripts" / "gen-chart-readme"


def test_parameters_table_is_up_to_date():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def _rows():
    readme = (CHART / "README.md").read_text()
    table = readme.split("<!-- parameters:start -->")[1].split("<!-- parameters:end -->")[0]
    return [
        [c.strip() for c in line.strip().strip("|").split(" | ")]
        for line in table.splitlines()
        if line.startswith("| `")
    ]


def _leaves(schema, values, path=""):
    """Every value's key: a schema object with properties is expanded, anything else a leaf."""
    for key, sub in schema.get("properties", {}).items():
        if key == "global":
            continue
        full = f"{path}.{key}" if path else key
        if sub.get("type") == "object" and "properties" in sub:
            yield from _leaves(sub, values[key], full)
        else:
            yield full


def test_every_value_has_a_row_with_its_default_and_type():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    rows = {r[0].strip("`"): r for r in _rows()}
    for key in _leaves(schema, values):
        # A row for the key itself or for the documented object holding it.
        owner = next((k for k in rows if key == k or key.startswith(k + ".")), None)
        assert owner is not None, f"{key} has no row in the chart README"
    for key, (_, kind, default, description) in rows.items():
        value = values
        for part in key.split("."):
            value = value[part]
        assert json.loads(default.strip("`").replace("\\|", "|")) == value, key
        assert kind and description, key


def test_the_readme_names_the_charts_own_version():
    """The packaged chart's name and tags in the README follow Chart.yaml's version
    (gen-chart-readme writes them; a bump without a regenerated README fails here)."""
    readme = (CHART / "README.md").read_text()
    version = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])
    archives = re.findall(r"eventfleet-operator-(\d[^\s`]*?)\.tgz", readme)
    tags = re.findall(r"oci:(\d[^\s`]*)", readme)
    assert archives and tags, "the README no longer shows the packaged chart"
    assert set(archives) == set(tags) == {version}, (archives, tags, version)
