"""Chatter transport: ping/pong keeps idle connections alive, silent peers are dropped."""

from __future__ import annotations

import asyncio

from eventfleet_server import chatter
from eventfleet_server.chatter.listener import ChatterListener
from eventfleet_server.listener import AdmissionLimits, Rejections


async def test_ping_answered_and_silent_peer_dropped():
    server_conns = []
    done = asyncio.Event()
    second = asyncio.Event()

    async def on_conn(conn):
        server_conns.append(conn)
        if len(server_conns) == 2:
            second.set()
        try:
            while True:
                await conn.receive()
        except ConnectionError:
            done.set()

    server = await chatter.serve(on_conn, "127.0.0.1", 0, ping_delay=0.1, ping_timeout=0.2)
    port = server.sockets[0].getsockname()[1]
    # A client that answers pings (its receive loop runs) stays connected.
    client = await chatter.connect("127.0.0.1", port, ping_delay=None)
    reader = asyncio.get_running_loop().create_task(client.receive())
    await asyncio.sleep(0.8)
    assert not server_conns[0].is_closed
    reader.cancel()
    # A raw socket that never answers is closed after delay + timeout.
    _, w = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(3):
        await second.wait()
        await server_conns[1].wait_closed()
    assert "ping" in server_conns[1].close_reason
    w.close()
    client.close()
    server.close()


async def test_listener_port_is_known_after_stop():
    """/status describes every protocol while the replica drains (HTTP stops last):
    the listener's port must not depend on the closed server's sockets."""

    async def initialize(conn, msg):  # never reached: nobody connects
        raise AssertionError("unexpected client")

    listener = ChatterListener(
        "test",
        "127.0.0.1",
        0,
        init_type="Test.MsgInit",
        initialize=initialize,
        limits=AdmissionLimits(),
        rejections=Rejections("test"),
    )
    await listener.start()
    port = listener.port
    assert port > 0
    await listener.stop()
    assert listener.port == port


def test_hand_built_frames_are_the_codecs_and_parse_back():
    """`send` builds frames without the C codec and `_read` parses them by hand: both
    must be byte for byte what hat's chatter (the C codec) writes and reads."""
    from eventfleet_server.chatter.connection import _frame_head, parse_msg
    from eventfleet_server.common.codec import repo

    for msg_id in (1, 63, 64, 127, 128, 8191, 8192, 2**40 + 3):
        for first in (1, 64, msg_id):
            for flags in ((True, True, True), (False, True, False), (True, False, False)):
                for msg_type in ("HatEventer.MsgRegisterRes", "", "é" * 70):
                    for data in (b"", b"\x00x", bytes(range(256)) * 300):
                        owner, token, last = flags
                        body = repo.encode(
                            "HatChatter.Msg",
                            {
                                "id": msg_id,
                                "first": first,
                                "owner": owner,
                                "token": token,
                                "last": last,
                                "data": {"type": msg_type, "data": data},
                            },
                        )
                        size = len(body).to_bytes((len(body).bit_length() + 7) // 8, "big")
                        head = _frame_head(msg_id, first, owner, token, last, msg_type, len(data))
                        assert head + data == bytes((len(size),)) + size + body
                        msg = parse_msg(body)
                        assert (msg.type, msg.data, msg.last, msg.token) == (
                            msg_type,
                            data,
                            last,
                            token,
                        )
                        assert msg.conv == chatter.Conversation(not owner, first)
                        assert msg.first == (owner and first == msg_id)
