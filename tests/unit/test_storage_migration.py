"""Storage schema version 2 (stored SBS bytes): a store written by the release before
it is migrated on first start, all or nothing; a newer store is still refused.

`tests/fixtures/storage-v1.sqlite` was written by that release's own storage code
(schema version 1: two server ids, three sessions each, JSON/binary/no payloads, with
and without source timestamps, a retention pass that deleted the oldest 8 events, meta
and event keys)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Order,
    QueryLatestParams,
    QueryServerParams,
    QueryTimeseriesParams,
    Timestamp,
)
from eventfleet_server.storage import SchemaVersionError, Storage, StorageError, schema

ASCENDING = QueryTimeseriesParams(order=Order.ASCENDING)
FIXTURE = Path(__file__).parent.parent / "fixtures" / "storage-v1.sqlite"


def _v1_events(path: Path) -> list[Event]:
    """The events of a version-1 file read with plain sqlite3 (not the storage code)."""
    with closing(sqlite3.connect(path)) as conn:
        types = {
            i: tuple(json.loads(t)) for i, t in conn.execute("SELECT type_id, type FROM types")
        }
        out = []
        for server, session, instance, type_id, ts, sts, kind, ptype, data in conn.execute(
            "SELECT server, session, instance, type_id, ts, source_ts, kind, ptype, payload"
            " FROM events ORDER BY ts, server, session, instance"
        ):
            payload = (
                EventPayloadJson(data)
                if kind == 2
                else EventPayloadBinary(ptype, data)
                if kind == 1
                else None
            )
            source = None if sts is None else Timestamp(*divmod(sts, 1_000_000))
            out.append(
                Event(
                    EventId(server, session, instance),
                    types[type_id],
                    Timestamp(*divmod(ts, 1_000_000)),
                    source,
                    payload,
                )
            )
        return out


def _latest_seqs(path: Path) -> list[tuple]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT * FROM latest ORDER BY type_id").fetchall()


@pytest.fixture
def v1_store(tmp_path) -> Path:
    path = tmp_path / "store" / "events.sqlite"
    path.parent.mkdir()
    shutil.copyfile(FIXTURE, path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    return path


async def test_a_version_1_store_is_migrated_on_open_and_answers_as_before(v1_store):
    before = _v1_events(v1_store)
    latest_before = _latest_seqs(v1_store)
    assert len(before) == 40 and any(e.source_timestamp for e in before)
    assert {type(e.payload) for e in before} == {EventPayloadJson, EventPayloadBinary, type(None)}

    s = await Storage.open(v1_store)
    try:
        assert s.last_seq == 48
        assert s.last_ids == {1: EventId(1, 3, 24), 2: EventId(2, 3, 48)}
        assert await s.get_meta("own_last") == [3, 30, 0]
        assert s.event_keys_seq == 2
        assert await s.find_event_keys(["uuid-1", "uuid-2", "nope"]) == {"uuid-1": 1, "uuid-2": 2}

        result = await s.query(ASCENDING)
        assert result.events == before
        # Every event got its stored bytes, equal to encoding it now.
        encoded = await s.query_sbs(ASCENDING)
        assert encoded.events == [codec.encode_event(e) for e in before]
        for server in (1, 2):
            got = await s.query_sbs(QueryServerParams(server))
            assert [codec.repo.decode("HatEventer.Event", b) for b in got.events] == [
                codec.event_to_sbs(e)
                for e in sorted(before, key=lambda e: e.id.instance)
                if e.id.server == server
            ]
        latest = await s.query_sbs(QueryLatestParams())
        assert len(latest.events) == len(latest_before)

        # It goes on as a version-3 store: new events, the same answers shape.
        new = Event(EventId(1, 9, 100), ("a", "new"), Timestamp(1_800_000_000, 0), None, None)
        assert await s.write([new]) == [(49, new)]
        assert (await s.query_sbs(QueryLatestParams([("a", "new")]))).events == [
            codec.encode_event(new)
        ]
    finally:
        await s.close()

    with closing(sqlite3.connect(v1_store)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 3
        assert conn.execute("SELECT count(*) FROM events WHERE length(sbs) = 0").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM events WHERE bus IS NOT NULL").fetchone() == (0,)
    assert _latest_seqs(v1_store)[: len(latest_before)] == latest_before

    # Opened again: no second migration, the same answers.
    s = await Storage.open(v1_store)
    try:
        assert (await s.query(ASCENDING)).events[:40] == before
    finally:
        await s.close()


async def test_a_failed_migration_leaves_the_version_1_store_untouched(v1_store, monkeypatch):
    original = v1_store.read_bytes()

    def broken_encode(event):
        raise sqlite3.OperationalError("disk I/O error (injected)")

    monkeypatch.setattr("eventfleet_server.storage.events.encode", broken_encode)
    with pytest.raises(StorageError, match="migration failed: disk I/O error"):
        await Storage.open(v1_store)
    with closing(sqlite3.connect(v1_store)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        columns = [row[1] for row in conn.execute("PRAGMA table_info(events)")]
        assert "sbs" not in columns and "bus" not in columns
    assert _v1_events(v1_store) == _v1_events_of_bytes(original, v1_store.parent)

    monkeypatch.undo()
    s = await Storage.open(v1_store)  # and a later start migrates it
    try:
        assert len((await s.query(ASCENDING)).events) == 40
    finally:
        await s.close()


def _v1_events_of_bytes(data: bytes, folder: Path) -> list[Event]:
    copy = folder / "original.sqlite"
    copy.write_bytes(data)
    return _v1_events(copy)


async def test_a_newer_store_is_still_refused_before_anything_changes(tmp_path):
    path = tmp_path / "newer.sqlite"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    original = path.read_bytes()
    with pytest.raises(SchemaVersionError, match=r"version 4 is newer than this replica's 3"):
        await Storage.open(path)
    assert path.read_bytes() == original
