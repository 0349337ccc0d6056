"""The chart's alerting rules: valid for Prometheus, each alert tested, wired into the chart."""

from __future__ import annotations

import subprocess

import yaml

from tests.unit.chart.chartlib import CHART, EVERYTHING_ON, REPO, one, render, tool

ALERTS = CHART / "files" / "alerts.yaml"
ALERTS_TEST = REPO / "tests" / "unit" / "chart" / "alerts_test.yaml"


def promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def _alert_names(groups) -> list[str]:
    return [r["alert"] for g in groups for r in g["rules"]]


def test_rules_file_passes_promtool_check():
    proc = promtool("check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_fires_when_it_should_and_only_then():
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    tested = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == set(_alert_names(groups)), "every alert needs a firing test case"
    proc = promtool("test", "rules", ALERTS_TEST.name, cwd=ALERTS_TEST.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rendered_prometheus_rule_applies_labels_and_exclusions(tmp_path):
    values = yaml.safe_load(EVERYTHING_ON.read_text())["alerts"]
    rule = one(render(tmp_path, EVERYTHING_ON), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert values["labels"].items() <= rule["metadata"]["labels"].items()
    source = yaml.safe_load(ALERTS.read_text())["groups"]
    rendered = rule["spec"]["groups"]
    expected = [n for n in _alert_names(source) if n not in values["exclude"]]
    assert _alert_names(rendered) == expected
    for r in (r for g in rendered for r in g["rules"]):
        assert values["alertLabels"].items() <= r["labels"].items()
    # What Prometheus will load is still a valid rule file.
    rules_file = tmp_path / "rendered.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rendered}))
    proc = promtool("check", "rules", str(rules_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alerts_are_off_by_default(tmp_path):
    assert not [d for d in render(tmp_path) if d["kind"] == "PrometheusRule"]


def test_runbook_covers_every_alert():
    runbook = (REPO / "docs" / "runbook.md").read_text()
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    missing = [n for n in _alert_names(groups) if f"`{n}`" not in runbook]
    assert missing == [], f"docs/runbook.md does not explain {missing}"
