"""The Event BUS plug-in: its factory and the object that starts the engine adapter and
the sockets together."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eventfleet_server.bus.adapter import EngineAdapter
from eventfleet_server.bus.config import BusConfig
from eventfleet_server.bus.server import BusServer
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.engine import Engine
from eventfleet_server.plugin import ProtocolContext, ProtocolServer


class BusProtocol(ProtocolServer):
    """The plug-in: the engine adapter and the sockets, started and stopped together."""

    name = "bus"

    def __init__(
        self,
        config: BusConfig,
        engine: Engine,
        host: str,
        token: str | None,
        tasks: Tasks,
        tokens: Callable[[], Sequence[str]] | None = None,
    ):
        self.config = config
        self._tasks = tasks
        self.adapter = EngineAdapter(engine, dedup_memory=config.dedup_memory, tasks=tasks)
        self.server = BusServer(self.adapter, host, config, token=token, tokens=tokens, tasks=tasks)
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


CONFIG = BusConfig


def create(config: BusConfig, ctx: ProtocolContext) -> BusProtocol:
    """The Event BUS of `ctx.engine` on `ctx.host`, ports `config.port` .. +2.

    With a fleet token (`ctx.token`) every socket requires ZAP PLAIN credentials whose
    password is a current client token, read at every handshake so that a token
    rotation needs no restart (docs/bus.md, "Authentication").
    """
    credentials = ctx.credentials
    tokens = (lambda: credentials.client) if credentials is not None else None
    token = ctx.token
    if token is None and credentials is not None and credentials.client:
        token = credentials.client[0]
    return BusProtocol(config, ctx.engine, ctx.host, token, ctx.tasks.child("bus"), tokens=tokens)
