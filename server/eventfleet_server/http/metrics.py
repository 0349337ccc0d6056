"""Prometheus metrics of one replica (served as ``/metrics``).

Two kinds of metrics, on purpose:

* **Hot-path instruments** (counters and histograms) are updated from engine hooks. Each
  hook does O(1) work per call (one call per session, per commit or per query), using
  label children bound once, so registration throughput does not depend on metrics.
  Those of the register path are plain numbers rendered at scrape time (`hot`): no
  mutex per update.
* **Scrape-time figures** (connections, rejections, storage size, last ids, status) are
  read from the replica's objects by `ReplicaCollector` only when Prometheus scrapes;
  nothing on the hot path maintains them. Protocols add their own (the Syncer's per-peer
  figures) with `Metrics.add_source` (`ProtocolContext.add_metrics`).

Every replica has its own `CollectorRegistry`: tests run several replicas in one process,
and the global default registry would mix (and reject) their metrics. docs/observability.md
lists every metric.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from eventfleet_server.common.model import (
    Event,
    QueryLatestParams,
    QueryServerParams,
    QueryTimeseriesParams,
    Status,
    timestamp_to_us,
)
from eventfleet_server.http.health import initial_sync_done
from eventfleet_server.http.hot import HotCollector

_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000)
# Group commit on SQLite: sub-millisecond when idle, up to seconds on a slow disk.
_COMMIT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_LATENCY_BUCKETS = (
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
)  # fmt: skip
_LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_QUERY_KINDS = {
    QueryLatestParams: "latest",
    QueryTimeseriesParams: "timeseries",
    QueryServerParams: "server",
}


class Metrics:
    """The metrics of one replica: a private registry, engine hooks and a scrape collector.

    `replica` is read duck-typed (``engine``, ``storage``, ``protocol_states`` and the protocol
    attributes in `PROTOCOLS`, any of them possibly None or absent) because the HTTP
    layer must not import the replica's entry point or other protocols.
    """

    def __init__(self, replica: Any):
        # `_created` series double the series count for no use here (a replica's start is
        # `process_start_time_seconds`). The switch is process-wide; replica processes
        # have no other prometheus-client users.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        reg = self.registry
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)

        # The engine hooks' instruments: plain numbers rendered at scrape time (`hot`).
        hot = HotCollector()
        registered = hot.counter(
            "eventfleet_events_registered",
            "Events this replica registered: created here for a client (origin=client) "
            "or received from a peer through the Syncer (origin=peer).",
            ["origin"],
            [("client",), ("peer",)],
        )
        self._registered_client = registered[("client",)]
        self._registered_peer = registered[("peer",)]
        (self._persisted,) = hot.counter(
            "eventfleet_events_persisted",
            "Events committed to this replica's SQLite store (both origins).",
        ).values()
        (self._batch_size,) = hot.histogram(
            "eventfleet_register_batch_size",
            "Events per client register request (one request is one session).",
            _SIZE_BUCKETS,
        ).values()
        (self._commit_duration,) = hot.histogram(
            "eventfleet_commit_duration_seconds",
            "Duration of one group commit of locally created events to SQLite.",
            _COMMIT_BUCKETS,
        ).values()
        (self._commit_events,) = hot.histogram(
            "eventfleet_commit_events",
            "Events per group commit (how much the group commit batches).",
            _SIZE_BUCKETS,
        ).values()
        notify = hot.histogram(
            "eventfleet_notify_latency_seconds",
            "From an event's server timestamp until the engine hands it to subscribers; "
            "persisted=true includes waiting for the commit. Locally created events only.",
            _LATENCY_BUCKETS,
            ["persisted"],
            [("false",), ("true",)],
        )
        self._notify = {p: notify[(str(p).lower(),)] for p in (False, True)}
        reg.register(hot)
        query = Histogram(
            "eventfleet_query_duration_seconds",
            "Duration of one query by query type (latest, timeseries, server).",
            ["query"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self._query = {cls: query.labels(query=kind) for cls, kind in _QUERY_KINDS.items()}
        self.loop_lag = Histogram(
            "eventfleet_event_loop_lag_seconds",
            "How late the event loop ran a timer that was due (sampled twice a second); "
            "a blocked loop delays every protocol of the replica.",
            buckets=_LOOP_LAG_BUCKETS,
            registry=reg,
        )
        self._collector = ReplicaCollector(replica)
        reg.register(self._collector)
        self._server_id: int | None = None
        self._unsubscribe: list[Callable[[], None]] = []

    # -- hot path --------------------------------------------------------------------------

    def add_source(self, source: Callable[[], Iterable[Metric]]) -> Callable[[], None]:
        """Yield `source()`'s metric families at every scrape; returns a function that
        removes the source again."""
        sources = self._collector.sources
        sources.append(source)

        def remove() -> None:
            if source in sources:
                sources.remove(source)

        return remove

    def instrument(self, engine: Any) -> None:
        """Hook the engine: events, commits and queries. Call once, right after creating it."""
        self._server_id = engine.server_id
        self._unsubscribe += [
            engine.add_listener(self._on_events),
            engine.add_commit_listener(self._on_commit),
            engine.add_query_listener(self._on_query),
        ]

    def close(self) -> None:
        """Remove the engine hooks."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []

    def _on_events(self, events: list[Event], persisted: bool) -> None:
        # The engine calls listeners once per session: all events share one server id, so
        # the first event decides the origin (own server id = created here).
        count = len(events)
        if not count:
            return
        first = events[0]
        local = first.id.server == self._server_id
        if persisted:
            self._persisted.inc(count)
        elif local:
            self._registered_client.inc(count)
            self._batch_size.observe(count)
        else:
            self._registered_peer.inc(count)
        if local:
            # Peer events are left out: their timestamp is another replica's clock and
            # their delay is replication lag, which the syncer metrics report.
            latency = time.time() - timestamp_to_us(first.timestamp) / 1e6
            self._notify[persisted].observe(max(latency, 0.0))

    def _on_commit(self, count: int, seconds: float) -> None:
        self._commit_duration.observe(seconds)
        self._commit_events.observe(count)

    def _on_query(self, params: Any, seconds: float) -> None:
        child = self._query.get(type(params))
        if child is not None:
            child.observe(seconds)

    # -- exposition ------------------------------------------------------------------------

    async def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition in the format the scraper asked for: (body, content type)."""
        await self._collector.refresh()
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class ReplicaCollector:
    """Scrape-time figures read from the replica's objects (see the module docstring)."""

    def __init__(self, replica: Any):
        self._replica = replica
        self._storage_stats: Any = None
        # Scrape-time figures contributed by protocols (`Metrics.add_source`).
        self.sources: list[Callable[[], Iterable[Metric]]] = []

    async def refresh(self) -> None:
        """Read what needs an await (storage figures) before the synchronous `collect`."""
        storage = getattr(self._replica, "storage", None)
        self._storage_stats = await storage.stats() if storage is not None else None

    def describe(self) -> list[Metric]:
        # Nothing to check at registration; avoids a collect() before the replica exists.
        return []

    def collect(self) -> Iterator[Metric]:
        replica = self._replica
        engine = getattr(replica, "engine", None)
        yield from _status_metrics(engine, initial_sync_done(replica))
        yield from _protocol_metrics(replica)
        for source in list(self.sources):
            yield from source()
        yield from _storage_metrics(getattr(replica, "storage", None), self._storage_stats)


