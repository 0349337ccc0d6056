"""Runs the replicas of a local fleet as processes and keeps them running.

Like a StatefulSet controller: a replica process that exits is started again on the
same data directory, after a delay that doubles with each quick failure (1 s up to
30 s; back to 1 s once a process ran for a minute), and the reason (exit code or
signal, last log line) is logged. SIGINT/SIGTERM stop every replica gracefully
(SIGTERM, up to `stop_timeout` seconds, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from eventfleet_server.fleet import banner
from eventfleet_server.fleet.layout import FleetPlan, ReplicaLayout

log = logging.getLogger(__name__)

RESTART_MIN_DELAY = 1.0
RESTART_MAX_DELAY = 30.0
STABLE_AFTER = 60.0  # seconds of running that reset the restart delay
READY_TIMEOUT = 120.0


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if the supervisor dies without stopping it (kill -9),
    # so no replica is left running unsupervised on the fleet's ports.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class ReplicaProcess:
    """One supervised replica."""

    def __init__(self, layout: ReplicaLayout):
        self.layout = layout
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.started_at = 0.0
        self.delay = RESTART_MIN_DELAY

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def argv(self) -> list[str]:
        config = str(self.layout.config_path)
        return [sys.executable, "-m", "eventfleet_cli", "server", "--config", config]

    async def spawn(self) -> None:
        env = dict(os.environ)
        # The token comes from the fleet's token file, never from the caller's environment.
        env.pop("EVENTFLEET_TOKEN", None)
        env.pop("EVENTFLEET_TOKEN_FILE", None)
        env.pop("EVENTFLEET_PEER_TOKEN", None)
        env.pop("EVENTFLEET_PEER_TOKEN_FILE", None)
        env.pop("EVENTFLEET_SERVER_ID", None)
        env.pop("EVENTFLEET_POD_NAME", None)
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.layout.log_path, "ab") as logf:  # noqa: ASYNC230 (local file, tiny)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            logf.write(f"--- {stamp} supervisor: starting\n".encode())
            logf.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops us
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        self.started_at = time.monotonic()

    def last_log_line(self) -> str:
        try:
            with open(self.layout.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
            return lines[-1] if lines else ""
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


class Supervisor:
    """Start, watch, restart and stop the replicas of one fleet."""

    def __init__(
        self,
        fleet: FleetPlan,
        *,
        json_lines: bool = False,
        out: Callable[[str], None] = lambda s: print(s, flush=True),
        stop_timeout: float = 30.0,
    ):
        self.fleet = fleet
        self.json_lines = json_lines
        self.out = out
        self.stop_timeout = stop_timeout
        self.replicas = [ReplicaProcess(r) for r in fleet.replicas]
        self._stopping = asyncio.Event()
        self._announced = False
        self._tasks: set[asyncio.Task] = set()

    def request_stop(self, why: str) -> None:
        if self._stopping.is_set():
            log.warning("%s again: killing every replica now", why)
            for r in self.replicas:
                r.signal(signal.SIGKILL)
            return
        log.info("%s: stopping the fleet", why)
        self._stopping.set()

    async def run(self) -> int:
        """Run until a stop is requested; returns the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
        watchers = [loop.create_task(self._watch(r)) for r in self.replicas]
        announce = loop.create_task(self._announce_when_up())
        try:
            await self._stopping.wait()
        finally:
            announce.cancel()
            for w in [*watchers, *self._tasks]:
                w.cancel()
            await asyncio.gather(*watchers, announce, return_exceptions=True)
            await self._stop_all()
        return 0

    async def _watch(self, r: ReplicaProcess) -> None:
        name = r.layout.name
        while not self._stopping.is_set():
            await r.spawn()
            log.info(
                "%s (server_id=%s) started: pid=%s log=%s",
                name,
                r.layout.server_id,
                r.pid,
                r.layout.log_path,
            )
            if self._announced:
                task = asyncio.get_running_loop().create_task(self._announce([r]))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            code = await r.proc.wait()
            if self._stopping.is_set():
                return
            ran = time.monotonic() - r.started_at
            if ran >= STABLE_AFTER:
                r.delay = RESTART_MIN_DELAY
            delay = r.delay
            r.delay = min(r.delay * 2, RESTART_MAX_DELAY)
            r.restarts += 1
            log.warning(
                "%s (server_id=%s, pid=%s) %s after %.1f s; restarting in %.0f s "
                "(restart %d); last log line: %s",
                name,
                r.layout.server_id,
                r.proc.pid,
                describe_exit(code),
                ran,
                delay,
                r.restarts,
                r.last_log_line() or "(none)",
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()

    async def _stop_all(self) -> None:
        running = [r for r in self.replicas if r.proc and r.proc.returncode is None]
        for r in running:
            r.signal(signal.SIGTERM)
        if not running:
            return
        _, pending = await asyncio.wait(
            [asyncio.ensure_future(r.proc.wait()) for r in running], timeout=self.stop_timeout
        )
        for r in running:
            if r.proc.returncode is None:
                log.warning(
                    "%s did not stop within %.0f s: SIGKILL", r.layout.name, self.stop_timeout
                )
                r.signal(signal.SIGKILL)
        if pending:
            await asyncio.wait(pending, timeout=10)
        for r in running:
            log.info("%s %s", r.layout.name, describe_exit(r.proc.returncode or 0))

    # -- telling the user how to connect ---------------------------------------------------

    async def _announce_when_up(self) -> None:
        await self._announce(self.replicas)
        self._announced = True
        if not self.json_lines:
            first = self.replicas[0].layout
            self.out(banner.connect_banner(self.fleet, banner.cli_command()))
            if self.fleet.replication_tables:
                self.out(
                    f"  replication: {first.replication(self.fleet.tls)}, tables "
                    f"{', '.join(self.fleet.replication_tables)} (password: the token file)"
                )

    async def _announce(self, replicas: list[ReplicaProcess]) -> None:
        """Print each replica once its Eventer port accepts connections."""

        async def one(r: ReplicaProcess) -> None:
            ok = await _wait_port(r.layout.host, r.layout.eventer_port, READY_TIMEOUT)
            self.out(self._line(r, ok))

        await asyncio.gather(*(one(r) for r in replicas))

    def _line(self, r: ReplicaProcess, up: bool) -> str:
        layout = r.layout
        if self.json_lines:
            return json.dumps(
                {
                    "name": layout.name,
                    "server_id": layout.server_id,
                    "pid": r.pid,
                    "up": up,
                    "restarts": r.restarts,
                    **layout.endpoints(),
                    **(layout.jetstream(self.fleet.tls) if self.fleet.jetstream else {}),
                    "data_dir": str(layout.data_dir),
                    "log": str(layout.log_path),
                }
            )
        endpoints = " ".join(f"{k}={v}" for k, v in layout.endpoints().items())
        state = "up" if up else f"NOT UP after {READY_TIMEOUT:.0f} s (see {layout.log_path})"
        return f"{layout.name} server_id={layout.server_id} pid={r.pid} {state}: {endpoints}"


def reached_a_listener(sock_name: object, peer_name: object) -> bool:
    """Whether a connection that succeeded reached a listening socket.

    A port in the kernel's ephemeral range with nothing listening on it can still
    "accept": a connect from the host to itself may be given that very port as its own
    source port, and TCP's simultaneous open then connects the socket to itself. Polling
    such a port for long enough makes that likely, and would report a replica that never
    bound its port as up.
    """
    return sock_name != peer_name


async def _wait_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(2):
                _, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.1)
            continue
        listening = reached_a_listener(
            writer.get_extra_info("sockname"), writer.get_extra_info("peername")
        )
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        if listening:
            return True
        await asyncio.sleep(0.1)
    return False
