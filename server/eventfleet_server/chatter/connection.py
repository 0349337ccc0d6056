"""One chatter connection: framing, conversations and pings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from eventfleet_server.common.codec import repo
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
        large = len(data) > _LARGE
        body = repo.encode(
            "HatChatter.Msg",
            {
                "id": msg_id,
                "first": conv.first_id,
                "owner": conv.owner,
                "token": token,
                "last": last,
                "data": {"type": msg_type, "data": b"" if large else data},
            },
        )
        if large:
            # Data.data is the record's last field: drop the empty Bytes (its length 0)
            # and append the real length; the payload follows as it is.
            body = body[:-1] + encode_int(len(data))
        size = len(body) + (len(data) if large else 0)
        size_bytes = size.to_bytes(max((size.bit_length() + 7) // 8, 1), "big")
        self._writer.write(bytes((len(size_bytes),)) + size_bytes + body)
        if large:
            self._writer.write(data)
        return conv

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
            raw = _parse_large(body) if size > _LARGE else repo.decode("HatChatter.Msg", body)
        except Exception as e:
            raise FrameError(f"undecodable chatter message: {e}") from e
        data = raw["data"]
        return Msg(
            type=data["type"],
            data=data["data"],
            conv=Conversation(not raw["owner"], raw["first"]),
            first=raw["owner"] and raw["first"] == raw["id"],
            last=raw["last"],
            token=raw["token"],
        )

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


def _parse_large(body: bytes) -> dict:
    """A ``HatChatter.Msg`` parsed by hand: the fields before Data.data are small; the
    payload is sliced out once instead of going through the C decoder."""
    view = memoryview(body)
    msg_id, pos = read_int(view, 0)
    first, pos = read_int(view, pos)
    if pos + 3 > len(view):
        raise SbsIntError("truncated message header")
    owner, token, last = (bool(view[pos]), bool(view[pos + 1]), bool(view[pos + 2]))
    pos += 3
    n, pos = read_int(view, pos)
    if n < 0 or pos + n > len(view):
        raise SbsIntError(f"type length {n} runs past the message")
    msg_type = str(view[pos : pos + n], "utf-8")
    pos += n
    n, pos = read_int(view, pos)
    if n < 0 or pos + n != len(view):
        raise SbsIntError(f"data length {n} does not match the message ({len(view) - pos} left)")
    data = bytes(view[pos:])
    return {
        "id": msg_id,
        "first": first,
        "owner": owner,
        "token": token,
        "last": last,
        "data": {"type": msg_type, "data": data},
    }


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
