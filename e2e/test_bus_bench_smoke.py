"""The Event BUS benchmark harness runs end to end with tiny counts (no timing checks:
every published event must arrive, on A and on B, and the snapshot must hold them all)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bus_bench_smoke(tmp_path):
    out = tmp_path / "bus.json"
    result = subprocess.run(
        [sys.executable, "-m", "e2e.bench.bus", "--quick", "--rate", "500", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["throughput"]["received"] == r["throughput"]["events"] == 2_000
    expected = int(500 * 2.0)  # every published event, on A and on B
    assert r["latency"]["local_received"] == r["latency"]["cross_received"] == expected
    assert r["snapshot"]["events"] == r["snapshot"]["head"] >= 5_000
