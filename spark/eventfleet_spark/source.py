"""``eventfleet``: a Spark (4.0+) Python data source reading a time range of events.

Usage::

    from eventfleet_spark.source import EventerDataSource
    spark.dataSource.register(EventerDataSource)
    df = (spark.read.format("eventfleet")
          .option("eventer", "127.0.0.1:23012")         # HOST:PORT[,HOST:PORT...]
          .option("start", "2025-01-01T00:00:00Z")      # inclusive (ISO 8601 or seconds)
          .option("end", "2025-01-01T01:00:00Z")        # exclusive
          .load())

Options (all strings, as Spark passes them):

``eventer`` (required)
    one or more replica endpoints. Every replica holds every event (the Syncer keeps
    the fleet in full mesh), so partition ``i`` reads from endpoint ``i mod n``; with
    several endpoints the replicas share the read load.
``http`` (default: none)
    the replicas' HTTP endpoints (``HOST:PORT[,HOST:PORT...]``). When given, partition
    ``i`` reads its slice as an Arrow stream from ``GET /export`` of endpoint ``i mod
    n`` (`export_io`: a fraction of the replica CPU of an Eventer read), and falls back
    to Eventer when that replica has no export (404/501: an older replica). Both paths
    hand the same events in the same order to the same code, so results are identical.
``start``, ``end`` (required)
    the range of the event *timestamp* (set by the creating server), ``[start, end)``.
``partitions`` (default 4)
    how many time slices the range is cut into; one Spark partition each.
``align_seconds`` (default: none)
    slice boundaries fall on multiples of this (the job passes its bucket size).
``types``
    JSON list of event-type patterns for the Eventer query (default: all types).
``exclude``
    JSON list of type prefixes to drop (``'?'`` matches one segment).
``json_numbers`` (default false)
    add the derived columns ``payload_class``, ``json_numbers``, ``json_skipped``
    (see `schema`).
``aggregate_bucket_seconds``, ``aggregate_prefix_depth`` (default: not set)
    instead of events, emit partial aggregates per (type or type prefix, bucket,
    field), computed by the reading worker (`partial`; the aggregation job's default).
``page_size`` (default 10000, the server's default cap)
``client_name`` (default ``eventfleet-spark``), ``token`` (default ``$EVENTFLEET_TOKEN``
    on each executor), ``timeout`` seconds (default 30), ``retries`` (default 3).
``tls_ca`` (default: none, plain TCP)
    the replicas serve TLS: every Eventer and ``/export`` connection verifies the
    replica's certificate against this CA file (PEM), which must exist at that path on
    the driver and every executor. ``tls_server_name``: verify the certificate for this
    name instead of the address connected to.

Why time slices and not server ids: the Eventer ``server`` query has no time bound, so
reading one window per server id would page through that server's whole history.
``timeseries`` with ``tFrom``/``tTo`` is an index range scan on the replica, and its
``lastEventId`` paging continues from an index key instead of re-scanning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator

from eventfleet_server.common.jsonfmt import timestamp_from_iso
from eventfleet_server.common.model import timestamp_to_us
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from eventfleet_spark import timeplan
from eventfleet_spark.endpoints import Endpoint, http_endpoints, parse_endpoints
from eventfleet_spark.partial import PARTIAL_SCHEMA_DDL, PartialAggregator
from eventfleet_spark.schema import (
    EVENT_SCHEMA_DDL,
    NUMBERS_SCHEMA_DDL,
    PageConverter,
    TypeFilter,
)
from eventfleet_spark.tls import ClientTls

FORMAT = "eventfleet"

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SlicePartition(InputPartition):
    """One time slice ``[start_us, end_us)`` read from one endpoint."""

    index: int
    start_us: int
    end_us: int
    host: str
    port: int
    http_host: str | None = None
    http_port: int | None = None


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Validated source options (`from_options` names any bad value)."""

    endpoints: tuple[Endpoint, ...]
    start_us: int
    end_us: int
    partitions: int = 4
    align_us: int = 1
    types: tuple[tuple[str, ...], ...] | None = None
    exclude: tuple[tuple[str, ...], ...] = ()
    json_numbers: bool = False
    aggregate_bucket_seconds: int | None = None
    aggregate_prefix_depth: int | None = None
    page_size: int = 10_000
    client_name: str = "eventfleet-spark"
    token: str | None = None
    timeout: float = 30.0
    retries: int = 3
    http: tuple[Endpoint, ...] = ()
    tls: ClientTls | None = None

    @classmethod
    def from_options(cls, options) -> ReadOptions:
        def get(name, default=None):
            value = options.get(name)
            return default if value is None or value == "" else value

        def number(name, default, kind=int, minimum=1):
            raw = get(name)
            if raw is None:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"option {name}={raw!r} is not a number") from None
            if value < minimum:
                raise ValueError(f"option {name}={raw!r} must be >= {minimum}")
            return value

        def instant(name):
            raw = get(name)
            if raw is None:
                raise ValueError(f"option {name} is required (ISO 8601 or seconds)")
            try:
                return timestamp_to_us(timestamp_from_iso(raw))
            except ValueError as e:
                raise ValueError(f"option {name}={raw!r}: {e}") from None

        def patterns(name):
            raw = get(name)
            if raw is None:
                return None
            try:
                value = json.loads(raw)
            except ValueError:
                value = None
            if not isinstance(value, list) or not all(
                isinstance(p, list) and all(isinstance(s, str) for s in p) for p in value
            ):
                raise ValueError(f"option {name}={raw!r} is not a JSON list of string lists")
            return tuple(tuple(p) for p in value)

        eventer = get("eventer")
        if eventer is None:
            raise ValueError("option eventer is required (HOST:PORT[,HOST:PORT...])")
        start_us, end_us = instant("start"), instant("end")
        if end_us <= start_us:
            raise ValueError(f"option end={get('end')!r} is not after start={get('start')!r}")
        aggregate_bucket = number("aggregate_bucket_seconds", None)
        # Partial aggregates are only final when no bucket spans two slices.
        align = number("align_seconds", aggregate_bucket, float, 1e-6)
        tls_ca, tls_server_name = get("tls_ca"), get("tls_server_name")
        if tls_server_name is not None and tls_ca is None:
            raise ValueError(f"option tls_server_name={tls_server_name!r} needs tls_ca")
        tls = ClientTls(tls_ca, tls_server_name) if tls_ca is not None else None
        if tls is not None:
            tls.context()  # an unusable CA file is named here, on the driver
        numbers = get("json_numbers", "false").lower()
        if numbers not in ("true", "false"):
            raise ValueError(f"option json_numbers={numbers!r} must be true or false")
        return cls(
            endpoints=tuple(parse_endpoints(eventer)),
            start_us=start_us,
            end_us=end_us,
            partitions=number("partitions", 4),
            align_us=1 if align is None else round(align * timeplan.US),
            types=patterns("types"),
            exclude=patterns("exclude") or (),
            json_numbers=numbers == "true",
            aggregate_bucket_seconds=aggregate_bucket,
            aggregate_prefix_depth=number("aggregate_prefix_depth", None, int, 0),
            page_size=number("page_size", 10_000),
            client_name=get("client_name", "eventfleet-spark"),
            token=get("token"),
            timeout=number("timeout", 30.0, float, 0.001),
            retries=number("retries", 3, int, 0),
            http=http_endpoints(get("http")),
            tls=tls,
        )

    def slice_partitions(self) -> list[SlicePartition]:
        spans = timeplan.slices(
            timeplan.Span(self.start_us, self.end_us), self.partitions, self.align_us
        )
        n, m = len(self.endpoints), len(self.http)
        return [
            SlicePartition(
                i,
                s.start,
                s.end,
                self.endpoints[i % n].host,
                self.endpoints[i % n].port,
                self.http[i % m].host if m else None,
                self.http[i % m].port if m else None,
            )
            for i, s in enumerate(spans)
        ]


