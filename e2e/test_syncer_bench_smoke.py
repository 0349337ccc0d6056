"""The replication benchmark harness runs end to end with tiny counts (no timing checks)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_replication_bench_smoke(tmp_path):
    out = tmp_path / "r.json"
    scratch = tmp_path / "scratch"  # the bench's TMPDIR: it must leave nothing there
    scratch.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "e2e.bench.replication",
            "--seconds",
            "1.5",
            "--rate",
            "500",
            "--catchup",
            "2000",
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
    assert doc["lag"]["lost"] == 0 and doc["lag"]["measured"] > 0
    assert doc["catchup"]["received_during_catchup"] >= 2000
    assert "| lag p50" in result.stdout
