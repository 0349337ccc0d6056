"""A store after an I/O error (`Storage.untrusted`): no more writes of any kind (commit,
fold, checkpoint, probe) until a restart, reads go on, and a read that meets a damaged
page names the earlier I/O error. Other faults (a full disk) recover in place.

The fault is injected: the writer's COMMIT raises "disk I/O error" and `faults.describe`
words it as the real one does (the e2e tests meet the real device)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import pytest
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadJson,
    QueryServerParams,
    QueryTimeseriesParams,
    Timestamp,
)
from eventfleet_server.storage import Storage, StorageFaultError, faults
from eventfleet_server.storage import backend as storage_backend
from eventfleet_server.storage import queries as storage_queries


def make_events(n: int, start: int = 1) -> list[Event]:
    return [
        Event(EventId(1, 1, i), ("a",), Timestamp(1_000 + i, 0), None, EventPayloadJson("1"))
        for i in range(start, start + n)
    ]


class FailingCommit:
    """The writer's sqlite3 connection, whose commits fail as on a device that fails
    its writes: a COMMIT, and an INSERT outside a transaction (a one-row write is its
    own transaction, `Storage._insert_alone`); everything else passes through."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __getattr__(self, name: str):
        return getattr(self._conn, name)

    def execute(self, sql: str, *args):
        if sql == "COMMIT" or (sql.startswith("INSERT") and not self._conn.in_transaction):
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)


@contextlib.contextmanager
def failing(storage: Storage, monkeypatch, cause: str):
    """Commits fail within the block, `faults.describe` naming `cause`."""
    monkeypatch.setattr(faults, "describe", lambda path, error: f"{cause} on {path}: injected")
    real = storage._writer._connection  # aiosqlite's, behind its `_conn`
    storage._writer._connection = FailingCommit(real)
    try:
        yield
    finally:
        storage._writer._connection = real


@contextlib.asynccontextmanager
async def opened(path, **kwargs):
    storage = await Storage.open(path, **kwargs)
    try:
        yield storage
    finally:
        await storage.close()


def count(path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT count(*) FROM events").fetchone()[0]


@pytest.fixture(autouse=True)
def no_background_fold(monkeypatch):
    monkeypatch.setattr(storage_backend, "_FOLD_INTERVAL", 3600)


async def test_an_io_error_stops_every_write_until_a_restart(tmp_path, monkeypatch, caplog):
    path = tmp_path / "events.sqlite"
    written = make_events(5)
    async with opened(path) as s:
        await s.write(written)
        assert s.untrusted is None
        with failing(s, monkeypatch, faults.EIO), pytest.raises(StorageFaultError):
            await s.write(make_events(3, start=6))
        # The device "works" again: still no write, the probe keeps failing.
        assert s.untrusted is not None and faults.EIO in s.untrusted
        assert str(path) in s.untrusted and "fsck" in s.untrusted
        for attempt in (
            s.write(make_events(1, start=9)),
            s.write([], {"key": 1}),
            s.probe_write(),
            s.fold(),
        ):
            with pytest.raises(StorageFaultError, match="no longer trusted"):
                await attempt
        assert count(path) == 5
        # Reads go on: everything committed before the error.
        got = await s.query(QueryServerParams(server_id=1, persisted=True))
        assert got.events == written
        got = await s.query(QueryTimeseriesParams(event_types=[("a",)]))
        assert sorted(got.events, key=lambda e: e.id.instance) == written
        logged = [r for r in caplog.records if "no longer trusted" in r.message]
        assert (
            len(logged) >= 1 and logged[0].levelname == "ERROR" and str(path) in logged[0].message
        )
    # A restart: trusted again (the operator checked the file system first).
    async with opened(path) as s:
        assert s.untrusted is None
        await s.write(make_events(2, start=6))
        assert count(path) == 7


async def test_a_full_disk_is_not_an_io_error_and_recovers_in_place(tmp_path, monkeypatch):
    path = tmp_path / "events.sqlite"
    async with opened(path) as s:
        with failing(s, monkeypatch, "no space left on device (ENOSPC)"):
            with pytest.raises(StorageFaultError, match="ENOSPC"):
                await s.write(make_events(3))
        assert s.untrusted is None
        monkeypatch.setattr(faults, "room_error", lambda path, size: None)
        await s.probe_write()
        await s.write(make_events(3))
        assert count(path) == 3


async def test_a_damaged_page_read_after_an_io_error_names_the_io_error(tmp_path, monkeypatch):
    path = tmp_path / "events.sqlite"
    async with opened(path) as s:
        await s.write(make_events(2))

        def malformed(*args):
            raise sqlite3.DatabaseError("database disk image is malformed")

        monkeypatch.setattr(storage_queries, "run", malformed)
        params = QueryServerParams(server_id=1, persisted=True)
        # Without an I/O error first it is a damaged store, as it was: not reworded.
        with pytest.raises(sqlite3.DatabaseError) as raised:
            await s.query(params)
        assert not isinstance(raised.value, StorageFaultError)
        with failing(s, monkeypatch, faults.EIO), pytest.raises(StorageFaultError):
            await s.write(make_events(1, start=3))
        with pytest.raises(StorageFaultError, match=r"query failed .*malformed.*no longer trusted"):
            await s.query(params)


async def test_the_syncers_reads_after_an_io_error_name_the_io_error(tmp_path, monkeypatch):
    """The reads a peer's catch-up and the Event BUS snapshot make are reworded the
    same way as queries (each reader method, made to meet a damaged page)."""
    path = tmp_path / "events.sqlite"
    async with opened(path) as s:
        await s.write(make_events(2))
        with failing(s, monkeypatch, faults.EIO), pytest.raises(StorageFaultError):
            await s.write(make_events(1, start=3))
        reads = {
            "_read_server": lambda: s.read_server(1, None, 10),
            "_read_since_seq": lambda: s.read_since_seq(0, 10),
            "_read_rows_since_seq": lambda: s.read_rows_since_seq(0, 10),
            "_read_bus_since_seq": lambda: s.read_bus_since_seq(0, 10),
        }
        for name, read in reads.items():

            def malformed(*args):
                raise sqlite3.DatabaseError("database disk image is malformed")

            with monkeypatch.context() as m:
                m.setattr(s, name, malformed)
                with pytest.raises(StorageFaultError, match=r"malformed.*no longer trusted"):
                    await read()
            assert await read() is not None  # the real read, unpatched: no damage here


async def test_no_checkpoint_after_an_io_error(tmp_path, monkeypatch):
    # NORMAL: inline commits, the WAL checkpointed from a task of its own.
    monkeypatch.setattr(storage_backend, "_CHECKPOINT_INTERVAL", 0.01)
    path = tmp_path / "events.sqlite"
    async with opened(path, synchronous="NORMAL") as s:
        checkpoints = 0
        checkpoint = s._checkpoint

        def counted() -> None:
            nonlocal checkpoints
            checkpoints += 1
            checkpoint()

        monkeypatch.setattr(s, "_checkpoint", counted)
        await s.write(make_events(2))
        await asyncio.sleep(0.1)
        assert checkpoints >= 1
        with failing(s, monkeypatch, faults.EIO), pytest.raises(StorageFaultError):
            await s.write(make_events(1, start=3))
        before = checkpoints
        s._commits_since_checkpoint = 1  # as if a commit had happened meanwhile
        await asyncio.sleep(0.1)
        assert checkpoints == before
