"""One chatter connection: framing, conversations and pings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from eventfleet_server.common.sbsint import SbsIntError, encode_int, read_int

log = logging.getLogger(__name__)

_PING = "HatChatter.Ping"
_PONG = "HatChatter.Pong"
DEFAULT_MAX_MSG_SIZE = 64 * 1024 * 1024
# Bytes of received messages held (queued for `receive`, or while the dispatch is
# paused) before the socket stops being read.
_READ_BUFFER = 1 << 20
# Above this many payload bytes the frame is built and parsed around the payload (no
# whole-message copy through the C codec, which would hold the GIL for all of it).
_LARGE = 64 * 1024
_HEAD_ROOM = 4096
"""A large frame's first chunk shorter than this is joined to the next before its
header is read: every header we or hat-event write fits (ids, flags, a type name)."""


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


class Connection(asyncio.Protocol):
    """A chatter connection, the transport's protocol: frames are parsed as bytes arrive
    (`data_received`) and pings answered there.

    Application messages go either to a handler set by `set_handler` — called
    synchronously, in the iteration that read them, without a stream reader, an async
    generator or a task step per message (`Eventer` sessions) — or to a queue that
    `receive` reads (the init message, the Syncer, clients). A handler can stop the
    dispatch for async work with `pause_dispatch` and continue it (`resume_dispatch`):
    messages stay in order.
    """

    def __init__(
        self,
        *,
        max_msg_size: int = DEFAULT_MAX_MSG_SIZE,
        ping_delay: float | None = 20.0,
        ping_timeout: float = 20.0,
        on_made: Callable[[Connection], None] | None = None,
    ):
        self._max_msg_size = max_msg_size
        self._ping = (ping_delay, ping_timeout)
        self._on_made = on_made
        # Unsent bytes past which a peer that still sends pings is cut: it is not reading.
        self.max_write_buffer: int | None = None
        self._next_id = 1
        self._loop = asyncio.get_running_loop()
        self._closed = self._loop.create_future()
        self._lost = self._loop.create_future()
        self._close_reason: str | None = None
        self._last_activity = self._loop.time()
        self._transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address = "?"
        self._ping_task: asyncio.Task | None = None
        # Received bytes not parsed yet: a partial frame, or frames held while the
        # dispatch is paused; `_need` bytes in all before a parse is worth it.
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 0
        self._handler: Callable[[Msg], None] | None = None
        self._on_error: Callable[[FrameError], None] | None = None
        self._dispatch_paused = False
        self._queue: deque[Msg] = deque()
        self._queued_bytes = 0
        self._waiter: asyncio.Future | None = None
        self._error: FrameError | None = None
        self._reading_paused = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # The remote IP alone (address-based policies: hat-compatible token exemption).
        self.address = peer[0] if isinstance(peer, tuple) else str(peer)
        self._last_activity = self._loop.time()
        delay, timeout = self._ping
        if delay:
            self._ping_task = self._loop.create_task(self._ping_loop(delay, timeout))
        if self._on_made is not None:
            on_made, self._on_made = self._on_made, None
            on_made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)
        self.close()
        self._wake()
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError(f"connection {self.peer} lost"))

    def eof_received(self) -> bool:
        return False  # the transport closes itself

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._last_activity = self._loop.time()
        if self._chunks:
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need or self._dispatch_paused:
                if self._dispatch_paused and self._have > _READ_BUFFER:
                    self._pause_reading()
                return
            if self._need > _LARGE and self._dispatch_large():
                return
            data = b"".join(self._chunks)
            self._chunks = []
            self._have = 0
        elif self._dispatch_paused:
            self._keep(data, 0)
            return
        self._parse(data)

    # -- reading ---------------------------------------------------------------------------

    def _keep(self, rest: bytes, need: int) -> None:
        self._chunks = [rest]
        self._have = len(rest)
        self._need = need

    def _dispatch_large(self) -> bool:
        """Dispatch the large frame that `_chunks` now completes, its payload copied once.

        Joining the chunks, slicing the frame out of the join and the payload out of the
        frame were three copies of up to `max_msg_size` bytes in one loop callback (a
        16 MiB request held the loop ~40 ms: /healthz waited). Here the header is read
        from the first chunk and only the payload is joined. A frame that began at the
        end of a read has its header split: the small first chunk is joined to the next
        ones first (up to `_HEAD_ROOM` bytes, a small copy). False (nothing consumed)
        when the header is still not wholly in the first chunk: then the general path runs.
        """
        chunks = self._chunks
        while len(chunks[0]) < _HEAD_ROOM and len(chunks) > 1:
            chunks[0:2] = [chunks[0] + chunks[1]]
        first = chunks[0]
        n = first[0]  # checked by `_parse` before it kept the partial frame
        head = 1 + n
        size = int.from_bytes(first[1:head], "big")
        end = head + size
        try:
            fields, data_start = _parse_head(first, head, end)
        except Exception:
            # Not in the first chunk, or not a message: the general path tells which.
            return False
        if data_start >= len(first):
            return False
        # The payload: the first chunk's tail, the middle chunks, the last one's head.
        parts: list[bytes | memoryview] = [memoryview(first)[data_start:]]
        offset = len(first)
        rest = b""
        for chunk in chunks[1:]:
            if offset + len(chunk) <= end:
                parts.append(chunk)
            else:
                parts.append(memoryview(chunk)[: end - offset])
                rest = chunk[end - offset :]
            offset += len(chunk)
        self._chunks = []
        self._have = 0
        self._need = 0
        self._dispatch(Msg(data=b"".join(parts), **fields), size)
        if rest:
            if self._dispatch_paused:
                self._keep(rest, 0)
            else:
                self._parse(rest)
        return True

    def _parse(self, data: bytes) -> None:
        """Dispatch every whole frame of `data`; keep the rest."""
        pos = 0
        size_all = len(data)
        while pos < size_all:
            if self._dispatch_paused or self._error is not None or self.is_closed:
                break
            n = data[pos]
            if not 1 <= n <= 8:
                self._frame_error(FrameError(f"invalid length-of-length byte {n}"))
                return
            head = pos + 1 + n
            if head > size_all:
                break
            size = int.from_bytes(data[pos + 1 : head], "big")
            if size > self._max_msg_size:
                self._frame_error(
                    FrameTooLarge(
                        f"message of {size} bytes exceeds the limit of {self._max_msg_size}"
                    ),
                    abort=True,
                )
                return
            end = head + size
            if end > size_all:
                self._keep(data[pos:], end - pos)
                return
            try:
                msg = _c.parse(data, head, end) if _c is not None else None
                if msg is None:
                    msg = _parse_msg_python(data[head:end])
            except Exception as e:
                self._frame_error(FrameError(f"undecodable chatter message: {e}"))
                return
            pos = end
            self._dispatch(msg, size)
        if pos < size_all and not self.is_closed and self._error is None:
            self._keep(data[pos:], 0)

    def _dispatch(self, msg: Msg, size: int) -> None:
        msg_type = msg.type
        if msg_type == _PING:
            limit = self.max_write_buffer
            if limit is not None and self.write_buffer_size > limit:
                self.abort(f"peer pings but does not read: {self.write_buffer_size} bytes unsent")
                return
            self.send(_PONG, b"", conv=msg.conv)
            return
        if msg_type == _PONG:
            return
        handler = self._handler
        if handler is not None:
            self._call(handler, msg)
            return
        self._queue.append(msg)
        self._queued_bytes += size
        if self._queued_bytes > _READ_BUFFER:
            self._pause_reading()
        self._wake()

    def _call(self, handler: Callable[[Msg], None], msg: Msg) -> None:
        try:
            handler(msg)
        except Exception:
            # A bug of the handler: this connection goes, the transport stays sane.
            log.exception("chatter connection %s: message handler failed", self.peer)
            self.abort(f"handler failed on {msg.type}", quiet=True)

    def _frame_error(self, error: FrameError, *, abort: bool = False) -> None:
        self._error = error
        self._chunks = []
        if abort:
            self.abort()
        if self._handler is not None and self._on_error is not None:
            self._on_error(error)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            with contextlib.suppress(Exception):
                self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            with contextlib.suppress(Exception):
                self._transport.resume_reading()

    def set_handler(
        self, handler: Callable[[Msg], None], on_error: Callable[[FrameError], None]
    ) -> None:
        """From now on hand each application message to `handler` as it is read (the
        queued ones first); a bad frame goes to `on_error` (the connection is not
        closed by it, except for an oversize one, which is aborted)."""
        self._handler = handler
        self._on_error = on_error
        self.resume_dispatch()

    def pause_dispatch(self) -> None:
        """Hold the messages read from now on until `resume_dispatch` (in order)."""
        self._dispatch_paused = True

    def resume_dispatch(self) -> None:
        """Dispatch what was held (queued messages first), then go on as bytes arrive."""
        self._dispatch_paused = False
        handler = self._handler
        if handler is None:
            return  # `receive` reads the queue
        queue = self._queue
        while queue and not self._dispatch_paused and not self.is_closed:
            self._call(handler, queue.popleft())
        if queue or self._dispatch_paused or self.is_closed:
            return
        self._queued_bytes = 0
        if self._error is not None:
            if self._on_error is not None:
                self._on_error(self._error)
            return
        self._resume_reading()
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks = []
            self._have = 0
            self._need = 0
            self._parse(data)

    @property
    def is_closed(self) -> bool:
        return self._closed.done()

    @property
    def close_reason(self) -> str | None:
        return self._close_reason

    @property
    def write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()  # type: ignore[union-attr]

    @property
    def max_msg_size(self) -> int:
        return self._max_msg_size

    def set_max_msg_size(self, size: int) -> None:
        """Change the frame size limit (raised once a session is initialised)."""
        self._max_msg_size = size

    async def receive(self) -> Msg:
        """Next queued application message; `ConnectionError` once closed, `FrameError`
        on garbage (pings are answered as they arrive)."""
        while not self._queue:
            if self._error is not None:
                raise self._error
            if self.is_closed:
                raise ConnectionError(f"connection {self.peer} closed")
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        msg = self._queue.popleft()
        if not self._queue:
            self._queued_bytes = 0
            self._resume_reading()
        return msg

    # -- writing ---------------------------------------------------------------------------

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
        head, conv = self._head(msg_type, len(data), conv, last, token)
        transport = self._transport
        if len(data) > _LARGE:
            transport.write(head)  # type: ignore[union-attr]
            transport.write(data)  # type: ignore[union-attr]
        else:
            transport.write(head + data)  # type: ignore[union-attr]
        return conv

    def send_parts(
        self, msg_type: str, parts: list[bytes], *, conv: Conversation | None = None
    ) -> Conversation:
        """`send` of the message whose data is `parts` joined, without joining them: the
        transport takes the pieces as they are (uvloop keeps references, where a join of
        a 16 MiB answer was a copy holding the loop ~15 ms)."""
        head, conv = self._head(msg_type, sum(map(len, parts)), conv, True, True)
        self._transport.write(head)  # type: ignore[union-attr]
        self._transport.writelines(parts)  # type: ignore[union-attr]
        return conv

    def _head(
        self, msg_type: str, size: int, conv: Conversation | None, last: bool, token: bool
    ) -> tuple[bytes, Conversation]:
        """The next message's frame head (for `size` bytes of data) and conversation."""
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
        head = _frame_head(msg_id, conv.first_id, conv.owner, token, last, msg_type, size)
        return head, conv

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
        self._transport.write(b"".join(parts))  # type: ignore[union-attr]

    async def drain(self) -> None:
        """Wait until the transport's buffer is below its high-water mark."""
        if self._lost.done():
            raise ConnectionResetError(f"connection {self.peer} lost")
        if not self._write_paused:
            return
        self._drain_waiter = self._loop.create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

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
        if self._transport is not None:
            self._transport.close()
        self._wake()

    def abort(self, reason: str | None = None, *, quiet: bool = False) -> None:
        """Close now, dropping unsent data: for a peer that stopped reading (a plain close
        would keep the socket until the peer reads what is queued) or sent garbage."""
        self.close(reason, quiet=quiet)
        if self._transport is not None:
            self._transport.abort()

    async def wait_closing(self) -> None:
        """Until either side closed the connection (what is queued may still be
        leaving: `wait_closed` waits for that too)."""
        await asyncio.shield(self._closed)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._lost)

    async def close_after_flush(self, timeout: float, reason: str | None = None) -> None:
        """Give the peer up to `timeout` s to read what is queued and close its side."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.drain(), timeout)
            # The peer is expected to close after an init error; wait for its EOF.
            await asyncio.wait_for(asyncio.shield(self._lost), timeout)
        self.close(reason)

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
    one message. Parsed in C when it is built (`_frame.c`), the same `Msg`."""
    if _c is not None:
        msg = _c.parse(body, 0, len(body))
        if msg is not None:
            return msg
    return _parse_msg_python(body)


