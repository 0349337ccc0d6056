"""Bad input and faults on Syncer connections: the offending connection is closed with
a logged reason, nothing is stored half-way, and the replica keeps serving."""

from __future__ import annotations

import asyncio
import json

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.model import EventId, EventPayloadJson, RegisterEvent
from eventfleet_server.syncer import SyncerServerLimits, wire

from tests.unit.test_syncer_replicas import (
    WAIT,
    FakePeer,
    Node,
    cluster,
    fake_events,
    raw_init,
    reg,
    until,
)


async def assert_closed(conn, timeout=5.0):
    async with asyncio.timeout(timeout):
        while True:
            try:
                await conn.receive()
            except ConnectionError:
                return


async def still_serves(node: Node):
    created = await node.replica.engine.register_wait([reg("still", "ok")])
    conn, error = await raw_init(
        node.replica.syncer.port, EventId(1, 0, created[0].id.instance - 1)
    )
    assert error is None
    msg = await asyncio.wait_for(conn.receive(), 5)
    assert wire.decode_events(msg.data, 1) == created
    conn.close()


@pytest.mark.parametrize(
    "garbage",
    [b"\x00", b"\x09" + b"\x01" * 9, b"\x01\x05hello"],
)
async def test_garbage_before_init(tmp_path, garbage, caplog):
    async with cluster(tmp_path, 1) as (node,):
        await node.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", node.replica.syncer.port)
        writer.write(garbage)
        async with asyncio.timeout(5):
            while await reader.read(1024):
                pass
        writer.close()
        assert node.replica.syncer.server.rejected.get("bad_frame") == 1
        assert "syncer refused" in caplog.text and "(bad_frame): before init" in caplog.text
        await still_serves(node)


async def test_first_message_must_be_init(tmp_path):
    from eventfleet_server import chatter

    async with cluster(tmp_path, 1) as (node,):
        await node.start()
        conn = await chatter.connect("127.0.0.1", node.replica.syncer.port, ping_delay=None)
        conn.send(wire.FLUSH_RES, b"")
        await assert_closed(conn)
        assert node.replica.syncer.server.rejected.get("not_initialized") == 1


@pytest.mark.parametrize(
    ("last", "token", "subs", "error"),
    [
        (EventId(1, 0, 0), "wrong", [("*",)], "invalid client token"),
        (EventId(1, 0, 0), None, [("*",)], "invalid client token"),
        (EventId(99, 0, 0), "secret", [("*",)], "server id 99 is unknown here"),
        (EventId(1, 0, 10**12), "secret", [("*",)], "is from the future"),
        (EventId(1, 10**12, 0), "secret", [("*",)], "is from the future"),
        (EventId(1, 0, 0), "secret", [("*", "x")], "'*' is only valid as the last segment"),
    ],
)
async def test_init_errors_name_the_problem(tmp_path, last, token, subs, error):
    async with cluster(tmp_path, 1, token="secret") as (node,):
        await node.start()
        conn, answer = await raw_init(node.replica.syncer.port, last, token=token, subs=subs)
        assert answer is not None and error in answer
        conn.close()
        await still_serves_with_token(node)


async def still_serves_with_token(node):
    conn, error = await raw_init(node.replica.syncer.port, EventId(1, 0, 0), token="secret")
    assert error is None
    conn.close()


async def test_unexpected_message_after_init_closes(tmp_path):
    async with cluster(tmp_path, 1) as (node,):
        await node.start()
        conn, _ = await raw_init(node.replica.syncer.port, EventId(1, 0, 0))
        conn.send(wire.EVENTS, wire.encode_events(fake_events(1, 1, 1, 1)))
        await assert_closed(conn)
        assert node.replica.syncer.server.rejected.get("unexpected_message") == 1
        assert node.replica.storage.last_ids == {}  # nothing a client sends is stored
        await still_serves(node)


async def test_a_peer_that_stops_reading_is_dropped(tmp_path):
    async with cluster(tmp_path, 1) as (node,):
        replica = await node.start()
        replica.syncer.server._limits = SyncerServerLimits(max_write_buffer=256 * 1024)
        conn, _ = await raw_init(replica.syncer.port, EventId(1, 0, 0))
        # Read MsgSynced, then stop reading while events keep coming.
        assert (await asyncio.wait_for(conn.receive(), 5)).type == wire.SYNCED
        payload = EventPayloadJson(json.dumps("x" * 60_000))
        async with asyncio.timeout(WAIT):
            while replica.syncer.server.rejected.get("slow_peer", 0) == 0:
                await replica.engine.register_wait(
                    [RegisterEvent(("big",), None, payload) for _ in range(10)]
                )
        await until(lambda: not replica.syncer.server.sessions(), "slow peer dropped")
        conn.close()
        await still_serves(node)


async def test_peer_sending_bad_events_is_cut_off_and_nothing_of_it_is_stored(tmp_path, caplog):
    good = wire.encode_events(fake_events(7, 1, 1, 2))
    mixed = wire.encode_events(fake_events(7, 2, 3, 1) + fake_events(7, 3, 4, 1))
    foreign = wire.encode_events(fake_events(8, 2, 3, 1))
    garbage = b"\x02\x03"
    for bad, reason in [
        (mixed, "mixes sessions"),
        (foreign, "is of server 8"),
        (garbage, "MsgEvents does not decode"),
    ]:
        caplog.clear()
        async with FakePeer(7, [good, bad]) as fake, cluster(tmp_path / reason[:5], 1) as (node,):
            node.overrides["peers"] = [fake.entry()]
            await node.start()
            await until(lambda: fake.closed.is_set(), f"connection closed after {reason!r}")
            await until(
                lambda: node.replica.syncer.state()[0]["last_error"] is not None, "error reported"
            )
            state = node.replica.syncer.state()[0]
            assert reason in state["last_error"]
            assert reason in caplog.text

            # The good message's merge may still be committing (FULL: on the writer
            # thread) when the bad one cuts the stream: wait for it, bounded.
            async def held():
                events = await node.replica.storage.read_server(7, None, 100)
                return [e.id.instance for e in events] == [1, 2]

            await until(held, "the good message stored")
            await asyncio.sleep(0.2)
            events = await node.replica.storage.read_server(7, None, 100)
            assert [e.id.instance for e in events] == [1, 2]  # the good message only
            await still_serves(node)


async def test_peer_with_the_wrong_token_is_refused_and_retried(tmp_path, caplog):
    async with cluster(tmp_path, 2) as (a, b):
        a.token, b.token = "one", "two"
        await asyncio.gather(a.start(), b.start())
        await until(
            lambda: "invalid client token" in (a.replica.syncer.state()[0]["last_error"] or ""),
            "a reports b's refusal",
        )
        assert a.replica.syncer.state()[0]["state"] == "disconnected"
        assert "refused by the peer: invalid client token" in caplog.text
        # Neither holds the other's events, and both keep serving.
        await b.replica.engine.register_wait([reg("b")])
        await asyncio.sleep(0.5)
        assert 2 not in a.replica.storage.last_ids


async def test_init_request_that_does_not_decode(tmp_path):
    from eventfleet_server import chatter

    async with cluster(tmp_path, 1) as (node,):
        await node.start()
        conn = await chatter.connect("127.0.0.1", node.replica.syncer.port, ping_delay=None)
        conv = conn.send(wire.INIT_REQ, b"\x01\x02\x03", last=False)
        msg = await asyncio.wait_for(conn.receive(), 5)
        assert msg.conv == conv
        kind, text = codec.repo.decode(wire.INIT_RES, msg.data)
        assert kind == "error" and "does not decode" in text
        conn.close()
        await still_serves(node)
