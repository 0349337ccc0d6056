"""docs/architecture.md, "Adding a protocol", followed to the letter: the example
protocol in tests/echo_protocol/ (its own package: schema.json, config, plugin) plus one
registry entry runs in a real replica process — its section is validated and
defaulted, it starts, serves clients through the engine, shows in /status and /metrics
and stops with the replica — without a line changed anywhere else.

The entry is added to the registry by the launcher (the example must not ship in the
product's registry); everything else is the normal `eventfleet server` path.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import socket
import subprocess
import sys

import aiohttp

REPO = pathlib.Path(__file__).resolve().parents[2]
WAIT = 60.0

# What a newcomer writes into eventfleet_server/registry.py, applied at run time here.
LAUNCHER = """
import sys
from eventfleet_server import registry
registry.PROTOCOLS = (
    *registry.PROTOCOLS,
    registry.ProtocolEntry("echo", "tests.echo_protocol.plugin", port=23099, optional=True),
)
from eventfleet_cli import main
sys.exit(main(["server", "--config", sys.argv[1]]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(
    http: aiohttp.ClientSession, base: str, proc: asyncio.subprocess.Process
) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            assert proc.returncode is None, f"the replica exited with {proc.returncode}"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{base}/readyz") as res:
                    if res.status == 200:
                        return
            await asyncio.sleep(0.1)


async def echo(port: int, lines: list[str]) -> list[str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write("".join(f"{line}\n" for line in lines).encode())
        await writer.drain()
        answers = [line for line in lines if not line.startswith("name ")]
        return [(await reader.readline()).decode().rstrip("\n") for _ in answers]
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_example_protocol_runs_in_a_real_replica(tmp_path):
    http_port, echo_port = free_port(), free_port()
    config = tmp_path / "replica.yaml"
    config.write_text(
        f"server_id: 1\n"
        f"data_dir: {tmp_path / 'data'}\n"
        f"host: 127.0.0.1\n"
        f"eventer: {{port: 0}}\n"
        f"syncer: {{port: 0}}\n"
        f"http: {{port: {http_port}}}\n"
        f"bus: {{enabled: false}}\n"
        f"echo: {{port: {echo_port}}}\n"
    )
    log = tmp_path / "replica.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            LAUNCHER,
            str(config),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    base = f"http://127.0.0.1:{http_port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await wait_ready(http, base, proc)

            answers = await echo(echo_port, ["name demo", "hello", "world"])
            instances = [int(a.split(" ", 1)[0]) for a in answers]
            assert [a.split(" ", 1)[1] for a in answers] == ["hello", "world"]
            assert instances[1] == instances[0] + 1  # two events, committed in order

            async with http.get(f"{base}/status") as res:
                status = await res.json()
            # The echo's events went through the engine into the store.
            assert status["last_ids"]["1"]["instance"] >= instances[1], status["last_ids"]
            assert status["protocols"]["echo"] == {"port": echo_port}
            async with http.get(f"{base}/metrics") as res:
                metrics = await res.text()
            assert 'eventfleet_connections{protocol="echo"}' in metrics
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            code = await proc.wait()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "echo=127.0.0.1:" in text  # the operational line names every protocol's port
