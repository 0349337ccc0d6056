"""What the Syncer contributes to the replica's HTTP server: ``POST /flush`` and the
per-peer metrics.

Both are handed to the HTTP server through the `ProtocolContext` (`mount_json`,
`add_metrics`) when the Syncer is created, so the HTTP layer knows nothing about the
Syncer. They read the Syncer only through `state()` and `flush_peer` (`FlushSource`),
which is also what a test stand-in implements.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from eventfleet_server.common.model import EventId
from eventfleet_server.plugin import JsonRequest

FLUSH_PATH = "/flush"
FLUSH_DEFAULT_TIMEOUT = 30.0
FLUSH_MAX_TIMEOUT = 300.0
# Flushes running at once; more are refused (429), so nobody can pile up long waits.
FLUSH_MAX_CONCURRENT = 4

# Peer states (`state()`) that mean "a connection is up".
_CONNECTED_STATES = frozenset({"connected", "syncing", "synced"})


class FlushSource(Protocol):
    """What the route and the metrics read of a Syncer."""

    def state(self) -> list[dict]: ...

    async def flush_peer(self, name: str, timeout: float) -> bool: ...


class FlushRoute:
    """``POST /flush?peer=<name>[&timeout=<s>]``: ask peer `peer` to confirm it committed
    everything this replica sent it (admin only: the peer token).

    200 once confirmed (with this replica's last ids); 400 bad arguments; 401 no admin
    token; 404 unknown peer; 429 too many flushes running; 503 the peer is not
    connected; 504 no confirmation within `timeout` seconds.
    """

    def __init__(self, syncer: FlushSource, last_ids: Callable[[], Mapping[int, EventId]]):
        self._syncer = syncer
        self._last_ids = last_ids
        self._running = 0

    async def __call__(self, request: JsonRequest) -> tuple[int, Any]:
        if not request.admin:
            return 401, _refused("POST /flush needs the peer token (Authorization: Bearer)")
        if self._running >= FLUSH_MAX_CONCURRENT:
            return 429, _refused(f"{FLUSH_MAX_CONCURRENT} flushes already running")
        self._running += 1
        try:
            return await self._flush(request.query)
        finally:
            self._running -= 1

    async def _flush(self, query: Mapping[str, str]) -> tuple[int, Any]:
        name = query.get("peer")
        if not name:
            return 400, _refused("query parameter 'peer' is required")
        try:
            timeout = float(query.get("timeout", FLUSH_DEFAULT_TIMEOUT))
        except ValueError:
            timeout = -1.0
        if not 0 < timeout <= FLUSH_MAX_TIMEOUT:
            return 400, _refused(f"timeout must be in (0, {FLUSH_MAX_TIMEOUT}]")
        syncer = self._syncer
        if name not in {p.get("name") for p in syncer.state()}:
            return 404, _refused(f"unknown peer {name!r}")
        try:
            # The syncer bounds the wait itself; the margin only guards against a syncer
            # that does not, so an HTTP request can never hang forever.
            ok = await asyncio.wait_for(syncer.flush_peer(name, timeout), timeout + 5)
        except KeyError:
            return 404, _refused(f"unknown peer {name!r}")
        except ConnectionError as e:
            return 503, _refused(f"peer {name!r} not connected: {e}")
        except TimeoutError:
            ok = False
        if not ok:
            return 504, _refused(f"peer {name!r} did not confirm within {timeout} s")
        held = self._last_ids()
        return 200, {
            "flushed": True,
            "last_ids": {
                str(server): {"server": e.server, "session": e.session, "instance": e.instance}
                for server, e in sorted(held.items())
            },
        }


def _refused(error: str) -> dict:
    return {"flushed": False, "error": error}


def peer_metrics(syncer: FlushSource) -> Iterator[Metric]:
    """The per-peer Syncer metrics of one scrape (docs/observability.md)."""
    connected = GaugeMetricFamily(
        "eventfleet_syncer_peer_connected",
        "1 while the Syncer connection to the peer is up.",
        labels=["peer"],
    )
    synced = GaugeMetricFamily(
        "eventfleet_syncer_peer_synced",
        "1 once the peer's history has been received and live events flow.",
        labels=["peer"],
    )
    lag_events = GaugeMetricFamily(
        "eventfleet_syncer_peer_lag_events",
        "Events received from the peer and not yet committed here (while synced).",
        labels=["peer"],
    )
    lag_seconds = GaugeMetricFamily(
        "eventfleet_syncer_peer_lag_seconds",
        "Replication lag behind the peer in seconds (per peer state: docs/observability.md).",
        labels=["peer"],
    )
    received = CounterMetricFamily(
        "eventfleet_syncer_events_received",
        "Events received from the peer through the Syncer.",
        labels=["peer"],
    )
    for peer in syncer.state():
        name = str(peer.get("name"))
        state = peer.get("state")
        connected.add_metric([name], 1.0 if state in _CONNECTED_STATES else 0.0)
        synced.add_metric([name], 1.0 if state == "synced" else 0.0)
        if peer.get("lag_events") is not None:
            lag_events.add_metric([name], peer["lag_events"])
        if peer.get("lag_seconds") is not None:
            lag_seconds.add_metric([name], peer["lag_seconds"])
        if peer.get("events_received") is not None:
            received.add_metric([name], peer["events_received"])
    yield from (connected, synced, lag_events, lag_seconds, received)
