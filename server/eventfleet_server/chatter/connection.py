"""One chatter connection: framing, conversations and pings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from eventfleet_server.common.sbsint import SbsIntError, encode_int, read_int

log = logging.getLogger(__name__)

_PING = "HatChatter.Ping"
_PONG = "HatChatter.Pong"
DEFAULT_MAX_MSG_SIZE = 64 * 1024 * 1024
# Above this many payload bytes the frame is built and parsed around the payload (no
# whole-message copy through the C codec, which would hold the GIL for all of it).
_LARGE = 64 * 1024


class FrameError(Exception):
    """The peer sent something that is not a valid chatter frame (message names why)."""


class FrameTooLarge(FrameError):
    """A frame announced a size above the connection's limit (its body was not read)."""


class Conversation(NamedTuple):
    owner: bool
    first_id: int


class Msg(NamedTuple):
    type: str
    data: bytes
    conv: Conversation
    first: bool
    last: bool
    token: bool


class Connection:
    """A chatter connection; `receive` yields application messages (pings are answered here)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_msg_size: int = DEFAULT_MAX_MSG_SIZE,
        ping_delay: float | None = 20.0,
        ping_timeout: float = 20.0,
    ):
        self._reader = reader
        self._writer = writer
        self._transport = writer.transport
        self._max_msg_size = max_msg_size
        # Unsent bytes past which a peer that still sends pings is cut: it is not reading.
        self.max_write_buffer: int | None = None
        self._next_id = 1
        self._closed = asyncio.get_running_loop().create_future()
        self._close_reason: str | None = None
        self._loop = asyncio.get_running_loop()
        self._last_activity = self._loop.time()
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # The remote IP alone (address-based policies: hat-compatible token exemption).
        self.address = peer[0] if isinstance(peer, tuple) else str(peer)
        self._ping_task = (
            asyncio.get_running_loop().create_task(self._ping_loop(ping_delay, ping_timeout))
            if ping_delay
            else None
        )

    @property
    def is_closed(self) -> bool:
        return self._closed.done()

    @property
    def close_reason(self) -> str | None:
        return self._close_reason

    @property
    def write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    @property
    def max_msg_size(self) -> int:
        return self._max_msg_size

    def set_max_msg_size(self, size: int) -> None:
        """Change the frame size limit (raised once a session is initialised)."""
        self._max_msg_size = size

    async def receive(self) -> Msg:
        """Next application message; `ConnectionError` once closed, `FrameError` on garbage."""
        while True:
            msg = await self._read()
            if msg.type == _PING:
                limit = self.max_write_buffer
                if limit is not None and self.write_buffer_size > limit:
                    self.abort(
                        f"peer pings but does not read: {self.write_buffer_size} bytes unsent"
                    )
                    raise ConnectionError(f"connection {self.peer} closed: not reading")
                self.send(_PONG, b"", conv=msg.conv)
                continue
            if msg.type == _PONG:
                continue
            return msg

    def send(
        self,
        msg_type: str,
        data: bytes,
        *,
        conv: Conversation | None = None,
        last: bool = True,
        token: bool = True,
    ) -> Conversation:
        """Queue one message on the transport (no await: the transport buffers it)."""
        if self.is_closed:
            raise ConnectionError(f"connection {self.peer} is closed")
        msg_id = self._next_id
        self._next_id += 1
        if conv is None:
            conv = Conversation(True, msg_id)
        # The frame is built by hand (`_frame_head`): the same bytes as the C codec's
        # ``HatChatter.Msg`` (tests/unit/test_chatter.py checks it), without a dict per
        # message and a schema lookup of the type name: a reply and a notification per
        # registration at batch 1 each paid ~10 µs for those.
        head = _frame_head(msg_id, conv.first_id, conv.owner, token, last, msg_type, len(data))
        if len(data) > _LARGE:
            self._writer.write(head)
            self._writer.write(data)
        else:
            self._writer.write(head + data)
        return conv

    def send_many(self, msgs: list[tuple[str, bytes, Conversation]]) -> None:
        """Queue several messages ``(type, data, conversation)`` (each with ``last``
        set) with one transport write: one ``send`` system call for all of them where
        `send` would make one each (on loopback each also runs the peer's receive path)."""
        if self.is_closed:
            raise ConnectionError(f"connection {self.peer} is closed")
        parts: list[bytes] = []
        for msg_type, data, conv in msgs:
            msg_id = self._next_id
            self._next_id += 1
            parts.append(
                _frame_head(msg_id, conv.first_id, conv.owner, True, True, msg_type, len(data))
            )
            parts.append(data)
        self._writer.write(b"".join(parts))

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self, reason: str | None = None, *, quiet: bool = False) -> None:
        """Close once what is queued is sent; `reason` is kept in `close_reason` and
        logged unless `quiet` (a refusal already logged, rate-limited, by the listener)."""
        if self.is_closed:
            return
        self._close_reason = reason
        if reason and not quiet:
            log.warning("closing chatter connection %s: %s", self.peer, reason)
        self._closed.set_result(None)
        if self._ping_task:
            self._ping_task.cancel()
        self._writer.close()

    def abort(self, reason: str | None = None, *, quiet: bool = False) -> None:
        """Close now, dropping unsent data: for a peer that stopped reading (a plain close
        would keep the socket until the peer reads what is queued) or sent garbage."""
        self.close(reason, quiet=quiet)
        self._transport.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def close_after_flush(self, timeout: float, reason: str | None = None) -> None:
        """Give the peer up to `timeout` s to read what is queued and close its side."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.drain(), timeout)
            # The peer is expected to close after an init error; wait for its EOF.
            await asyncio.wait_for(self._reader.read(), timeout)
        self.close(reason)

    async def _read(self) -> Msg:
        try:
            n = (await self._reader.readexactly(1))[0]
            if not 1 <= n <= 8:
                raise FrameError(f"invalid length-of-length byte {n}")
            size = int.from_bytes(await self._reader.readexactly(n), "big")
            if size > self._max_msg_size:
                self.abort()
                raise FrameTooLarge(
                    f"message of {size} bytes exceeds the limit of {self._max_msg_size}"
                )
            body = await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            self.close()
            raise ConnectionError(f"connection {self.peer} closed") from e
        self._last_activity = self._loop.time()
        try:
            return parse_msg(body)
        except Exception as e:
            raise FrameError(f"undecodable chatter message: {e}") from e

    async def _ping_loop(self, delay: float, timeout: float) -> None:
        # Sleeps until the idle deadline instead of waking on every message: the hot
        # path only stores a timestamp.
        try:
            while not self.is_closed:
                idle = self._loop.time() - self._last_activity
                if idle < delay:
                    await asyncio.sleep(delay - idle)
                    continue
                self.send(_PING, b"", last=False)
                sent = self._loop.time()
                await asyncio.sleep(timeout)
                if self._last_activity < sent:
                    self.close(f"no answer to ping within {timeout} s")
        except (ConnectionError, asyncio.CancelledError):
            pass


def parse_msg(body: bytes) -> Msg:
    """A ``HatChatter.Msg`` parsed by hand (the layout `_frame_head` writes): the header
    fields are a few small integers and flags, and the payload is sliced out once. This
    replaces the C decoder's dict of dicts and a schema lookup per message (every
    request pays it) and, for large bodies, a whole-message pass holding the GIL.
    Raises `SbsIntError` (a ValueError) or `UnicodeDecodeError` for bytes that are not
    one message."""
    msg_id, pos = read_int(body, 0)
    first, pos = read_int(body, pos)
    if pos + 3 > len(body):
        raise SbsIntError("truncated message header")
    owner, token, last = (bool(body[pos]), bool(body[pos + 1]), bool(body[pos + 2]))
    pos += 3
    n, pos = read_int(body, pos)
    if n < 0 or pos + n > len(body):
        raise SbsIntError(f"type length {n} runs past the message")
    msg_type = body[pos : pos + n].decode()
    pos += n
    n, pos = read_int(body, pos)
    if n < 0 or pos + n != len(body):
        raise SbsIntError(f"data length {n} does not match the message ({len(body) - pos} left)")
    return Msg(
        type=msg_type,
        data=body[pos:],
        conv=Conversation(not owner, first),
        first=owner and first == msg_id,
        last=last,
        token=token,
    )


_TYPE_BYTES: dict[str, bytes] = {}  # message type -> its encoded String (a few per protocol)
_BOOL = (b"\x00", b"\x01")


def _frame_head(
    msg_id: int, first: int, owner: bool, token: bool, last: bool, msg_type: str, size: int
) -> bytes:
    """The frame's length prefix and the ``HatChatter.Msg`` encoding up to its payload:
    ``id``, ``first`` (Integers), ``owner``, ``token``, ``last`` (Booleans, one byte
    each), ``data.type`` (String) and the length of ``data.data`` (Bytes), whose `size`
    bytes follow the head on the wire."""
    encoded_type = _TYPE_BYTES.get(msg_type)
    if encoded_type is None:
        raw = msg_type.encode()
        encoded_type = _TYPE_BYTES.setdefault(msg_type, encode_int(len(raw)) + raw)
    body = b"".join(
        (
            encode_int(msg_id),
            encode_int(first),
            _BOOL[bool(owner)],
            _BOOL[bool(token)],
            _BOOL[bool(last)],
            encoded_type,
            encode_int(size),
        )
    )
    total = len(body) + size
    total_bytes = total.to_bytes(max((total.bit_length() + 7) // 8, 1), "big")
    return bytes((len(total_bytes),)) + total_bytes + body


ConnectionCb = Callable[[Connection], Awaitable[None]]


async def serve(connection_cb: ConnectionCb, host: str, port: int, **conn_kwargs) -> asyncio.Server:
    """Listen on host:port; `connection_cb` runs per connection, which is closed after it."""

    async def on_client(reader, writer):
        conn = Connection(reader, writer, **conn_kwargs)
        try:
            await connection_cb(conn)
        except Exception:
            log.exception("chatter connection %s: handler failed", conn.peer)
        finally:
            conn.close()

    return await asyncio.start_server(on_client, host, port, limit=1 << 20)


async def connect(
    host: str, port: int, *, ssl=None, server_hostname: str | None = None, **conn_kwargs
) -> Connection:
    """Connect (over TLS with `ssl`, an ssl.SSLContext verifying `server_hostname`, by
    default `host`)."""
    tls_name = {"server_hostname": server_hostname} if ssl is not None and server_hostname else {}
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20, ssl=ssl, **tls_name)
    return Connection(reader, writer, **conn_kwargs)
