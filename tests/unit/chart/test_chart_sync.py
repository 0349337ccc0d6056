"""The chart's copies of the CRD, the operator's RBAC and the dashboard, and the operator
package's copy of the EventServer CRD, match their sources.

The chart cannot reference files outside its own directory (a packaged chart is a
tarball of that directory), so it carries copies made by scripts/sync-chart-files.
These tests fail when someone edits a source without re-running the script.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys

import pytest
import yaml

from tests.unit.chart.chartlib import CHART, REPO

SCRIPT = REPO / "scripts" / "sync-chart-files"


def _load_script():
    loader = importlib.machinery.SourceFileLoader("sync_chart_files", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


sync = _load_script()


def test_chart_copies_are_in_sync():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_every_crd_is_in_the_chart_byte_for_byte():
    sources = sorted((REPO / "crds").glob("*.yaml"))
    assert sources, "crds/ is empty"
    for src in sources:
        copy = CHART / "files" / "crds" / src.name
        assert copy.exists(), f"{src.name} is missing from the chart"
        assert copy.read_bytes() == src.read_bytes(), f"{src.name} drifted"


def test_the_operator_package_carries_the_eventserver_crd_byte_for_byte():
    # eventfleet_operator.crd reads its spec defaults from this copy.
    src = REPO / "crds" / "eventfleet.io_eventservers.yaml"
    copy = REPO / "operator" / "eventfleet_operator" / src.name
    assert copy.read_bytes() == src.read_bytes(), f"{copy} drifted from {src}"


def test_chart_rbac_is_derived_from_the_operator_rbac():
    derived = sync.rbac_rules(REPO)
    if derived is None:
        pytest.fail("operator/deploy/ has no ClusterRole or Role: the chart has no RBAC source")
    _, text = derived
    assert (CHART / "files" / "rbac-rules.yaml").read_text() == text


def test_rules_are_split_by_scope_and_nothing_is_lost():
    rules = [
        {"apiGroups": [""], "resources": ["namespaces", "events"], "verbs": ["list"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get"],
        },
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["*"]},
        {"nonResourceURLs": ["/healthz"], "verbs": ["get"]},
    ]
    cluster, namespaced = sync.split_rules(rules)
    assert cluster == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]},
        rules[1],
        rules[3],
    ]
    assert namespaced == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
        rules[2],
    ]


def test_rendered_rbac_grants_every_operator_rule():
    """Whatever the chart binds is, rule for rule, what the operator's RBAC asks for."""
    derived = yaml.safe_load((CHART / "files" / "rbac-rules.yaml").read_text())
    granted = derived["clusterScoped"] + derived["namespaced"] + derived["ownNamespace"]
    wanted = []
    for path in sorted((REPO / "operator" / "deploy").glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("ClusterRole", "Role"):
                wanted.extend(doc.get("rules") or [])

    def atoms(rules):
        return {
            (g, r, v)
            for rule in rules
            for g in rule.get("apiGroups", [""])
            for r in rule.get("resources", rule.get("nonResourceURLs", []))
            for v in rule["verbs"]
        }

    assert atoms(granted) == atoms(wanted)


def test_dashboard_copy_matches_the_published_dashboard():
    published = REPO / "docs" / "grafana" / "eventfleet.json"
    chart_copy = CHART / "files" / "dashboard.json"
    # Until a dashboard is published under docs/, the chart's own file is the source.
    if published.exists():
        assert chart_copy.read_bytes() == published.read_bytes()


def test_dashboard_is_loadable_grafana_json():
    # Which metrics the panels query is checked against a live replica's /metrics by
    # tests/integration/test_http.py on the source file; here only what the chart's
    # ConfigMap needs: one self-contained dashboard with a stable uid.
    dash = json.loads((CHART / "files" / "dashboard.json").read_text())
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert exprs and all("eventfleet_" in e or "process_" in e for e in exprs)
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "pod"} <= variables
