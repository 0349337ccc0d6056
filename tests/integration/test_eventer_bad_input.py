"""Bad input: the offending connection gets a clear error, others are unaffected."""

from __future__ import annotations

import asyncio
import logging

import pytest
from eventfleet_server.common import codec
from hat.drivers import chatter as hat_chatter
from hat.drivers import net
from hat.event import common as hat
from hat.event.eventer import client as hat_client

from tests.conftest import running_replica


def addr(replica):
    return net.TcpAddress("127.0.0.1", replica.eventer.port)


async def assert_closed_by_server(reader, timeout=5.0):
    async with asyncio.timeout(timeout):
        while await reader.read(65536):
            pass


async def assert_server_still_serves(replica):
    client = await hat_client.connect(addr(replica), "survivor")
    try:
        events = await client.register([hat.RegisterEvent(("ok",), None, None)], True)
        assert events and events[0].type == ("ok",)
    finally:
        await client.async_close()


async def stored_count(replica):
    return (await replica.storage.stats()).events


async def raw_chatter(replica):
    return await hat_chatter.connect(hat_chatter_addr(replica), ping_delay=None)


def hat_chatter_addr(replica):

    return net.TcpAddress("127.0.0.1", replica.eventer.port)


def init_data(**kw):
    req = {
        "clientName": "raw",
        "clientToken": ("none", None),
        "subscriptions": [],
        "serverId": ("none", None),
        "persisted": False,
    }
    req.update(kw)
    return codec.repo.encode("HatEventer.MsgInitReq", req)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00",  # length-of-length 0
        b"\x09" + b"\x01" * 9,  # length-of-length beyond 8 bytes
        b"\x01\x05hello",  # a frame whose body is not HatChatter.Msg
    ],
)
async def test_garbage_frames_close_the_connection(replica, garbage):
    reader, writer = await asyncio.open_connection("127.0.0.1", replica.eventer.port)
    writer.write(garbage)
    await writer.drain()
    await assert_closed_by_server(reader)
    writer.close()
    await assert_server_still_serves(replica)


async def test_oversized_message_is_refused_before_it_is_read(tmp_path):
    async with running_replica(tmp_path / "o", eventer={"max_msg_size": 4096}) as replica:
        reader, writer = await asyncio.open_connection("127.0.0.1", replica.eventer.port)
        size = 10_000_000
        writer.write(bytes([4]) + size.to_bytes(4, "big"))
        await writer.drain()
        await assert_closed_by_server(reader)
        writer.close()
        await assert_server_still_serves(replica)


async def test_register_before_init_closes(replica):
    conn = await raw_chatter(replica)
    data = codec.repo.encode(
        "HatEventer.MsgRegisterReq",
        [{"type": ["x"], "sourceTimestamp": ("none", None), "payload": ("none", None)}],
    )
    await conn.send(hat_chatter.Data("HatEventer.MsgRegisterReq", data), last=False)
    await asyncio.wait_for(conn.wait_closed(), 5)
    assert await stored_count(replica) == 0
    await assert_server_still_serves(replica)


async def test_undecodable_init_gets_init_error(replica):
    conn = await raw_chatter(replica)
    await conn.send(hat_chatter.Data("HatEventer.MsgInitReq", b"\xff\xff"), last=False)
    msg = await asyncio.wait_for(conn.receive(), 5)
    assert msg.data.type == "HatEventer.MsgInitRes"
    kind, text = codec.repo.decode("HatEventer.MsgInitRes", msg.data.data)
    assert kind == "error" and "does not decode" in text
    await asyncio.wait_for(conn.wait_closed(), 10)


async def initialized_raw(replica):
    conn = await raw_chatter(replica)
    await conn.send(hat_chatter.Data("HatEventer.MsgInitReq", init_data()), last=False)
    msg = await asyncio.wait_for(conn.receive(), 5)
    assert codec.repo.decode(msg.data.type, msg.data.data)[0] == "success"
    return conn


async def test_unknown_message_type_closes(replica):
    conn = await initialized_raw(replica)
    await conn.send(hat_chatter.Data("HatEventer.MsgNoSuchThing", b""))
    await asyncio.wait_for(conn.wait_closed(), 5)
    await assert_server_still_serves(replica)


async def test_undecodable_register_stores_nothing(replica):
    conn = await initialized_raw(replica)
    await conn.send(hat_chatter.Data("HatEventer.MsgRegisterReq", b"\x05\x01"), last=False)
    await asyncio.wait_for(conn.wait_closed(), 5)
    assert await stored_count(replica) == 0
    await assert_server_still_serves(replica)


