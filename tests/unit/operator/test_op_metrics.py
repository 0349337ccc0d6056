"""The operator's metrics: bounded series, removed with the fleet, served over HTTP."""

from __future__ import annotations

import shutil
import socket
import subprocess

import aiohttp
import pytest
from eventfleet_operator import metrics

from tests import parts


def sample(metric: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(metric, labels)


def status(ready: int, held: str) -> dict:
    return {
        "readyReplicas": ready,
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "ScaleDownHeld", "status": held},
            {"type": "PeersSynced", "status": "Unknown"},
        ],
    }


def test_fleet_series_follow_the_status_and_go_away_with_the_fleet():
    metrics.observe_status("ns", "m1", 3, status(2, "True"))
    assert sample("eventfleet_operator_fleet_desired_replicas", namespace="ns", name="m1") == 3
    assert sample("eventfleet_operator_fleet_ready_replicas", namespace="ns", name="m1") == 2
    assert sample("eventfleet_operator_scale_down_held", namespace="ns", name="m1") == 1
    peers = sample(
        "eventfleet_operator_fleet_condition", namespace="ns", name="m1", condition="PeersSynced"
    )
    assert peers == -1
    metrics.forget("ns", "m1")
    assert sample("eventfleet_operator_fleet_ready_replicas", namespace="ns", name="m1") is None
    assert (
        sample("eventfleet_operator_fleet_condition", namespace="ns", name="m1", condition="Ready")
        is None
    )


async def test_served_over_http():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics.RECONCILES.labels("ok").inc()
    runner = await metrics.serve(f"http://127.0.0.1:{port}/metrics")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                assert response.status == 200
                text = await response.text()
    finally:
        await runner.cleanup()
    assert 'eventfleet_operator_reconciles_total{result="ok"}' in text


def test_exposition_is_promtool_clean():
    promtool = shutil.which("promtool")
    if promtool is None:
        parts.skip_missing("prometheus", "no promtool", "run scripts/tools/prometheus.sh")
    metrics.RECONCILES.labels("ok").inc()
    metrics.CHILD_WRITES.labels("StatefulSet", "created").inc()
    metrics.RECONCILE_SECONDS.observe(0.2)
    metrics.observe_status("ns", "lint", 3, status(3, "False"))
    try:
        text = metrics.render().decode()
        check = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        metrics.forget("ns", "lint")


async def test_bad_endpoint_is_named():
    with pytest.raises(ValueError, match="--metrics"):
        await metrics.serve("tcp://0.0.0.0")
