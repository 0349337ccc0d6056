"""The Event BUS plug-in: its factory and the object that starts the engine adapter and
the sockets together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from eventfleet_server.bus.adapter import EngineAdapter
from eventfleet_server.bus.config import BusConfig, CurveError
from eventfleet_server.bus.curve import BusCurve
from eventfleet_server.bus.server import BusServer
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.engine import Engine
from eventfleet_server.plugin import ProtocolContext, ProtocolServer

log = logging.getLogger(__name__)


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
        curve: BusCurve | None = None,
        reload_interval: float = 5.0,
    ):
        self.config = config
        self._tasks = tasks
        self.curve = curve
        self._reload_interval = reload_interval
        self.adapter = EngineAdapter(engine, dedup_memory=config.dedup_memory, tasks=tasks)
        self.server = BusServer(
            self.adapter, host, config, token=token, tokens=tokens, tasks=tasks, curve=curve
        )
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
        if self.curve is not None:
            self._tasks.spawn("curve-watch", self._curve_watch_loop())

    def reload(self, reason: str = "SIGHUP") -> None:
        """Re-read the CURVE key files (the replica calls it on SIGHUP)."""
        if self.curve is None:
            return
        try:
            self.curve.reload(reason)
        except Exception:
            # The current keys still serve; the next change of the files may load.
            log.exception("bus curve reload (%s) failed, keeping the current keys", reason)

    async def _curve_watch_loop(self) -> None:
        # Polling, not inotify: kubelet swaps Secret volumes through a symlink.
        while True:
            await asyncio.sleep(self._reload_interval)
            self.reload("key file changed")

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
        out = self.server.describe()
        if self.curve is not None:
            out["curve"] = self.curve.describe()
        return out


CONFIG = BusConfig


def create(config: BusConfig, ctx: ProtocolContext) -> BusProtocol:
    """The Event BUS of `ctx.engine` on `ctx.host`, ports `config.port` .. +2.

    With a fleet token (`ctx.token`) every socket requires ZAP PLAIN credentials whose
    password is a current client token, read at every handshake so that a token
    rotation needs no restart (docs/bus.md, "Authentication"). With ``bus.curve`` on,
    the sockets are CURVE servers instead (`eventfleet_server.bus.curve`); their key
    files are re-read on SIGHUP and every ``token_reload_interval``.
    """
    credentials = ctx.credentials
    tokens = (lambda: credentials.client) if credentials is not None else None
    token = ctx.token
    if token is None and credentials is not None and credentials.client:
        token = credentials.client[0]
    curve = None
    if config.curve.enabled:
        if config.curve.plain_port is not None and token is None:
            raise CurveError(
                f"bus.curve.plain_port: {config.curve.plain_port} needs a client token "
                "(PLAIN's password); none is configured"
            )
        curve = BusCurve(config.curve, tokens)
    return BusProtocol(
        config,
        ctx.engine,
        ctx.host,
        token,
        ctx.tasks.child("bus"),
        tokens=tokens,
        curve=curve,
        reload_interval=ctx.core.token_reload_interval,
    )
