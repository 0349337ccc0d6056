"""The Event BUS engine adapter in-process (no sockets): the UUID index catches up with
events committed while no adapter indexed them (a crash between a commit and its index
write, or a store older than the index), and a PUB retried with a held UUID is dropped —
also while nobody subscribes, when the adapter skips building broadcasts."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import sqlite3
import uuid as uuidlib

import msgpack
import pytest
from eventfleet_server.bus import mapping, wire
from eventfleet_server.bus.adapter import EngineAdapter, to_item
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    RegisterEvent,
    Timestamp,
)
from eventfleet_server.engine import Engine
from eventfleet_server.storage import Storage, schema
from eventfleet_server.syncer import wire as syncer_wire
from eventfleet_server.syncer.rows import decode_rows


class Recorder:
    """The server side of the adapter: records broadcasts, subscribers switchable."""

    def __init__(self, subscribed: bool = True):
        self.sent = []
        self.subscribed = subscribed

    def has_subscribers(self) -> bool:
        return self.subscribed

    def broadcast(self, items):
        self.sent.extend(items)


def pub(topic: str, uuid: str) -> wire.Publish:
    return wire.parse_pub([topic.encode(), b"", b"p", b"", uuid.encode(), msgpack.packb({"x": 1})])


@pytest.mark.parametrize("subscribed", [True, False], ids=["subscribed", "no-subscriber"])
# NORMAL looks held UUIDs up at once on the loop's thread (find_event_keys_now), FULL
# on the reader thread.
@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_index_catches_up_and_dedups_across_adapters(tmp_path, subscribed, synchronous):
    storage = await Storage.open(tmp_path / "e.sqlite", synchronous=synchronous)
    assert (storage.find_event_keys_now([]) is None) == (synchronous == "FULL")
    tasks = Tasks("test")
    engine = Engine(storage, 1, tasks=tasks)
    await engine.start()
    engine.set_operational()
    try:
        # Committed with an envelope but never indexed (no adapter running).
        held = str(uuidlib.uuid4())
        await engine.register_wait(
            [RegisterEvent(("a",), None, mapping.to_payload(held, "p", msgpack.packb(1)))]
        )
        assert await storage.find_event_keys([held]) == {}

        adapter = EngineAdapter(engine, dedup_memory=0, tasks=tasks)  # no memory: store only
        recorder = Recorder(subscribed)
        adapter.attach(recorder)
        await adapter.start()
        assert (await storage.find_event_keys([held]))[held] == 1
        assert adapter.head == storage.last_seq == 1

        fresh = str(uuidlib.uuid4())
        result = await adapter.publish([pub("/a", held), pub("/b", fresh), pub("/c", fresh)])
        assert result.duplicates == 2 and result.refused == []
        await engine.flush()
        sent = [(seq, item[0].decode(), item[3].decode()) for seq, item in recorder.sent]
        assert sent == ([(2, "/b", fresh)] if subscribed else [])
        # An envelope committed by another way (a peer's event merged by the Syncer):
        # remembered and indexed whether or not anyone subscribes.
        merged = str(uuidlib.uuid4())
        await engine.register_wait(
            [RegisterEvent(("m",), None, mapping.to_payload(merged, "p", msgpack.packb(2)))]
        )
        await adapter.stop()
        assert (await storage.find_event_keys([merged]))[merged] == 3
        assert (await storage.find_event_keys([fresh]))[fresh] == 2

        # A new adapter (a restart) finds both in the store.
        again = EngineAdapter(engine, dedup_memory=0, tasks=tasks)
        again.attach(recorder)
        await again.start()
        result = await again.publish([pub("/d", fresh), pub("/e", held), pub("/f", merged)])
        assert result.duplicates == 3
        await again.stop()
    finally:
        await tasks.close()
        await engine.stop()
        await storage.close()


async def test_snapshot_reads_plain_rows_as_the_events_broadcast_them(tmp_path):
    # The snapshot reads rows without event objects (Storage.read_rows_since_seq and
    # mapping.record_of); every kind of stored event must come out as `to_item` of the
    # event would make it.
    storage = await Storage.open(tmp_path / "e.sqlite")
    tasks = Tasks("test")
    engine = Engine(storage, 1, tasks=tasks)
    await engine.start()
    engine.set_operational()
    try:
        uuid = str(uuidlib.uuid4())
        await engine.register_wait(
            [
                RegisterEvent(("a", "b"), None, mapping.to_payload(uuid, "p", msgpack.packb(1))),
                RegisterEvent(
                    ("a", "c"),
                    Timestamp(1714564800, 7),
                    mapping.to_payload(str(uuidlib.uuid4()), "q", msgpack.packb(b"\x00")),
                ),
                RegisterEvent(("x",), None, EventPayloadJson('{"k": [1, 2]}')),
                RegisterEvent(("x", "%/"), None, EventPayloadBinary("blob", b"\x01\x02")),
                RegisterEvent(("y",), Timestamp(0, 0), None),
            ]
        )
        adapter = EngineAdapter(engine, dedup_memory=10, tasks=tasks)
        await adapter.start()
        expected = [(seq, to_item(event)) for seq, event in await storage.read_since_seq(0, 100)]
        assert len(expected) == 5
        assert await adapter.read(0, 100, ()) == (5, expected)
        assert await adapter.read(1, 2, ()) == (3, expected[1:3])
        assert await adapter.read(0, 100, (b"/a/", b"/x/%25")) == (
            5,
            [expected[0], expected[1], expected[3]],
        )
        assert await adapter.read(5, 100, ()) == (5, [])
        await adapter.stop()
    finally:
        await tasks.close()
        await engine.stop()
        await storage.close()


def _stored_records(path) -> dict[int, bytes | None]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return dict(conn.execute("SELECT seq, bus FROM events"))


@contextlib.asynccontextmanager
async def attached(path: pathlib.Path):
    """An operational engine on a fresh store at `path` with an adapter attached to a
    subscribed `Recorder`: ``(engine, adapter, recorder)``; all stopped after."""
    storage = await Storage.open(path, synchronous="NORMAL")
    tasks = Tasks("test")
    engine = Engine(storage, 1, tasks=tasks)
    await engine.start()
    engine.set_operational()
    adapter = EngineAdapter(engine, dedup_memory=100, tasks=tasks)
    recorder = Recorder()
    adapter.attach(recorder)
    await adapter.start()
    try:
        yield engine, adapter, recorder
    finally:
        await adapter.stop()
        await tasks.close()
        await engine.stop()
        await storage.close()


async def test_broadcast_and_snapshot_serve_the_record_stored_at_commit(tmp_path):
    # Own PUBs: the frames made when the PUB was parsed are stored in the events' own
    # INSERT and broadcast after the commit; a peer's envelopes merged by the Syncer get
    # theirs once, at their commit. The snapshot sends the stored records: the same
    # frames as the BROADCASTs, and as the events' columns give (`to_item`).
    path = tmp_path / "e.sqlite"
    async with attached(path) as (engine, adapter, recorder):
        uuids = [str(uuidlib.uuid4()) for _ in range(4)]
        pubs = [
            wire.parse_pub(
                [
                    b"/a/b",
                    b"",
                    b"plc",
                    b"2024-05-01T12:00:00.5Z",
                    uuids[0].encode(),
                    msgpack.packb({"t": 1.5}),
                ]
            ),
            wire.parse_pub(
                [b"/a/c", b"", b"plc", b"", uuids[1].encode(), msgpack.packb(b"\x00raw")]
            ),
            wire.parse_pub([b"/x", b"", b"q", b"", uuids[2].encode(), b""]),
        ]
        assert (await adapter.publish(pubs)).refused == []
        await engine.flush()
        own_sent = list(recorder.sent)
        assert [seq for seq, _ in own_sent] == [1, 2, 3]
        assert own_sent[0][1][2] == b"2024-05-01T12:00:00.500000Z"

        # A peer's events as the Syncer hands them over: two envelopes and a plain event.
        peer = [
            Event(
                EventId(2, 1, 1),
                ("p", "1"),
                Timestamp(1_700_000_000, 3),
                None,
                mapping.to_payload(uuids[3], "peer-plc", msgpack.packb([1, "x"])),
            ),
            Event(
                EventId(2, 1, 2),
                ("p", "2"),
                Timestamp(1_700_000_000, 3),
                Timestamp(1_600_000_000, 9),
                mapping.to_payload(str(uuidlib.uuid4()), "bin", msgpack.packb(b"\x01")),
            ),
            Event(
                EventId(2, 1, 3),
                ("p", "3"),
                Timestamp(1_700_000_000, 3),
                None,
                EventPayloadJson('{"plain": true}'),
            ),
        ]
        await engine.merge_rows(decode_rows(syncer_wire.encode_events(peer), 2, {}))
        merged_sent = recorder.sent[3:]
        assert merged_sent == [(4 + i, to_item(e)) for i, e in enumerate(peer)]

        stored = _stored_records(path)
        assert [seq for seq, rec in stored.items() if rec is not None] == [1, 2, 3, 4, 5]
        for seq, item in own_sent + merged_sent[:2]:
            assert mapping.unpack_record(stored[seq]) == item[1:]
        assert stored[6] is None  # not a BUS envelope: built from its columns when read

        assert await adapter.read(0, 100, ()) == (6, own_sent + merged_sent)
        assert await adapter.read(0, 100, (b"/p/",)) == (6, merged_sent)
        # A peer's UUID is remembered at its commit: a PUB retrying it is dropped.
        retry = wire.parse_pub([b"/p/1", b"", b"x", b"", uuids[3].encode(), b""])
        assert (await adapter.publish([retry])).duplicates == 1

        # Nobody subscribed: a peer's envelope gets no record (nothing needs its frames
        # now); the snapshot builds them from its columns, the same frames.
        recorder.subscribed = False
        late = Event(
            EventId(2, 2, 4),
            ("p", "4"),
            Timestamp(1_700_000_001, 0),
            None,
            mapping.to_payload(str(uuidlib.uuid4()), "peer-plc", msgpack.packb({"k": None})),
        )
        await engine.merge_rows(decode_rows(syncer_wire.encode_events([late]), 2, {}))
        assert _stored_records(path)[7] is None
        assert (await adapter.read(6, 100, ())) == (7, [(7, to_item(late))])


async def test_payloads_nested_too_deep_lose_no_broadcast_snapshot_or_merge(tmp_path):
    """Nesting that Python's JSON parser cannot follow (RecursionError) where events
    enter the BUS: a PUB's msgpack data (RecursionError out of the mapping stopped the
    collector), and a peer's events merged by the Syncer, which checks no JSON (the
    records of the whole merge were dropped, the broadcast of all of it was lost, and
    every snapshot over it failed). Eventer registrations refuse such JSON themselves."""
    deep = "[" * 5000 + "]" * 5000
    async with attached(tmp_path / "e.sqlite") as (engine, adapter, recorder):
        uuids = [str(uuidlib.uuid4()) for _ in range(4)]
        nested = b"\x91" * 1000 + b"\x01"
        pubs = [
            wire.parse_pub([b"/a/deep", b"", b"plc", b"", uuids[0].encode(), nested]),
            wire.parse_pub([b"/a/ok", b"", b"plc", b"", uuids[1].encode(), msgpack.packb(1)]),
        ]
        assert (await adapter.publish(pubs)).refused == []
        await engine.flush()
        assert [item[3:] for _, item in recorder.sent] == [
            (uuids[0].encode(), nested),
            (uuids[1].encode(), msgpack.packb(1)),
        ]

        # A peer's envelope whose data is too deep to parse, and a plain payload as deep,
        # between two good envelopes.
        peer = [
            Event(
                EventId(2, 1, i + 1),
                ("p", str(i)),
                Timestamp(1_700_000_000, 3),
                None,
                payload,
            )
            for i, payload in enumerate(
                [
                    mapping.to_payload(uuids[2], "peer", msgpack.packb([1])),
                    EventPayloadJson(
                        f'{{"$bus":{{"uuid":"{uuids[3]}","producer":"p"}},"data":{deep}}}'
                    ),
                    EventPayloadJson(deep),
                    mapping.to_payload(str(uuidlib.uuid4()), "peer", msgpack.packb([3])),
                ]
            )
        ]
        merged = await engine.merge_rows(decode_rows(syncer_wire.encode_events(peer), 2, {}))
        assert len(merged) == 4
        assert [seq for seq, _ in recorder.sent] == [1, 2, 3, 4, 5, 6]
        assert recorder.sent[2][1][3] == uuids[2].encode()
        # Not envelopes: each goes out as its text, under its derived UUID.
        assert msgpack.unpackb(recorder.sent[3][1][4]).endswith(f"{deep}}}")
        assert msgpack.unpackb(recorder.sent[4][1][4]) == deep

        last, snapshot = await adapter.read(0, 100, ())
        assert last == 6 and snapshot == recorder.sent


V2_FIXTURE = pathlib.Path(__file__).parent.parent / "fixtures" / "storage-v2.sqlite"


async def test_a_store_of_the_previous_release_opens_and_its_snapshot_is_unchanged(tmp_path):
    # `tests/fixtures/storage-v2.sqlite` was written by the release before records were
    # stored (schema 2, events.bus always NULL; BUS envelopes in JSON and binary form,
    # Eventer events, with and without source timestamps). It opens as it is (same schema
    # version, no migration), its snapshot is built from the columns exactly as before,
    # and new PUBs are stored with their records next to the old rows.
    path = tmp_path / "events.sqlite"
    shutil.copyfile(V2_FIXTURE, path)
    storage = await Storage.open(path, synchronous="NORMAL")
    tasks = Tasks("test")
    engine = Engine(storage, 1, tasks=tasks)
    await engine.start()
    engine.set_operational()
    adapter = EngineAdapter(engine, dedup_memory=100, tasks=tasks)
    recorder = Recorder()
    adapter.attach(recorder)
    await adapter.start()
    try:
        old = await storage.read_since_seq(0, 100)
        assert len(old) == 30 and set(_stored_records(path).values()) == {None}
        kinds = {type(e.payload).__name__ for _, e in old}
        assert kinds == {"EventPayloadJson", "EventPayloadBinary", "NoneType"}
        expected = [(seq, to_item(event)) for seq, event in old]
        assert await adapter.read(0, 100, ()) == (30, expected)
        # Its envelopes' UUIDs above the index's mark (2) were indexed at start: a retry
        # is dropped.
        envelope = next(e for _, e in reversed(old) if mapping.envelope_uuid(e.payload))
        held = mapping.envelope_uuid(envelope.payload)
        assert (await adapter.publish([pub("/z", held)])).duplicates == 1

        fresh = str(uuidlib.uuid4())
        assert (await adapter.publish([pub("/new", fresh)])).refused == []
        await engine.flush()
        assert _stored_records(path)[31] is not None
        assert await adapter.read(0, 100, ()) == (31, [*expected, *recorder.sent])
    finally:
        await adapter.stop()
        await tasks.close()
        await engine.stop()
        await storage.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 5