class EventerDataSource(DataSource):
    """Events of a time range, read over Eventer by time slice (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        if self.options.get("aggregate_bucket_seconds"):
            return PARTIAL_SCHEMA_DDL
        numbers = str(self.options.get("json_numbers") or "").lower() == "true"
        return EVENT_SCHEMA_DDL + (NUMBERS_SCHEMA_DDL if numbers else "")

    def reader(self, schema) -> DataSourceReader:
        return EventerReader(ReadOptions.from_options(self.options))


class EventerReader(DataSourceReader):
    def __init__(self, options: ReadOptions):
        self.options = options

    def partitions(self) -> list[SlicePartition]:
        return self.options.slice_partitions()

    def read(self, partition: SlicePartition) -> Iterator:
        # Runs in a Python worker on an executor: everything it needs (event loop,
        # connection) is created here, nothing is shared with the driver.
        o = self.options
        if o.aggregate_bucket_seconds is not None:
            partial = PartialAggregator(
                o.aggregate_bucket_seconds, o.aggregate_prefix_depth, TypeFilter(o.exclude)
            )
            for exported, page in self._pages(partition):
                if exported:
                    partial.add_export(page)
                else:
                    partial.add(page)
                yield from partial.finished()
            yield from partial.rest()
            return
        converter = PageConverter(TypeFilter(o.exclude), numbers=o.json_numbers)
        for exported, page in self._pages(partition):
            batch = converter.convert_export(page) if exported else converter.convert(page)
            if batch.num_rows:
                yield batch

    def _pages(self, partition: SlicePartition) -> Iterator[tuple[bool, object]]:
        """``(True, ExportPage)`` from ``/export``, or ``(False, raw events)`` over
        Eventer: the slice's events in ascending natural order either way."""
        o = self.options
        if partition.http_host is not None:
            from eventfleet_spark.export_io import ExportUnavailable, read_span_arrow

            endpoint = Endpoint(partition.http_host, partition.http_port)
            yielded = False
            try:
                for page in read_span_arrow(
                    endpoint,
                    partition.start_us,
                    partition.end_us,
                    event_types=o.types,
                    token=o.token,
                    timeout=o.timeout,
                    retries=o.retries,
                    tls=o.tls,
                ):
                    yielded = True
                    yield True, page
                return
            except ExportUnavailable as e:
                if yielded:  # the replica changed under us; a restart would duplicate
                    raise
                log.warning("%s; reading slice %d over Eventer instead", e, partition.index)
        # Imported here: the SBS codec costs ~0.3 s of CPU to import, in every Python
        # worker that loads this module (the driver's data source and planning workers
        # and, with ``http``, the readers too) although only an Eventer read needs it.
        from eventfleet_spark.eventer_io import read_span

        for events in read_span(
            Endpoint(partition.host, partition.port),
            partition.start_us,
            partition.end_us,
            event_types=o.types,
            page_size=o.page_size,
            client_name=o.client_name,
            token=o.token,
            timeout=o.timeout,
            retries=o.retries,
            tls=o.tls,
        ):
            yield False, events
