"""A replica's graceful stop is bounded: the `stop_deadline` ends a stop that hangs, a
second SIGTERM ends it at once, and in both cases every acknowledged event is in the
store. Real `eventfleet server` processes; the stop hangs on a real peer that is
stopped (SIGSTOP) while its Syncer link is up, so the shutdown flush never hears back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import RegisterEvent
from eventfleet_server.storage import Storage

from e2e.fleet_helpers import LOOPBACK_CLIENTS, ReplicaProc, free_block, merge, mesh_peers

# The flush would wait this long for the stopped peer: far above what the test allows.
FLUSH_WAIT = 120.0


async def _hanging_stop(tmp_path, stop_deadline: float):
    """(leaving replica with 25 acknowledged events, its stopped peer)."""
    base = free_block(2)
    token = tmp_path / "token"
    token.write_text("e2e-secret\n")
    extra = merge(
        LOOPBACK_CLIENTS,
        {"stop_deadline": stop_deadline, "syncer": {"shutdown_flush_timeout": FLUSH_WAIT}},
    )
    procs = [
        ReplicaProc(tmp_path, f"r{i}", i, base + 10 * (i - 1), token_file=token, extra=extra)
        for i in (1, 2)
    ]
    for p in procs:
        p.write_config(mesh_peers(procs))
        p.start()
    await asyncio.gather(*(p.wait_ready() for p in procs))
    leaving, peer = procs
    client = await connect(*leaving.eventer, "e2e/stop")
    try:
        await client.register(
            [RegisterEvent(("stop", str(i)), None, None) for i in range(25)], True
        )
    finally:
        await client.close()
    os.killpg(peer.proc.pid, signal.SIGSTOP)  # its link stays up, it never answers
    return leaving, peer


def _wait_exit(proc, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc.returncode
        time.sleep(0.05)
    return None


async def _events(data_dir) -> int:
    storage = await Storage.open(data_dir / "events.sqlite")
    try:
        return (await storage.stats()).events
    finally:
        await storage.close()


async def _cleanup(leaving, peer):
    os.killpg(peer.proc.pid, signal.SIGCONT)
    peer.stop(timeout=10)
    leaving.stop(timeout=10)


async def test_a_second_sigterm_ends_a_hanging_stop_at_once(tmp_path):
    leaving, peer = await _hanging_stop(tmp_path, stop_deadline=60)
    try:
        leaving.proc.send_signal(signal.SIGTERM)
        # The graceful stop waits for the stopped peer's flush answer ...
        assert _wait_exit(leaving.proc, 2.0) is None, leaving.log()
        started = time.monotonic()
        leaving.proc.send_signal(signal.SIGTERM)
        # ... and the second signal ends it now, not after the deadline or the flush wait.
        assert _wait_exit(leaving.proc, 5.0) == 1, leaving.log()
        assert time.monotonic() - started < 5.0
        assert "SIGTERM during the stop: exiting without finishing the graceful stop" in (
            leaving.log()
        )
        assert await _events(leaving.data_dir) >= 25
    finally:
        await _cleanup(leaving, peer)


async def test_the_stop_deadline_ends_a_hanging_stop(tmp_path):
    leaving, peer = await _hanging_stop(tmp_path, stop_deadline=2)
    try:
        started = time.monotonic()
        leaving.proc.send_signal(signal.SIGTERM)
        assert _wait_exit(leaving.proc, 10.0) == 1, leaving.log()
        took = time.monotonic() - started
        assert 1.5 <= took < 10.0, took
        assert "graceful stop not done within 2 s" in leaving.log()
        assert await _events(leaving.data_dir) >= 25
    finally:
        await _cleanup(leaving, peer)


def test_sigterm_during_start_up_stops_pid_1_at_once():
    """As PID 1 (a container's first process, here in a new PID namespace) a SIGTERM
    that arrives before the role's event loop has taken the signal over must still stop
    the process: the kernel drops signals PID 1 has no handler for, and the kubelet then
    waits the whole grace period before SIGKILL (a fleet deleted during start-up took
    60 s per pod on the real cluster). The process signals itself right after importing
    the `eventfleet` command, then would sleep 30 s."""
    code = (
        "import os, signal, time, eventfleet_cli; "
        "assert os.getpid() == 1; os.kill(1, signal.SIGTERM); time.sleep(30)"
    )
    proc = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # Dropped, the process would sleep its 30 s and exit 0.
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
