"""Stand-ins for `eventfleet_server.listener` (Rejections, Tasks) until the protocol
scaffold lands on this branch; same call shapes, so switching is an import change."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Rejections:
    """Counts refusals by reason; logs the first of a reason at once, then one summary
    line per reason per interval (a flood costs a line or two)."""

    def __init__(self, protocol: str, log_interval: float = 10.0):
        self.protocol = protocol
        self._interval = log_interval
        self._counts: dict[str, int] = {}
        self._windows: dict[str, tuple[float, int]] = {}

    @property
    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def reject(self, reason: str, detail: str, peer: str | None = None) -> None:
        reason = str(reason)
        self._counts[reason] = self._counts.get(reason, 0) + 1
        now = time.monotonic()
        window = self._windows.get(reason)
        if window is not None and now - window[0] < self._interval:
            self._windows[reason] = (window[0], window[1] + 1)
            return
        if window is not None and window[1]:
            log.warning(
                "%s refused %d more (%s) in the last %.0f s; total %d",
                self.protocol,
                window[1],
                reason,
                now - window[0],
                self._counts[reason],
            )
        self._windows[reason] = (now, 0)
        where = f" from {peer}" if peer else ""
        log.warning("%s refused%s (%s): %s", self.protocol, where, reason, detail)


class Tasks:
    """Named tasks; a critical one that ends while the group is open calls `on_fatal`."""

    def __init__(self, owner: str, on_fatal: Callable[[str], None] | None = None):
        self.owner = owner
        self._on_fatal = on_fatal
        self._tasks: dict[asyncio.Task, str] = {}
        self._closing = False

    def spawn(
        self, name: str, coro: Coroutine[Any, Any, Any], *, critical: bool = True
    ) -> asyncio.Task:
        full = f"{self.owner}/{name}"
        task = asyncio.get_running_loop().create_task(coro, name=full)
        self._tasks[task] = full
        task.add_done_callback(lambda t: self._done(t, critical))
        return task

    def _done(self, task: asyncio.Task, critical: bool) -> None:
        name = self._tasks.pop(task, task.get_name())
        if task.cancelled():
            error: BaseException | None = None
        else:
            error = task.exception()
        if error is not None and not (critical and not self._closing):
            log.error("task %s failed", name, exc_info=error)
        if critical and not self._closing:
            log.critical("background task stopped: %s (%r)", name, error)
            if self._on_fatal is not None:
                self._on_fatal(f"{name} exited: {error!r}")

    async def close(self) -> None:
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
