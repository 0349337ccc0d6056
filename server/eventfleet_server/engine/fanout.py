"""Hand committed sessions to a protocol's subscribers in order, a large one in slices.

Both the Eventer (notifications) and the Syncer (live ``MsgEvents``) get every committed
session from the engine and send each subscriber its selection of the stored bytes. A
small session goes out at once, inside the engine's callback; a large one (or anything
queued behind it, so that the order holds) is delivered a slice at a time by a task that
yields to the loop between slices, so that 10,000 events never hold the loop for the
whole selection.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from eventfleet_server.common.model import Event

Deliver = Callable[..., None]
"""``deliver(events, sbs, *extra)``: send one slice (never raises for one subscriber)."""

Spawn = Callable[[str, Coroutine[Any, Any, Any]], Any]
"""Starts the slicing task under the protocol's own guarded task group."""


class SlicedFanout:
    """An ordered queue of committed sessions in front of `deliver`."""

    def __init__(self, deliver: Deliver, slice_size: int, spawn: Spawn) -> None:
        self._deliver = deliver
        self._slice = slice_size
        self._spawn = spawn
        self._queue: deque[tuple[list[Event], list[bytes], tuple[Any, ...]]] = deque()
        self._running = False

    def push(self, events: list[Event], sbs: list[bytes], *extra: Any) -> None:
        """Deliver now when nothing waits and the session is small, else queue it."""
        if not self._queue and len(events) <= self._slice:
            self._deliver(events, sbs, *extra)
            return
        self._queue.append((events, sbs, extra))
        if not self._running:
            self._running = True
            try:
                self._spawn("fan-out", self._loop())
            except BaseException:
                self._running = False
                raise

    async def _loop(self) -> None:
        try:
            while self._queue:
                events, sbs, extra = self._queue[0]
                for start in range(0, len(events), self._slice):
                    end = start + self._slice
                    self._deliver(events[start:end], sbs[start:end], *extra)
                    await asyncio.sleep(0)
                self._queue.popleft()
        finally:
            self._running = False
