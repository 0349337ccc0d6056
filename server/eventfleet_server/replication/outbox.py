"""A bounded queue of messages to one websocket (server or client side)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from eventfleet_server.replication import codec


class Outbox:
    """A bounded queue of messages to one websocket, drained by one writer task."""

    def __init__(self, ws: Any, limit: int):
        self._ws = ws
        self._limit = limit
        self._queue: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()
        self.overflowed = False
        self.closed = False

    def put(self, msg: dict[str, Any]) -> bool:
        """Queue `msg`; False (and nothing queued) once the limit is reached."""
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

    async def drain(self) -> None:
        """Run until closed: send queued messages in order."""
        queue = self._queue
        encode = codec.encode
        while not self.closed:
            await self._ready.wait()
            self._ready.clear()
            while queue and not self.closed:
                await self._ws.send_str(encode(queue.popleft()))
            if self.overflowed:
                return

    def close(self) -> None:
        self.closed = True
        self._ready.set()
