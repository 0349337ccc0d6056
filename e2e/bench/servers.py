"""Server processes under benchmark: eventfleet's replica and the reference hat-event server.

Each server runs as its own process (in its own process group) on 127.0.0.1 with a fresh
data directory. The harness reads the process's CPU time and memory from /proc and stops
the whole process group at the end, on error too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from hat.drivers import net
from hat.event import common as hat_common
from hat.event import eventer

from e2e.fleet_helpers import free_block, ports_of

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = pathlib.Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0

# Every process group the harness started and has not stopped yet (for the atexit and
# signal paths: servers are stopped even when the harness dies on an error).
_live: dict[int, subprocess.Popen] = {}


@dataclass(frozen=True)
class ServerKind:
    """One column of the report."""

    key: str
    label: str
    family: str  # "eventfleet" | "reference"
    synchronous: str | None = None  # eventfleet only: storage.synchronous (None: default)
    event_loop: str | None = None  # eventfleet only: event_loop (None: default, auto)


# The main column pins NORMAL, the mode the targets and all earlier runs were measured in
# (the replica's default became FULL with the hardening work; its row is eventfleet-full).
# Left to the default, the main column silently turned into a second FULL column.
KINDS: dict[str, ServerKind] = {
    "eventfleet": ServerKind(
        "eventfleet", "eventfleet (NORMAL)", "eventfleet", synchronous="NORMAL"
    ),
    "eventfleet-full": ServerKind(
        "eventfleet-full", "eventfleet (FULL)", "eventfleet", synchronous="FULL"
    ),
    # The stock asyncio loop, to show what uvloop (the default where installed) gives.
    "eventfleet-asyncio": ServerKind(
        "eventfleet-asyncio",
        "eventfleet (NORMAL, asyncio loop)",
        "eventfleet",
        synchronous="NORMAL",
        event_loop="asyncio",
    ),
    "reference": ServerKind("reference", "reference hat-event 0.9.44", "reference"),
}


def free_port() -> int:
    """One free port of the fleet layout's range (below the kernel's ephemeral range,
    where an outgoing connection cannot take it between now and the bind)."""
    return free_block(1)


@dataclass
class ProcStat:
    cpu_s: float  # utime + stime of the whole process (all threads)
    rss_kib: int
    hwm_kib: int
    main_cpu_s: float = 0.0  # the main thread (the asyncio event loop in both servers)
    sys_cpu_s: float = 0.0  # stime alone (all threads): the kernel's share of cpu_s


def _times(stat_path: str) -> tuple[int, int]:
    with open(stat_path) as f:
        raw = f.read()
    # comm may contain spaces/parentheses: split after the last ')'
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[11]), int(fields[12])  # utime, stime (ticks)


def _cpu_s(stat_path: str) -> float:
    return sum(_times(stat_path)) / CLK_TCK  # utime + stime


def read_proc(pid: int) -> ProcStat:
    utime, stime = _times(f"/proc/{pid}/stat")
    cpu = (utime + stime) / CLK_TCK
    try:
        main = _cpu_s(f"/proc/{pid}/task/{pid}/stat")
    except OSError:
        main = 0.0
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return ProcStat(cpu, rss, hwm, main, stime / CLK_TCK)


@dataclass
class ServerProcess:
    kind: ServerKind
    workdir: pathlib.Path
    port: int
    proc: subprocess.Popen
    log_path: pathlib.Path
    argv: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def addr(self) -> net.TcpAddress:
        return net.TcpAddress("127.0.0.1", self.port)

    def stat(self) -> ProcStat:
        return read_proc(self.pid)

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def check_alive(self) -> None:
        rc = self.proc.poll()
        if rc is not None:
            raise RuntimeError(
                f"{self.kind.label} exited with code {rc}; log tail:\n{self.log_tail()}"
            )

    def stop(self) -> None:
        stop_process_group(self.proc)


def _eventfleet_config(kind: ServerKind, datadir: pathlib.Path, port: int) -> dict:
    # `port` heads a free block of the fleet layout: the side listeners (the Event BUS
    # takes three consecutive ports) sit at their layout offsets, all free together.
    ports = ports_of(port, 1)
    conf: dict = {
        # the reference logs warnings only: same for eventfleet, logging is not measured
        "log": {"level": "WARNING"},
        "syncer": {"port": ports["syncer"]},
        "bus": {"port": ports["bus"]},
        "http": {"port": ports["http"]},
    }
    if kind.synchronous:
        conf["storage"] = {"synchronous": kind.synchronous}
    if kind.event_loop:
        conf["event_loop"] = kind.event_loop
    return conf


def _reference_config(datadir: pathlib.Path, port: int) -> dict:
    # hat-event 0.9.44 server, lmdb backend, flush period 1 s, no monitor: without a
    # `monitor_component` key MainRunner creates the engine runner directly (standalone).
    return {
        "type": "event",
        "name": "bench-reference",
        "server_id": 1,
        "backend": {
            "module": "hat.event.backends.lmdb",
            "db_path": str(datadir / "event.db"),
            "identifier": None,
            "flush_period": 1,
            "cleanup_period": 3600,
            "conditions": [],
            "latest": {"subscriptions": [["*"]]},
            "timeseries": [{"order_by": "TIMESTAMP", "subscriptions": [["*"]]}],
        },
        "modules": [],
        "eventer_server": {"host": "127.0.0.1", "port": port},
    }


def _cprofile_wrapper(out: pathlib.Path) -> list[str]:
    # Only for the harness's own profiling switch (EVENTFLEET_BENCH_CPROFILE): runs the
    # same console entry point under cProfile and dumps the stats on SIGTERM.
    code = (
        "import cProfile, signal, sys\n"
        "from eventfleet_cli import main\n"
        "p = cProfile.Profile()\n"
        "def _stop(*a):\n"
        "    raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGTERM, _stop)\n"
        "sys.argv = ['eventfleet'] + sys.argv[1:]\n"
        "p.enable()\n"
        "try:\n"
        "    main()\n"
        "except (KeyboardInterrupt, SystemExit):\n"
        "    pass\n"
        "finally:\n"
        "    p.disable()\n"
        f"    p.dump_stats({str(out)!r})\n"
    )
    return [sys.executable, "-c", code]


def start_server(kind: ServerKind, workdir: pathlib.Path, name: str) -> ServerProcess:
    """Start one server process on a fresh data directory; does not wait for readiness."""
    base = workdir / name
    datadir = base / "data"
    datadir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = base / "server.log"
    if kind.family == "eventfleet":
        conf_path = base / "eventfleet.yaml"
        conf_path.write_text(json.dumps(_eventfleet_config(kind, datadir, port), indent=2))
        args = [
            "server",
            "--config",
            str(conf_path),
            "--data-dir",
            str(datadir),
            "--server-id",
            "1",
            "--eventer-port",
            str(port),
            "--host",
            "127.0.0.1",
        ]
        prof = os.environ.get("EVENTFLEET_BENCH_CPROFILE")
        if prof:
            argv = [*_cprofile_wrapper(pathlib.Path(prof) / f"{name}.pstats"), *args]
        else:
            argv = [str(VENV_BIN / "eventfleet"), *args]
    else:
        conf_path = base / "reference.yaml"
        conf_path.write_text(json.dumps(_reference_config(datadir, port), indent=2))
        argv = [str(VENV_BIN / "hat-event-server"), "--conf", str(conf_path)]
    env = dict(os.environ)
    env.pop("EVENTFLEET_TOKEN", None)
    env.pop("EVENTFLEET_TOKEN_FILE", None)
    env["PYTHONUNBUFFERED"] = "1"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=base,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own process group: killpg stops it and its children
        )
    _live[proc.pid] = proc
    return ServerProcess(kind, base, port, proc, log_path, argv)


async def wait_operational(server: ServerProcess, timeout: float = START_TIMEOUT) -> None:
    """Wait until the server accepts an Eventer client and reports OPERATIONAL."""
    deadline = time.monotonic() + timeout
    last_err: Exception | None = None
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            client = await asyncio.wait_for(
                eventer.connect(server.addr, "bench-probe"), timeout=2.0
            )
        except (TimeoutError, OSError, ConnectionError) as e:
            last_err = e
            await asyncio.sleep(0.1)
            continue
        try:
            while time.monotonic() < deadline:
                if client.status == hat_common.Status.OPERATIONAL:
                    return
                if not client.is_open:
                    break
                await asyncio.sleep(0.05)
        finally:
            await client.async_close()
    server.check_alive()
    raise TimeoutError(
        f"{server.kind.label} not operational after {timeout:.0f} s ({last_err!r}); "
        f"log tail:\n{server.log_tail()}"
    )


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, wait (bounded), then SIGKILL it."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # leftovers in the group, or a hung server
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT)
    finally:
        _live.pop(proc.pid, None)


def stop_all() -> None:
    for proc in list(_live.values()):
        stop_process_group(proc)
