"""The Event BUS engine adapter in-process (no sockets): the UUID index catches up with
events committed while no adapter indexed them (a crash between a commit and its index
write, or a store older than the index), and a PUB retried with a held UUID is dropped —
also while nobody subscribes, when the adapter skips building broadcasts."""

from __future__ import annotations

import uuid as uuidlib

import msgpack
import pytest
from eventfleet_server.bus import mapping, wire
from eventfleet_server.bus.adapter import EngineAdapter, to_item
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import (
    EventPayloadBinary,
    EventPayloadJson,
    RegisterEvent,
    Timestamp,
)
from eventfleet_server.engine import Engine
from eventfleet_server.storage import Storage


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
