"""`promtool check metrics` (the real one, Debian's prometheus package) on a live /metrics."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import subprocess
import threading

import aiohttp
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import RegisterEvent
from eventfleet_server.listener import RejectReason

from tests import parts
from tests.integration.test_http import FakeSyncer, install_syncer, peer

REPO = pathlib.Path(__file__).resolve().parents[2]
_install_lock = threading.Lock()


def prometheus_tool(name: str) -> str:
    """Path of `promtool`/`prometheus`, running scripts/tools/prometheus.sh if absent.

    CI runs the script before pytest; running it here only helps someone who calls
    pytest directly. Skips only when the package cannot be installed on this machine.
    """
    local = REPO / ".tools" / "bin" / name
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    with _install_lock:
        found = shutil.which(name)
        if not found:
            subprocess.run(
                ["bash", str(REPO / "scripts" / "tools" / "prometheus.sh")],
                check=False,
                timeout=600,
            )
            found = shutil.which(name) or (str(local) if local.exists() else None)
    if not found:
        parts.skip_missing(
            "prometheus", f"{name} is not installed", "run scripts/tools/prometheus.sh"
        )
    return found


async def test_promtool_accepts_the_exposition_of_a_live_replica(replica, monkeypatch):
    promtool = prometheus_tool("promtool")
    # Exercise every family so labelled series are present, not just their headers.
    # (monkeypatch restores the replica's own syncer before the fixture stops it)
    fake = FakeSyncer(
        [peer("r2", 2, events_received=4), peer("r3", 3, "disconnected", lag_events=None)]
    )
    install_syncer(replica, monkeypatch, fake)
    client = await connect("127.0.0.1", replica.eventer.port, "test/promtool")
    try:
        await client.register([RegisterEvent(("p", "1"), None, None)] * 3, with_response=True)
    finally:
        await client.close()
    replica.eventer.rejections.reject(RejectReason.BAD_TOKEN, "a refusal for the exposition")

    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(f"http://127.0.0.1:{replica.http.port}/metrics") as resp,
    ):
        assert resp.status == 200
        exposition = await resp.read()
    assert b"eventfleet_syncer_peer_lag_events{" in exposition
    assert b"eventfleet_rejected_total{" in exposition

    proc = await asyncio.create_subprocess_exec(
        promtool,
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(30):
        output, _ = await proc.communicate(exposition)
    # promtool exits non-zero on lint findings; a clean run also prints nothing at all.
    findings = output.decode().strip()
    assert proc.returncode == 0 and not findings, findings
