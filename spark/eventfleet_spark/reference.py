"""The aggregation in plain Python, one process: the executable definition of the result.

The Spark plan (`aggregation`) is tested against this, and the benchmark runs it as the
single-process baseline. Per (type, bucket):

* the bucket of an event is ``timestamp - timestamp mod bucket`` (server timestamp,
  epoch-aligned); its type is cut to the first `prefix_depth` segments (whole type
  when None);
* count, first and last timestamp, one count per payload class and the number of
  skipped fields (`payloads`);
* per numeric field: count, min, max, sum (added in ascending natural order of the
  events, the order a timeseries query returns, starting from 0.0) and
  mean = sum / count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from eventfleet_server.common.model import Event, EventPayloadBinary, EventPayloadJson

from eventfleet_spark.payloads import PAYLOAD_CLASSES, classify
from eventfleet_spark.record import Aggregate, FieldStats

_US = 1_000_000


class RefEvent(NamedTuple):
    """What the aggregation looks at: type, timestamp (us), payload kind and JSON text."""

    type: tuple[str, ...]
    timestamp_us: int
    kind: str  # "none" | "json" | "binary"
    text: str | None = None


def from_event(e: Event) -> RefEvent:
    ts = e.timestamp.s * _US + e.timestamp.us
    if isinstance(e.payload, EventPayloadJson):
        return RefEvent(tuple(e.type), ts, "json", e.payload.data)
    if isinstance(e.payload, EventPayloadBinary):
        return RefEvent(tuple(e.type), ts, "binary")
    return RefEvent(tuple(e.type), ts, "none")


def from_raw(events: Iterable[dict]) -> Iterator[RefEvent]:
    """From raw SBS event records (`eventer_io.read_span` pages)."""
    for e in events:
        t = e["timestamp"]
        p = e["payload"]
        ts = t["s"] * _US + t["us"]
        if p[0] != "value":
            yield RefEvent(tuple(e["type"]), ts, "none")
        elif p[1][0] == "json":
            yield RefEvent(tuple(e["type"]), ts, "json", p[1][1])
        else:
            yield RefEvent(tuple(e["type"]), ts, "binary")


class _Acc:
    __slots__ = ("classes", "count", "fields", "first", "last", "skipped")

    def __init__(self, ts: int):
        self.count = 0
        self.first = self.last = ts
        self.classes = dict.fromkeys(PAYLOAD_CLASSES, 0)
        self.skipped = 0
        self.fields: dict[str, list] = {}


def aggregate(
    events: Iterable[RefEvent], bucket_seconds: int, prefix_depth: int | None = None
) -> dict[tuple[tuple[str, ...], int], Aggregate]:
    """Aggregates keyed by ``(type, bucket start us)``; `events` in ascending natural order."""
    bucket_us = bucket_seconds * _US
    accs: dict[tuple[tuple[str, ...], int], _Acc] = {}
    for e in events:
        group = e.type if prefix_depth is None else e.type[:prefix_depth]
        key = (group, e.timestamp_us - e.timestamp_us % bucket_us)
        acc = accs.get(key)
        if acc is None:
            acc = accs[key] = _Acc(e.timestamp_us)
        acc.count += 1
        acc.first = min(acc.first, e.timestamp_us)
        acc.last = max(acc.last, e.timestamp_us)
        cls, numbers, skipped = classify(e.kind, e.text)
        acc.classes[cls] += 1
        acc.skipped += skipped
        for name, x in numbers.items():
            st = acc.fields.get(name)
            if st is None:
                acc.fields[name] = [1, x, x, 0.0 + x]
            else:
                st[0] += 1
                if x < st[1]:
                    st[1] = x
                if x > st[2]:
                    st[2] = x
                st[3] += x
    return {key: _result(key, acc, bucket_seconds) for key, acc in accs.items()}


def _result(key, acc: _Acc, bucket_seconds: int) -> Aggregate:
    return Aggregate(
        type=key[0],
        bucket_start_us=key[1],
        bucket_seconds=bucket_seconds,
        count=acc.count,
        first_us=acc.first,
        last_us=acc.last,
        numeric_payloads=acc.classes["numeric"],
        non_numeric_payloads=acc.classes["non_numeric"],
        invalid_json_payloads=acc.classes["invalid_json"],
        binary_payloads=acc.classes["binary"],
        empty_payloads=acc.classes["empty"],
        skipped_fields=acc.skipped,
        fields={
            name: FieldStats(st[0], st[1], st[2], st[3], st[3] / st[0])
            for name, st in sorted(acc.fields.items())
        },
    )
