"""The Event BUS benchmark harness runs end to end with tiny counts (no timing checks:
every published event must arrive, on A and on B, and the snapshot must hold them all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bus_bench_smoke(tmp_path):
    out = tmp_path / "bus.json"
    scratch = tmp_path / "scratch"  # the bench's TMPDIR: it must leave nothing there
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "e2e.bench.bus", "--quick", "--rate", "500", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        env=dict(os.environ, TMPDIR=str(scratch)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not list(scratch.iterdir()), "the bench left its scratch behind"
    r = json.loads(out.read_text())
    assert r["throughput"]["received"] == r["throughput"]["events"] == 2_000
    expected = int(500 * 2.0)  # every published event, on A and on B
    assert r["latency"]["local_received"] == r["latency"]["cross_received"] == expected
    assert r["snapshot"]["events"] == r["snapshot"]["head"] >= 5_000
    # What the load itself cost the shared cores is reported beside the servers' CPU.
    fleet_throughput = r["runs"]["fleet"][-1]["throughput"]
    assert 0 < fleet_throughput["clients_cpu_us_per_event"] < 1e6
    assert 0 < r["snapshot"]["cpu_s"] < 60


def test_bus_bench_refuses_a_plot_it_cannot_draw_before_measuring(tmp_path):
    """Without matplotlib, `--plot` is an argument error up front, not a traceback after
    minutes of measuring (find_spec is made to miss the installed matplotlib)."""
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'matplotlib' else real(n, *a)\n"
        "from e2e.bench import bus\n"
        "sys.exit(bus.main(['--plot', sys.argv[1]]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "sweep.png")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "matplotlib is not installed" in result.stderr
    assert "Traceback" not in result.stderr
    assert "-- run 1" not in result.stderr + result.stdout  # nothing was measured
