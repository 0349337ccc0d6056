"""Chatter transport: ping/pong keeps idle connections alive, silent peers are dropped."""

from __future__ import annotations

import asyncio
import random

import pytest
from eventfleet_server import chatter
from eventfleet_server.chatter import connection as connection_module
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


def codec_msg(msg_id, first, owner, token, last, msg_type, data) -> bytes:
    """A ``HatChatter.Msg`` as hat's C codec writes it."""
    from eventfleet_server.common.codec import repo

    return repo.encode(
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


@pytest.mark.parametrize("c_frame", [True, False], ids=["c-frame", "python-frame"])
def test_hand_built_frames_are_the_codecs_and_parse_back(c_frame, monkeypatch):
    """`send` builds frames without hat's C codec and `_read` parses them by hand (in
    our C, `chatter/_frame.c`, and in Python): both must be byte for byte what hat's
    chatter (its C codec) writes and reads."""
    from eventfleet_server.chatter.connection import _frame_head, parse_msg

    if not c_frame:
        monkeypatch.setattr(connection_module, "_c", None)

    for msg_id in (1, 63, 64, 127, 128, 8191, 8192, 2**40 + 3):
        for first in (1, 64, msg_id):
            for flags in ((True, True, True), (False, True, False), (True, False, False)):
                for msg_type in ("HatEventer.MsgRegisterRes", "", "é" * 70):
                    for data in (b"", b"\x00x", bytes(range(256)) * 300):
                        owner, token, last = flags
                        body = codec_msg(msg_id, first, owner, token, last, msg_type, data)
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


class _Transport:
    """The transport side a `Connection` writes to and pauses (a real socket's would do;
    this one keeps what is written and the reading state for the asserts)."""

    def __init__(self):
        self.written = bytearray()
        self.reading = True
        self.closed = False

    def get_extra_info(self, name):
        return ("127.0.0.1", 1)

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data) -> None:
        self.written += data

    def writelines(self, parts) -> None:
        for part in parts:
            self.written += part

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def _frame(msg_id: int, msg_type: str, data: bytes) -> bytes:
    from eventfleet_server.chatter.connection import _frame_head

    return _frame_head(msg_id, msg_id, True, True, True, msg_type, len(data)) + data


async def test_frames_split_anywhere_are_dispatched_in_order_across_pauses():
    """Frames are parsed as bytes arrive (`data_received`), however the reads split
    them; a handler that pauses the dispatch (for async work) gets the messages read
    meanwhile after `resume_dispatch`, in order; pings are answered as they arrive;
    messages queued for `receive` before `set_handler` come first."""
    frames = [_frame(i, f"T.Msg{i}", bytes([i]) * (i * 37 % 300)) for i in range(1, 40)]
    ping = _frame(99, "HatChatter.Ping", b"")
    stream = frames[0] + ping + b"".join(frames[1:])
    for step in (1, 7, 64, len(stream)):
        conn = chatter.Connection(ping_delay=None)
        transport = _Transport()
        conn.connection_made(transport)
        conn.data_received(stream[:1])
        conn.data_received(stream[1 : len(frames[0])])  # the first frame, queued
        assert (await conn.receive()).type == "T.Msg1"
        got: list[str] = []

        def handler(msg, got=got, conn=conn):
            got.append(msg.type)
            if len(got) % 5 == 0:
                conn.pause_dispatch()  # as a session awaiting a large request does

        conn.set_handler(handler, lambda e: pytest.fail(f"frame error {e}"))
        rest = stream[len(frames[0]) :]
        for pos in range(0, len(rest), step):
            conn.data_received(rest[pos : pos + step])
            while conn._dispatch_paused:
                conn.resume_dispatch()
        assert got == [f"T.Msg{i}" for i in range(2, 40)], step
        assert b"HatChatter.Pong" in transport.written  # the ping answered on arrival