def _parse_msg_python(body: bytes) -> Msg:
    fields, pos = _parse_head(body, 0, len(body))
    return Msg(data=body[pos:], **fields)


def _parse_head(buf: bytes, start: int, end: int) -> tuple[dict[str, Any], int]:
    """The fields of the ``HatChatter.Msg`` whose encoding runs from `start` to `end`
    but its payload, read from `buf`, and where the payload starts. `buf` may end before
    `end` (the first chunk of a large frame): then it raises if the header does not fit
    in it (an error that the whole frame may not have)."""
    msg_id, pos = read_int(buf, start)
    first, pos = read_int(buf, pos)
    if pos + 3 > end:
        raise SbsIntError("truncated message header")
    owner, token, last = (bool(buf[pos]), bool(buf[pos + 1]), bool(buf[pos + 2]))
    pos += 3
    n, pos = read_int(buf, pos)
    if n < 0 or pos + n > end:
        raise SbsIntError(f"type length {n} runs past the message")
    if pos + n > len(buf):
        raise IndexError("message type past the buffer")
    msg_type = buf[pos : pos + n].decode()
    pos += n
    n, pos = read_int(buf, pos)
    if n < 0 or pos + n != end:
        raise SbsIntError(f"data length {n} does not match the message ({end - pos} left)")
    fields = {
        "type": msg_type,
        "conv": Conversation(not owner, first),
        "first": owner and first == msg_id,
        "last": last,
        "token": token,
    }
    return fields, pos


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
    if _c is not None:
        head = _c.head(msg_id, first, owner, token, last, encoded_type, size)
        if head is not None:
            return head
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


