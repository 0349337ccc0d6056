"""Helpers of the bare control plane (``controlplane.py``, the chart tests): where the
tools are, a bounded wait, stopping a process by its pid."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"
T = TypeVar("T")


def tool(name: str) -> str | None:
    """A real binary from .tools/bin (scripts/tools/k8s-binaries.sh) or PATH."""
    return shutil.which(name, path=f"{TOOLS}{os.pathsep}{os.environ.get('PATH', '')}")


def wait_for(
    check: Callable[[], T], *, timeout: float, interval: float = 0.2, what: str = "condition"
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # keep polling, report the last one
            last_error = e
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen, *, grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Stop one process we started, by its pid: ``sig``, then SIGKILL after ``grace``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
