"""Partial aggregation in the reading Python worker (the source's ``aggregate`` mode).

Measured on the benchmark (1M events, 2 cores), turning every event into an Arrow row
and aggregating in the JVM cost as much again as the read itself; the worker already
holds each decoded event, so it can fold it into its (type, bucket) group for less than
building the row costs. The source then emits one row per (type, bucket, field) --
`PARTIAL_SCHEMA_DDL`, the same rows `aggregation.partials` computes from event rows --
and Spark merges them.

Slices end on bucket boundaries, so a worker sees every event of its buckets, in
ascending natural order: its partial rows are already final, and sums are added in the
same order as in `reference` (an independent implementation of the same rules, which
the tests compare against).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from eventfleet_spark.payloads import PAYLOAD_CLASSES, classify_fast
from eventfleet_spark.schema import TypeFilter

PARTIAL_SCHEMA_DDL = (
    "type ARRAY<STRING> NOT NULL, bucket_us BIGINT NOT NULL, field STRING, n BIGINT NOT NULL,"
    " first_us BIGINT, last_us BIGINT,"
    + "".join(f" {name}_payloads BIGINT," for name in PAYLOAD_CLASSES)
    + " skipped_fields BIGINT, vmin DOUBLE, vmax DOUBLE, vsum DOUBLE"
)
"""A header row per (type, bucket) (``field`` NULL: event count, first/last, class
counts, skipped fields) and a row per numeric field (``n`` numbers, min, max, sum)."""

_I64, _F64 = pa.int64(), pa.float64()
PARTIAL_ARROW_SCHEMA = pa.schema(
    [
        pa.field("type", pa.list_(pa.string()), nullable=False),
        pa.field("bucket_us", _I64, nullable=False),
        pa.field("field", pa.string()),
        pa.field("n", _I64, nullable=False),
        pa.field("first_us", _I64),
        pa.field("last_us", _I64),
        *[pa.field(f"{name}_payloads", _I64) for name in PAYLOAD_CLASSES],
        pa.field("skipped_fields", _I64),
        pa.field("vmin", _F64),
        pa.field("vmax", _F64),
        pa.field("vsum", _F64),
    ]
)
_CLASS_INDEX = {name: i for i, name in enumerate(PAYLOAD_CLASSES)}
_EXCLUDED = object()  # the group of an excluded type
_US = 1_000_000


class _Group:
    __slots__ = ("classes", "count", "fields", "first", "last", "skipped")

    def __init__(self, ts: int):
        self.count = 0
        self.first = self.last = ts
        self.classes = [0] * len(PAYLOAD_CLASSES)
        self.skipped = 0
        self.fields: dict[str, list] = {}


class PartialAggregator:
    """Folds events into (type, bucket) groups; emits finished buckets.

    Input: pages of raw SBS event records (`add`) or Arrow export pages (`add_export`).

    Events must arrive in ascending timestamp order (a timeseries read): a bucket is
    finished, and flushed by `finished`, once an event of a later bucket was seen.
    """

    def __init__(self, bucket_seconds: int, prefix_depth: int | None, exclude: TypeFilter):
        self._bucket_us = bucket_seconds * _US
        self._depth = prefix_depth
        self._exclude = exclude if exclude else None
        self._groups: dict[tuple, _Group] = {}
        self._group_types: dict[tuple, tuple] = {}
        self._current = None  # bucket of the last event seen

    def add(self, events: list[dict]) -> None:
        """Fold a page of raw SBS event records (the Eventer read, `eventer_io`)."""
        types, stamps, kinds, texts = [], [], [], []
        for e in events:
            types.append(tuple(e["type"]))
            stamp = e["timestamp"]
            stamps.append(stamp["s"] * _US + stamp["us"])
            p = e["payload"]
            if p[0] != "value":
                kinds.append("none")
                texts.append(None)
            elif p[1][0] == "json":
                kinds.append("json")
                texts.append(p[1][1])
            else:
                kinds.append("binary")
                texts.append(None)
        self._fold(types, stamps, kinds, texts)

    def add_export(self, page) -> None:
        """Fold an `export_io.ExportPage` (the Arrow read of ``/export``)."""
        batch = page.batch
        self._fold(
            page.types,
            batch.column("timestamp").cast(pa.int64()).to_pylist(),
            batch.column("payload_kind").to_pylist(),
            batch.column("payload_json").to_pylist(),
        )

    def _fold(self, types: list, stamps: list, kinds: list, texts: list) -> None:
        # Both read paths end here with the same values in the same order, so both
        # produce the same partial rows, bit for bit. The loop runs once per event: the
        # exclusion and the group of each type are decided once per type (`_group_of`).
        bucket_us, groups, group_types = self._bucket_us, self._groups, self._group_types
        group_of, class_index = self._group_of, _CLASS_INDEX
        bucket = None
        for t, ts, kind, text in zip(types, stamps, kinds, texts, strict=True):
            g = group_types.get(t)
            if g is None:
                g = group_of(t)
            if g is _EXCLUDED:
                continue
            bucket = ts - ts % bucket_us
            acc = groups.get((g, bucket))
            if acc is None:
                acc = groups[(g, bucket)] = _Group(ts)
            acc.count += 1
            if ts < acc.first:
                acc.first = ts
            if ts > acc.last:
                acc.last = ts
            cls, numbers, skipped = classify_fast(kind, text)
            acc.classes[class_index[cls]] += 1
            if skipped:
                acc.skipped += skipped
            if numbers:
                fields = acc.fields
                for name, x in numbers.items():
                    st = fields.get(name)
                    if st is None:
                        fields[name] = [1, x, x, 0.0 + x]
                    else:
                        st[0] += 1
                        if x < st[1]:
                            st[1] = x
                        if x > st[2]:
                            st[2] = x
                        st[3] += x
        if bucket is not None:
            self._current = bucket

    def _group_of(self, event_type: tuple):
        """The group of `event_type` (itself or its prefix), or `_EXCLUDED`; cached."""
        if self._exclude is not None and not self._exclude.keeps(event_type):
            group = _EXCLUDED
        else:
            group = event_type if self._depth is None else event_type[: self._depth]
        self._group_types[event_type] = group
        return group

    def finished(self) -> Iterator[pa.RecordBatch]:
        """Batches of the groups of buckets before the current one."""
        done = [k for k in self._groups if k[1] != self._current]
        if done:
            yield self._batch(done)

    def rest(self) -> Iterator[pa.RecordBatch]:
        """Batches of every group left (the end of the partition)."""
        if self._groups:
            yield self._batch(list(self._groups))

    def _batch(self, keys: list[tuple]) -> pa.RecordBatch:
        cols: dict[str, list] = {f.name: [] for f in PARTIAL_ARROW_SCHEMA}
        empty_classes = [None] * len(PAYLOAD_CLASSES)
        for key in keys:
            acc = self._groups.pop(key)
            rows = [(None, acc.count, acc.first, acc.last, acc.classes, acc.skipped, None)]
            rows += [
                (name, st[0], None, None, empty_classes, None, st)
                for name, st in acc.fields.items()
            ]
            for field, n, first, last, classes, skipped, st in rows:
                cols["type"].append(key[0])
                cols["bucket_us"].append(key[1])
                cols["field"].append(field)
                cols["n"].append(n)
                cols["first_us"].append(first)
                cols["last_us"].append(last)
                for name, value in zip(PAYLOAD_CLASSES, classes, strict=True):
                    cols[f"{name}_payloads"].append(value)
                cols["skipped_fields"].append(skipped)
                cols["vmin"].append(st[1] if st else None)
                cols["vmax"].append(st[2] if st else None)
                cols["vsum"].append(st[3] if st else None)
        return pa.RecordBatch.from_pydict(cols, schema=PARTIAL_ARROW_SCHEMA)
