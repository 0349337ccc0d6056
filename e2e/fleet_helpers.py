"""Helpers for end-to-end tests with real replica processes on 127.0.0.1.

Every process is started in its own process group and killed (the whole group) when
the test ends, on failure too. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import aiohttp
import yaml
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import EventId, QueryServerParams
from eventfleet_server.config import merge

from e2e import ports

PYTHON = sys.executable
HOST = "127.0.0.1"
BLOCK = 10  # ports per replica, as the fleet lays them out
START_TIMEOUT = 60.0
STOP_TIMEOUT = 45.0  # above a replica's own 25 s stop deadline and the fleet's 30 s


# -- ports -------------------------------------------------------------------------------


def free_block(replicas: int) -> int:
    """A base port whose `replicas` blocks of 10 ports are all free right now."""
    return ports.free_block(BLOCK * replicas, align=BLOCK)


def ports_of(base: int, index: int) -> dict[str, int]:
    """The fleet's layout: replica `index` (1-based) uses base + 10*(index-1) + offset."""
    b = base + BLOCK * (index - 1)
    return {"eventer": b, "syncer": b + 1, "bus": b + 2, "http": b + 5}


# -- processes ---------------------------------------------------------------------------


def _spawn(argv: list[str], log_path: pathlib.Path, stdout=None) -> subprocess.Popen:
    env = dict(os.environ)
    for key in ("EVENTFLEET_TOKEN", "EVENTFLEET_TOKEN_FILE", "EVENTFLEET_SERVER_ID"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    log = open(log_path, "ab")  # closed by stop_group, with the process
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=stdout if stdout is not None else log,
        stderr=log,
        env=env,
        start_new_session=True,  # own process group: killpg reaches it and its children
    )
    proc._log_file = log  # type: ignore[attr-defined]
    return proc


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_group(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> int | None:
    """SIGTERM the group, wait (bounded), then SIGKILL it; returns the exit code."""
    if proc.poll() is None:
        kill_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    code = proc.poll()
    kill_group(proc, signal.SIGKILL)  # leftovers in the group, or a hung process
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    log = getattr(proc, "_log_file", None)
    if log:
        log.close()
    return code


def tail(path: pathlib.Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class FleetProc:
    """``eventfleet fleet --json`` as a process; collects its JSON lines."""

    def __init__(
        self,
        data_dir: pathlib.Path,
        replicas: int,
        base_port: int | None = None,
        extra_args: list[str] | None = None,
    ):
        self.extra_args = list(extra_args or [])
        self.data_dir = data_dir
        self.replicas = replicas
        self.base_port = base_port
        self.log_path = data_dir.parent / f"{data_dir.name}-supervisor.log"
        self.proc: subprocess.Popen | None = None
        self.lines: list[dict] = []
        self._cond = threading.Condition()

    def start(self) -> FleetProc:
        argv = [
            PYTHON,
            "-m",
            "eventfleet_cli",
            "fleet",
            "--replicas",
            str(self.replicas),
            "--data-dir",
            str(self.data_dir),
            "--json",
        ]
        if self.base_port is not None:
            argv += ["--base-port", str(self.base_port)]
        argv += self.extra_args
        self.lines = []
        self.proc = _spawn(argv, self.log_path, stdout=subprocess.PIPE)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        return self

    def _read(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            with contextlib.suppress(ValueError), self._cond:
                self.lines.append(json.loads(raw))
                self._cond.notify_all()

    def latest(self) -> dict[str, dict]:
        with self._cond:
            return {line["name"]: line for line in self.lines}

    async def wait_up(self, timeout: float = START_TIMEOUT, *, since: int = 0) -> dict[str, dict]:
        """Wait until every replica printed an ``up`` line (after line number `since`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                up = {ln["name"]: ln for ln in self.lines[since:] if ln.get("up")}
            if len(up) >= self.replicas:
                return self.latest()
            if self.proc.poll() is not None:
                raise RuntimeError(f"fleet exited {self.proc.returncode}:\n{tail(self.log_path)}")
            await asyncio.sleep(0.1)
        raise TimeoutError(f"fleet not up within {timeout} s:\n{tail(self.log_path)}")

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        code = stop_group(self.proc, timeout) if self.proc else None
        # Safety net: replicas run in process groups of their own; kill any that
        # outlived the supervisor (by pid, only if it is still one of ours).
        with self._cond:
            pids = {line["pid"] for line in self.lines if line.get("pid")}
        for pid in pids:
            try:
                cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(self.data_dir) in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return code

    def supervisor_log(self) -> str:
        return tail(self.log_path, 400)


# The tests' own clients (readers, writers) connect from loopback without a token: the
# replicas' hat-compatible mode, limited to loopback, admits them (the peers still need
# the token). Tests about client authentication set their own `eventer` section.
LOOPBACK_CLIENTS = {
    "eventer": {"allow_tokenless_clients": True, "tokenless_client_networks": ["127.0.0.1"]}
}


class ReplicaProc:
    """One ``eventfleet server --config`` process whose configuration the test writes."""

    def __init__(
        self,
        workdir: pathlib.Path,
        name: str,
        server_id: int,
        base_port: int,
        *,
        token_file: pathlib.Path | None = None,
        extra: dict | None = None,
    ):
        """`extra` is deep-merged into the configuration the test writes."""
        self.name = name
        self.server_id = server_id
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.dir / "data"
        self.config_path = self.dir / "config.yaml"
        self.log_path = self.dir / "replica.log"
        self.ports = ports_of(base_port, 1)
        self.token_file = token_file
        self.extra = extra or {}
        self.peers: list[dict] = []
        self.proc: subprocess.Popen | None = None

    @property
    def eventer(self) -> tuple[str, int]:
        return HOST, self.ports["eventer"]

    @property
    def http(self) -> str:
        return f"http://{HOST}:{self.ports['http']}"

    def entry(self, port: int | None = None) -> dict:
        """This replica as a peer entry (optionally through another port: a proxy)."""
        return {
            "name": self.name,
            "host": HOST,
            "port": port or self.ports["syncer"],
            "server_id": self.server_id,
        }

    def write_config(self, peers: list[dict] | None = None) -> None:
        """Write (atomically: the replica polls the file) with `peers`."""
        if peers is not None:
            self.peers = peers
        conf = {
            "server_id": self.server_id,
            "host": HOST,
            "data_dir": str(self.data_dir),
            "token_file": str(self.token_file) if self.token_file else None,
            "eventer": {"port": self.ports["eventer"]},
            "syncer": {
                "port": self.ports["syncer"],
                "reload_interval": 0.5,
                "reconnect_max_delay": 2.0,
                "bootstrap_timeout": 5.0,
            },
            "bus": {"port": self.ports["bus"], "enabled": False},
            "http": {"port": self.ports["http"]},
            "peers": self.peers,
        }
        conf = merge(conf, self.extra)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(conf))
        tmp.replace(self.config_path)

    def start(self) -> ReplicaProc:
        if not self.config_path.exists():
            self.write_config()
        argv = [PYTHON, "-m", "eventfleet_cli", "server", "--config", str(self.config_path)]
        self.proc = _spawn(argv, self.log_path)
        return self

    async def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Wait for /readyz 200 (operational and initial sync done)."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited {self.proc.returncode}:\n{tail(self.log_path)}"
                    )
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with s.get(self.http + "/readyz") as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready within {timeout} s:\n{tail(self.log_path)}")

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        code = stop_group(self.proc, timeout) if self.proc else None
        self.proc = None
        return code

    def kill9(self) -> None:
        if self.proc:
            kill_group(self.proc, signal.SIGKILL)
            self.proc.wait(timeout=10)
            stop_group(self.proc)
            self.proc = None

    def log(self) -> str:
        return tail(self.log_path, 1000)


def mesh_peers(replicas: list[ReplicaProc]) -> list[dict]:
    return [r.entry() for r in replicas]


# -- reading replicas --------------------------------------------------------------------


async def status(http: str) -> dict:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
        s.get(http + "/status") as resp,
    ):
        return await resp.json()


async def read_all(eventer: tuple[str, int], server_ids) -> dict[tuple[int, int], tuple]:
    """Every committed event of `server_ids` on one replica: {(server, instance): event}."""
    client = await connect(*eventer, "e2e/reader", timeout=10)
    out: dict[tuple[int, int], tuple] = {}
    try:
        for server_id in sorted(server_ids):
            after: EventId | None = None
            while True:
                result = await asyncio.wait_for(
                    client.query(QueryServerParams(server_id, True, 10_000, after)), 30
                )
                for e in result.events:
                    out[(e.id.server, e.id.instance)] = tuple(e)
                if not result.more_follows or not result.events:
                    break
                after = result.events[-1].id
    finally:
        await client.close()
    return out


async def read_ids(eventer: tuple[str, int], server_id: int) -> list[EventId]:
    """Every committed id of `server_id` on one replica, as the replica returns them
    (a list: an id stored twice shows up twice)."""
    client = await connect(*eventer, "e2e/id-reader", timeout=10)
    ids: list[EventId] = []
    try:
        after: EventId | None = None
        while True:
            result = await asyncio.wait_for(
                client.query(QueryServerParams(server_id, True, 10_000, after)), 30
            )
            ids.extend(e.id for e in result.events)
            if not result.more_follows or not result.events:
                break
            after = result.events[-1].id
    finally:
        await client.close()
    return ids


def digest(events: dict) -> str:
    return hashlib.sha256(repr(sorted(events.items())).encode()).hexdigest()


async def wait_converged(
    eventers: list[tuple[str, int]], server_ids, timeout: float = 60.0
) -> dict[tuple[int, int], tuple]:
    """Wait until every replica holds the identical event set; returns it."""
    deadline = time.monotonic() + timeout
    sizes: list = []
    while True:
        sets = [await read_all(e, server_ids) for e in eventers]
        digests = {digest(s) for s in sets}
        sizes = [len(s) for s in sets]
        if len(digests) == 1:
            return sets[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"replicas did not converge within {timeout} s: sizes {sizes}")
        await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def serving(replica: ReplicaProc):
    """`replica` configured, started and ready for the block; stopped after it, which
    must end with exit code 0 (its log in the failure otherwise)."""
    replica.write_config()
    replica.start()
    try:
        await replica.wait_ready()
        yield replica
    finally:
        code = replica.stop()
        assert code == 0, f"replica exit code {code}:\n{replica.log()}"


async def eventually(check: Callable[[], Awaitable], what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            last = await check()
            if last:
                return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


# -- a TCP proxy the test can cut --------------------------------------------------------


class PausableProxy:
    """Forwards 127.0.0.1:<port> to a target; `pause` cuts every link and refuses new ones
    (accepted and closed at once) until `resume`."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port: int | None = None
        self.paused = False
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def start(self) -> PausableProxy:
        self._server = await asyncio.start_server(self._on_client, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self.pause()
        if self._server:
            self._server.close()

    def pause(self) -> None:
        self.paused = True
        for a, b in list(self._pairs):
            for w in (a, b):
                with contextlib.suppress(Exception):
                    w.transport.abort()
        self._pairs.clear()

    def resume(self) -> None:
        self.paused = False

    async def _on_client(self, reader, writer) -> None:
        if self.paused:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        pair = (writer, up_writer)
        self._pairs.add(pair)

        async def pipe(src, dst):
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._pairs.discard(pair)