def _status_metrics(engine: Any, sync_done: bool) -> Iterator[Metric]:
    current = engine.status if engine is not None else Status.STARTING
    status = GaugeMetricFamily(
        "eventfleet_status",
        "The replica's engine status (1 for the current one).",
        labels=["status"],
    )
    for s in Status:
        status.add_metric([s.value], 1.0 if s == current else 0.0)
    yield status
    yield GaugeMetricFamily(
        "eventfleet_initial_sync_done",
        "1 once the initial sync with the peers is done (1 when there is no Syncer).",
        value=1.0 if sync_done else 0.0,
    )
    if engine is not None:
        yield GaugeMetricFamily(
            "eventfleet_server_id", "This replica's server id.", value=engine.server_id
        )
        failures = CounterMetricFamily(
            "eventfleet_engine_callback_failures",
            "Engine callbacks (commit, query, status, sequence, event listeners) that raised; "
            "each is logged with the callback's name and skipped.",
            labels=["kind"],
        )
        for kind, n in sorted(dict(getattr(engine, "callback_failures", None) or {}).items()):
            failures.add_metric([kind], n)
        yield failures


def _protocol_metrics(replica: Any) -> Iterator[Metric]:
    connections = GaugeMetricFamily(
        "eventfleet_connections",
        "Open client or peer connections by protocol.",
        labels=["protocol"],
    )
    rejected = CounterMetricFamily(
        "eventfleet_rejected",
        "Connections or messages refused by protocol and reason (bad token, bad frame, "
        "slow subscriber, ...).",
        labels=["protocol", "reason"],
    )
    # Every protocol the replica started (the plug-in interface), whatever its name.
    for name, proto in dict(getattr(replica, "protocols", None) or {}).items():
        connections.add_metric([name], proto.connection_count)
        for reason, n in dict(proto.rejected).items():
            rejected.add_metric([name, reason], n)
    # The HTTP port's own refusals (failed TLS handshakes).
    for reason, n in dict(getattr(getattr(replica, "http", None), "rejected", None) or {}).items():
        rejected.add_metric(["http", reason], n)
    yield connections
    yield rejected


def _storage_metrics(storage: Any, stats: Any) -> Iterator[Metric]:
    if stats is not None:
        yield GaugeMetricFamily(
            "eventfleet_storage_events", "Events in the SQLite store.", value=stats.events
        )
        yield GaugeMetricFamily(
            "eventfleet_storage_db_bytes",
            "Size of the SQLite database on disk (main file plus WAL).",
            value=stats.db_bytes,
        )
    last = GaugeMetricFamily(
        "eventfleet_last_event_instance",
        "Instance of the last event held per server id (committed here).",
        labels=["server"],
    )
    last_session = GaugeMetricFamily(
        "eventfleet_last_event_session",
        "Session of the last event held per server id (committed here).",
        labels=["server"],
    )
    for server, event_id in sorted((getattr(storage, "last_ids", None) or {}).items()):
        last.add_metric([str(server)], event_id.instance)
        last_session.add_metric([str(server)], event_id.session)
    yield last
    yield last_session
