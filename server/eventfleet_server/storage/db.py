"""Event storage on SQLite through aiosqlite.

Threads and connections: two aiosqlite connections to one WAL database, each with its
own thread. The *writer* runs `write` and `enforce_retention`; the *reader* runs every
query and read. WAL lets the reader see the last committed state while the writer is
inside a transaction or waiting for fsync, so a long write or a group commit never
holds up a query. `write` returns only after COMMIT, and the reader starts a fresh
snapshot per statement (autocommit, cursors always drained), so a query issued after
`write` returns sees those events.

Inline writes: with ``synchronous`` OFF or NORMAL a commit does not wait for the disk
(WAL pages are handed to the OS, fsync happens only at checkpoints), so `write` runs on
the event loop's thread instead of hopping to the writer thread: the hop (queue, wake-up,
self-pipe, context switches) costs more CPU than the commit itself. The writer then has
automatic checkpoints disabled and a background task checkpoints (PASSIVE) from the
reader's thread, so no fsync ever blocks the loop. With FULL or EXTRA every commit
fsyncs, and writes go to the writer thread as described below.

Each public call is one hop to the connection's thread: the whole call (validation,
statements, commit, decoding) runs there as one function through aiosqlite's
``Connection._execute`` (a private method, pinned by ``aiosqlite~=0.22``; the public
per-statement API would cost one hop per statement). Shared in-memory state (type
cache, ``last_ids``, counters) is only changed by the writer thread; the reader only
looks values up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import pathlib
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiosqlite

from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    EventType,
    Order,
    OrderBy,
    QueryLatestParams,
    QueryResult,
    QueryServerParams,
    QueryTimeseriesParams,
    Timestamp,
    timestamp_to_us,
)
from eventfleet_server.common.subscription import Subscription
from eventfleet_server.storage import schema

__all__ = ["Retention", "Storage", "StorageError", "StorageStats"]

_T = TypeVar("_T")
_US = 1_000_000
_MIN_I64 = -(1 << 63)
_MAX_I64 = (1 << 63) - 1
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_KIND_NONE, _KIND_BINARY, _KIND_JSON = 0, 1, 2
# Up to this many matching types a timeseries query merges per-type index scans;
# beyond it, it scans the timestamp index and filters by type id.
_MERGE_MAX_TYPES = 32
# Small enough that an inline chunk blocks the event loop only for milliseconds.
_RETENTION_CHUNK = 2_000
_CHECKPOINT_INTERVAL = 0.5  # seconds between PASSIVE checkpoints when inline writes are on

log = logging.getLogger(__name__)
_EXPANSION_CACHE = 256


class StorageError(Exception):
    """A write or the database failed; the message names the bad event or value."""


class CorruptStoreError(StorageError):
    """The database file failed its integrity check at start (one line: the file, what
    is wrong, what to do)."""


class SchemaVersionError(StorageError):
    """The database file has a storage schema version this replica does not know (one
    line: the file and both versions). Raised before anything in the file changes."""

    def __init__(self, path: object, found: int, known: int) -> None:
        self.found, self.known = found, known
        if found > known:
            text = (
                f"{path}: storage schema version {found} is newer than this replica's "
                f"{known} (the store was written by a newer eventfleet): run that version "
                "or a newer one; a downgrade across storage schema versions is not supported"
            )
        else:
            text = (
                f"{path}: storage schema version {found} is older than this replica's "
                f"{known} and no migration from it exists: run the eventfleet version that "
                "wrote it, or restore the replica from a peer (docs/runbook.md, 'Restore')"
            )
        super().__init__(text)


RESTORE_HINT = (
    "stop this replica, move the file aside and restore the replica from a peer "
    "(docs/runbook.md, 'Restore')"
)

# Batches above this many events are written on the writer thread even in inline mode,
# so that one large register request never holds the event loop for the whole insert.
INLINE_MAX_EVENTS = 500


@dataclass(frozen=True)
class Retention:
    """What `Storage.enforce_retention` deletes.

    `max_age_seconds`: events whose timestamp is older than now minus this.
    `max_events`: keep at most this many events, deleting the oldest by local
    sequence number first. None disables a rule.
    """

    max_age_seconds: float | None = None
    max_events: int | None = None

    def __post_init__(self) -> None:
        if self.max_age_seconds is not None and not self.max_age_seconds > 0:
            raise ValueError(f"max_age_seconds {self.max_age_seconds!r} must be > 0")
        if self.max_events is not None and (
            not isinstance(self.max_events, int) or self.max_events < 0
        ):
            raise ValueError(f"max_events {self.max_events!r} must be an integer >= 0")


@dataclass(frozen=True)
class StorageStats:
    events: int
    db_bytes: int
    last_seq: int


def _run(conn: aiosqlite.Connection, fn: Callable[..., _T], *args: Any) -> Awaitable[_T]:
    # One queue hop to the connection's thread for a whole operation (see module doc).
    return conn._execute(fn, *args)


def _describe(index: int, event: Any) -> str:
    text = repr(event)
    if len(text) > 300:
        text = text[:300] + "..."
    return f"event {index} {text}"


def _decode(rows: list[tuple], types: list[EventType | None]) -> list[Event]:
    # The only per-row Python work on reads: build the model tuples.
    out = []
    append = out.append
    for server, session, instance, type_id, ts, sts, kind, ptype, data in rows:
        s, us = divmod(ts, _US)
        if sts is not None:
            ss, sus = divmod(sts, _US)
            source = Timestamp(ss, sus)
        else:
            source = None
        if kind == _KIND_JSON:
            payload = EventPayloadJson(data)
        elif kind == _KIND_BINARY:
            payload = EventPayloadBinary(ptype, data)
        else:
            payload = None
        append(
            Event(
                EventId(server, session, instance),
                types[type_id],  # type: ignore[arg-type]
                Timestamp(s, us),
                source,
                payload,
            )
        )
    return out


def _bounds(lo: Timestamp | None, hi: Timestamp | None) -> tuple[int, int]:
    return (
        _MIN_I64 if lo is None else timestamp_to_us(lo),
        _MAX_I64 if hi is None else timestamp_to_us(hi),
    )


def _page_size(max_results: int | None, cap: int) -> int:
    if max_results is None:
        return cap
    return max(0, min(max_results, cap))


class Storage:
    """Events of one replica in one SQLite database (see the module doc for threads).

    Open with `Storage.open`; close with `close`.
    """

    def __init__(self) -> None:
        raise TypeError("use `await Storage.open(path)`")

    @classmethod
    async def open(
        cls,
        path: pathlib.Path,
        *,
        synchronous: str = "FULL",
        retention: Retention = Retention(),
        quick_check_timeout: float = 0.0,
        max_db_bytes: int | None = None,
    ) -> Storage:
        """Open (creating parent directories and schema) the database at `path`.

        `synchronous` is SQLite's synchronous mode for commits in WAL mode: OFF,
        NORMAL (durable against process crashes, not power loss), FULL or EXTRA.
        `quick_check_timeout` > 0 runs ``PRAGMA quick_check`` for at most that many
        seconds first; a damaged file raises `CorruptStoreError`. `max_db_bytes` caps
        the database size (SQLite ``max_page_count``): past it commits fail as on a full
        disk.
        """
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(f"synchronous {synchronous!r} is not one of {', '.join(_SYNCHRONOUS)}")
        if not isinstance(retention, Retention):
            raise TypeError(f"retention {retention!r} is not a Retention")
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)

        self = object.__new__(cls)
        self._path = path
        self._retention = retention
        self._closed = False
        # type_id -> type (None for ids burned by a rolled-back write) and back.
        self._types: list[EventType | None] = []
        self._type_ids: dict[EventType, int] = {}
        self._last_ids: dict[int, EventId] = {}
        self._last_seq = 0
        self._event_count = 0
        self._meta: dict[str, str] = {}
        # Subscription patterns -> (types scanned so far, matching ids, ids as JSON).
        self._expansions: dict[tuple, tuple[int, list[int], str]] = {}

        sync = synchronous.upper()
        self._inline = sync in ("OFF", "NORMAL")
        self._quick_check_timeout = quick_check_timeout
        self._max_db_bytes = max_db_bytes
        self._commits_since_checkpoint = 0
        self._checkpoint_task: asyncio.Task | None = None
        # One writer at a time on the writer connection. Inline mode still hands batches
        # above INLINE_MAX_EVENTS to the writer thread; without this lock an inline
        # write (a UUID index mark, a retention delete) issued meanwhile ran on the same
        # connection from the loop's thread, inside the thread's open transaction
        # ("cannot start a transaction within a transaction": the commit failed and the
        # replica refused registrations).
        self._write_lock = asyncio.Lock()
        try:
            # check_same_thread=False: inline writes use this connection from the loop's
            # thread; the writer thread runs set-up, close and the large batches.
            self._writer = await aiosqlite.connect(
                path, isolation_level=None, cached_statements=64, check_same_thread=False
            )
            try:
                await _run(self._writer, self._init_writer, sync)
                self._reader = await aiosqlite.connect(
                    path, isolation_level=None, cached_statements=256
                )
            except BaseException:
                await self._writer.close()
                raise
            try:
                await _run(self._reader, self._init_reader)
            except BaseException:
                await self._reader.close()
                await self._writer.close()
                raise
        except sqlite3.DatabaseError as e:
            if "malformed" in str(e) or "not a database" in str(e):
                raise CorruptStoreError(f"{path} is damaged ({e}): {RESTORE_HINT}") from None
            raise StorageError(f"{path}: cannot open: {e}") from e
        if self._inline:
            self._checkpoint_task = asyncio.get_running_loop().create_task(self._checkpoint_loop())
        return self

    def _quick_check(self, conn: sqlite3.Connection) -> None:
        """``PRAGMA quick_check``, interrupted after `_quick_check_timeout` seconds (a
        huge store must not hold the start-up longer than that; a skipped check is
        logged). Raises `CorruptStoreError` naming the first problem."""
        deadline = time.monotonic() + self._quick_check_timeout
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
        try:
            rows = conn.execute("PRAGMA quick_check(5)").fetchall()
        except sqlite3.OperationalError as e:
            if "interrupted" not in str(e):
                raise
            log.warning(
                "%s: quick_check not finished within %g s, skipped (raise "
                "storage.quick_check_timeout to check it fully)",
                self._path,
                self._quick_check_timeout,
            )
            return
        finally:
            conn.set_progress_handler(None, 0)
        # One line: quick_check's rows may themselves hold newlines.
        problems = [" ".join(row[0].split()) for row in rows if row[0] != "ok"]
        if problems:
            raise CorruptStoreError(
                f"{self._path} is damaged (quick_check: {'; '.join(problems)[:300]}): "
                f"{RESTORE_HINT}"
            )

    def _init_writer(self, synchronous: str) -> None:
        conn = self._writer._conn
        if self._quick_check_timeout > 0 and self._path.exists():
            self._quick_check(conn)
        # Version first: a file of another schema is refused before anything changes it.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, schema.SCHEMA_VERSION):
            raise SchemaVersionError(self._path, version, schema.SCHEMA_VERSION)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StorageError(f"{self._path}: journal_mode WAL refused (got {mode!r})")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        if self._inline:
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # see "Inline writes" above
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA cache_size = -32000")  # KiB
        if self._max_db_bytes:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {max(self._max_db_bytes // page_size, 1)}")
        if version == 0:
            try:
                # One script, one transaction: a half-created schema is never committed.
                conn.executescript(
                    f"BEGIN IMMEDIATE; {schema.DDL};"
                    f" PRAGMA user_version = {schema.SCHEMA_VERSION}; COMMIT;"
                )
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        conn.execute(schema.EVENT_KEYS_DDL)

        for type_id, text in conn.execute("SELECT type_id, type FROM types"):
            event_type = tuple(json.loads(text))
            if type_id >= len(self._types):
                self._types.extend([None] * (type_id + 1 - len(self._types)))
            self._types[type_id] = event_type
            self._type_ids[event_type] = type_id
        self._last_ids = {
            server: EventId(server, session, instance)
            for server, session, instance in conn.execute(
                "SELECT server, session, instance FROM last_ids"
            )
        }
        self._last_seq, self._event_count = conn.execute(
            "SELECT last_seq, event_count FROM state WHERE id = 0"
        ).fetchone()
        self._meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())

    def _init_reader(self) -> None:
        conn = self._reader._conn
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA cache_size = -32000")
        # Guard: nothing on the reader may change the database.
        conn.execute("PRAGMA query_only = ON")

    async def close(self) -> None:
        """Close both connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._checkpoint_task:
            self._checkpoint_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpoint_task
        try:
            await self._reader.close()
        finally:
            await self._writer.close()

    async def _checkpoint_loop(self) -> None:
        """Checkpoint the WAL from the reader's thread while inline writes are on."""
        while True:
            await asyncio.sleep(_CHECKPOINT_INTERVAL)
            if not self._commits_since_checkpoint:
                continue
            self._commits_since_checkpoint = 0
            try:
                await _run(self._reader, self._checkpoint)
            except sqlite3.Error as e:
                log.warning("%s: WAL checkpoint failed (will retry): %s", self._path, e)

    def _checkpoint(self) -> None:
        self._reader._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    @property
    def last_ids(self) -> dict[int, EventId]:
        """Highest event id (by instance) per server id ever held (a copy)."""
        return dict(self._last_ids)

    @property
    def last_seq(self) -> int:
        """Highest local sequence number assigned (0 before the first event)."""
        return self._last_seq

    @property
    def path(self) -> pathlib.Path:
        return self._path

    async def get_meta(self, key: str) -> Any | None:
        """The JSON value stored under `key` by `write`, or None."""
        text = self._meta.get(key)
        return None if text is None else json.loads(text)

    # -- writing ---------------------------------------------------------------------

    async def write(
        self, events: Sequence[Event], meta: Mapping[str, Any] | None = None
    ) -> list[tuple[int, Event]]:
        """Insert `events` and set `meta` keys in one transaction, committed on return.

        Events already held (same server id and instance) are skipped, so writing the
        same events again is a no-op. Each inserted event gets the next local sequence
        number (strictly increasing, never reused). Returns ``(seq, event)`` for the
        inserted events in the given order. All or nothing: on any error nothing is
        stored and `StorageError` names the bad event or meta key.
        """
        meta_items: list[tuple[str, str]] = []
        for key, value in (meta or {}).items():
            if not isinstance(key, str):
                raise StorageError(f"meta key {key!r} is not a string")
            try:
                meta_items.append((key, json.dumps(value)))
            except (TypeError, ValueError) as e:
                raise StorageError(f"meta key {key!r}: value is not JSON: {e}") from e
        if not events and not meta_items:
            return []
        self._check_open()
        async with self._write_lock:
            if self._inline and len(events) <= INLINE_MAX_EVENTS:
                inserted = self._write(events, meta_items)
                self._commits_since_checkpoint += 1
                return inserted
            return await _run(self._writer, self._write, events, meta_items)

    async def probe_write(self) -> None:
        """One tiny committed write (a meta key): does the store accept commits again?"""
        await self.write([], {"probe": time.time()})

    def set_max_db_bytes(self, max_db_bytes: int | None) -> None:
        """Change the size cap (tests simulate a full disk and freed space with it)."""
        self._max_db_bytes = max_db_bytes
        conn = self._writer._conn
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = max(max_db_bytes // page_size, 1) if max_db_bytes else 4294967294
        conn.execute(f"PRAGMA max_page_count = {pages}")

    def _write(
        self, events: Sequence[Event], meta_items: list[tuple[str, str]]
    ) -> list[tuple[int, Event]]:
        conn = self._writer._conn
        type_ids = self._type_ids
        last_ids = self._last_ids
        new_types: list[int] = []
        rows: list[tuple] = []
        inserted: list[tuple[int, Event]] = []
        tops: dict[int, int] = {}  # highest instance per server seen in this batch
        seen: set[tuple[int, int]] | None = None  # built only if an old id shows up
        seq = self._last_seq
        try:
            for index, event in enumerate(events):
                try:
                    event_id = event.id
                    server = event_id.server
                    instance = event_id.instance
                    top = tops.get(server)
                    if top is None:
                        last = last_ids.get(server)
                        top = last.instance if last is not None else -math.inf
                    if instance > top:
                        # Above everything held for this server: new, no lookup needed.
                        tops[server] = instance
                        if seen is not None:
                            seen.add((server, instance))
                    else:
                        if seen is None:
                            seen = {(row[1], row[3]) for row in rows}
                        if (server, instance) in seen or conn.execute(
                            schema.IS_HELD, (server, instance)
                        ).fetchall():
                            continue
                        seen.add((server, instance))

                    event_type = event.type
                    type_id = type_ids.get(event_type)
                    if type_id is None:
                        type_id = self._add_type(event_type, new_types)

                    source = event.source_timestamp
                    payload = event.payload
                    if payload is None:
                        kind, ptype, data = _KIND_NONE, None, None
                    elif type(payload) is EventPayloadJson:
                        kind, ptype, data = _KIND_JSON, None, payload.data
                        if type(data) is not str:
                            raise TypeError(f"JSON payload data {data!r} is not a str")
                    elif type(payload) is EventPayloadBinary:
                        kind, ptype, data = _KIND_BINARY, payload.type, payload.data
                        if type(ptype) is not str or not isinstance(
                            data, bytes | bytearray | memoryview
                        ):
                            raise TypeError(f"binary payload {payload!r} needs str type, bytes")
                    else:
                        raise TypeError(f"payload {payload!r} is not a model payload")
                    seq += 1
                    rows.append(
                        (
                            seq,
                            server,
                            event_id.session,
                            instance,
                            type_id,
                            timestamp_to_us(event.timestamp),
                            None if source is None else timestamp_to_us(source),
                            kind,
                            ptype,
                            data,
                        )
                    )
                    inserted.append((seq, event))
                except (TypeError, ValueError, AttributeError) as e:
                    raise StorageError(f"{_describe(index, event)}: {e}") from e

            conn.execute("BEGIN IMMEDIATE")
            try:
                if new_types:
                    conn.executemany(
                        schema.INSERT_TYPE,
                        [(i, json.dumps(self._types[i])) for i in new_types],
                    )
                lids: list[tuple[int, int, int]] = []
                if rows:
                    try:
                        conn.executemany(schema.INSERT_EVENT, rows)
                    except (sqlite3.Error, OverflowError, UnicodeError) as e:
                        raise StorageError(_diagnose(events, rows, inserted, e)) from e
                    first = rows[0][0]
                    conn.execute(schema.UPSERT_LATEST, (first,))
                    lids = conn.execute(schema.UPSERT_LAST_IDS, (first,)).fetchall()
                    conn.execute(schema.UPDATE_STATE, (seq, len(rows)))
                if meta_items:
                    conn.executemany(schema.UPSERT_META, meta_items)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except BaseException as e:
            for type_id in new_types:
                # Burn the id instead of reusing it: a concurrent reader may hold it.
                del type_ids[self._types[type_id]]  # type: ignore[arg-type]
                self._types[type_id] = None
            if isinstance(e, sqlite3.Error):
                raise StorageError(f"{self._path}: write failed: {e}") from e
            raise

        self._last_seq = seq
        self._event_count += len(rows)
        for server, session, instance in lids:
            last_ids[server] = EventId(server, session, instance)
        for key, value in meta_items:
            self._meta[key] = value
        return inserted

    def _add_type(self, event_type: Any, new_types: list[int]) -> int:
        if not isinstance(event_type, tuple | list):
            raise TypeError(f"type {event_type!r} is not a tuple of str")
        event_type = tuple(event_type)
        for i, segment in enumerate(event_type):
            if type(segment) is not str:
                raise TypeError(f"type segment {i} {segment!r} is not a str")
        type_id = self._type_ids.get(event_type)  # the type was given as a list
        if type_id is not None:
            return type_id
        type_id = len(self._types)
        # Visible to the reader before commit; harmless, no committed row uses it yet.
        self._types.append(event_type)
        self._type_ids[event_type] = type_id
        new_types.append(type_id)
        return type_id

    # -- reading ---------------------------------------------------------------------

    async def query(
        self,
        params: QueryLatestParams | QueryTimeseriesParams | QueryServerParams,
        *,
        max_results_cap: int = 10_000,
    ) -> QueryResult:
        """Run an Eventer query (hat-event 0.9 semantics).

        ``latest``: the greatest event (natural order) of every stored type matching
        `event_types` (None: all), from the latest-per-type table; order unspecified.

        ``timeseries``: events matching the types and the inclusive bounds, ordered by
        timestamp or source timestamp (then natural order), ascending or descending.
        An event without a source timestamp fails any source bound and is left out of
        every query ordered by source timestamp. `last_event_id` is a sentinel: the
        result continues after it, and is empty if it is not among the filtered
        events.

        ``server``: events of `server_id` in ascending (session, instance) order with
        instance above ``last_event_id.instance``. `persisted` is ignored: the
        storage holds only committed events.

        Page size: ``min(max_results, max_results_cap)`` (the cap when `max_results`
        is None). A `max_results` <= 0 gives no events, with `more_follows` telling
        whether any event would have been returned. `more_follows` is True when more
        events follow the page. Cost is O(page) index range scans (see `schema`).
        """
        if not isinstance(max_results_cap, int) or max_results_cap < 1:
            raise ValueError(f"max_results_cap {max_results_cap!r} must be an integer >= 1")
        self._check_open()
        if isinstance(params, QueryTimeseriesParams):
            return await _run(self._reader, self._timeseries, params, max_results_cap)
        if isinstance(params, QueryServerParams):
            return await _run(self._reader, self._server, params, max_results_cap)
        if isinstance(params, QueryLatestParams):
            return await _run(self._reader, self._latest, params)
        raise TypeError(f"query params {params!r} are not a query")

    def _expand(self, event_types: list[EventType] | None) -> tuple[list[int], str] | None:
        """Type ids matching `event_types` and their JSON; None when every type matches."""
        if event_types is None:
            return None
        subscription = Subscription(event_types)
        if subscription.matches_all:
            return None
        patterns = subscription.patterns
        types = self._types
        known = len(types)  # the writer may append while we look; take a fixed prefix
        cached = self._expansions.get(patterns)
        if cached is not None and cached[0] == known:
            return cached[1], cached[2]
        start, ids = (cached[0], list(cached[1])) if cached is not None else (0, [])
        for type_id in range(start, known):
            event_type = types[type_id]
            if event_type is not None and subscription.matches(event_type):
                ids.append(type_id)
        text = json.dumps(ids)
        if len(self._expansions) >= _EXPANSION_CACHE:
            self._expansions.clear()
        self._expansions[patterns] = (known, ids, text)
        return ids, text

    def _latest(self, params: QueryLatestParams) -> QueryResult:
        conn = self._reader._conn
        expansion = self._expand(params.event_types)
        if expansion is None:
            rows = conn.execute(schema.LATEST_ALL).fetchall()
        elif not expansion[0]:
            return QueryResult([], False)
        else:
            rows = conn.execute(schema.LATEST_TYPES, (expansion[1],)).fetchall()
        return QueryResult(_decode(rows, self._types), False)

    def _timeseries(self, params: QueryTimeseriesParams, cap: int) -> QueryResult:
        conn = self._reader._conn
        try:
            source = OrderBy(params.order_by) is OrderBy.SOURCE_TIMESTAMP
            descending = Order(params.order) is Order.DESCENDING
            lo, hi = _bounds(params.t_from, params.t_to)
            slo, shi = _bounds(params.source_t_from, params.source_t_to)
        except ValueError as e:
            raise ValueError(f"timeseries query {params!r}: {e}") from e
        source_filter = params.source_t_from is not None or params.source_t_to is not None
        page = _page_size(params.max_results, cap)

        expansion = self._expand(params.event_types)
        if expansion is not None and not expansion[0]:
            return QueryResult([], False)

        args: dict[str, Any] = {"lo": lo, "hi": hi}
        if source or source_filter:
            args["slo"], args["shi"] = slo, shi

        after = params.last_event_id
        if after is not None:
            found = conn.execute(
                schema.SENTINEL, (after.server, after.instance, after.session)
            ).fetchall()
            if not found:
                return QueryResult([], False)
            ts, sts, type_id = found[0]
            if (
                not lo <= ts <= hi
                or ((source or source_filter) and (sts is None or not slo <= sts <= shi))
                or (expansion is not None and type_id not in expansion[0])
            ):
                return QueryResult([], False)
            key = (
                (sts, ts, after.server, after.session, after.instance)
                if source
                else (ts, after.server, after.session, after.instance)
            )
            for i, value in enumerate(key):
                args[f"k{i}"] = value

        types: int | None = None
        if expansion is not None:
            ids, text = expansion
            if not source and len(ids) <= _MERGE_MAX_TYPES:
                types = len(ids)
                for i, type_id in enumerate(ids):
                    args[f"t{i}"] = type_id
            else:
                types = 0
                args["types"] = text

        # One row beyond the page tells whether more follow.
        args["limit"] = page + 1
        sql = schema.timeseries_sql(
            source=source,
            descending=descending,
            source_filter=source_filter and not source,
            types=types,
            after=after is not None,
        )
        rows = conn.execute(sql, args).fetchall()
        more = len(rows) > page
        return QueryResult(_decode(rows[:page], self._types), more)

    def _server(self, params: QueryServerParams, cap: int) -> QueryResult:
        page = _page_size(params.max_results, cap)
        after = params.last_event_id
        rows = self._reader._conn.execute(
            schema.SERVER,
            (params.server_id, _MIN_I64 if after is None else after.instance, page + 1),
        ).fetchall()
        return QueryResult(_decode(rows[:page], self._types), len(rows) > page)

    async def read_server(self, server_id: int, after: EventId | None, limit: int) -> list[Event]:
        """Up to `limit` events of `server_id` with instance above ``after.instance``
        (all if `after` is None), ascending (session, instance). For the Syncer."""
        self._check_open()
        return await _run(self._reader, self._read_server, server_id, after, limit)

    def _read_server(self, server_id: int, after: EventId | None, limit: int) -> list[Event]:
        rows = self._reader._conn.execute(
            schema.SERVER,
            (server_id, _MIN_I64 if after is None else after.instance, max(limit, 0)),
        ).fetchall()
        return _decode(rows, self._types)

    async def read_since_seq(self, seq: int, limit: int) -> list[tuple[int, Event]]:
        """Up to `limit` ``(seq, event)`` with local sequence number above `seq`,
        ascending. For the Event BUS and Replication."""
        self._check_open()
        return await _run(self._reader, self._read_since_seq, seq, limit)

    def _read_since_seq(self, seq: int, limit: int) -> list[tuple[int, Event]]:
        rows = self._reader._conn.execute(schema.SINCE_SEQ, (seq, max(limit, 0))).fetchall()
        events = _decode([row[1:] for row in rows], self._types)
        return [(row[0], event) for row, event in zip(rows, events, strict=True)]

    async def read_rows_since_seq(self, seq: int, limit: int) -> list[tuple]:
        """`read_since_seq` without model objects, for bulk readers that re-encode
        every event anyway (the Event BUS snapshot): up to `limit` rows ``(seq, server,
        session, instance, type, timestamp_us, source_timestamp_us, payload_type,
        payload_data)`` with local sequence number above `seq`, ascending. `type` is the
        event type tuple; `source_timestamp_us` may be None; the payload is JSON text
        (`payload_type` None, data str), binary (`payload_type` str, data bytes) or
        absent (both None)."""
        self._check_open()
        return await _run(self._reader, self._read_rows_since_seq, seq, limit)

    def _read_rows_since_seq(self, seq: int, limit: int) -> list[tuple]:
        rows = self._reader._conn.execute(schema.SINCE_SEQ, (seq, max(limit, 0))).fetchall()
        types = self._types
        return [
            (seq, server, session, instance, types[type_id], ts, sts, ptype, data)
            for seq, server, session, instance, type_id, ts, sts, _kind, ptype, data in rows
        ]

    # -- event keys (protocol indexes, e.g. the Event BUS UUID) ------------------------

    @property
    def event_keys_seq(self) -> int:
        """Local sequence number up to which `add_event_keys` was told it has indexed."""
        text = self._meta.get(schema.EVENT_KEYS_META)
        return 0 if text is None else int(json.loads(text))

    async def add_event_keys(self, items: Sequence[tuple[str, int]], upto_seq: int) -> None:
        """Store ``(key, seq)`` pairs (a key already held keeps its first seq) and record
        that events up to `upto_seq` are indexed; one transaction."""
        self._check_open()
        await self._on_writer(self._add_event_keys, list(items), upto_seq)

    def _add_event_keys(self, items: list[tuple[str, int]], upto_seq: int) -> None:
        conn = self._writer._conn
        value = json.dumps(max(upto_seq, self.event_keys_seq))
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(schema.INSERT_EVENT_KEY, items)
            conn.execute(schema.UPSERT_META, (schema.EVENT_KEYS_META, value))
            conn.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise StorageError(f"{self._path}: event keys write failed: {e}") from e
            raise
        self._meta[schema.EVENT_KEYS_META] = value

    async def find_event_keys(self, keys: Sequence[str]) -> dict[str, int]:
        """The held keys among `keys`, with the sequence number of their event."""
        self._check_open()
        if not keys:
            return {}
        return await _run(self._reader, self._find_event_keys, json.dumps(list(keys)))

    def find_event_keys_now(self, keys: Sequence[str]) -> dict[str, int] | None:
        """`find_event_keys` answered at once on the loop's thread when the store can:
        in inline mode (synchronous OFF/NORMAL) with no write in flight on the writer
        thread, the writer connection is idle and sees every commit. None when it
        cannot; then await `find_event_keys`. (A hop to the reader thread and back is
        two thread wake-ups on the path of every Event BUS PUB.)"""
        self._check_open()
        if not self._inline or self._write_lock.locked():
            return None
        if not keys:
            return {}
        rows = self._writer._conn.execute(schema.FIND_EVENT_KEYS, (json.dumps(list(keys)),))
        return dict(rows.fetchall())

    def _find_event_keys(self, keys_json: str) -> dict[str, int]:
        return dict(self._reader._conn.execute(schema.FIND_EVENT_KEYS, (keys_json,)).fetchall())

    async def read_latest(self, event_types: list[EventType]) -> list[tuple[int, Event]]:
        """``(seq, event)`` of the latest event of every stored type matching
        `event_types`, with the local sequence number at which it was stored (the
        latest-per-type table, like a ``latest`` query). For Replication's row index."""
        self._check_open()
        return await _run(self._reader, self._read_latest, event_types)

    def _read_latest(self, event_types: list[EventType]) -> list[tuple[int, Event]]:
        expansion = self._expand(event_types)
        if expansion is not None and not expansion[0]:
            return []
        if expansion is None:
            raise ValueError("read_latest needs event types that do not match every type")
        rows = self._reader._conn.execute(schema.LATEST_TYPES_SEQ, (expansion[1],)).fetchall()
        events = _decode([row[1:] for row in rows], self._types)
        return [(row[0], event) for row, event in zip(rows, events, strict=True)]

    # -- retention and stats ---------------------------------------------------------

    async def enforce_retention(self) -> int:
        """Delete events per the `Retention` given to `open`; returns how many.

        Deletes in chunks of 2,000 events, one transaction each, so writes queued
        meanwhile get their turn. Each chunk repairs the latest-per-type table (a type
        whose latest event went falls back to its next newest, or disappears).
        `last_ids` and `last_seq` are untouched.
        """
        self._check_open()
        retention = self._retention
        total = 0
        if retention.max_age_seconds is not None:
            cutoff = time.time_ns() // 1000 - round(retention.max_age_seconds * _US)
            while True:
                n = await self._on_writer(
                    self._delete, schema.DELETE_OLDER, (cutoff, _RETENTION_CHUNK)
                )
                total += n
                if n < _RETENTION_CHUNK:
                    break
        if retention.max_events is not None:
            while (excess := self._event_count - retention.max_events) > 0:
                chunk = (min(excess, _RETENTION_CHUNK),)
                n = await self._on_writer(self._delete, schema.DELETE_FIRST, chunk)
                total += n
                if n == 0:  # the counter disagrees with the table; do not spin
                    break
        return total

    async def _on_writer(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run `fn` where writes run: inline (then yield, so chunks interleave) or on the thread."""
        async with self._write_lock:
            if self._inline:
                result = fn(*args)
                self._commits_since_checkpoint += 1
            else:
                return await _run(self._writer, fn, *args)
        await asyncio.sleep(0)
        return result

    def _delete(self, sql: str, args: tuple) -> int:
        conn = self._writer._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            deleted = conn.execute(sql, args).rowcount
            if deleted:
                for (type_id,) in conn.execute(schema.STALE_LATEST).fetchall():
                    newest = conn.execute(schema.NEWEST_OF_TYPE, (type_id,)).fetchall()
                    if newest:
                        conn.execute(schema.REPLACE_LATEST, (type_id, *newest[0]))
                    else:
                        conn.execute(schema.DELETE_LATEST, (type_id,))
                conn.execute(schema.DELETED_STATE, (deleted,))
            conn.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise StorageError(f"{self._path}: retention failed: {e}") from e
            raise
        self._event_count -= deleted
        return deleted

    async def stats(self) -> StorageStats:
        """Event count, database size on disk (file plus WAL) and last sequence number."""
        size = 0
        for suffix in ("", "-wal"):
            try:
                size += os.stat(f"{self._path}{suffix}").st_size
            except FileNotFoundError:
                pass
        return StorageStats(events=self._event_count, db_bytes=size, last_seq=self._last_seq)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self._path}: storage is closed")


def _diagnose(
    events: Sequence[Event], rows: list[tuple], inserted: list[tuple[int, Event]], error: Exception
) -> str:
    """Name the event whose row SQLite refused (only runs after a failed insert)."""
    for row, (_, event) in zip(rows, inserted, strict=True):
        problem = None
        for value in row[1:4]:
            if type(value) is not int or not _MIN_I64 <= value <= _MAX_I64:
                problem = f"id {value!r} is not a 64-bit integer"
        for value in row[8:]:
            if isinstance(value, str):
                try:
                    value.encode()
                except UnicodeError:
                    problem = "text is not valid UTF-8"
        if problem is not None:
            index = next(i for i, e in enumerate(events) if e is event)
            return f"{_describe(index, event)}: {problem}: {error}"
    return f"write of {len(rows)} events failed: {error}"
