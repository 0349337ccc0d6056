"""Storage schema migrations: a store written by an earlier release is migrated on first
start, all or nothing (version 1 -> stored SBS bytes; versions 3 and 4 -> the per-type
index as a table of its own, ``events_by_type``); a newer store is still refused.

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
from eventfleet_server.storage import Retention, SchemaVersionError, Storage, StorageError, schema

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


def _store_copy(tmp_path: Path, fixture: Path, version: int) -> Path:
    """A copy of `fixture` (a store of schema `version`) where a replica keeps its store."""
    path = tmp_path / "store" / "events.sqlite"
    path.parent.mkdir()
    shutil.copyfile(fixture, path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == version
    return path


@pytest.fixture
def v1_store(tmp_path) -> Path:
    return _store_copy(tmp_path, FIXTURE, 1)


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

        # It goes on as a current store: new events, the same answers shape.
        new = Event(EventId(1, 9, 100), ("a", "new"), Timestamp(1_800_000_000, 0), None, None)
        assert await s.write([new]) == [(49, new)]
        assert (await s.query_sbs(QueryLatestParams([("a", "new")]))).events == [
            codec.encode_event(new)
        ]
    finally:
        await s.close()

    with closing(sqlite3.connect(v1_store)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 5
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
    newer = schema.SCHEMA_VERSION + 1
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {newer}")
    original = path.read_bytes()
    with pytest.raises(
        SchemaVersionError,
        match=rf"version {newer} is newer than this replica.s {schema.SCHEMA_VERSION}",
    ):
        await Storage.open(path)
    assert path.read_bytes() == original


# -- versions 3 and 4 -> 5: the folded index tables (indexes) ------------------------

# Written by the schema-3 release: the version-1 fixture migrated by it, then six events
# of types ("a", "v3", "0") / ("a", "v3", "1") (sequence numbers 49-54).
V3_FIXTURE = Path(__file__).parent.parent / "fixtures" / "storage-v3.sqlite"
V3_TYPES = [("a", "v3", "0"), ("a", "v3", "1")]
# Written by the schema-4 release: the version-3 fixture migrated by it, then six events
# of types ("a", "v4", "0") / ("a", "v4", "1") (sequence numbers 55-60), of which 55-57
# were folded into its partial index (``typed`` 1) and 58-60 were not (``typed`` 0).
V4_FIXTURE = Path(__file__).parent.parent / "fixtures" / "storage-v4.sqlite"
V4_TYPES = [("a", "v4", "0"), ("a", "v4", "1")]


@pytest.fixture
def v3_store(tmp_path) -> Path:
    return _store_copy(tmp_path, V3_FIXTURE, 3)


@pytest.fixture
def v4_store(tmp_path) -> Path:
    return _store_copy(tmp_path, V4_FIXTURE, 4)


def _index_names(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


FOLDED = ("events_by_ts", "events_by_source_ts", "events_by_type")


def _assert_migrated_to_v5(path: Path, events: int, top: int) -> None:
    """Version 5 on disk: the old indexes gone, every event in the folded index tables
    with its key and seq, all folded up to `top`."""
    names = _index_names(path)
    assert not names & {"events_ts", "events_source_ts", "events_type_ts"}
    assert {*FOLDED, "events_folded_delete", "events_id"} <= names
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 5
        with_source = conn.execute(
            "SELECT count(*) FROM events WHERE source_ts IS NOT NULL"
        ).fetchone()[0]
        assert 0 < with_source < events  # the fixtures have both kinds
        for table in FOLDED:
            expected = with_source if table == "events_by_source_ts" else events
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (expected,)
            assert conn.execute(
                f"SELECT count(*) FROM events JOIN {table} t USING (seq) WHERE"
                " (events.type_id, events.ts, events.server, events.session, events.instance)"
                " = (t.type_id, t.ts, t.server, t.session, t.instance)"
            ).fetchone() == (expected,)
        # `latest` agrees with the events it points at, one row per type.
        assert (
            conn.execute(
                "SELECT count(*) FROM latest JOIN events USING (seq)"
                " WHERE latest.type_id = events.type_id"
            ).fetchone()
            == conn.execute("SELECT count(DISTINCT type_id) FROM events").fetchone()
        )
        assert conn.execute(
            "SELECT value FROM meta WHERE key = ?", (schema.FOLDED_UPTO_KEY,)
        ).fetchone() == (str(top),)
        assert conn.execute("SELECT value FROM meta WHERE key = 'typed_upto'").fetchone() is None


async def _type_queries_answer_as_before(path: Path, types: list, last_seq: int) -> None:
    before = _v1_events(path)  # the same columns in versions 3 and 4
    typed = [e for e in before if e.type in types]
    assert len(typed) == 6
    s = await Storage.open(path)
    try:
        assert s.last_seq == last_seq
        for t in types:
            got = await s.query(QueryTimeseriesParams(event_types=[t], order=Order.ASCENDING))
            assert got.events == [e for e in typed if e.type == t]
        got = await s.query(QueryTimeseriesParams(event_types=types, order=Order.DESCENDING))
        assert got.events == typed[::-1]
        assert (await s.query(ASCENDING)).events == before
        # New rows wait outside the index until a fold; a type query still sees them.
        new = Event(EventId(1, 30, 400), types[1], Timestamp(1_990_000_000, 0), None, None)
        await s.write([new])
        got = await s.query(QueryTimeseriesParams(event_types=[types[1]], order=Order.ASCENDING))
        assert got.events == [e for e in typed if e.type == types[1]] + [new]
    finally:
        await s.close()
    _assert_migrated_to_v5(path, len(before) + 1, last_seq + 1)


async def test_a_version_3_store_is_migrated_and_its_type_queries_answer_as_before(v3_store):
    assert len(_v1_events(v3_store)) == 46
    await _type_queries_answer_as_before(v3_store, V3_TYPES, 54)


async def test_a_version_4_store_is_migrated_with_its_unfolded_rows(v4_store):
    with closing(sqlite3.connect(v4_store)) as conn:
        # The fixture is what it says: some rows were not folded by the release.
        assert conn.execute("SELECT seq FROM events WHERE typed = 0").fetchall() == [
            (58,),
            (59,),
            (60,),
        ]
    assert len(_v1_events(v4_store)) == 52
    await _type_queries_answer_as_before(v4_store, V4_TYPES, 60)


async def test_retention_after_the_migration_takes_the_index_entries_along(v4_store):
    # The per-type index table must not keep entries of deleted events: a type whose
    # events are all gone answers nothing, and `latest` falls back to what is left.
    s = await Storage.open(v4_store, retention=Retention(max_events=3))
    try:
        assert await s.enforce_retention() == 49
        got = await s.query(QueryTimeseriesParams(event_types=V4_TYPES, order=Order.ASCENDING))
        assert [e.id.instance for e in got.events] == [303, 304, 305]
        assert (await s.query(QueryTimeseriesParams(event_types=V3_TYPES))).events == []
        latest = await s.query(QueryLatestParams(V4_TYPES))
        assert sorted(e.id.instance for e in latest.events) == [304, 305]
    finally:
        await s.close()
    with closing(sqlite3.connect(v4_store)) as conn:
        assert conn.execute("SELECT seq FROM events_by_type ORDER BY seq").fetchall() == [
            (58,),
            (59,),
            (60,),
        ]


@pytest.mark.parametrize("version", [3, 4])
async def test_a_failed_migration_to_version_5_leaves_the_store_untouched(
    tmp_path, monkeypatch, version
):
    path = _store_copy(tmp_path, V3_FIXTURE if version == 3 else V4_FIXTURE, version)
    original = path.read_bytes()
    monkeypatch.setattr("eventfleet_server.storage.indexes.FILL", ["INSERT INTO nowhere SELECT 1"])
    with pytest.raises(StorageError, match="migration failed"):
        await Storage.open(path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == version
    names = _index_names(path)
    assert "events_type_ts" in names and "events_ts" in names
    assert not names & set(FOLDED)
    assert path.read_bytes() == original
    monkeypatch.undo()
    s = await Storage.open(path)  # a later start migrates it
    try:
        assert len((await s.query(ASCENDING)).events) == (46 if version == 3 else 52)
    finally:
        await s.close()