async def test_register_with_invalid_event_fails_as_a_whole(replica):
    client = await hat_client.connect(addr(replica), "c")
    try:
        good = hat.RegisterEvent(("good",), None, None)
        wildcard = hat.RegisterEvent(("bad", "*"), None, None)
        assert await client.register([good, wildcard], True) is None
        bad_time = hat.RegisterEvent(("bad",), hat.Timestamp(1, 5_000_000), None)
        assert await client.register([good, bad_time], True) is None
        assert await stored_count(replica) == 0
        assert await client.register([good], True)
    finally:
        await client.async_close()


@pytest.mark.parametrize(
    "params",
    [
        hat.QueryTimeseriesParams(max_results=-1),
        hat.QueryTimeseriesParams(event_types=[("*", "a")]),
        hat.QueryLatestParams(event_types=[("a", "*", "b")]),
        hat.QueryServerParams(server_id=1, max_results=-5),
    ],
)
async def test_absurd_query_closes_with_reason(replica, params):
    client = await hat_client.connect(addr(replica), "absurd")
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(client.query(params), 5)
    await client.async_close()
    # Closed by the server for this reason, not by anything else.
    assert replica.eventer.rejected == {"bad_query": 1}
    await assert_server_still_serves(replica)


async def test_slow_subscriber_is_dropped_without_stalling_others(tmp_path):
    limits = {"max_queued_events": 2000, "ack_every": 4, "ack_window": 2}
    async with running_replica(tmp_path / "slow", eventer=limits) as replica:
        # A subscriber that never reads: its acks never come.
        conn = await raw_chatter(replica)
        await conn.send(
            hat_chatter.Data("HatEventer.MsgInitReq", init_data(subscriptions=[["*"]])),
            last=False,
        )
        await asyncio.wait_for(conn.receive(), 5)
        fast = asyncio.Queue()
        good = await hat_client.connect(
            addr(replica),
            "fast",
            subscriptions=[("*",)],
            events_cb=lambda _, e: fast.put_nowait(len(e)),
        )
        pub = await hat_client.connect(addr(replica), "pub")
        # The raw client is never asked for messages again, so it never sends MsgEventsAck.
        batch = [hat.RegisterEvent(("load",), None, None)] * 100
        async with asyncio.timeout(20):
            for _ in range(50):
                assert await pub.register(batch, True)
        received = 0
        async with asyncio.timeout(10):
            while received < 5000:
                received += await fast.get()
        assert received == 5000
        assert replica.eventer.rejected.get("slow_subscriber") == 1
        await good.async_close()
        await pub.async_close()
        await conn.async_close()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"v": NaN}', "the number NaN"),  # Python's json.dumps writes these by default
        ("[Infinity]", "the number Infinity"),
        ("-Infinity", "the number -Infinity"),
        ('{"v": 1e400}', "the number 1e400"),  # JSON, but no double holds it
        ("[1, " + "9" * 400 + "]", "the number 999999999999... (400 characters)"),
    ],
    ids=["nan", "inf", "-inf", "1e400", "int400"],
)
async def test_register_with_a_number_no_json_reader_holds_is_refused(replica, caplog, text, named):
    """The shared payload rule (docs/security.md, "Validation"): NaN, ±Infinity and
    numbers beyond a double are refused at registration, the request as a whole, with
    the value named; nothing reaches a reader that could not parse it (Jetstream, a
    client's JSON.parse). Raw requests: hat-event's client refuses to encode NaN."""

    def event(type_, payload):
        return {
            "type": [type_],
            "sourceTimestamp": ("none", None),
            "payload": ("value", ("json", payload)),
        }

    conn = await initialized_raw(replica)
    try:
        request = [event("good", "[1.5e308, 1e-400]"), event("bad", text)]
        data = codec.repo.encode("HatEventer.MsgRegisterReq", request)
        with caplog.at_level(logging.WARNING, logger="eventfleet_server"):
            await conn.send(hat_chatter.Data("HatEventer.MsgRegisterReq", data), last=False)
            msg = await asyncio.wait_for(conn.receive(), 5)
        assert codec.repo.decode(msg.data.type, msg.data.data)[0] == "failure"
        assert await stored_count(replica) == 0
        refused = [r.getMessage() for r in caplog.records]
        expected = f"event 1: JSON payload: {named} is not a finite double"
        assert any(expected in m for m in refused), refused
        # The same connection goes on; doubles at the edges are numbers like others.
        data = codec.repo.encode("HatEventer.MsgRegisterReq", request[:1])
        await conn.send(hat_chatter.Data("HatEventer.MsgRegisterReq", data), last=False)
        msg = await asyncio.wait_for(conn.receive(), 5)
        assert codec.repo.decode(msg.data.type, msg.data.data)[0] == "events"
        assert await stored_count(replica) == 1
    finally:
        await conn.async_close()
