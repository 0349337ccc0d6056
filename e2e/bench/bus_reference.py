"""The reference Event BUS (micro-toolkit/event-bus-zeromq 3.0.4, Node) for
`e2e.bench.bus`: found by path, started with its in-memory event store, stopped.

It is never part of this repository: fetch it into a directory outside the repo, then
build it there (docs/performance.md, "Event BUS", has the recipe: libzmq3-dev, zeromq
5.3.1 and bluebird in its package.json, ``npm install --zmq-external``). Point the
benchmark at that directory with ``--reference DIR`` or ``$EVENTFLEET_BUS_REFERENCE``.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import time

ENV = "EVENTFLEET_BUS_REFERENCE"

# Its own bus with the memory store its tests use (no MongoDB); ports P, P+1, P+2.
_RUNNER = """
var base = parseInt(process.argv[1], 10), host = 'tcp://127.0.0.1:'
require('./lib/bus').getInstance({
  snapshot: host + base, publisher: host + (base + 1), collector: host + (base + 2),
  store: {eventInstance: require('./test/support/memory_event_store').getInstance()}
}).connect().then(function () { console.log('ready') })
"""


def locate(path: str | None) -> tuple[pathlib.Path | None, str]:
    """(the built reference's directory, "") or (None, why it cannot run here)."""
    given = path or os.environ.get(ENV)
    if not given:
        return None, f"no reference BUS given (--reference DIR or ${ENV})"
    root = pathlib.Path(given)
    if not (root / "lib" / "bus.js").is_file():
        return None, f"{root} is not an event-bus-zeromq checkout (no lib/bus.js)"
    if not (root / "node_modules" / "zeromq").is_dir():
        return None, f"{root} is not built (no node_modules/zeromq: run npm install there)"
    if shutil.which("node") is None:
        return None, "node is not installed"
    return root, ""


class ReferenceBus:
    """The reference BUS process on ports `port` .. `port` + 2."""

    def __init__(self, root: pathlib.Path, port: int, log_path: pathlib.Path):
        self.root = root
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["node", "-e", _RUNNER, str(self.port)],
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NODE_ENV": "production"},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"reference BUS exited: {self.log_path.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port + 2), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.1)
                continue
            if b"ready" in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        raise RuntimeError(f"reference BUS did not start in {timeout:g} s ({self.log_path})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
