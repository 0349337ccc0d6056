"""The Jetstream benchmark harness runs end to end against both servers with small counts
(no timing checks: the figures belong in docs/performance.md)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_jetstream_bench_smoke(tmp_path):
    out = tmp_path / "j.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "e2e.bench.jetstream",
            "--quick",
            "--repeat",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        cwd=pathlib.Path(__file__).resolve().parents[1],  # `-m e2e...` from the repo root
    )
    assert result.returncode == 0, result.stderr[-3000:]
    medians = json.loads(out.read_text())["medians"]
    for server in ("eventfleet", "reference"):
        row = medians[server]
        # Every fan-out reached every session, and every figure was measured.
        assert row["fanout_delivered"] == "500/500", row
        assert all(row[k] > 0 for k in ("rtt1_p50_ms", "rtt50_p50_ms", "state_p50_ms", "cpu_s"))
    assert "| ScopeState of 1,000 models, p50 (ms) |" in result.stdout
