"""Drive reference Jetstream clients (jetstream-js under Node) and the reference server.

Both come from the npm package ``jetstream`` 0.13.4, installed with the helpers they need
by ``scripts/tools/jetstream.sh`` into ``<repo>/.tools/jetstream``. Every process is
started in its own process group and killed when its owner ends; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "jetstream"
NODE_MODULES = TOOLS / "node_modules"
DRIVER = pathlib.Path(__file__).with_name("driver.js")
REFERENCE_SERVER = pathlib.Path(__file__).with_name("reference_server.js")


def ensure_tools() -> None:
    """Install the reference (idempotent, cached) or fail naming what is missing."""
    if shutil.which("node") is None:
        raise RuntimeError("node is required for the Jetstream reference tests")
    subprocess.run(
        ["bash", str(ROOT / "scripts/tools/jetstream.sh")],
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )


def node_env() -> dict[str, str]:
    env = dict(os.environ)
    env["NODE_PATH"] = str(NODE_MODULES)
    return env


class RefClient:
    """One reference client process; `call(op, **args)` sends a command, returns the answer."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str):
        self._proc = proc
        self.name = name
        self._ids = itertools.count(1)

    @classmethod
    async def start(cls, name: str = "client") -> RefClient:
        proc = await asyncio.create_subprocess_exec(
            "node",
            str(DRIVER),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=node_env(),
            start_new_session=True,
            limit=64 * 1024 * 1024,  # an answer carries the whole list (large in some tests)
        )
        return cls(proc, name)

    async def call(self, op: str, timeout: float = 30.0, **args) -> dict:
        cmd = {"id": next(self._ids), "op": op, **args}
        self._proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self._proc.stdin.drain()
        async with asyncio.timeout(timeout):
            line = await self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: node driver exited (code {self._proc.returncode})")
        answer = json.loads(line)
        assert answer["id"] == cmd["id"], (answer, cmd)
        return answer

    async def connect(self, url: str, scope: str, token: str | None = None) -> dict:
        answer = await self.call("connect", url=url, scope=scope, token=token)
        if not answer["ok"]:
            raise RuntimeError(f"{self.name}: connect to {url} failed: {answer}")
        return answer

    async def close(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self.call("close")
                    await self._proc.wait()
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            await self._proc.wait()


@contextlib.asynccontextmanager
async def ref_clients(n: int):
    clients = [await RefClient.start(f"client{i + 1}") for i in range(n)]
    try:
        yield clients
    finally:
        await asyncio.gather(*(c.close() for c in clients))


class ReferenceServer:
    """Uber's server from the same package, with the demo's models (List/Item), on a port."""

    def __init__(self, port: int, log_path: pathlib.Path):
        self.port = port
        self.url = f"ws://127.0.0.1:{port}"
        self._log_path = log_path
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> ReferenceServer:
        log = open(self._log_path, "ab")
        self._log = log
        self._proc = subprocess.Popen(
            ["node", str(REFERENCE_SERVER), str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env=node_env(),
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        line = b""
        while not line.startswith(b"ready"):
            # The reference's own logger may print first ("info: Starting server").
            line = _readline_with_timeout(self._proc, max(0.0, deadline - time.monotonic()))
            if not line:
                self.stop()
                raise RuntimeError(f"reference server did not start within {timeout} s")
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=10)
        if getattr(self, "_log", None):
            self._log.close()

    @property
    def pid(self) -> int:
        return self._proc.pid


def _readline_with_timeout(proc: subprocess.Popen, timeout: float) -> bytes:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            return b""
        return proc.stdout.readline()
    finally:
        sel.close()


if __name__ == "__main__":  # pragma: no cover - manual use
    ensure_tools()
    print(NODE_MODULES, file=sys.stderr)
