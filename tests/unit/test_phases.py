"""The README test command's two phases select complementary halves of the suite."""

from __future__ import annotations

import types

import pytest

from tests import phases


class _Item:
    def __init__(self, name: str, *fixtures: str) -> None:
        self.name = name
        self.fixturenames = list(fixtures)


def _config(seen: list):
    hook = types.SimpleNamespace(pytest_deselected=lambda items: seen.extend(items))
    return types.SimpleNamespace(hook=hook)


def _select(monkeypatch, value: str | None, items):
    if value is None:
        monkeypatch.delenv(phases.PHASE_ENV, raising=False)
    else:
        monkeypatch.setenv(phases.PHASE_ENV, value)
    deselected: list = []
    items = list(items)
    phases.pytest_collection_modifyitems(_config(deselected), items)
    return [i.name for i in items], [i.name for i in deselected]


ITEMS = (
    _Item("unit", "tmp_path"),
    _Item("on-cluster", "real_cluster", "tmp_path"),
    _Item("e2e-local", "replica"),
    _Item("helm", "operator_release", "real_cluster"),
)


def test_phases_split_the_suite_into_complementary_halves(monkeypatch):
    local, local_dropped = _select(monkeypatch, "local", ITEMS)
    cluster, cluster_dropped = _select(monkeypatch, "cluster", ITEMS)
    assert local == ["unit", "e2e-local"] == cluster_dropped
    assert cluster == ["on-cluster", "helm"] == local_dropped


def test_no_phase_runs_everything(monkeypatch):
    kept, dropped = _select(monkeypatch, None, ITEMS)
    assert kept == [i.name for i in ITEMS] and dropped == []


def test_a_misspelt_phase_stops_the_run(monkeypatch):
    with pytest.raises(pytest.UsageError, match="'clsuter': not a phase"):
        _select(monkeypatch, "clsuter", ITEMS)
