"""A window read and folded by the driver process itself (``--read-in driver``).

The source's executor path pays fixed costs before the first event is folded: Spark's
lookup of installed Python data sources, planning in Python planner processes, and cold
Python workers for the first tasks. Measured on a cold job of 1M events (2 cores,
docs/performance.md run AA) that was ~8 s of 24. When the executors are threads of the
driver's own machine (a ``local[N]`` master) they add no CPU the driver does not have,
so the driver reads the window here instead, with the same reader code, slice by slice:
the source's `EventerReader` (failover to Eventer, TLS, token, exclusion) yields the same
partial rows in the same order.

The partial rows are then merged here too (`combine`), not by Spark: every (type, bucket)
comes from one slice and one fold, so its partial rows are already final and merging
them only regroups a header row and its field rows. Spark's two-level aggregation of a
few thousand rows cost ~5 s of a cold run (codegen and two shuffles in a fresh JVM);
this costs milliseconds and gives the same values bit for bit (the tests compare the
Parquet bytes of both paths). Spark still writes the Parquet (`parquet_output`).

Memory stays bounded by the partial rows, not the events: each slice is folded page by
page (`partial.PartialAggregator`) and only finished (type, bucket, field) rows are kept.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from eventfleet_spark.partial import PARTIAL_ARROW_SCHEMA
from eventfleet_spark.payloads import PAYLOAD_CLASSES
from eventfleet_spark.record import Aggregate, FieldStats
from eventfleet_spark.source import EventerReader, ReadOptions, SlicePartition

Progress = Callable[[str], None]


def _stderr(line: str) -> None:
    print(f"eventfleet aggregate: {line}", file=sys.stderr, flush=True)


def read_partials(
    source_options: Mapping[str, str], progress: Progress | None = _stderr
) -> pa.Table:
    """The partial aggregates of one window (`partial.PARTIAL_ARROW_SCHEMA`).

    `source_options` are the ``eventfleet`` source's options (with
    ``aggregate_bucket_seconds``); a bad one raises `ValueError` naming it, as the source
    would. `progress` gets one line per slice read.
    """
    options = ReadOptions.from_options(source_options)
    if options.aggregate_bucket_seconds is None:
        raise ValueError("read_partials needs the option aggregate_bucket_seconds")
    reader = EventerReader(options)
    slices = reader.partitions()
    batches: list[pa.RecordBatch] = []
    for partition in slices:
        t0 = time.perf_counter()
        first = len(batches)
        batches.extend(reader.read(partition))
        if progress is not None:
            events = _events(batches[first:])
            progress(
                f"read slice {partition.index + 1}/{len(slices)} from {_source(partition)}:"
                f" {events:,} events in {time.perf_counter() - t0:.1f} s"
            )
    return pa.Table.from_batches(batches, schema=PARTIAL_ARROW_SCHEMA)


def _events(batches: list[pa.RecordBatch]) -> int:
    """Events folded into `batches`: the counts of their header rows (field NULL)."""
    return sum(pc.sum(pc.filter(b["n"], pc.is_null(b["field"]))).as_py() or 0 for b in batches)


def _source(partition: SlicePartition) -> str:
    if partition.http_host is not None:
        return f"http://{partition.http_host}:{partition.http_port}/export"
    return f"eventer {partition.host}:{partition.port}"


def combine(partials: pa.Table, bucket_seconds: int) -> list[Aggregate]:
    """One `Aggregate` per (type, bucket) of `read_partials` rows, as
    `aggregation.combine` computes it (sorted by key).

    A (type, bucket, field) seen twice means the slices were not bucket-aligned or a
    read was out of order; Spark's merge would add the two, here it is an error: the
    result would no longer be the one the rules define, bit for bit.
    """
    headers: dict[tuple, dict] = {}
    fields: dict[tuple, dict[str, FieldStats]] = {}
    for row in partials.to_pylist():
        key = (tuple(row["type"]), row["bucket_us"])
        name = row["field"]
        if name is None:
            if key in headers:
                raise ValueError(f"partial header of {key} read twice")
            headers[key] = row
            continue
        stats = fields.setdefault(key, {})
        if name in stats:
            raise ValueError(f"partial field {name!r} of {key} read twice")
        n, total = row["n"], row["vsum"]
        stats[name] = FieldStats(n, row["vmin"], row["vmax"], total, total / n)
    missing = fields.keys() - headers.keys()
    if missing:
        raise ValueError(f"partial fields without a header row: {sorted(missing)[:3]}")
    return [
        Aggregate(
            type=key[0],
            bucket_start_us=key[1],
            bucket_seconds=bucket_seconds,
            count=h["n"],
            first_us=h["first_us"],
            last_us=h["last_us"],
            skipped_fields=h["skipped_fields"] or 0,
            # Sorted by name, as Spark's array_sort orders the map's UTF-8 keys.
            fields=dict(sorted(fields.get(key, {}).items())),
            **{f"{name}_payloads": h[f"{name}_payloads"] for name in PAYLOAD_CLASSES},
        )
        for key, h in sorted(headers.items())
    ]
