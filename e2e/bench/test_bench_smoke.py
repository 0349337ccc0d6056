"""Smoke test of the benchmark harness: `--quick` with tiny counts against eventfleet and
the reference server must produce a complete result table. No timing assertions."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from e2e.bench import report
from e2e.bench.scenarios import QUERY_NAMES
from tests import parts

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVERS = ["eventfleet", "reference"]


@pytest.mark.timeout(120)
def test_quick_bench_produces_complete_table(tmp_path: pathlib.Path) -> None:
    parts.require_module("hat-event", "hat.event.eventer")
    out_json = tmp_path / "results.json"
    out_md = tmp_path / "table.md"
    cmd = [
        sys.executable,
        "-m",
        "e2e.bench.eventer",
        "--quick",
        "--servers",
        ",".join(SERVERS),
        "--events",
        "200",
        "--latency-events",
        "20",
        "--latency-interval",
        "0",
        "--stored",
        "1000",
        "--query-reps",
        "3",
        "--query-budget",
        "0.2",
        "--no-plot",
        "--workdir",
        str(tmp_path / "work"),
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"

    res = json.loads(out_json.read_text())
    assert list(res["servers"]) == SERVERS
    scen = res["meta"]["register_scenarios"]
    assert len(scen) == 16  # batch 1/10/100/1000 x 1/4 clients x wait/16 in flight
    for key in SERVERS:
        s = res["servers"][key]
        for skey, *_ in scen:
            r = s["register"][skey]
            assert "error" not in r, (key, skey, r)
            assert r["events"] == 200 and r["events_per_s"] > 0 and r["cpu_us_per_event"] >= 0
        for persisted in ("false", "true"):
            r = s["notify"][persisted]
            assert "error" not in r, (key, persisted, r)
            assert r["samples"] == 20
        for name, _ in QUERY_NAMES:
            r = s["query"][name]
            assert "error" not in r, (key, name, r)
            # 1000 stored over 1000 types: the one-type query finds exactly one event
            assert r["returned"] == (1 if name == "ts_one_type" else 1000), (key, name, r)
        assert set(s["rss"]) == {"after_register_kib", "after_query_kib", "hwm_kib"}

    # the printed table: every section, both servers, a ratio column, no error cells
    text = proc.stdout
    for section in (
        "register throughput",
        "server CPU per event",
        "notify latency",
        "queries (ms)",
        "server memory",
    ):
        assert section in text
    assert "ef/ref" in text and "ERR" not in text
    rows = report.build_rows(res)
    assert all(isinstance(v, (int, float)) for r in rows for v in r.values.values())
    assert out_md.read_text().startswith("| metric |")
