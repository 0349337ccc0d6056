"""The memory benchmark harness runs end to end for a few seconds (no memory checks:
the figures are the benchmark's output, docs/performance.md)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_memory_bench_smoke(tmp_path):
    out = tmp_path / "m.json"
    scratch = tmp_path / "scratch"  # the bench's TMPDIR: it must leave nothing there
    scratch.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "e2e.bench.memory",
            "--seconds",
            "3",
            "--rate",
            "500",
            "--sample",
            "0.5",
            "--no-plot",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, TMPDIR=str(scratch)),
        stdin=subprocess.DEVNULL,
        cwd=pathlib.Path(__file__).resolve().parents[1],  # `-m e2e...` from the repo root
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not list(scratch.iterdir()), "the bench left its scratch behind"
    doc = json.loads(out.read_text())
    assert set(doc["servers"]) == {"eventfleet", "reference"}
    for server in doc["servers"].values():
        # Every request of the paced load was sent and answered, RSS was sampled.
        assert server["events"] >= 1000
        assert len(server["samples"]) >= 3 and server["idle_mib"] > 0
    assert "| eventfleet (NORMAL)" in result.stdout
