"""The event schema of the Spark source; Eventer pages and ``/export`` pages as its rows.

One row per event:

=====================  ==================  ==============================================
column                 type                meaning
=====================  ==================  ==============================================
server                 bigint              event id: server id
session                bigint              event id: session
instance               bigint              event id: instance
type                   array<string>       event type segments
type_key               string              segments joined with ``/`` (the CLI's form)
timestamp              timestamp           set by the creating server (UTC, microseconds)
source_timestamp       timestamp           set by the client, or null
payload_kind           string              ``none``, ``json`` or ``binary``
payload_json           string              JSON payload text as stored (may be invalid)
payload_binary_type    string              binary payload type name
payload_binary         binary              binary payload bytes
=====================  ==================  ==============================================

With the source option ``json_numbers=true``, three derived columns follow (rules:
`payloads`), computed in the same Python worker that decodes the page:

=====================  ==================  ==============================================
payload_class          string              ``numeric``, ``non_numeric``, ``invalid_json``,
                                           ``binary`` or ``empty``
json_numbers           map<string,double>  usable numbers by field (``$``: the payload)
json_skipped           int                 skipped top-level fields of a JSON object
=====================  ==================  ==============================================
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from eventfleet_spark.payloads import classify_fast

EVENT_SCHEMA_DDL = (
    "server BIGINT NOT NULL, session BIGINT NOT NULL, instance BIGINT NOT NULL,"
    " type ARRAY<STRING> NOT NULL, type_key STRING NOT NULL,"
    " timestamp TIMESTAMP NOT NULL, source_timestamp TIMESTAMP,"
    " payload_kind STRING NOT NULL, payload_json STRING,"
    " payload_binary_type STRING, payload_binary BINARY"
)

NUMBERS_SCHEMA_DDL = (
    ", payload_class STRING NOT NULL, json_numbers MAP<STRING, DOUBLE> NOT NULL,"
    " json_skipped INT NOT NULL"
)

_TS = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        pa.field("server", pa.int64(), nullable=False),
        pa.field("session", pa.int64(), nullable=False),
        pa.field("instance", pa.int64(), nullable=False),
        pa.field("type", pa.list_(pa.string()), nullable=False),
        pa.field("type_key", pa.string(), nullable=False),
        pa.field("timestamp", _TS, nullable=False),
        pa.field("source_timestamp", _TS),
        pa.field("payload_kind", pa.string(), nullable=False),
        pa.field("payload_json", pa.string()),
        pa.field("payload_binary_type", pa.string()),
        pa.field("payload_binary", pa.binary()),
    ]
)
NUMBERS_FIELDS = [
    pa.field("payload_class", pa.string(), nullable=False),
    pa.field("json_numbers", pa.map_(pa.string(), pa.float64()), nullable=False),
    pa.field("json_skipped", pa.int32(), nullable=False),
]
ARROW_SCHEMA_NUMBERS = pa.schema([*ARROW_SCHEMA, *NUMBERS_FIELDS])

_US = 1_000_000


class TypeFilter:
    """Drops events whose type starts with one of `prefixes` (``'?'`` = any one segment).

    The job excludes its own write-back prefix this way: Eventer queries can only
    include types, and aggregating the aggregates would feed them back forever.
    Decisions are cached per type; a fleet has far fewer types than events.
    """

    def __init__(self, prefixes):
        self._prefixes = [tuple(p) for p in prefixes]
        self._cache: dict[tuple, bool] = {}

    def __bool__(self) -> bool:
        return bool(self._prefixes)

    def keeps(self, event_type: tuple) -> bool:
        kept = self._cache.get(event_type)
        if kept is None:
            kept = not any(_starts_with(event_type, p) for p in self._prefixes)
            self._cache[event_type] = kept
        return kept


def _starts_with(event_type: tuple, prefix: tuple) -> bool:
    if len(event_type) < len(prefix):
        return False
    return all(p in ("?", s) for p, s in zip(prefix, event_type, strict=False))


class PageConverter:
    """Builds Arrow record batches from raw SBS event records (see `eventer_io`).

    Keeps a per-type cache of the joined key, so the per-event cost is a handful of
    dict lookups and list appends; Arrow builds each column in one call. With
    `numbers`, each payload is also classified (`payloads.classify_fast`).
    """

    def __init__(self, exclude: TypeFilter | None = None, numbers: bool = False):
        self._types: dict[tuple, str] = {}
        self._exclude = exclude if exclude else None
        self._numbers = numbers
        self.schema = ARROW_SCHEMA_NUMBERS if numbers else ARROW_SCHEMA

    def convert_export(self, page) -> pa.RecordBatch:
        """The same rows from an `export_io.ExportPage` (``/export``, already Arrow):
        columns are passed through, only the derived ones are computed per event."""
        batch, types = page.batch, page.types
        if self._exclude is not None:
            mask = [self._exclude.keeps(t) for t in types]
            if not all(mask):
                batch = batch.filter(pa.array(mask, pa.bool_()))
        arrays = [
            batch.column("server"),
            batch.column("session"),
            batch.column("instance"),
            batch.column("type"),
            pc.binary_join(batch.column("type"), "/"),
            batch.column("timestamp"),
            batch.column("source_timestamp"),
            batch.column("payload_kind"),
            batch.column("payload_json"),
            batch.column("payload_binary_type"),
            batch.column("payload_binary"),
        ]
        if self._numbers:
            classes, num_offsets, num_keys, num_values, skipped = [], [0], [], [], []
            kinds = batch.column("payload_kind").to_pylist()
            texts = batch.column("payload_json").to_pylist()
            for kind, text in zip(kinds, texts, strict=True):
                cls, found, skip = classify_fast(kind, text)
                classes.append(cls)
                if found:
                    num_keys.extend(found)
                    num_values.extend(found.values())
                num_offsets.append(len(num_keys))
                skipped.append(skip)
            arrays += _number_arrays(classes, num_offsets, num_keys, num_values, skipped)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def convert(self, events: list[dict]) -> pa.RecordBatch:
        server, session, instance = [], [], []
        type_offsets, type_values, type_keys = [0], [], []
        ts, source_ts = [], []
        kinds, texts, bin_types, bins = [], [], [], []
        classes, num_offsets, num_keys, num_values, skipped = [], [0], [], [], []
        types = self._types
        exclude = self._exclude
        numbers = self._numbers
        for e in events:
            t = tuple(e["type"])
            if exclude is not None and not exclude.keeps(t):
                continue
            key = types.get(t)
            if key is None:
                key = types[t] = "/".join(t)
            i = e["id"]
            server.append(i["server"])
            session.append(i["session"])
            instance.append(i["instance"])
            type_values.extend(t)
            type_offsets.append(len(type_values))
            type_keys.append(key)
            stamp = e["timestamp"]
            ts.append(stamp["s"] * _US + stamp["us"])
            st = e["sourceTimestamp"]
            source_ts.append(st[1]["s"] * _US + st[1]["us"] if st[0] == "value" else None)
            p = e["payload"]
            if p[0] != "value":
                kind, text, bin_type, data = "none", None, None, None
            elif p[1][0] == "json":
                kind, text, bin_type, data = "json", p[1][1], None, None
            else:
                kind, text = "binary", None
                bin_type, data = p[1][1]["type"], bytes(p[1][1]["data"])
            kinds.append(kind)
            texts.append(text)
            bin_types.append(bin_type)
            bins.append(data)
            if numbers:
                cls, found, skip = classify_fast(kind, text)
                classes.append(cls)
                if found:
                    num_keys.extend(found)
                    num_values.extend(found.values())
                num_offsets.append(len(num_keys))
                skipped.append(skip)
        arrays = [
            pa.array(server, pa.int64()),
            pa.array(session, pa.int64()),
            pa.array(instance, pa.int64()),
            pa.ListArray.from_arrays(
                pa.array(type_offsets, pa.int32()), pa.array(type_values, pa.string())
            ),
            pa.array(type_keys, pa.string()),
            pa.array(ts, pa.int64()).cast(_TS),
            pa.array(source_ts, pa.int64()).cast(_TS),
            pa.array(kinds, pa.string()),
            pa.array(texts, pa.string()),
            pa.array(bin_types, pa.string()),
            pa.array(bins, pa.binary()),
        ]
        if numbers:
            arrays += _number_arrays(classes, num_offsets, num_keys, num_values, skipped)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _number_arrays(classes, num_offsets, num_keys, num_values, skipped) -> list[pa.Array]:
    return [
        pa.array(classes, pa.string()),
        pa.MapArray.from_arrays(
            pa.array(num_offsets, pa.int32()),
            pa.array(num_keys, pa.string()),
            pa.array(num_values, pa.float64()),
        ),
        pa.array(skipped, pa.int32()),
    ]
