"""Liveness and readiness: what ``/healthz`` and ``/readyz`` decide, and the loop monitor.

Liveness answers "would a restart help?": only a wedged event loop qualifies, so
``/healthz`` deliberately looks at nothing else — not the disk, not the peers. A slow
disk or a lost peer would otherwise turn into restart loops that make things worse.
Readiness answers "should clients be sent here?": the engine must be operational and the
initial sync with the peers done (a replica that starts empty must not serve queries
before it has caught up, nor create ids before it has learned its own last id).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from eventfleet_server.common.model import Status


def readiness(replica: Any) -> tuple[bool, str | None]:
    """(ready, reason when not ready) from the engine status and every protocol's health.

    Each protocol the replica created (`replica.protocol_states`) must be started and
    say nothing against readiness (the Syncer holds it back until the initial sync is
    done).
    """
    engine = getattr(replica, "engine", None)
    if engine is None:
        return False, "starting: the store is being opened"
    if engine.status != Status.OPERATIONAL:
        return False, f"engine status is {engine.status.value}"
    storage_problem = engine.health() if hasattr(engine, "health") else None
    if storage_problem:
        return False, storage_problem
    for proto, started in getattr(replica, "protocol_states", ()):
        reason = proto.health()
        if reason:
            return False, reason
        if not started:
            return False, f"protocol {proto.name} is starting"
    return True, None


def initial_sync_done(replica: Any) -> bool:
    """True once every created protocol caught up with its peers (True without any that
    has peers: nothing to wait for)."""
    return all(proto.initial_sync_done for proto, _ in getattr(replica, "protocol_states", ()))


def peer_states(replica: Any) -> list[dict]:
    """The replication peers of every created protocol (`ProtocolServer.peer_states`)."""
    return [p for proto, _ in getattr(replica, "protocol_states", ()) for p in proto.peer_states()]


class LoopMonitor:
    """Samples how late the event loop runs a due timer (feeds a histogram).

    If the loop is blocked, /healthz itself is not answered and the kubelet's probe times
    out, which is the liveness signal; this monitor makes shorter stalls visible too.
    """

    def __init__(self, observe, interval: float = 0.5):
        self._observe = observe
        self._interval = interval
        self._task: asyncio.Task | None = None
        self.last_lag: float = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._interval
            await asyncio.sleep(self._interval)
            self.last_lag = max(loop.time() - due, 0.0)
            self._observe(self.last_lag)
