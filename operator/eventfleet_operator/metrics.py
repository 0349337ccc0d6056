"""The operator's own Prometheus metrics (``--metrics URL`` / ``EVENTFLEET_OPERATOR_METRICS``).

Served by an aiohttp app inside the operator's event loop. Labels are bounded: the
per-fleet gauges carry only ``namespace`` and ``name`` and are removed with the fleet.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

import aiohttp.web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from eventfleet_operator.constants import ConditionStatus, ConditionType

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "eventfleet_operator_reconciles_total",
    "Reconciliation passes over EventServers, by outcome (ok, invalid_spec, apply_failed, error).",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "eventfleet_operator_reconcile_duration_seconds",
    "Duration of one reconciliation pass (including the replicas' /status and /flush calls).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
CHILD_WRITES = Counter(
    "eventfleet_operator_child_writes_total",
    "Children created, updated (drift or spec change) or deleted, by kind.",
    ["kind", "action"],
    registry=REGISTRY,
)
DESIRED = Gauge(
    "eventfleet_operator_fleet_desired_replicas",
    "spec.replicas of each EventServer.",
    ["namespace", "name"],
    registry=REGISTRY,
)
READY = Gauge(
    "eventfleet_operator_fleet_ready_replicas",
    "Ready replicas of each EventServer.",
    ["namespace", "name"],
    registry=REGISTRY,
)
HELD = Gauge(
    "eventfleet_operator_scale_down_held",
    "1 while a scale-down of the EventServer waits for events to be replicated.",
    ["namespace", "name"],
    registry=REGISTRY,
)
CONDITION = Gauge(
    "eventfleet_operator_fleet_condition",
    "1 if the condition of the EventServer is True, 0 if False, -1 if Unknown.",
    ["namespace", "name", "condition"],
    registry=REGISTRY,
)

_FLEET_GAUGES = (DESIRED, READY, HELD)
CONDITION_VALUES = {ConditionStatus.TRUE: 1, ConditionStatus.FALSE: 0, ConditionStatus.UNKNOWN: -1}


def observe_status(namespace: str, name: str, desired: int, status: Mapping[str, Any]) -> None:
    DESIRED.labels(namespace, name).set(desired)
    READY.labels(namespace, name).set(int(status.get("readyReplicas") or 0))
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    held = conditions.get(ConditionType.SCALE_DOWN_HELD) == ConditionStatus.TRUE
    HELD.labels(namespace, name).set(1 if held else 0)
    for type_, value in conditions.items():
        CONDITION.labels(namespace, name, type_).set(CONDITION_VALUES.get(value, -1))


def forget(namespace: str, name: str) -> None:
    """Drop a deleted fleet's series (bounded cardinality over time)."""
    for gauge in _FLEET_GAUGES:
        try:
            gauge.remove(namespace, name)
        except KeyError:
            pass
    for type_ in ConditionType:
        try:
            CONDITION.remove(namespace, name, type_.value)
        except KeyError:
            pass


def render() -> bytes:
    return generate_latest(REGISTRY)


async def serve(url: str) -> aiohttp.web.AppRunner:
    """Serve the metrics at ``url`` (``http://HOST:PORT/PATH``); returns the runner to clean up."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "http" or not parsed.port:
        raise ValueError(f"--metrics {url!r}: expected http://HOST:PORT/PATH")
    path = parsed.path or "/metrics"

    async def handle(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = aiohttp.web.Application()
    app.router.add_get(path, handle)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, parsed.hostname or "0.0.0.0", parsed.port).start()
    return runner
