"""Event storage on SQLite through aiosqlite: the backend that owns the connections
and the transactions; the tables are modules of their own (see `schema`).

Transactions: every change goes through `Storage._transaction` (BEGIN IMMEDIATE,
COMMIT, ROLLBACK on any error, a failed SQLite call raised as `StorageError` naming
the file and the operation) — schema creation, migration, event writes, event keys
and retention alike.

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
automatic checkpoints disabled and a background task checkpoints (PASSIVE) on a third
connection with a thread of its own, so no fsync ever blocks the loop. Each checkpoint
ends with a short pass that holds writes, so that the WAL is wholly copied and the next
commit starts it over: under a steady load it would grow without bound otherwise. With
FULL or EXTRA every commit fsyncs, and writes go to the writer thread as described
below.

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
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import aiosqlite

from eventfleet_server.common.model import (
    Event,
    EventId,
    EventType,
    QueryLatestParams,
    QueryResult,
    QueryServerParams,
    QueryTimeseriesParams,
)
from eventfleet_server.storage import (
    event_keys,
    event_types,
    events,
    faults,
    indexes,
    last_ids,
    latest,
    merge_rows,
    multirow,
    queries,
    schema,
    state,
)
from eventfleet_server.storage.errors import (
    RESTORE_HINT,
    CorruptStoreError,
    SchemaVersionError,
    StorageError,
    StorageFaultError,
)

# The package (`eventfleet_server.storage`) is the public face; the errors live in `errors`.
__all__ = ["Retention", "SbsResult", "Storage", "StorageStats"]

_T = TypeVar("_T")
_US = 1_000_000
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
# Small enough that an inline chunk blocks the event loop only for milliseconds.
_RETENTION_CHUNK = 2_000
_CHECKPOINT_INTERVAL = 0.5  # seconds between PASSIVE checkpoints when inline writes are on
_WAL_SIZE_LIMIT = 64 << 20  # bytes a started-over WAL keeps (`journal_size_limit`)
# The fold (`Storage.fold`, `indexes`): how often the background pass runs, and
# the most rows one of its transactions takes (writes wait while it runs, on the writer's
# thread: ~20-30 ms for a chunk this size).
_FOLD_INTERVAL = 1.0
FOLD_CHUNK = 20_000

log = logging.getLogger(__name__)

# Batches above this many events are written on the writer thread even in inline mode,
# so that one large register request never holds the event loop for the whole insert.
INLINE_MAX_EVENTS = 500

# The `state` mark and `last_ids` are written every this many commits (and on every
# delete and meta write), not on every commit: two statements and two WAL pages saved
# per commit; start-up reads the events above the mark back (at most this many
# commits' or `MARK_EVERY_EVENTS` events' worth, one rowid range).
MARK_EVERY_COMMITS = 1_000
MARK_EVERY_EVENTS = 50_000

# A failing store counts as working again only with room for at least this much next
# to it (see `Storage.probe_write`): a few batches' worth, enough that a file system
# with a few kilobytes freed does not flap between ready and failing.
PROBE_MIN_BYTES = 1 << 20

# Why a store is not trusted after an I/O error (`Storage.untrusted`), after the cause.
UNTRUSTED = (
    "after this I/O error the store is no longer trusted: written pages whose write-back "
    "failed may be held only in memory, and the file system under it may be damaged; "
    "no more writes until a restart: stop the replica, check the file system (fsck) and "
    "start it again (docs/runbook.md, 'storage failing', I/O error)"
)


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


class SbsResult(NamedTuple):
    """A query answered with the stored SBS ``Event`` bytes of each event, in order."""

    events: list[bytes]
    more_follows: bool


def _run(conn: aiosqlite.Connection, fn: Callable[..., _T], *args: Any) -> Awaitable[_T]:
    # One queue hop to the connection's thread for a whole operation (see module doc).
    return conn._execute(fn, *args)


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
        disk. A store of an older schema version is migrated (`schema.migrate`); one of
        a newer version raises `SchemaVersionError` before anything changes.
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
        self._cache = event_types.TypeCache()
        self._last_ids: dict[int, EventId] = {}
        self._last_seq = 0
        self._event_count = 0
        # The `state` mark (`state`): its last_seq, the commits since it and the
        # last_ids rows raised since it (server -> (server, session, instance)).
        self._mark = 0
        self._commits_since_mark = 0
        self._unmarked_ids: dict[int, tuple[int, int, int]] = {}
        self._meta: dict[str, str] = {}
        self._bus_of_events: Callable[[Sequence[Event]], Sequence[bytes | None] | None] | None
        self._bus_of_rows: Callable[[list[list]], Sequence[bytes | None] | None] | None
        self._bus_of_events = self._bus_of_rows = None
        self.bus_recorder_failures = 0
        self._rows_may_carry_bus = False  # see `write_rows`

        sync = synchronous.upper()
        self._inline = sync in ("OFF", "NORMAL")
        self._quick_check_timeout = quick_check_timeout
        self._max_db_bytes = max_db_bytes
        self._commits_since_checkpoint = 0
        self._failed_write_bytes = 0
        self._checkpoint_task: asyncio.Task | None = None
        self._fold_task: asyncio.Task | None = None
        # Events up to this sequence number are in the folded indexes (`indexes`).
        self._folded_upto = 0
        self._fold_failing = False
        self._untrusted: str | None = None  # see `untrusted`
        self._checkpointer: aiosqlite.Connection | None = None
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
            # 128 statements: the writer's own few dozen, and `multirow.STATEMENTS` for
            # each of the three statements it inserts rows with.
            self._writer = await aiosqlite.connect(
                path, isolation_level=None, cached_statements=128, check_same_thread=False
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
            # Its own connection and thread: a checkpoint never waits behind a long
            # query, which matters while its last pass holds the writes.
            try:
                self._checkpointer = await aiosqlite.connect(path, isolation_level=None)
            except BaseException:
                await self._reader.close()
                await self._writer.close()
                raise
            self._checkpoint_task = asyncio.get_running_loop().create_task(self._checkpoint_loop())
        self._fold_task = asyncio.get_running_loop().create_task(self._fold_loop())
        return self

    # -- the one transaction helper ------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE on the writer connection; COMMIT when the block ends, ROLLBACK
        if it raises. A failed SQLite call (also the COMMIT) becomes `StorageError`
        ("<file>: <what> failed: ..."); other exceptions pass through unchanged."""
        if self._untrusted is not None:
            # Nothing more onto a device that lost writes (see `untrusted`).
            raise StorageFaultError(self._untrusted)
        conn = self._writer._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                cause = faults.describe(self._path, e)
                if cause is not None:
                    self._distrust_on_eio(cause)
                    raise StorageFaultError(cause) from e
                raise StorageError(f"{self._path}: {what} failed: {e}") from e
            raise

    @property
    def untrusted(self) -> str | None:
        """Why the store takes no writes until a restart, or None while it is sound.

        Set by the first I/O error (EIO) a write meets, for good. Linux marks pages whose
        write-back failed clean although they are not on the device, and reports the
        error to `fsync` once; on a device that loses writes (a thin volume whose pool ran
        out) the file system's own metadata goes too. Once the kernel evicts such pages,
        reads return zeros or stale data: acknowledged events gone and "database disk
        image is malformed", after a later `fsync` had succeeded. So no write (commit,
        fold, checkpoint, state mark) goes to the store any more, the engine's probe
        keeps failing, and recovery is a restart after the file system is checked.
        """
        return self._untrusted

    def _distrust_on_eio(self, cause: str) -> None:
        if self._untrusted is not None or not cause.startswith(faults.EIO):
            return
        self._untrusted = f"{cause}; {UNTRUSTED}"
        log.error("%s: %s", self._path, self._untrusted)

    # -- set-up ----------------------------------------------------------------------------

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
        if version not in (0, schema.SCHEMA_VERSION, *schema.MIGRATABLE):
            raise SchemaVersionError(self._path, version, schema.SCHEMA_VERSION)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StorageError(f"{self._path}: journal_mode WAL refused (got {mode!r})")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        if self._inline:
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # see "Inline writes" above
        # A WAL that a burst grew is cut back to this when it starts over.
        conn.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA cache_size = -32000")  # KiB
        if self._max_db_bytes:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {max(self._max_db_bytes // page_size, 1)}")
        if version != schema.SCHEMA_VERSION:
            # One transaction: a half-created or half-migrated schema is never committed.
            with self._transaction("schema creation" if version == 0 else "migration") as tx:
                if version == 0:
                    schema.create(tx)
                else:
                    schema.migrate(tx, version, self._path)
                tx.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION}")
        conn.execute(schema.EVENT_KEYS_DDL)

        self._cache.load(conn)
        self._last_seq, self._event_count, self._mark, self._meta = state.load(conn)
        self._folded_upto = int(self._meta.get(schema.FOLDED_UPTO_KEY, "0"))
        self._last_ids = last_ids.load(conn, self._mark)
        if self._last_seq != self._mark:
            # Events above the mark (a stop without a clean close): their ids go into
            # the table with the next mark.
            self._unmarked_ids = {s: (s, i.session, i.instance) for s, i in self._last_ids.items()}

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
        for task in (self._checkpoint_task, self._fold_task):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            await self._on_writer(self._mark_now)
        except Exception as e:
            # Nothing is lost: the next start reads the events above the mark back.
            log.warning("%s: could not write the state mark at close: %s", self._path, e)
        try:
            if self._checkpointer is not None:
                await self._checkpointer.close()
            await self._reader.close()
        finally:
            await self._writer.close()

    async def _checkpoint_loop(self) -> None:
        """Checkpoint the WAL from a thread of its own while inline writes are on."""
        while True:
            await asyncio.sleep(_CHECKPOINT_INTERVAL)
            if not self._commits_since_checkpoint or self._untrusted is not None:
                continue
            self._commits_since_checkpoint = 0
            try:
                # The bulk (both fsyncs, the copy) while commits go on ...
                await _run(self._checkpointer, self._checkpoint)
                # ... then the frames committed meanwhile, with writes held: the next
                # commit finds the whole WAL copied and starts it over from its first
                # frame. Without this pass a steady load never lets the WAL be fully
                # copied, so it grew without bound (878 MB after 30,000 one-event
                # commits) and every new block cost the kernel an allocation and a
                # zeroing (16 % of the replica's CPU at batch 1).
                async with self._write_lock:
                    await _run(self._checkpointer, self._checkpoint)
            except sqlite3.Error as e:
                log.warning("%s: WAL checkpoint failed (will retry): %s", self._path, e)

    # -- the folds (indexes, latest) --------------------------------------------------

    async def fold(self) -> None:
        """Put every event committed so far into the folded indexes and the ``latest``
        table (`indexes`, `latest.FOLD`), in transactions of at most `FOLD_CHUNK` rows
        on the writer's thread (the event loop goes on; writes wait for each chunk). A
        query that reads them calls this first (`fold_for_read`), so it never misses an
        event committed before it; a background pass does it every `_FOLD_INTERVAL` so
        that such a query seldom waits. Stops once what was committed when it was called
        is folded: under a steady load it does not chase the commits that arrive
        meanwhile."""
        target = self._last_seq
        while self._folded_upto < target:
            self._check_open()
            async with self._write_lock:
                await _run(self._writer, self._fold_chunk)

    async def fold_for_read(self) -> int | None:
        """Fold before a read of the folded tables: None once they hold every event
        committed before the call; the sequence number they go up to when the fold
        could not be written (a full disk): the reader then adds the events above it
        from ``events`` itself (`queries`)."""
        if self._last_seq <= self._folded_upto:
            return None
        try:
            await self.fold()
        except StorageError as e:
            # A store that takes no writes still answers reads, completely.
            self._fold_failed(e)
            return self._folded_upto
        return None

    def _fold_chunk(self) -> None:
        upto = min(self._last_seq, self._folded_upto + FOLD_CHUNK)
        if upto <= self._folded_upto:
            return
        with self._transaction("fold") as tx:
            self._fold_in(tx, upto)
        self._folded(upto)

    def _fold_in(self, tx: sqlite3.Connection, upto: int) -> None:
        span = (self._folded_upto, upto)
        for statement in indexes.FOLD:
            tx.execute(statement, span)
        tx.execute(latest.FOLD, span)
        state.set_meta(tx, [(schema.FOLDED_UPTO_KEY, str(upto))])

    def _folded(self, upto: int) -> None:
        """The in-memory state after a fold up to `upto` committed."""
        self._folded_upto = upto
        self._meta[schema.FOLDED_UPTO_KEY] = str(upto)

    async def _fold_loop(self) -> None:
        while True:
            await asyncio.sleep(_FOLD_INTERVAL)
            try:
                await self.fold()
            except StorageError as e:
                self._fold_failed(e)
            except Exception:
                # Not a store fault: a bug. Logged with its traceback; the pass goes on.
                log.exception("%s: fold failed", self._path)
            else:
                if self._fold_failing:
                    self._fold_failing = False
                    log.info("%s: folds work again", self._path)

    def _fold_failed(self, error: StorageError) -> None:
        # Once per failing period (a full disk fails every pass): the engine reports the
        # store's health; queries meanwhile answer without the per-type index.
        if not self._fold_failing:
            self._fold_failing = True
            log.warning(
                "%s: fold failed (retried every %g s; queries read the events not folded "
                "yet from the events table meanwhile): %s",
                self._path,
                _FOLD_INTERVAL,
                error,
            )

    def _checkpoint(self) -> None:
        assert self._checkpointer is not None  # inline mode opened it
        self._checkpointer._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

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

    @property
    def _types(self) -> list[EventType | None]:
        # type_id -> type; read by the Arrow export (`bulk`) and the Syncer's history.
        return self._cache.types

    def type_of(self, type_id: int) -> EventType:
        """The event type of a stored `type_id` (as returned by `read_server_stream`)."""
        return self._cache.types[type_id]  # type: ignore[return-value]

    async def get_meta(self, key: str) -> Any | None:
        """The JSON value stored under `key` by `write`, or None."""
        text = self._meta.get(key)
        return None if text is None else json.loads(text)

    # -- writing ---------------------------------------------------------------------

    async def write(
        self,
        events: Sequence[Event],
        meta: Mapping[str, Any] | None = None,
        *,
        encoded: Sequence[bytes] | None = None,
    ) -> list[tuple[int, Event]]:
        """Insert `events` and set `meta` keys in one transaction, committed on return.

        Events already held (same server id and instance) are skipped, so writing the
        same events again is a no-op. Each inserted event gets the next local sequence
        number (strictly increasing, never reused). Returns ``(seq, event)`` for the
        inserted events in the given order. All or nothing: on any error nothing is
        stored and `StorageError` names the bad event or meta key.

        `encoded`: the SBS ``Event`` bytes of each event when the caller has them (the
        engine builds them once for notifications and the reply); encoded here if not.
        """
        meta_items = self._meta_items(meta)
        if not events and not meta_items:
            return []
        self._check_write(events, encoded)
        async with self._write_lock:
            # Under the lock, on the loop's thread: the recorder reads protocol state.
            bus = self._bus_records(self._bus_of_events, events)
            if self._inline and len(events) <= INLINE_MAX_EVENTS:
                return self._write_inline(events, meta_items, encoded, bus)
            try:
                return await _run(self._writer, self._write, events, meta_items, encoded, bus)
            except StorageError:
                self._note_failed_write(encoded)
                raise

    def can_write_now(self, count: int) -> bool:
        """Whether `write_now` can commit `count` events at once on the loop's thread:
        inline mode (synchronous OFF/NORMAL), a batch small enough, no write in flight."""
        return self._inline and count <= INLINE_MAX_EVENTS and not self._write_lock.locked()

    def write_now(
        self,
        events: Sequence[Event],
        meta: Mapping[str, Any] | None = None,
        *,
        encoded: Sequence[bytes] | None = None,
    ) -> list[tuple[int, Event]]:
        """`write` without awaiting: committed on return, on the loop's thread. Only
        when `can_write_now` (raises `StorageError` otherwise); the engine's commit of
        small batches, which then needs no task switch."""
        meta_items = self._meta_items(meta)
        if not events and not meta_items:
            return []
        self._check_write(events, encoded)
        if not self.can_write_now(len(events)):
            raise StorageError(f"{self._path}: {len(events)} events cannot be written inline")
        bus = self._bus_records(self._bus_of_events, events)
        return self._write_inline(events, meta_items, encoded, bus)

    @staticmethod
    def _meta_items(meta: Mapping[str, Any] | None) -> list[tuple[str, str]]:
        meta_items: list[tuple[str, str]] = []
        for key, value in (meta or {}).items():
            if not isinstance(key, str):
                raise StorageError(f"meta key {key!r} is not a string")
            try:
                meta_items.append((key, json.dumps(value)))
            except (TypeError, ValueError) as e:
                raise StorageError(f"meta key {key!r}: value is not JSON: {e}") from e
        return meta_items

    def _check_write(self, events: Sequence[Event], encoded: Sequence[bytes] | None) -> None:
        if encoded is not None and len(encoded) != len(events):
            raise ValueError(f"{len(encoded)} encoded events for {len(events)} events")
        self._check_open()

    def _write_inline(
        self,
        events: Sequence[Event],
        meta_items: list[tuple[str, str]],
        encoded: Sequence[bytes] | None,
        bus: Sequence[bytes | None] | None,
    ) -> list[tuple[int, Event]]:
        try:
            inserted = self._write(events, meta_items, encoded, bus)
        except StorageError:
            self._note_failed_write(encoded)
            raise
        self._commits_since_checkpoint += 1
        return inserted

    def _note_failed_write(self, encoded: Sequence[bytes] | None) -> None:
        # What `probe_write` asks room for before calling the store healthy.
        size = sum(map(len, encoded)) if encoded is not None else 0
        self._failed_write_bytes = max(self._failed_write_bytes, size)

    async def write_rows(self, rows: list[list]) -> list[list]:
        """`write` for events received from peers as merge rows (`merge_rows`): the
        Syncer's catch-up path, which never builds a model object per event.

        Same contract as `write`: events already held are skipped, each inserted event
        gets the next sequence number, all or nothing, committed on return. Returns the
        inserted rows in order, their sequence number and type id filled in (read them
        back as events with `merged_events`). On error nothing is stored, the rows are as
        they were given, and `StorageError` says why.
        """
        if not rows:
            return []
        self._check_open()
        async with self._write_lock:
            # Rows with records get the BUS slot (`merge_rows.BUS`), taken off again if
            # the write fails (the rows go back as they were given); without records the
            # INSERT leaves the column NULL and the rows are not touched.
            if self._rows_may_carry_bus:
                for r in rows:  # rows given back by a cancelled write may have the slot
                    del r[merge_rows.BUS :]
            bus = self._bus_records(self._bus_of_rows, rows)
            if bus is not None:
                for r, record in zip(rows, bus, strict=True):
                    r.append(record)
            sql = events.INSERT if bus is not None else events.INSERT_NO_BUS
            try:
                if self._inline and len(rows) <= INLINE_MAX_EVENTS:
                    inserted = self._write_rows(rows, sql)
                    self._commits_since_checkpoint += 1
                    return inserted
                return await _run(self._writer, self._write_rows, rows, sql)
            except asyncio.CancelledError:
                # The writer thread may still be using the rows: their slot stays, and
                # later writes take such slots off first.
                if bus is not None:
                    self._rows_may_carry_bus = True
                raise
            except Exception as e:
                if bus is not None:
                    for r in rows:
                        del r[merge_rows.BUS :]
                if isinstance(e, StorageError):
                    size = sum(len(r[merge_rows.SBS]) for r in rows)
                    self._failed_write_bytes = max(self._failed_write_bytes, size)
                raise

    def merged_events(self, rows: list[list]) -> merge_rows.RowEvents:
        """The model events of rows `write_rows` returned (a sequence, built on first
        use)."""
        return merge_rows.RowEvents(rows, self._cache.types)

    async def room_problem(self) -> str | None:
        """None when `PROBE_MIN_BYTES` can be written and synced next to the store, else
        one line naming the cause (ENOSPC, EROFS, EIO) and the path."""
        self._check_open()
        return await asyncio.to_thread(faults.room_error, self._path, PROBE_MIN_BYTES)

    async def probe_write(self) -> None:
        """Does the store accept commits again? Room for twice the last failed write
        (at least `PROBE_MIN_BYTES`) next to the store, then one tiny committed write
        (a meta key). Raises `StorageError` naming the cause while either fails."""
        self._check_open()
        if self._untrusted is not None:
            raise StorageFaultError(self._untrusted)
        size = max(PROBE_MIN_BYTES, 2 * self._failed_write_bytes)
        problem = await asyncio.to_thread(faults.room_error, self._path, size)
        if problem is not None:
            raise StorageFaultError(problem)
        await self.write([], {"probe": time.time()})
        self._failed_write_bytes = 0

    def _write(
        self,
        batch: Sequence[Event],
        meta_items: list[tuple[str, str]],
        encoded: Sequence[bytes] | None,
        bus: Sequence[bytes | None] | None,
    ) -> list[tuple[int, Event]]:
        cache = self._cache
        type_ids = cache.ids
        last = self._last_ids
        new_types: list[int] = []
        rows: list[tuple] = []
        inserted: list[tuple[int, Event]] = []
        tops: dict[int, float] = {}  # highest instance per server seen in this batch
        top_sessions: dict[int, int] = {}  # the session of that event
        seen: set[tuple[int, int]] | None = None  # built only if an old id shows up
        seq = self._last_seq
        conn = self._writer._conn
        try:
            for index, event in enumerate(batch):
                try:
                    event_id = event.id
                    server = event_id.server
                    instance = event_id.instance
                    top = tops.get(server)
                    if top is None:
                        top = events.top_instance(last, server)
                    if instance > top:
                        # Above everything held for this server: new, no lookup needed.
                        tops[server] = instance
                        top_sessions[server] = event_id.session
                        if seen is not None:
                            seen.add((server, instance))
                    else:
                        if seen is None:
                            seen = {(row[1], row[3]) for row in rows}
                        if (server, instance) in seen or events.is_held(conn, server, instance):
                            continue
                        seen.add((server, instance))
                    type_id = type_ids.get(event.type)
                    if type_id is None:
                        type_id = cache.add(event.type, new_types)
                    seq += 1
                    rows.append(
                        events.row(
                            seq,
                            event,
                            type_id,
                            None if encoded is None else encoded[index],
                            None if bus is None else bus[index],
                        )
                    )
                    inserted.append((seq, event))
                except (TypeError, ValueError, AttributeError) as e:
                    raise StorageError(f"{events.describe(index, event)}: {e}") from e

            lids, marked = self._commit_rows(
                "write",
                events.INSERT,
                rows,
                new_types,
                tops,
                top_sessions,
                meta_items,
                lambda e: events.diagnose(batch, rows, inserted, e),
            )
        except BaseException:
            cache.burn(new_types)
            raise
        self._committed(seq, len(rows), lids, meta_items, marked)
        return inserted

    def _write_rows(self, rows: list[list], sql: str) -> list[list]:
        # `_write` for merge rows; the loop is the same, over list items. `sql`: the
        # INSERT for rows with or without the BUS slot.
        cache = self._cache
        type_ids = cache.ids
        last = self._last_ids
        new_types: list[int] = []
        out: list[list] = []
        tops: dict[int, float] = {}  # highest instance per server seen in this batch
        top_sessions: dict[int, int] = {}  # the session of that event, if it raised the top
        seen: set[tuple[int, int]] | None = None  # built only if an old id shows up
        seq = self._last_seq
        conn = self._writer._conn
        try:
            server = None
            top = -math.inf
            for r in rows:
                if r[1] != server:
                    if server is not None:
                        tops[server] = top
                    server = r[1]
                    top = tops.get(server)
                    if top is None:
                        top = events.top_instance(last, server)
                instance = r[3]
                if instance > top:
                    # Above everything held for this server: new, no lookup needed.
                    top = instance
                    top_sessions[server] = r[2]
                    if seen is not None:
                        seen.add((server, instance))
                else:
                    if seen is None:
                        seen = {(o[1], o[3]) for o in out}
                    if (server, instance) in seen or events.is_held(conn, server, instance):
                        continue
                    seen.add((server, instance))
                type_id = type_ids.get(r[4])
                if type_id is None:
                    try:
                        type_id = cache.add(r[4], new_types)
                    except TypeError as e:
                        raise StorageError(f"event {tuple(r[1:4])}: {e}") from e
                seq += 1
                r[0] = seq
                r[4] = type_id
                out.append(r)
            if server is not None:
                tops[server] = top

            lids, marked = self._commit_rows(
                "merge",
                sql,
                out,
                new_types,
                tops,
                top_sessions,
                [],
                lambda e: f"merge of {len(out)} events failed: {e}",
            )
        except BaseException:
            # The rows go back as given (a retry writes them again), then the new ids go.
            types = cache.types
            for r in out:
                r[0] = None
                if type(r[4]) is int:
                    r[4] = types[r[4]]
            cache.burn(new_types)
            raise
        self._committed(seq, len(out), lids, [], marked)
        return out

    def _commit_rows(
        self,
        what: str,
        sql: str,
        rows: Sequence[Sequence],
        new_types: list[int],
        tops: dict[int, float],
        top_sessions: dict[int, int],
        meta_items: list[tuple[str, str]],
        diagnose: Callable[[Exception], str],
    ) -> tuple[list[tuple[int, int, int]], bool]:
        """The one transaction of every event write: the new types, the rows (`sql`:
        `events.INSERT` or `events.INSERT_NO_BUS`; sequence numbers ascending), the
        latest-per-type table and the meta keys; the state mark and `last_ids` when one
        is due (`MARK_EVERY_COMMITS`, with meta keys). Returns the `last_ids` rows this
        batch raised (servers whose top `top_sessions` names, ``tops`` holding the
        instance) and whether the mark was written.

        Raises `StorageFaultError` when the file system refused (full, read-only, I/O
        error), else `StorageError` with `diagnose(error)` for a refused row; nothing is
        stored then. In-memory state is the caller's to change (`_committed`) after
        this returns.

        The rows go in as multi-row statements (`multirow.insert`), so the writer thread
        does not wait for the GIL once per row while the loop runs Python."""
        if len(rows) == 1 and not new_types and not meta_items and not self._mark_due(1):
            self._insert_alone(sql, rows[0], diagnose)
            return [(srv, ses, int(tops[srv])) for srv, ses in top_sessions.items()], False
        lids: list[tuple[int, int, int]] = []
        with self._transaction(what) as tx:
            self._cache.insert(tx, new_types)
            if rows:
                try:
                    multirow.insert(tx, sql, rows)
                except sqlite3.Error as e:
                    # The file system (full, read-only, I/O error) before the rows.
                    cause = faults.describe(self._path, e)
                    if cause is not None:
                        raise StorageFaultError(cause) from e
                    raise StorageError(diagnose(e)) from e
                except (OverflowError, UnicodeError) as e:
                    raise StorageError(diagnose(e)) from e
                # The servers whose highest id this batch raised, known from the caller's
                # walk: no GROUP BY over the batch's rows (18 µs of a 140 µs batch-1
                # commit).
                lids = [(srv, ses, int(tops[srv])) for srv, ses in top_sessions.items()]
            marked = bool(meta_items) or self._mark_due(len(rows))
            if marked:
                self._write_mark(
                    tx,
                    rows[-1][0] if rows else self._last_seq,
                    self._event_count + len(rows),
                    lids,
                )
            if meta_items:
                state.set_meta(tx, meta_items)
        return lids, marked

    def _insert_alone(self, sql: str, row: Sequence, diagnose: Callable[[Exception], str]) -> None:
        """`_commit_rows` of one row when nothing else is due: the INSERT is its own
        transaction (the connection is in autocommit mode; SQLite takes the write lock
        when the statement starts and commits when it ends). One statement where
        ``BEGIN IMMEDIATE``, the INSERT and ``COMMIT`` were three: the batch-1
        registration's commit, ~30 -> ~25 µs of CPU (docs/performance.md, run AG). Errors
        as `_transaction` and `_commit_rows` give them."""
        if self._untrusted is not None:
            raise StorageFaultError(self._untrusted)
        conn = self._writer._conn
        try:
            conn.execute(sql, row)
        except sqlite3.Error as e:
            if conn.in_transaction:  # not left open by a failed autocommit statement
                conn.execute("ROLLBACK")
            cause = faults.describe(self._path, e)
            if cause is not None:
                self._distrust_on_eio(cause)
                raise StorageFaultError(cause) from e
            raise StorageError(diagnose(e)) from e
        except (OverflowError, UnicodeError) as e:
            raise StorageError(diagnose(e)) from e

    def _mark_due(self, count: int) -> bool:
        return (
            self._commits_since_mark + 1 >= MARK_EVERY_COMMITS
            or self._last_seq + count - self._mark >= MARK_EVERY_EVENTS
        )

    def _write_mark(
        self,
        tx: sqlite3.Connection,
        last_seq: int,
        event_count: int,
        lids: Sequence[tuple[int, int, int]] = (),
    ) -> None:
        """The state mark and the `last_ids` raised since the last one (`lids`: also
        those of the caller's batch), in the caller's transaction."""
        raised = self._unmarked_ids
        if lids:
            raised = {**raised, **{row[0]: row for row in lids}}
        if raised:
            last_ids.update(tx, list(raised.values()))
        state.set_mark(tx, last_seq, event_count)

    def _committed(
        self,
        seq: int,
        count: int,
        lids: list[tuple[int, int, int]],
        meta_items: list[tuple[str, str]],
        marked: bool,
    ) -> None:
        """The in-memory state after `_commit_rows` committed."""
        self._last_seq = seq
        self._event_count += count
        last = self._last_ids
        for server, session, instance in lids:
            last[server] = EventId(server, session, instance)
        if marked:
            self._marked(seq)
        else:
            self._commits_since_mark += 1
            for row in lids:
                self._unmarked_ids[row[0]] = row
        for key, value in meta_items:
            self._meta[key] = value

    # -- the Event BUS's records (events.bus) ----------------------------------------

    def set_bus_recorder(
        self,
        of_events: Callable[[Sequence[Event]], Sequence[bytes | None] | None] | None,
        of_rows: Callable[[list[list]], Sequence[bytes | None] | None] | None,
    ) -> None:
        """Fill the ``bus`` column at commit (see `events`): before every write, on the
        loop's thread, `of_events` gets the events `write`/`write_now` are given and
        `of_rows` the merge rows `write_rows` is given; each returns one record (bytes)
        or None per item, aligned, or None for "no records". What the write inserts is
        stored with its record in the same `INSERT`. A recorder that raises is logged and
        its write stores no records (readers build them from the columns then). None
        removes a recorder."""
        self._bus_of_events = of_events
        self._bus_of_rows = of_rows

    def _bus_records(
        self, recorder: Callable[[Any], Sequence[bytes | None] | None] | None, items: Sequence
    ) -> Sequence[bytes | None] | None:
        if recorder is None or not items:
            return None
        try:
            records = recorder(items)
            if records is not None and len(records) != len(items):
                raise ValueError(f"{len(records)} records for {len(items)} events")
        except Exception:
            self.bus_recorder_failures += 1
            if self.bus_recorder_failures == 1:
                log.exception("%s: BUS recorder failed; writing without records", self._path)
            return None
        return records

    async def read_bus_since_seq(
        self, seq: int, limit: int
    ) -> tuple[list[tuple[int, int, bytes | None]], dict[int, tuple]]:
        """The Event BUS snapshot's rows: up to `limit` ``(seq, type_id, record)`` with
        sequence number above `seq`, ascending (`type_of` names a type id), and for the
        rows whose `record` is None (`set_bus_recorder` stored none) their columns by seq:
        ``(server, session, instance, timestamp_us, source_timestamp_us, payload_type,
        payload_data)`` as `read_rows_since_seq` gives them."""
        self._check_open()
        return await self._read(self._read_bus_since_seq, seq, limit)

    def _read_bus_since_seq(
        self, seq: int, limit: int
    ) -> tuple[list[tuple[int, int, bytes | None]], dict[int, tuple]]:
        conn = self._reader._conn
        rows = conn.execute(events.BUS_SINCE_SEQ, (seq, max(limit, 0))).fetchall()
        missing = [r[0] for r in rows if r[2] is None]
        columns: dict[int, tuple] = {}
        if missing:
            for r in conn.execute(events.BUS_COLUMNS, (json.dumps(missing),)):
                columns[r[0]] = r[1:]
        return rows, columns

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
        events follow the page. Cost is O(page) index range scans (see `queries`).
        """
        rows = await self._query(params, max_results_cap, events.COLS)
        return QueryResult(events.decode(rows.rows, self._cache.types), rows.more_follows)

    async def query_sbs(
        self,
        params: QueryLatestParams | QueryTimeseriesParams | QueryServerParams,
        *,
        max_results_cap: int = 10_000,
    ) -> SbsResult:
        """`query`, answered with the stored SBS ``Event`` bytes of each event (what the
        Eventer sends): no model object per event."""
        rows = await self._query(params, max_results_cap, queries.SBS)
        return SbsResult([row[0] for row in rows.rows], rows.more_follows)

    async def _query(self, params: Any, cap: int, cols: str) -> queries.Rows:
        if not isinstance(cap, int) or cap < 1:
            raise ValueError(f"max_results_cap {cap!r} must be an integer >= 1")
        if not isinstance(params, QueryLatestParams | QueryTimeseriesParams | QueryServerParams):
            raise TypeError(f"query params {params!r} are not a query")
        self._check_open()
        folded = await self.fold_for_read() if queries.reads_folded(params) else None
        return await self._read(
            queries.run, self._reader._conn, self._cache, params, cap, cols, folded, what="query"
        )

    async def _read(self, fn: Callable[..., _T], *args: Any, what: str = "") -> _T:
        """`fn(*args)` on the reader's thread. After an I/O error (`untrusted`) a read
        that meets a damaged page says so, naming that error, not only "malformed"."""
        try:
            return await _run(self._reader, fn, *args)
        except sqlite3.DatabaseError as e:
            if self._untrusted is None:
                raise
            # Expected after an I/O error: pages the kernel dropped read back wrong.
            what = what or fn.__name__.lstrip("_")
            raise StorageFaultError(f"{self._path}: {what} failed ({e}): {self._untrusted}") from e

    async def read_server(self, server_id: int, after: EventId | None, limit: int) -> list[Event]:
        """Up to `limit` events of `server_id` with instance above ``after.instance``
        (all if `after` is None), ascending (session, instance)."""
        self._check_open()
        return await self._read(self._read_server, server_id, after, limit)

    def _read_server(self, server_id: int, after: EventId | None, limit: int) -> list[Event]:
        rows = self._reader._conn.execute(
            events.SERVER,
            (server_id, events.MIN_I64 if after is None else after.instance, max(limit, 0)),
        ).fetchall()
        return events.decode(rows, self._cache.types)

    async def newest_of_server(self, server_id: int) -> tuple[int, int, int] | None:
        """``(session, instance, timestamp_us)`` of the stored event of `server_id` with
        the highest instance, None if none is stored (retention may have deleted it:
        `last_ids` keeps the id, not the timestamp)."""
        self._check_open()
        return await self._read(self._newest_of_server, server_id)

    def _newest_of_server(self, server_id: int) -> tuple[int, int, int] | None:
        row = self._reader._conn.execute(last_ids.NEWEST_OF_SERVER, (server_id,)).fetchone()
        return None if row is None else tuple(row)

    async def read_server_stream(
        self, server_id: int, after_instance: int, limit: int
    ) -> list[tuple[int, int, int, bytes]]:
        """Up to `limit` ``(session, instance, type_id, sbs)`` of the events of
        `server_id` with instance above `after_instance`, ascending: the Syncer's
        history, sent as stored (`type_of` names a type id)."""
        self._check_open()
        return await self._read(self._read_server_stream, server_id, after_instance, limit)

    def _read_server_stream(self, server_id: int, after: int, limit: int) -> list[tuple]:
        return self._reader._conn.execute(
            events.SERVER_STREAM, (server_id, after, max(limit, 0))
        ).fetchall()

    async def read_since_seq(self, seq: int, limit: int) -> list[tuple[int, Event]]:
        """Up to `limit` ``(seq, event)`` with local sequence number above `seq`,
        ascending. For the Event BUS and Replication."""
        self._check_open()
        return await self._read(self._read_since_seq, seq, limit)

    def _read_since_seq(self, seq: int, limit: int) -> list[tuple[int, Event]]:
        rows = self._reader._conn.execute(events.SINCE_SEQ, (seq, max(limit, 0))).fetchall()
        decoded = events.decode([row[1:] for row in rows], self._cache.types)
        return [(row[0], event) for row, event in zip(rows, decoded, strict=True)]

    async def read_rows_since_seq(self, seq: int, limit: int) -> list[tuple]:
        """`read_since_seq` without model objects, for bulk readers that re-encode
        every event anyway (the Event BUS snapshot): up to `limit` rows ``(seq, server,
        session, instance, type, timestamp_us, source_timestamp_us, payload_type,
        payload_data)`` with local sequence number above `seq`, ascending. `type` is the
        event type tuple; `source_timestamp_us` may be None; the payload is JSON text
        (`payload_type` None, data str), binary (`payload_type` str, data bytes) or
        absent (both None)."""
        self._check_open()
        return await self._read(self._read_rows_since_seq, seq, limit)

    def _read_rows_since_seq(self, seq: int, limit: int) -> list[tuple]:
        rows = self._reader._conn.execute(events.SINCE_SEQ, (seq, max(limit, 0))).fetchall()
        types = self._types
        return [
            (seq, server, session, instance, types[type_id], ts, sts, ptype, data)
            for seq, server, session, instance, type_id, ts, sts, _kind, ptype, data in rows
        ]

    # -- event keys (protocol indexes, e.g. the Event BUS UUID) ------------------------

    @property
    def event_keys_seq(self) -> int:
        """Local sequence number up to which `add_event_keys` was told it has indexed."""
        text = self._meta.get(event_keys.META_KEY)
        return 0 if text is None else int(json.loads(text))

    async def add_event_keys(self, items: Sequence[tuple[str, int]], upto_seq: int) -> None:
        """Store ``(key, seq)`` pairs (a key already held keeps its first seq) and record
        that events up to `upto_seq` are indexed; one transaction."""
        self._check_open()
        await self._on_writer(self._add_event_keys, list(items), upto_seq)

    def _add_event_keys(self, items: list[tuple[str, int]], upto_seq: int) -> None:
        value = json.dumps(max(upto_seq, self.event_keys_seq))
        with self._transaction("event keys write") as tx:
            multirow.insert(tx, event_keys.INSERT, items)
            state.set_meta(tx, [(event_keys.META_KEY, value)])
        self._meta[event_keys.META_KEY] = value

    async def find_event_keys(self, keys: Sequence[str]) -> dict[str, int]:
        """The held keys among `keys`, with the sequence number of their event."""
        self._check_open()
        if not keys:
            return {}
        return await self._read(self._find_event_keys, json.dumps(list(keys)))

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
        rows = self._writer._conn.execute(event_keys.FIND, (json.dumps(list(keys)),))
        return dict(rows.fetchall())

    def _find_event_keys(self, keys_json: str) -> dict[str, int]:
        return dict(self._reader._conn.execute(event_keys.FIND, (keys_json,)).fetchall())

    async def read_latest(self, event_types: list[EventType]) -> list[tuple[int, Event]]:
        """``(seq, event)`` of the latest event of every stored type matching
        `event_types`, with the local sequence number at which it was stored (the
        latest-per-type table, like a ``latest`` query). For Replication's row index."""
        self._check_open()
        folded = await self.fold_for_read()
        return await self._read(self._read_latest, event_types, folded)

    def _read_latest(
        self, event_types: list[EventType], folded: int | None
    ) -> list[tuple[int, Event]]:
        expansion = self._cache.expand(event_types)
        if expansion is not None and not expansion[0]:
            return []
        if expansion is None:
            raise ValueError("read_latest needs event types that do not match every type")
        sql = latest.query_sql(f"seq, {latest.EVENTS_COLS}", types=True, tail=folded is not None)
        args = {"types": expansion[1], "folded": folded}
        rows = self._reader._conn.execute(sql, args).fetchall()
        decoded = events.decode([row[1:] for row in rows], self._cache.types)
        return [(row[0], event) for row, event in zip(rows, decoded, strict=True)]

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
                    self._delete, events.DELETE_OLDER, (cutoff, _RETENTION_CHUNK)
                )
                total += n
                if n < _RETENTION_CHUNK:
                    break
        if retention.max_events is not None:
            while (excess := self._event_count - retention.max_events) > 0:
                chunk = (min(excess, _RETENTION_CHUNK),)
                n = await self._on_writer(self._delete, events.DELETE_FIRST, chunk)
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
        with self._transaction("retention") as tx:
            # Folded first: a delete by age reads the timestamp index, the repair a
            # type's next newest event in the per-type index (`indexes`), and the
            # trigger takes the deleted events' entries along.
            folded = self._last_seq > self._folded_upto
            if folded:
                self._fold_in(tx, self._last_seq)
            deleted = tx.execute(sql, args).rowcount
            if deleted:
                latest.repair(tx)
                # Nothing above the mark may be deleted (`state`): the mark moves to now.
                self._write_mark(tx, self._last_seq, self._event_count - deleted)
        self._event_count -= deleted
        if folded:
            self._folded(self._last_seq)
        if deleted:
            self._marked(self._last_seq)
        return deleted

    def _marked(self, seq: int) -> None:
        self._mark = seq
        self._commits_since_mark = 0
        self._unmarked_ids = {}

    def _mark_now(self) -> None:
        """Write the mark if events were committed since the last one (a clean close:
        the next start reads nothing back)."""
        if self._last_seq == self._mark and not self._unmarked_ids:
            return
        with self._transaction("state mark") as tx:
            self._write_mark(tx, self._last_seq, self._event_count)
        self._marked(self._last_seq)

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
