"""One aggregate (event type or type prefix, time bucket) and its write-back form.

Both the Spark plan (`aggregation`) and the plain-Python definition (`reference`)
produce `Aggregate` values, so they compare with ``==``; the write-back payload is
`Aggregate.payload_json`, a canonical JSON text (sorted keys, no spaces, shortest
round-trip floats), so equal aggregates have byte-equal payloads.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from eventfleet_server.common.jsonfmt import timestamp_to_iso
from eventfleet_server.common.model import timestamp_from_us


@dataclasses.dataclass(frozen=True)
class FieldStats:
    count: int
    min: float
    max: float
    sum: float
    mean: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Aggregate:
    """Statistics of the events of `type` (or of every type under it) in one bucket."""

    type: tuple[str, ...]
    bucket_start_us: int
    bucket_seconds: int
    count: int
    first_us: int
    last_us: int
    numeric_payloads: int = 0
    non_numeric_payloads: int = 0
    invalid_json_payloads: int = 0
    binary_payloads: int = 0
    empty_payloads: int = 0
    skipped_fields: int = 0
    fields: Mapping[str, FieldStats] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> tuple[tuple[str, ...], int]:
        return (self.type, self.bucket_start_us)

    def payload(self) -> dict:
        return {
            "type": list(self.type),
            "bucket_start": _iso(self.bucket_start_us),
            "bucket_seconds": self.bucket_seconds,
            "count": self.count,
            "first_timestamp": _iso(self.first_us),
            "last_timestamp": _iso(self.last_us),
            "payloads": {
                "numeric": self.numeric_payloads,
                "non_numeric": self.non_numeric_payloads,
                "invalid_json": self.invalid_json_payloads,
                "binary": self.binary_payloads,
                "empty": self.empty_payloads,
            },
            "skipped_fields": self.skipped_fields,
            "fields": {name: self.fields[name].to_json() for name in sorted(self.fields)},
        }

    def payload_json(self) -> str:
        """Canonical JSON text: equal aggregates give byte-equal text (idempotency)."""
        return json.dumps(self.payload(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_parquet_row(cls, row: Mapping[str, Any]) -> Aggregate:
        """The aggregate of one row of the job's Parquet output, as pyarrow reads it
        (``to_pylist``: timestamps as aware datetimes, ``fields`` as (name, stats) pairs)."""
        return cls(
            type=tuple(row["type"]),
            bucket_start_us=_datetime_to_us(row["bucket_start"]),
            bucket_seconds=int(row["bucket_seconds"]),
            first_us=_datetime_to_us(row["first_timestamp"]),
            last_us=_datetime_to_us(row["last_timestamp"]),
            fields={name: FieldStats(**stats) for name, stats in sorted(row["fields"] or [])},
            **{name: row[name] for name in COUNT_COLUMNS},
        )


COUNT_COLUMNS = (
    "count",
    "numeric_payloads",
    "non_numeric_payloads",
    "invalid_json_payloads",
    "binary_payloads",
    "empty_payloads",
    "skipped_fields",
)
"""The integer counters an aggregate row carries under the same name in every form
(the Spark result rows, the Parquet rows and `Aggregate`)."""

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _datetime_to_us(value: datetime.datetime) -> int:
    return (value - _EPOCH) // datetime.timedelta(microseconds=1)


def _iso(us: int) -> str:
    return timestamp_to_iso(timestamp_from_us(us))


def expand_prefix(prefix: Sequence[str], bucket_seconds: int) -> tuple[str, ...]:
    """The write-back prefix with ``{bucket}`` replaced by the bucket size in seconds."""
    return tuple(s.replace("{bucket}", str(bucket_seconds)) for s in prefix)


def exclusion_prefix(prefix: Sequence[str]) -> tuple[str, ...]:
    """The prefix as a read filter: a ``{bucket}`` segment matches any bucket size, so no
    run aggregates any run's output."""
    return tuple("?" if "{bucket}" in s else s for s in prefix)
