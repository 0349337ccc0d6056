"""A bounded queue of messages to one websocket (server or client side).

Batched writes: when several messages are queued, the server side writes all their
frames with one ``transport.writelines`` (one system call) instead of one per frame —
the per-frame ``send`` was the largest single cost of an initial pass. That path builds
uncompressed text frames itself (masked on the client side, with aiohttp's own mask
function) and uses aiohttp's writer internals (``_writer.transport``/``protocol``/
``use_mask``, pinned by ``aiohttp~=3.13.3``); it is taken only for a writer without
compression and falls back to ``send_str`` otherwise.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections import deque
from typing import Any

from eventfleet_server.replication import wire

try:  # aiohttp's (Cython) XOR mask; the client side must mask every frame
    from aiohttp._websocket.helpers import websocket_mask as _mask
except ImportError:  # pragma: no cover - then the client side uses send_str
    _mask = None

_LEN1 = struct.Struct("!BB").pack
_LEN2 = struct.Struct("!BBH").pack
_LEN3 = struct.Struct("!BBQ").pack
_BATCH_BYTES = 256 * 1024  # flush a batch at this size, then honour flow control


def _frame(text: str, masked: bool = False) -> bytes:
    data = text.encode()
    n = len(data)
    bit = 0x80 if masked else 0
    if n < 126:
        header = _LEN1(0x81, n | bit)
    elif n < 65536:
        header = _LEN2(0x81, 126 | bit, n)
    else:
        header = _LEN3(0x81, 127 | bit, n)
    if not masked:
        return header + data
    key = os.urandom(4)
    payload = bytearray(data)
    _mask(key, payload)
    return header + key + payload


class Outbox:
    """Messages to one websocket, drained in order by one writer task."""

    def __init__(self, ws: Any, limit: int):
        self._ws = ws
        self._limit = limit
        self._queue: deque[dict[str, Any] | str] = deque()
        self._ready = asyncio.Event()
        self.overflowed = False
        self.closed = False

    def put(self, msg: dict[str, Any] | str) -> bool:
        """Queue `msg` (a message, or its frame text already encoded); False (and
        nothing queued) once the limit is reached."""
        if self.closed or self.overflowed:
            return False
        if len(self._queue) >= self._limit:
            self.overflowed = True
            self._ready.set()
            return False
        self._queue.append(msg)
        self._ready.set()
        return True

    def __len__(self) -> int:
        return len(self._queue)

    def _raw_writer(self) -> Any:
        writer = getattr(self._ws, "_writer", None)
        if (
            writer is None
            or (getattr(writer, "use_mask", True) and _mask is None)
            or getattr(writer, "compress", 1)
            or not hasattr(writer, "transport")
            or not hasattr(writer, "protocol")
        ):
            return None
        return writer

    async def drain(self) -> None:
        """Run until closed: send queued messages in order."""
        queue = self._queue

        def encode(msg: dict[str, Any] | str) -> str:
            return msg if type(msg) is str else wire.encode(msg)  # type: ignore[arg-type]

        while not self.closed:
            await self._ready.wait()
            self._ready.clear()
            while queue and not self.closed:
                writer = self._raw_writer() if len(queue) > 1 else None
                if writer is None or writer.transport is None or writer.transport.is_closing():
                    await self._ws.send_str(encode(queue.popleft()))
                    continue
                frames: list[bytes] = []
                size = 0
                masked = bool(writer.use_mask)
                while queue and size < _BATCH_BYTES:
                    frame = _frame(encode(queue.popleft()), masked)
                    frames.append(frame)
                    size += len(frame)
                writer.transport.writelines(frames)
                protocol = writer.protocol
                if getattr(protocol, "_paused", False):
                    await protocol._drain_helper()
            if self.overflowed:
                return

    def close(self) -> None:
        self.closed = True
        self._ready.set()
