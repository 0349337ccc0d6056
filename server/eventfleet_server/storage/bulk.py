"""Bulk export of a timestamp window as an Arrow IPC stream (``GET /export``).

Why a second read path next to Eventer: the Spark job reads millions of events, and
serving them over Eventer costs the replica 13-14 µs of CPU per event (SQLite row →
model objects → SBS records → SBS bytes). Here a page of SQLite rows goes straight into
Arrow columns: the rows are fetched as tuples (the only per-row Python objects), split
into columns with ``zip`` and handed to Arrow, which builds each column in C. Event
types are mapped through the storage's type cache by an Arrow ``take`` from a cached
list array of every known type, so no per-event type list is ever built in Python.

Pages are read on the storage's *reader* connection (one hop to its thread per page,
like every query), in ascending natural order ``(timestamp, server, session,
instance)`` with keyset paging on the folded timestamp index ``events_by_ts`` (folded
up to the export's start first: `Storage.fold_for_read`), so a page costs O(page) and
the write path is never blocked. The next page is read while the current one is
written to the client. Paging is not a snapshot: an event committed behind the current
key (a late Syncer merge with an old timestamp) during the export is not in it — the
same as Eventer ``timeseries`` paging.

The stream (`EXPORT_SCHEMA`) ends with an empty record batch whose custom metadata
holds ``eventfleet.end`` = the number of events sent; a reader that never sees it got
a truncated stream (the server failed or the connection broke after the 200 status
line) and must not take the read as complete.

pyarrow is imported by this module only; the HTTP route imports it on the first
export, so a replica that never exports never loads pyarrow.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from eventfleet_server.storage.backend import Storage, _run

__all__ = [
    "END_METADATA_KEY",
    "EXPORT_SCHEMA",
    "ExportKey",
    "ExportStats",
    "export_stream",
]

END_METADATA_KEY = "eventfleet.end"
"""Custom metadata key of the final (empty) batch: the number of events in the stream."""

SCHEMA_VERSION = "1"

_TS = pa.timestamp("us", tz="UTC")
EXPORT_SCHEMA = pa.schema(
    [
        pa.field("server", pa.int64(), nullable=False),
        pa.field("session", pa.int64(), nullable=False),
        pa.field("instance", pa.int64(), nullable=False),
        # The replica's own id of the type: stable for that replica's database, so a
        # reader can cache per id (decoding `type` once per type, not per event).
        pa.field("type_id", pa.int32(), nullable=False),
        pa.field("type", pa.list_(pa.string()), nullable=False),
        pa.field("timestamp", _TS, nullable=False),
        pa.field("source_timestamp", _TS),
        pa.field("payload_kind", pa.string(), nullable=False),
        pa.field("payload_json", pa.string()),
        pa.field("payload_binary_type", pa.string()),
        pa.field("payload_binary", pa.binary()),
    ],
    metadata={"eventfleet.export": SCHEMA_VERSION},
)

_JSON, _BINARY, _NONE = (pa.scalar(k, pa.string()) for k in ("json", "binary", "none"))


# `payload` holds TEXT for JSON and a BLOB for binary payloads; split into two columns
# here so that each becomes one typed Arrow column. `ptype` is NULL unless binary, and
# the kind is derived from which of the two is set (one Python value less per row).
def _cols(q: str) -> str:
    return (
        f"{q}server AS server, {q}session AS session, {q}instance AS instance,"
        f" {q}type_id AS type_id, {q}ts AS ts, events.source_ts, events.ptype,"
        " CASE events.kind WHEN 2 THEN events.payload END AS pjson,"
        " CASE events.kind WHEN 1 THEN events.payload END AS pbin"
    )


_ORDER = "ORDER BY ts, server, session, instance LIMIT :limit"


@functools.cache
def page_sql(*, first: bool, tail: bool) -> str:
    """A page of the export: keyset paging on the folded timestamp index
    (``events_by_ts``, the one the Eventer timeseries query reads), which the caller
    folds first. After the first page the key (``:k0``..``:k3``) bounds the start, so the
    lower bound is left out (a second bound on the same side would compete with the
    row-value range for the index). `tail`: the events above ``:folded`` read from
    ``events`` too (a fold failed)."""

    def where(q: str) -> str:
        start = (
            f"{q}ts >= :start"
            if first
            else f"({q}ts, {q}server, {q}session, {q}instance) > (:k0, :k1, :k2, :k3)"
        )
        return f"{start} AND {q}ts < :end"

    arm = (
        f"SELECT {_cols('t.')} FROM events_by_ts AS t CROSS JOIN events ON events.seq = t.seq"
        f" WHERE {where('t.')}"
    )
    if not tail:
        return f"{arm} ORDER BY t.ts, t.server, t.session, t.instance LIMIT :limit"
    rest = f"SELECT {_cols('events.')} FROM events WHERE seq > :folded AND {where('events.')}"
    return f"{arm} UNION ALL {rest} {_ORDER}"


DEFAULT_PAGE_ROWS = 20_000


class ExportKey(NamedTuple):
    """Natural-order key of an event: export resumes strictly after it."""

    ts: int
    server: int
    session: int
    instance: int


@dataclasses.dataclass
class ExportStats:
    events: int = 0
    batches: int = 0
    bytes: int = 0


class _Chunks:
    """A write-only file for pyarrow's stream writer that collects what it writes."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


