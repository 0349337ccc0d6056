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
