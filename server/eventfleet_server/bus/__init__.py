"""The Event BUS (micro-toolkit RFC, a ZeroMQ clone pattern): SNAPSHOT, PUBLISHER and
COLLECTOR sockets on ports P, P+1, P+2. See docs/bus.md.

`wire` (frames) and `mapping` (events <-> BUS records) are engine-free and ZeroMQ-free;
`server` owns the sockets and talks to a `BusHandler`; `adapter` is that handler over
the engine. ZeroMQ is imported only in this package.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from eventfleet_server.bus._support import Tasks
from eventfleet_server.bus.adapter import EngineAdapter
from eventfleet_server.bus.config import BusConfig
from eventfleet_server.bus.server import BusServer

CONFIG = BusConfig
SCHEMA = json.loads((pathlib.Path(__file__).parent / "schema.json").read_text())


class BusProtocol:
    """The plug-in: the engine adapter and the sockets, started and stopped together."""

    name = "bus"

    def __init__(self, config: BusConfig, engine: Any, host: str, token: str | None, tasks):
        self.config = config
        self._tasks = tasks
        self.adapter = EngineAdapter(engine, dedup_memory=config.dedup_memory, tasks=tasks)
        self.server = BusServer(self.adapter, host, config, token=token, tasks=tasks)
        self.adapter.attach(self.server)

    async def start(self) -> None:
        # The adapter first: the sockets must never serve a snapshot before the head
        # sequence is known (a broadcast before the bind is simply not sent).
        await self.adapter.start()
        try:
            await self.server.start()
        except BaseException:
            await self.adapter.stop()
            await self._tasks.close()
            raise

    async def stop(self) -> None:
        await self.adapter.stop()
        await self.server.stop()

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.server.ports)

    @property
    def connection_count(self) -> int:
        return self.server.connection_count

    @property
    def rejected(self) -> dict[str, int]:
        return self.server.rejected

    def health(self) -> str | None:
        return self.server.health()

    def describe(self) -> dict:
        return self.server.describe()


def create(config: BusConfig, ctx: Any) -> BusProtocol:
    """The Event BUS for the replica described by `ctx` (engine, host, token, tasks)."""
    parent = getattr(ctx, "tasks", None)
    tasks = parent.child("bus") if hasattr(parent, "child") else Tasks("bus")
    return BusProtocol(config, ctx.engine, ctx.host, ctx.token, tasks)


__all__ = ["CONFIG", "SCHEMA", "BusConfig", "BusProtocol", "BusServer", "create"]