class _TypeColumn:
    """Every known type of one storage as an Arrow list array indexed by type id.

    Rebuilt when a page holds a type id beyond it (types only ever get appended; ids
    burned by a rolled-back write are None and no committed row uses them).
    """

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._array = pa.array([], pa.list_(pa.string()))

    def take(self, type_ids: pa.Array, max_id: int) -> pa.Array:
        if max_id >= len(self._array):
            types = self._storage._types
            known = len(types)  # the writer may append meanwhile: a fixed prefix
            self._array = pa.array(
                [None if t is None else list(t) for t in types[:known]], pa.list_(pa.string())
            )
        return self._array.take(type_ids)


class _Pager:
    """Reads pages on the reader connection's thread and encodes them as IPC bytes."""

    def __init__(self, storage: Storage, start_us: int, end_us: int, page_rows: int) -> None:
        self._storage = storage
        self._end = end_us
        self._start = start_us
        self._page_rows = page_rows
        self._types = _TypeColumn(storage)
        self._sink = _Chunks()
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._sink, mode="w"), EXPORT_SCHEMA)
        self.stats = ExportStats()
        # None: the folded index holds every event; else how far it goes (`page_sql`).
        self.folded: int | None = None

    def header(self) -> bytes:
        return self._sink.take()

    def page(self, after: ExportKey | None) -> tuple[bytes, ExportKey | None]:
        """The next page after `after` (None: from the start) as IPC bytes, and the key
        of its last event (None when the window is exhausted)."""
        conn = self._storage._reader._conn
        # A page is ~20k row tuples (GC-tracked) that die within milliseconds: with the
        # cyclic GC on, its generation-0 passes cost ~30% of the page (measured 2.3 vs
        # 1.6 µs/row). It is process-wide, so it is off only for this bounded stretch,
        # on the reader thread, the only place that toggles it.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            args: dict[str, Any] = {"end": self._end, "limit": self._page_rows}
            if after is None:
                args["start"] = self._start
            else:
                args.update(zip(("k0", "k1", "k2", "k3"), after, strict=True))
            if self.folded is not None:
                args["folded"] = self.folded
            sql = page_sql(first=after is None, tail=self.folded is not None)
            rows = conn.execute(sql, args).fetchall()
            if not rows:
                return b"", None
            batch = self._batch(rows)
            server, session, instance, _, ts = rows[-1][:5]
            del rows
        finally:
            if gc_was_enabled:
                gc.enable()
        self._writer.write_batch(batch)
        self.stats.events += batch.num_rows
        self.stats.batches += 1
        return self._sink.take(), ExportKey(ts, server, session, instance)

    def _batch(self, rows: list[tuple]) -> pa.RecordBatch:
        (server, session, instance, type_id, ts, source_ts, ptype, text, data) = zip(
            *rows, strict=True
        )
        type_ids = pa.array(type_id, pa.int32())
        texts = pa.array(text, pa.string())
        blobs = pa.array(data, pa.binary())
        kinds = pc.if_else(
            pc.is_valid(texts), _JSON, pc.if_else(pc.is_valid(blobs), _BINARY, _NONE)
        )
        return pa.RecordBatch.from_arrays(
            [
                pa.array(server, pa.int64()),
                pa.array(session, pa.int64()),
                pa.array(instance, pa.int64()),
                type_ids,
                self._types.take(type_ids, max(type_id)),
                pa.array(ts, _TS),
                pa.array(source_ts, _TS),
                kinds,
                texts,
                pa.array(ptype, pa.string()),
                blobs,
            ],
            schema=EXPORT_SCHEMA,
        )

    def end(self) -> bytes:
        """The closing empty batch carrying the event count, and the end-of-stream mark."""
        self._writer.write_batch(
            pa.RecordBatch.from_pylist([], schema=EXPORT_SCHEMA),
            custom_metadata={END_METADATA_KEY: str(self.stats.events)},
        )
        self._writer.close()
        return self._sink.take()


async def export_stream(
    storage: Storage,
    start_us: int,
    end_us: int,
    *,
    after: ExportKey | None = None,
    page_rows: int = DEFAULT_PAGE_ROWS,
    stats: ExportStats | None = None,
) -> AsyncIterator[bytes]:
    """The Arrow IPC stream of the events with ``start_us <= timestamp < end_us`` (and
    after `after`, if given), in ascending natural order, as chunks of bytes.

    Each page is read and encoded on the reader connection's thread; the next page is
    already being read while the caller writes the current one. `stats`, if given, is
    updated as the stream goes (events, batches, bytes).
    """
    storage._check_open()
    pager = _Pager(storage, start_us, end_us, page_rows)
    pager.folded = await storage.fold_for_read()
    if stats is not None:
        pager.stats = stats
    reader: Any = storage._reader
    header = pager.header()
    pager.stats.bytes += len(header)
    yield header
    # A task, so the read runs while the caller writes the previous chunk; it never
    # outlives this generator (awaited, or cancelled in `finally`).
    pending = asyncio.ensure_future(_run(reader, pager.page, after))
    try:
        while True:
            chunk, key = await pending
            if key is None:
                break
            # Ask for the next page before handing this one out (see module doc).
            pending = asyncio.ensure_future(_run(reader, pager.page, key))
            pager.stats.bytes += len(chunk)
            yield chunk
    finally:
        if not pending.done():
            # Abandoned mid-stream (client gone): the page finishes on the reader's
            # thread and is dropped.
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
    tail = pager.end()
    pager.stats.bytes += len(tail)
    yield tail
