"""The replica process: wires storage, engine and protocols, and handles signals.

Protocols are plug-ins (`eventfleet_server.plugin`), listed in start order by the protocol
registry (`eventfleet_server.registry`); `PROTOCOLS` holds their plug-in modules, each with
``CONFIG`` (its typed section) and ``create(config, ctx)``.
Start: HTTP (probes answer from the first second), storage, engine; every protocol's
``prepare`` (the Syncer serves our store and learns our last id from peers
before any id is created); the engine; then each protocol's ``start``. Stop: the engine
stops accepting and commits what is pending, then protocols close in reverse order
(the Syncer asks peers to confirm they hold our events), then storage, then HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import hashlib
import importlib
import logging
import os
import pathlib
import signal
from collections.abc import Mapping
from types import ModuleType

from eventfleet_server import gctune
from eventfleet_server.backup import BackupError, RestoreSource
from eventfleet_server.backup.restore import restore as restore_backup
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.config import ConfigError, ReplicaConfig, build, read_credentials
from eventfleet_server.engine import Engine
from eventfleet_server.http import HttpServer
from eventfleet_server.listener import Credentials, TlsError, TlsSettings
from eventfleet_server.plugin import ProtocolContext, ProtocolServer
from eventfleet_server.registry import PROTOCOLS as REGISTRY
from eventfleet_server.storage import CorruptStoreError, Retention, SchemaVersionError, Storage

log = logging.getLogger(__name__)

# Seconds after `stop_deadline` at which the C watchdog ends a stop the loop cannot.
_WATCHDOG_MARGIN = 5.0

# name (= configuration section = package) -> plug-in module, in the registry's start
# order. Imported by name from the registry, so adding a protocol does not touch this file.
PROTOCOLS: dict[str, ModuleType] = {e.name: importlib.import_module(e.plugin) for e in REGISTRY}


class Replica:
    """One replica built from a validated, default-filled configuration mapping.

    `token` is the one shared token (tests, embedding) or the replica's `Credentials`
    (client and peer tokens, `eventfleet server`); with token files configured, the
    credentials are re-read on SIGHUP and when a file changes. `config_path` (optional)
    is the file the peer list is reloaded from. `failed` is set (with the reason) when a
    critical background task stops: `run` then stops the replica and exits non-zero.
    """

    def __init__(
        self,
        conf: Mapping,
        token: str | Credentials | None,
        config_path: pathlib.Path | None = None,
    ):
        self.conf = conf
        self.core = build(ReplicaConfig, conf)
        self.credentials = token if isinstance(token, Credentials) else Credentials.of(token)
        # Files to re-read on reload; a token given directly never changes.
        self._token_files = (
            [p for p in (self.core.token_file, self.core.peer_token_file) if p]
            if isinstance(token, Credentials)
            else []
        )
        self._token_digest = self._digest_token_files()
        self.config_path = config_path
        self.tasks = Tasks("replica", self._on_fatal)
        self.failure: str | None = None
        self.failed = asyncio.Event()
        self.storage: Storage | None = None
        self.engine: Engine | None = None
        self.http: HttpServer | None = None
        self.tls: TlsSettings | None = None  # reloaded with the tokens (renewal)
        # Started protocols by name, in start order (metrics, /status, /readyz read it).
        self.protocols: dict[str, ProtocolServer] = {}
        self._created: list[ProtocolServer] = []

    # Named access for the protocols that other parts of the replica talk to directly
    # (tests and embedding; the HTTP server reads protocols only through the interface).
    @property
    def token(self) -> str | None:
        """The (first) client token, None when clients need none."""
        return self.credentials.client_token

    @property
    def eventer(self):
        return self._protocol("eventer")

    @property
    def syncer(self):
        return self._protocol("syncer")

    @property
    def protocol_states(self) -> list[tuple[ProtocolServer, bool]]:
        """Every protocol created from the configuration, in start order, with whether it
        has started yet (what readiness needs, in one place)."""
        return [(p, p.name in self.protocols) for p in self._created]

    def _protocol(self, name: str):
        return self.protocols.get(name) or next((p for p in self._created if p.name == name), None)

    def _on_fatal(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            log.critical("replica failing: %s", reason)
        self.failed.set()

    async def start(self) -> None:
        core = self.core
        data_dir = pathlib.Path(core.data_dir)
        # HTTP first: probes answer ("alive, not ready") during the whole start-up.
        _private_dir(data_dir)
        tls = self.tls = core.tls.settings()
        self.http = HttpServer(
            self,
            core.http.host or core.host,
            core.http.port,
            ssl_context=tls.server_context() if tls and core.tls.http else None,
        )
        await self.http.start()
        db_path = data_dir / "events.sqlite"
        await self._restore_if_empty(db_path)
        retention = core.storage.retention
        self.storage = await Storage.open(
            db_path,
            synchronous=core.storage.synchronous,
            quick_check_timeout=core.storage.quick_check_timeout,
            max_db_bytes=core.storage.max_db_bytes,
            retention=Retention(
                max_age_seconds=retention.max_age_seconds, max_events=retention.max_events
            ),
        )
        self.engine = Engine(
            self.storage,
            core.server_id,
            max_uncommitted=core.storage.max_uncommitted,
            # A query limit, configured with the query protocol it is visible in.
            max_results_cap=self.conf["eventer"]["max_results_cap"],
            tasks=self.tasks,
        )
        self.http.metrics.instrument(self.engine)
        ctx = ProtocolContext(
            engine=self.engine,
            host=core.host,
            server_id=core.server_id,
            data_dir=data_dir,
            token=self.token,
            credentials=self.credentials,
            tls=tls,
            tasks=self.tasks,
            mount=self.http.mount,
            mount_json=self.http.mount_json,
            add_metrics=self.http.add_metrics,
            peers=lambda: list(self.conf.get("peers", [])),
            core=core,
            config_path=self.config_path,
        )
        for name, module in PROTOCOLS.items():
            section = self.conf.get(name, {})
            if not section.get("enabled", True):
                log.info("protocol %s disabled by configuration", name)
                continue
            proto = module.create(build(module.CONFIG, section), ctx)
            if not isinstance(proto, ProtocolServer):
                raise TypeError(
                    f"protocol {name!r}: create() returned {proto!r}, not a ProtocolServer"
                )
            self._created.append(proto)
        # Before any id exists: protocols may learn our highest own id (Syncer bootstrap).
        continue_after = None
        for proto in self._created:
            learned = await proto.prepare(self.engine)
            if learned is not None and (
                continue_after is None or learned.instance > continue_after.instance
            ):
                continue_after = learned
        await self.engine.start(continue_after=continue_after)
        self.engine.set_operational()
        for proto in self._created:
            await proto.start()
            self.protocols[proto.name] = proto
        gctune.settle()  # start-up's objects out of the collector's way (see there)
        if retention.enabled:
            self.tasks.spawn("retention", self._retention_loop(retention.check_interval_seconds))
        if self._token_files or tls:
            self.tasks.spawn(
                "credential-watch", self._credential_watch_loop(core.token_reload_interval)
            )
        log.info(
            "replica server_id=%s operational: %s peers=%s data=%s",
            core.server_id,
            " ".join(f"{p.name}={core.host}:{p.describe().get('port')}" for p in self._created),
            [p["name"] for p in self.conf.get("peers", [])],
            data_dir,
        )

    async def _restore_if_empty(self, db_path: pathlib.Path) -> None:
        """Fill an empty data directory from ``backup.restore_from`` (see
        `eventfleet_server.backup.restore` for when and why only then)."""
        source = RestoreSource.from_config((self.conf.get("backup") or {}).get("restore_from"))
        if source is None or await asyncio.to_thread(db_path.exists):
            return
        if not self.core.allow_empty_start:
            log.warning(
                "backup.restore_from ignored: allow_empty_start is false (a replica of an "
                "initialized fleet re-syncs from its peers instead of starting behind them)"
            )
            return
        log.info("data directory holds no store: restoring %s", source.describe(source.key))
        await asyncio.to_thread(restore_backup, source, db_path)

    async def stop(self) -> None:
        """Graceful: status stopping (clients are told), commit, close protocols (in
        reverse start order), storage, then HTTP."""
        if self.engine:
            await self.engine.stop()
        for proto in reversed(self._created):
            try:
                await proto.stop()
            except Exception:
                log.exception("protocol %s did not stop cleanly", proto.name)
        await self.tasks.close(timeout=5)
        if self.storage:
            await self.storage.close()
        if self.http:
            # Last: /readyz reports "stopping" and /healthz stays alive while we drain.
            await self.http.stop()
        log.info("replica stopped")

    def reload(self, reason: str = "SIGHUP") -> None:
        """Re-read what can change without a restart (tokens, certificates, the peer
        list)."""
        self.reload_credentials(reason)
        if self.tls is not None:
            self.tls.reload()
        for proto in self._created:
            proto.reload(reason)

    def _digest_token_files(self) -> str:
        h = hashlib.sha256()
        for path in self._token_files:
            try:
                h.update(pathlib.Path(path).read_bytes())
            except OSError:
                h.update(b"\0missing")
        return h.hexdigest()

    def reload_credentials(self, reason: str) -> bool:
        """Re-read the token files; True when the tokens changed.

        A file that cannot be read (a Secret half-swapped, an operator error) keeps the
        current tokens: refusing every client because of a bad reload would be an outage.
        New tokens apply to new connections; established sessions stay.
        """
        if not self._token_files:
            return False
        self._token_digest = self._digest_token_files()
        try:
            client, peer = read_credentials(self.conf)
        except ConfigError as e:
            log.error("token reload (%s) ignored, keeping the current tokens: %s", reason, e)
            return False
        changed = self.credentials.update(client, peer)
        if changed:
            log.info(
                "tokens reloaded (%s): %d client token(s), %d peer token(s)",
                reason,
                len(self.credentials.client),
                len(self.credentials.peer),
            )
        return changed

    async def _credential_watch_loop(self, interval: float) -> None:
        # Polling, not inotify: kubelet swaps Secret volumes through a symlink.
        while True:
            await asyncio.sleep(interval)
            if self._token_files and self._digest_token_files() != self._token_digest:
                self.reload_credentials("token file changed")
            if self.tls is not None:
                self.tls.reload()

    async def _retention_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                deleted = await self.storage.enforce_retention()
                if deleted:
                    log.info("retention deleted %d events", deleted)
            except Exception:
                log.exception("retention pass failed")


def _private_dir(path: pathlib.Path) -> None:
    """Create the data directory readable by this user only (0700); tighten an existing
    one we own, and the files in it (0600: a store an older version created 0644).
    Events may be confidential and the token files often sit beside it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for item, mode in [(path, 0o700), *((f, 0o600) for f in _files(path))]:
        try:
            st = item.lstat()
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                item.chmod(mode)
                log.info("made %s private (%o)", item, mode)
        except OSError as e:
            log.warning("cannot make %s private (%o): %s", item, mode, e)


