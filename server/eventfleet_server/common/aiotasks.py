"""Named, guarded background tasks bound to their owner's lifecycle.

A task that is meant to run until its owner stops (a writer, a merger, a watcher) and
instead returns or fails is the worst failure an event server can have when it goes
unnoticed: events stop being committed while the process looks healthy. `Tasks` makes
such an exit loud: it is logged with the task's name and reported to `on_fatal`, which
the replica turns into a stop with that reason (and a non-zero exit, so a supervisor or
the kubelet restarts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

FatalCallback = Callable[[str], None]


class TaskFailed(Exception):
    """Raised by `Tasks.spawn` after `close` (the owner is stopping)."""


class Tasks:
    """A group of named tasks owned by one component.

    `spawn(name, coro)` starts a *critical* task by default: if it ends while the group is
    open, `on_fatal("<owner>/<name> ...")` is called. `critical=False` is for tasks that
    may end by themselves (one per connection or per request); their failures are logged.
    `child(name)` makes a sub-group that shares `on_fatal` and is closed with its parent.
    `close()` cancels every task still running and waits for all of them.
    """

    def __init__(self, owner: str, on_fatal: FatalCallback | None = None):
        self.owner = owner
        self._on_fatal = on_fatal
        self._tasks: dict[asyncio.Task, str] = {}
        self._children: list[Tasks] = []
        self._closing = False

    @property
    def names(self) -> list[str]:
        """Names of the running tasks (for status pages and tests)."""
        return sorted(self._tasks.values())

    def child(self, name: str) -> Tasks:
        group = Tasks(f"{self.owner}/{name}", self._on_fatal)
        if self._closing:
            group._closing = True
        self._children.append(group)
        return group

    def group(self, name: str) -> Tasks:
        """A sub-group that shares `on_fatal` but is closed by whoever made it (not with
        this group): for components that come and go, such as one peer's link."""
        return Tasks(f"{self.owner}/{name}", self._on_fatal)

    def spawn(
        self, name: str, coro: Coroutine[Any, Any, Any], *, critical: bool = True
    ) -> asyncio.Task:
        if self._closing:
            coro.close()
            raise TaskFailed(f"{self.owner} is stopping: task {name!r} not started")
        full = f"{self.owner}/{name}"
        task = asyncio.get_running_loop().create_task(coro, name=full)
        self._tasks[task] = full
        task.add_done_callback(lambda t: self._done(t, critical))
        return task

    def _done(self, task: asyncio.Task, critical: bool) -> None:
        name = self._tasks.pop(task, task.get_name())
        if task.cancelled():
            if critical and not self._closing:
                self._fatal(f"{name} was cancelled while its owner is running")
            return
        error = task.exception()
        if error is not None:
            if critical and not self._closing:
                log.error("task %s failed", name, exc_info=error)
                self._fatal(f"{name} failed: {error!r}")
            elif not isinstance(error, ConnectionError):
                log.error("task %s failed", name, exc_info=error)
            return
        if critical and not self._closing:
            self._fatal(f"{name} exited while its owner is running")

    def _fatal(self, reason: str) -> None:
        log.critical("background task stopped: %s", reason)
        if self._on_fatal is not None:
            self._on_fatal(reason)

    async def close(self, timeout: float | None = None) -> None:
        """Cancel and await every task of this group and its children."""
        self._closing = True
        for group in self._children:
            await group.close(timeout)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.gather(*tasks, return_exceptions=True)
