"""values.yaml, its documentation and values.schema.json agree; bad values are refused."""

from __future__ import annotations

import json
import re
import tomllib

import jsonschema
import pytest
import yaml

from tests.unit.chart.chartlib import CHART, EVERYTHING_ON, REPO, helm

VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.-]*):(?P<rest>.*)$")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("helm-home")


def test_schema_is_a_valid_draft7_schema():
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def _merged(base, overlay):
    """Helm's merge of a values file over the defaults (maps merge, the rest replaces)."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        return {
            k: _merged(base.get(k), overlay[k]) if k in overlay else base[k]
            for k in base.keys() | overlay.keys()
        }
    return overlay


@pytest.mark.parametrize("path", [CHART / "values.yaml", EVERYTHING_ON], ids=lambda p: p.name)
def test_values_files_meet_the_schema(path):
    values = _merged(VALUES, yaml.safe_load(path.read_text()))
    jsonschema.Draft7Validator(SCHEMA).validate(values)


def _chart_objects(schema, value, path=""):
    """Yield (path, schema, value) for every object the chart itself defines (strict ones)."""
    if schema.get("type") == "object" and schema.get("additionalProperties") is False:
        yield path, schema, value
        for key, sub in schema.get("properties", {}).items():
            if isinstance(value, dict) and key in value:
                yield from _chart_objects(sub, value[key], f"{path}.{key}")


def test_every_chart_level_object_is_strict():
    # Only Kubernetes pass-through values (affinity, securityContext, ...) may be open.
    open_keys = []

    def walk(schema, path):
        if schema.get("type") == "object" and "properties" in schema:
            if schema.get("additionalProperties") is not False:
                open_keys.append(path)
            for key, sub in schema["properties"].items():
                walk(sub, f"{path}.{key}")

    walk(SCHEMA, "")
    assert open_keys == []


def test_schema_and_values_yaml_list_the_same_keys():
    # A key in the schema but not in values.yaml would be undocumented; a key in
    # values.yaml but not in the schema would be rejected by the schema itself.
    missing = []
    for path, schema, value in _chart_objects(SCHEMA, VALUES):
        for key in schema["properties"]:
            if key == "global":  # Helm's own; never in a chart's values.yaml
                continue
            if not isinstance(value, dict) or key not in value:
                missing.append(f"{path}.{key}")
    assert missing == [], f"schema keys without a default in values.yaml: {missing}"


def test_every_value_is_documented_with_a_helm_docs_comment():
    """Each key has a `# --` comment, on itself or on an enclosing key.

    A parent key (an object whose children follow) may go undocumented only if each of
    its children is documented.
    """
    lines = VALUES_TEXT.splitlines()
    keys = []  # (line number, indent, key, documented)
    for i, line in enumerate(lines):
        m = _KEY.match(line)
        if not m or line.lstrip().startswith("-"):
            continue
        j = i - 1
        documented = False
        while j >= 0 and lines[j].strip().startswith("#"):
            if lines[j].strip().startswith("# --"):
                documented = True
            j -= 1
        keys.append((i, len(m["indent"]), m["key"], documented, m["rest"].strip()))
    undocumented = []
    stack: list[tuple[int, bool]] = []  # (indent, covered) of enclosing keys
    for n, (_, indent, key, documented, rest) in enumerate(keys):
        while stack and stack[-1][0] >= indent:
            stack.pop()
        covered = documented or any(c for _, c in stack)
        following = keys[n + 1] if n + 1 < len(keys) else None
        is_parent = rest == "" and following is not None and following[1] > indent
        if not covered and not is_parent:
            undocumented.append(key)
        stack.append((indent, covered))
    assert undocumented == []


BAD_VALUES = [
    # (--set argument, text the error must contain)
    ("replicaCount=2", "/replicaCount"),
    ("crds.creat=true", "'creat' not allowed"),
    ("unknownTopLevel=1", "'unknownTopLevel' not allowed"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("image.digest=latest", "/image/digest"),
    ("operator.logLevel=loud", "/operator/logLevel"),
    ("operator.logFormat=xml", "/operator/logFormat"),
    ("operator.resyncSeconds=0", "/operator/resyncSeconds"),
    ("operator.watchNamespaces[0]=Not_A_Namespace", "/operator/watchNamespaces/0"),
    ("operator.healthPort=70000", "/operator/healthPort"),
    ("metrics.serviceMonitor.interval=soon", "/metrics/serviceMonitor/interval"),
    ("podDisruptionBudget.minAvailable=lots", "/podDisruptionBudget/minAvailable"),
    ("resources.requests.gpu[0]=1", "/resources/requests/gpu"),
    # Wrong types: the schema names the key, what it got and what it wants.
    ("replicaCount=one", "at '/replicaCount': got string, want integer"),
    ("operator.allNamespaces=yes", "at '/operator/allNamespaces': got string, want boolean"),
    ("image.tag[0]=x", "at '/image/tag': got array, want string"),
    ("commonLabels.team.name=a", "/commonLabels/team"),
    # Cross-field rules the schema cannot express are enforced by the templates.
    ("metrics.serviceMonitor.enabled=true", "needs metrics.enabled"),
    ("metrics.enabled=true,metrics.port=8080", "must differ"),
]


@pytest.mark.parametrize(("setting", "expected"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_values_are_rejected(home, setting, expected):
    proc = helm(home, "template", "ef", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    assert expected in proc.stderr, proc.stderr


def test_chart_metadata_matches_the_package_and_the_crd():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # Images are tagged with the package version, and the chart's default operator image
    # is `eventfleet/operator:<appVersion>`: the two must name the same release.
    assert chart["appVersion"] == project["version"]
    # Artifact Hub lists every CRD the chart installs, at its storage version.
    expected = []
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        (storage,) = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
        expected.append((crd["metadata"]["name"], crd["spec"]["names"]["kind"], storage))
    listed = yaml.safe_load(chart["annotations"]["artifacthub.io/crds"])
    assert sorted((c["name"], c["kind"], c["version"]) for c in listed) == sorted(expected)
    # ... and the images a release runs, at the release's version.
    images = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    assert {i["image"] for i in images} == {
        f"eventfleet/{name}:{project['version']}" for name in ("operator", "server", "spark")
    }


def test_lint_refuses_a_wrong_typed_value(home):
    # `helm lint` (what a chart CI runs) checks the values against the schema as well.
    proc = helm(home, "lint", str(CHART), "--set", "replicaCount=one", check=False)
    assert proc.returncode != 0
    assert "at '/replicaCount': got string, want integer" in proc.stdout + proc.stderr
