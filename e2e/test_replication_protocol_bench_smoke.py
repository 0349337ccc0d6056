"""The Replication protocol benchmark harness runs end to end with tiny counts (no
timing checks): every figure is produced and every row arrives."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_replication_protocol_bench_smoke(tmp_path):
    out = tmp_path / "r.json"
    scratch = tmp_path / "scratch"  # the bench's TMPDIR: it must leave nothing there
    scratch.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "e2e.bench.replication_protocol",
            "--rows",
            "2000",
            "--changes",
            "100",
            "--live",
            "50",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, TMPDIR=str(scratch)),
        stdin=subprocess.DEVNULL,
        cwd=pathlib.Path(__file__).resolve().parents[1],  # `-m e2e...` from the repo root
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not list(scratch.iterdir()), "the bench left its scratch behind"
    doc = json.loads(out.read_text())
    assert doc["incremental_client_rows"] == 100
    assert doc["live_other_replica"]["samples"] == 50
    assert doc["pass_pipelined_rows_per_s"] > 0 and doc["pass_replicator_rows_per_s"] > 0