def _files(path: pathlib.Path) -> list[pathlib.Path]:
    try:
        return [f for f in path.iterdir() if f.is_file() and not f.is_symlink()]
    except OSError:
        return []


async def run(
    conf: Mapping, token: str | Credentials | None, config_path: pathlib.Path | None = None
) -> int:
    """Run a replica until SIGTERM/SIGINT, then stop gracefully; SIGHUP reloads peers.

    Returns the exit code: 0 after a requested stop, 1 when a critical background task
    stopped (the reason is logged) or the start failed.
    """
    replica = Replica(conf, token, config_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGHUP, replica.reload)
    try:
        # Start-up can wait for peers (identity safety): a stop request must still win.
        starting = loop.create_task(replica.start(), name="replica/start")
        stopping = loop.create_task(stop.wait(), name="replica/stop-signal")
        failing = loop.create_task(replica.failed.wait(), name="replica/failure")
        await asyncio.wait({starting, stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done() and not failing.done():
            try:
                starting.result()
            except (CorruptStoreError, SchemaVersionError, TlsError, BackupError, ConfigError) as e:
                # One line, no traceback: the message says what to do (a restart loop
                # with a traceback tells an operator nothing).
                log.critical("cannot start: %s", e)
                replica.failure = str(e)
                return 1
            await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        if failing.done():
            log.error("stopping: %s", replica.failure)
        else:
            log.info("stop requested")
        _arm_stop_deadline(loop, replica.core.stop_deadline)
        for task in (starting, stopping, failing):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        await replica.stop()
        faulthandler.cancel_dump_traceback_later()  # the stop finished: disarm the watchdog
    return 1 if replica.failure else 0


def _arm_stop_deadline(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    """A graceful stop gets `deadline` seconds (``stop_deadline``); a second SIGTERM/SIGINT
    ends it now.

    Why: a stop stuck on a peer or a task must not leave the process running forever
    (a supervisor or kubelet would kill it anyway, later). The store needs no clean
    close: every commit is already durable.
    """

    def force(why: str) -> None:
        log.error("%s: exiting without finishing the graceful stop", why)
        logging.shutdown()
        os._exit(1)

    loop.call_later(deadline, force, f"graceful stop not done within {deadline:g} s")
    # The same deadline when the loop itself is blocked (a C call that never returns
    # cannot be interrupted by `call_later`): a C watchdog thread prints every thread's
    # stack to stderr, so the hang names itself, and exits with 1.
    faulthandler.dump_traceback_later(deadline + _WATCHDOG_MARGIN, exit=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, force, f"{signal.Signals(sig).name} during the stop")