try:
    # The parse and the head above in C (`_frame.c`): the same messages and bytes, or
    # None for what only the Python code judges (errors, integers beyond 64 bits).
    from eventfleet_server.chatter import _frame as _c

    _c.setup(Msg, Conversation)
except ImportError:  # not built (no C compiler): the Python code alone
    _c = None


ConnectionCb = Callable[[Connection], Awaitable[None]]


async def serve(connection_cb: ConnectionCb, host: str, port: int, **conn_kwargs) -> asyncio.Server:
    """Listen on host:port; `connection_cb` runs per connection, which is closed after it."""
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task] = set()

    async def run(conn: Connection) -> None:
        try:
            await connection_cb(conn)
        except Exception:
            log.exception("chatter connection %s: handler failed", conn.peer)
        finally:
            conn.close()

    def made(conn: Connection) -> None:
        task = loop.create_task(run(conn))
        running.add(task)
        task.add_done_callback(running.discard)

    return await loop.create_server(lambda: Connection(on_made=made, **conn_kwargs), host, port)


async def connect(
    host: str, port: int, *, ssl=None, server_hostname: str | None = None, **conn_kwargs
) -> Connection:
    """Connect (over TLS with `ssl`, an ssl.SSLContext verifying `server_hostname`, by
    default `host`)."""
    tls_name = {"server_hostname": server_hostname} if ssl is not None and server_hostname else {}
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(
        lambda: Connection(**conn_kwargs), host, port, ssl=ssl, **tls_name
    )
    return conn