async def test_large_frames_split_anywhere_arrive_whole_and_in_order(monkeypatch):
    """Frames above 64 KiB take the one-copy path (header read from the first chunk,
    only the payload joined): whatever the split, including a first chunk that ends
    inside the header and chunks that end inside the next frame, every payload
    arrives byte for byte and in order, across dispatch pauses. None goes through the
    whole-frame parse (three copies of it in one loop callback: a 16 MiB request held
    the loop ~40 ms when its frame began at the end of a read)."""
    parsed_whole: list[int] = []
    parse_python = connection_module._parse_msg_python

    def parse_counted(body):
        parsed_whole.append(len(body))
        return parse_python(body)

    monkeypatch.setattr(connection_module, "_parse_msg_python", parse_counted)
    c_frame = connection_module._c
    if c_frame is not None:  # the C parse of whole frames, counted the same way

        class Counted:
            @staticmethod
            def parse(buf, start, end):
                parsed_whole.append(end - start)
                return c_frame.parse(buf, start, end)

            head = staticmethod(c_frame.head)

        monkeypatch.setattr(connection_module, "_c", Counted)
    rng = random.Random(5)
    payloads = [rng.randbytes(n) for n in (200_000, 70_000, 10, 1_000_000, 65_537, 3)]
    frames = [_frame(i + 1, f"T.Big{i}", data) for i, data in enumerate(payloads)]
    stream = b"".join(frames)
    for step in (1, 5, 40, 4096, 65_536, 300_001, len(stream)):
        conn = chatter.Connection(ping_delay=None, max_msg_size=2_000_000)
        conn.connection_made(_Transport())
        got: list[tuple[str, bytes]] = []

        def handler(msg, got=got, conn=conn):
            got.append((msg.type, msg.data))
            if len(got) % 2 == 0:
                conn.pause_dispatch()

        conn.set_handler(handler, lambda e: pytest.fail(f"frame error {e}"))
        pos = 0
        while pos < len(stream):
            # Uneven reads: a real socket's sizes vary from one read to the next.
            n = step if step < 40 else rng.randrange(1, 2 * step)
            conn.data_received(stream[pos : pos + n])
            pos += n
            while conn._dispatch_paused:
                conn.resume_dispatch()
        assert [t for t, _ in got] == [f"T.Big{i}" for i in range(len(payloads))], step
        assert [d for _, d in got] == payloads, step
        if step < 65_536:  # every large frame arrived in pieces
            assert max(parsed_whole, default=0) < 65_536, step
        parsed_whole.clear()


async def test_a_message_sent_in_parts_is_the_message_sent_whole():
    parts = [b"head", b"x" * 70_000, b"", b"tail"]
    whole, pieces = _Transport(), _Transport()
    for transport, send in ((whole, "send"), (pieces, "send_parts")):
        conn = chatter.Connection(ping_delay=None)
        conn.connection_made(transport)
        conv = chatter.Conversation(False, 7)
        if send == "send":
            conn.send("T.Res", b"".join(parts), conv=conv)
        else:
            conn.send_parts("T.Res", parts, conv=conv)
    assert pieces.written == whole.written
    receiver = chatter.Connection(ping_delay=None, max_msg_size=1_000_000)
    receiver.connection_made(_Transport())
    receiver.data_received(bytes(pieces.written))
    msg = await receiver.receive()
    assert (msg.type, msg.data, msg.conv) == (
        "T.Res",
        b"".join(parts),
        chatter.Conversation(True, 7),
    )


async def test_a_large_frame_with_a_bad_header_is_a_frame_error():
    conn = chatter.Connection(ping_delay=None, max_msg_size=2_000_000)
    conn.connection_made(_Transport())
    got, errors = [], []
    conn.set_handler(lambda m: got.append(m.type), errors.append)
    frame = bytearray(_frame(1, "T.Big", b"x" * 100_000))
    frame[-100_001] ^= 0x7F  # the payload's length no longer matches the frame's
    conn.data_received(bytes(frame[:70_000]))
    conn.data_received(bytes(frame[70_000:]))
    assert got == []
    assert len(errors) == 1 and "does not match" in str(errors[0])


async def test_a_frame_error_reaches_the_handler_after_the_good_frames():
    conn = chatter.Connection(ping_delay=None)
    conn.connection_made(_Transport())
    got, errors = [], []
    conn.set_handler(lambda m: got.append(m.type), errors.append)
    conn.data_received(_frame(1, "T.A", b"x") + b"\x09garbage")
    assert got == ["T.A"]
    assert len(errors) == 1 and "length-of-length byte 9" in str(errors[0])
