"""The replica process: wires storage, engine and protocols, and handles signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import signal
from collections.abc import Mapping

from eventfleet_server import bus
from eventfleet_server.engine import Engine
from eventfleet_server.eventer import EventerLimits, EventerServer
from eventfleet_server.http import HttpServer
from eventfleet_server.storage import Retention, Storage
from eventfleet_server.syncer import Syncer

log = logging.getLogger(__name__)


class Replica:
    """One replica built from a validated configuration mapping.

    `config_path` (optional) is the file the peer list is reloaded from.
    """

    def __init__(self, conf: Mapping, token: str | None, config_path: pathlib.Path | None = None):
        self.conf = conf
        self.token = token
        self.config_path = config_path
        # Exists from construction so that /readyz can report "initial sync not done".
        self.syncer = Syncer(conf, token)
        self.storage: Storage | None = None
        self.engine: Engine | None = None
        self.eventer: EventerServer | None = None
        self.bus: bus.BusProtocol | None = None
        self.http: HttpServer | None = None
        self._retention_task: asyncio.Task | None = None

    async def start(self) -> None:
        conf = self.conf
        data_dir = pathlib.Path(conf["data_dir"])
        # HTTP first: probes answer ("alive, not ready") during the whole start-up.
        self.http = HttpServer(self, conf["host"], conf["http"]["port"])
        await self.http.start()
        retention_conf = conf["storage"]["retention"]
        self.storage = await Storage.open(
            data_dir / "events.sqlite",
            synchronous=conf["storage"]["synchronous"],
            retention=Retention(
                max_age_seconds=retention_conf.get("max_age_seconds"),
                max_events=retention_conf.get("max_events"),
            ),
        )
        ev = conf["eventer"]
        self.engine = Engine(
            self.storage,
            conf["server_id"],
            max_uncommitted=conf["storage"]["max_uncommitted"],
            max_results_cap=ev["max_results_cap"],
        )
        self.http.metrics.instrument(self.engine)
        # Serve our store to peers first (peers booting at the same time learn from us),
        # then learn our own highest id from them before the engine creates any event.
        await self.syncer.start_server(self.engine)
        await self.engine.start(continue_after=await self.syncer.bootstrap())
        self.eventer = EventerServer(
            self.engine,
            conf["host"],
            ev["port"],
            token=self.token,
            limits=EventerLimits(
                max_msg_size=ev["max_msg_size"],
                max_queued_events=ev["max_queued_events"],
                ack_every=ev["ack_every"],
                ack_window=ev["ack_window"],
            ),
        )
        await self.eventer.start()
        if conf["bus"]["enabled"]:
            self.bus = bus.create(
                bus.CONFIG.from_mapping(conf["bus"]),
                _Context(self.engine, conf["host"], self.token),
            )
            await self.bus.start()
        if retention_conf.get("max_age_seconds") or retention_conf.get("max_events"):
            self._retention_task = asyncio.get_running_loop().create_task(
                self._retention_loop(retention_conf["check_interval_seconds"])
            )
        self.engine.set_operational()
        self.syncer.start_mesh(self.config_path)
        log.info(
            "replica server_id=%s operational: eventer=%s:%s syncer=%s:%s peers=%s data=%s",
            conf["server_id"],
            conf["host"],
            self.eventer.port,
            conf["host"],
            self.syncer.port,
            [p.name for p in self.syncer.peers],
            data_dir,
        )

    async def stop(self) -> None:
        """Graceful: status stopping (clients are told), commit, close listeners and storage."""
        if self._retention_task:
            self._retention_task.cancel()
        if self.engine:
            await self.engine.stop()
        # After the last commit: peers confirm they hold our events (MsgFlushReq/Res).
        await self.syncer.stop()
        if self.eventer:
            await self.eventer.stop()
        if self.bus:
            await self.bus.stop()
        if self.storage:
            await self.storage.close()
        if self.http:
            # Last: /readyz reports "stopping" and /healthz stays alive while we drain.
            await self.http.stop()
        log.info("replica stopped")

    async def _retention_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                deleted = await self.storage.enforce_retention()
                if deleted:
                    log.info("retention deleted %d events", deleted)
            except Exception:
                log.exception("retention pass failed")


class _Context:
    """The part of the protocol context the Event BUS uses (until the scaffold's)."""

    def __init__(self, engine: Engine, host: str, token: str | None):
        self.engine = engine
        self.host = host
        self.token = token
        self.tasks = None


async def run(conf: Mapping, token: str | None, config_path: pathlib.Path | None = None) -> None:
    """Run a replica until SIGTERM/SIGINT, then stop gracefully; SIGHUP reloads peers."""
    replica = Replica(conf, token, config_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGHUP, replica.syncer.reload)
    try:
        # Start-up can wait for peers (identity safety): a stop request must still win.
        starting = loop.create_task(replica.start())
        stopping = loop.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()
            await stopping
        log.info("stop requested")
        _arm_stop_deadline(loop)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
    finally:
        await replica.stop()


STOP_DEADLINE = 25.0


def _arm_stop_deadline(loop: asyncio.AbstractEventLoop) -> None:
    """A graceful stop gets STOP_DEADLINE seconds; a second SIGTERM/SIGINT ends it now.

    Why: a stop stuck on a peer or a task must not leave the process running forever
    (a supervisor or kubelet would kill it anyway, later). The store needs no clean
    close: every commit is already durable.
    """

    def force(why: str) -> None:
        log.error("%s: exiting without finishing the graceful stop", why)
        logging.shutdown()
        os._exit(1)

    loop.call_later(STOP_DEADLINE, force, f"graceful stop not done within {STOP_DEADLINE:g} s")
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, force, f"{signal.Signals(sig).name} during the stop")
