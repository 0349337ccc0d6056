"""The start banner of ``./scripts/run`` works as printed, against a real local fleet.

The fleet starts the way ``./scripts/run`` starts it: through ``.venv/bin/eventfleet``
from the checkout's directory (here a directory with that path linked to this venv's
console script). The test reads what it prints and runs it: the ``register`` and
``watch`` commands through bash, exactly as printed, and the Hat lines with the real
hat-event 0.9.44 client, in the async function a reader would put them in.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest
from eventfleet_server.fleet import banner

from e2e.fleet_helpers import free_block, stop_group

pytestmark = pytest.mark.slow

HAT_CHECK = """
import asyncio

from hat.event import common


async def main():
{lines}
    try:
        await conn.register(
            [common.RegisterEvent(("banner", "hat"), None, common.EventPayloadJson(1))],
            with_response=True,
        )
        result = await conn.query(common.QueryLatestParams(event_types=[("banner", "*")]))
        print(sorted(e.type for e in result.events))
    finally:
        await conn.async_close()


asyncio.run(main())
"""


def _banner(proc: subprocess.Popen, timeout: float = 90) -> list[str]:
    """Lines printed until 'Ctrl-C stops the fleet' (bounded by `timeout`)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("Ctrl-C stops the fleet"):
            return lines
    raise AssertionError("no banner:\n" + "\n".join(lines))


def _hat_lines(lines: list[str]) -> list[str]:
    start = lines.index(banner.HAT_HEADER) + 1
    body = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        body.append(line)
    return body


def _bash(command: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTFLEET_")}
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("strict", [False, True], ids=["tokenless-loopback", "token-required"])
def test_printed_examples_run_as_printed(tmp_path, strict):
    checkout = tmp_path / "checkout"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "eventfleet").symlink_to(
        pathlib.Path(sys.executable).parent / "eventfleet"
    )
    base = free_block(1)
    argv = [".venv/bin/eventfleet", "fleet", "--replicas", "1", "--base-port", str(base)]
    argv += ["--data-dir", str(tmp_path / "data")] + (["--require-client-token"] if strict else [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTFLEET_")}
    proc = subprocess.Popen(
        argv,
        cwd=checkout,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        lines = _banner(proc)
        # The CLI lines, as printed (the path the fleet was started with, runnable).
        (register,) = [ln.strip() for ln in lines if " register --eventer " in ln]
        assert register.startswith(".venv/bin/eventfleet register "), register
        result = _bash(register, checkout)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["type"] == ["a", "b"]
        (watch,) = [ln.strip() for ln in lines if " watch --eventer " in ln]
        result = _bash(
            watch.replace(" watch ", " watch --count 1 ", 1)
            + " &\nsleep 2\n"
            + register
            + " >/dev/null\nwait",
            checkout,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[0])["type"] == ["a", "b"]
        # The Hat lines with the real hat-event client.
        hat = _hat_lines(lines)
        assert hat, lines
        script = tmp_path / "hat_example.py"
        script.write_text(
            HAT_CHECK.format(lines=textwrap.indent(textwrap.dedent("\n".join(hat)), "    "))
        )
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "[('banner', 'hat')]"
    finally:
        stop_group(proc)
