"""Processes and clients for the e2e tests: the emulator, kubectl, the operator.

Every process binds 127.0.0.1 only, is started by the test that needs it and is
stopped by its pid; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import yaml

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


class EmulatorProcess:
    """``python -m e2e.k8s.serve`` in its own process, like a real API server."""

    def __init__(self, workdir: pathlib.Path) -> None:
        self.workdir = workdir
        self.kubeconfig = workdir / "kubeconfig"
        self.audit_log = workdir / "audit.jsonl"
        self.url = ""
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> EmulatorProcess:
        stderr = open(self.workdir / "emulator.log", "w")  # lives with the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "e2e.k8s.serve",
                "--port",
                "0",
                "--kubeconfig",
                str(self.kubeconfig),
                "--audit-log",
                str(self.audit_log),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        lines: list[str] = []
        reader = threading.Thread(
            target=lambda: lines.append(self.proc.stdout.readline()), daemon=True
        )
        reader.start()
        reader.join(timeout)
        if not lines or not lines[0].startswith("http://"):
            self.stop()
            raise RuntimeError(
                f"the emulator did not start: {(self.workdir / 'emulator.log').read_text()[-2000:]}"
            )
        self.url = lines[0].strip()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=5)

    def audit(self) -> list[dict[str, Any]]:
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line]


class Api:
    """A tiny synchronous REST client for the emulator (test plumbing, not under test)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise RuntimeError(f"{method} {path}: {e.code} {e.read()[:300]!r}") from e

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def merge_patch(self, path: str, patch: Any) -> Any:
        return self.request("PATCH", path, patch, "application/merge-patch+json")


class Kubectl:
    """The real kubectl against one kubeconfig and namespace."""

    def __init__(
        self,
        binary: str,
        kubeconfig: pathlib.Path,
        namespace: str = "default",
        *,
        validate: bool = False,
    ) -> None:
        self.binary, self.kubeconfig, self.namespace = binary, kubeconfig, namespace
        # The emulator serves no OpenAPI, so kubectl cannot validate against it; the real
        # API server does, and there kubectl validates strictly (unknown fields fail).
        self.validate = validate

    def run(
        self, *args: str, input: str | None = None, timeout: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess:
        cmd = [self.binary, "--kubeconfig", str(self.kubeconfig), "-n", self.namespace, *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self.run("get", kind, name, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise AssertionError(f"kubectl get {kind} {name}: {result.stderr.strip()}")
        return json.loads(result.stdout)

    def apply(self, doc: dict[str, Any] | str, *extra: str) -> subprocess.CompletedProcess:
        text = doc if isinstance(doc, str) else yaml.safe_dump(doc)
        validate = "--validate=strict" if self.validate else "--validate=false"
        return self.run("apply", validate, "-f", "-", *extra, input=text)


class OperatorProcess:
    """The real operator: ``python -m eventfleet_operator`` watching one namespace."""

    def __init__(
        self,
        workdir: pathlib.Path,
        kubeconfig: pathlib.Path,
        namespace: str,
        *,
        urls_file: pathlib.Path,
        extra: Sequence[str] = (),
    ) -> None:
        self.workdir, self.kubeconfig, self.namespace = workdir, kubeconfig, namespace
        self.urls_file, self.extra = urls_file, list(extra)
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / f"operator-{namespace}.log"
        self.starts = 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.metrics_url = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"

    def start(self) -> OperatorProcess:
        self.starts += 1
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)  # never pick up an in-cluster account here
        log = open(self.log_path, "a")  # lives with the process
        log.write(f"--- start #{self.starts} ---\n")
        log.flush()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eventfleet_operator",
                "--namespace",
                self.namespace,
                "--resync-seconds",
                "1",
                "--status-timeout",
                "2",
                "--flush-timeout",
                "5",
                "--replica-urls-file",
                str(self.urls_file),
                "--metrics",
                self.metrics_url,
                *self.extra,
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    def stop(self, *, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=15, sig=sig)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return response.read().decode()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def operator_calls_beyond_rbac(audit: list[dict]) -> tuple[set[tuple[str, str, str]], list]:
    """The operator's ``(group, resource, verb)`` calls in an emulator audit log, and
    those of them that ``operator/deploy/rbac.yaml`` does not allow (sorted)."""
    allowed: set[tuple[str, str, str]] = set()
    for doc in yaml.safe_load_all((ROOT / "operator" / "deploy" / "rbac.yaml").read_text()):
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            allowed.add((group, resource, verb))
    made = {
        (e["group"], e["resource"], e["verb"])
        for e in audit
        if e["userAgent"].startswith("eventfleet-operator/")
    }
    return made, sorted(made - allowed)
