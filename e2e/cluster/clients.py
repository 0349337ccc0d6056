"""kubectl and helm against the cluster, as its admin."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time
import urllib.request

from .cluster import Cluster
from .layout import HELM, KUBECTL


class ClusterKubectl:
    """The real kubectl as the cluster admin, in one namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def run(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        kubeconfig = str(self.cluster.kubeconfig)
        proc = subprocess.run(
            [str(KUBECTL), "--kubeconfig", kubeconfig, "-n", self.namespace, *args],
            input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
            )
        return proc

    def get(self, kind: str, name: str) -> dict | None:
        proc = self.run("get", kind, name, "-o", "json", check=False)
        if proc.returncode != 0:
            assert "NotFound" in proc.stderr, proc.stderr
            return None
        return json.loads(proc.stdout)

    def apply(self, doc: dict) -> None:
        self.run("apply", "-f", "-", stdin=json.dumps(doc))

    def json(self, *args: str) -> dict:
        return json.loads(self.run(*args, "-o", "json").stdout)

    @property
    def binary(self) -> str:
        return str(KUBECTL)

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.cluster.kubeconfig


class OperatorDeployment:
    """The chart's operator Deployment, as an administrator handles it: scaled to 0 and
    back, its pod's process killed, its log and its metrics read."""

    def __init__(self, k: ClusterKubectl, name: str) -> None:
        self.k, self.name = k, name

    def pods(self) -> list[dict]:
        selector = "app.kubernetes.io/name=eventfleet-operator"
        return self.k.json("get", "pods", "-l", selector)["items"]

    def _wait_pods(self, want: int) -> None:
        deadline = time.monotonic() + 180
        while True:
            pods = [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]
            ready = [
                p for p in pods
                if all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}])
            ]  # fmt: skip
            if (want == 0 and not self.pods()) or (want and len(ready) == want == len(pods)):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"operator pods not {want} after 180 s: {pods}")
            time.sleep(1)

    def stop(self, *, sig: int = signal.SIGTERM) -> None:
        """Scale the Deployment to 0 and wait for its pod to go; with SIGKILL the
        operator's process is killed first (a crash: no shutdown of its own)."""
        if sig == signal.SIGKILL:
            from .replicas import container_pid

            for pod in self.pods():
                for s in pod["status"].get("containerStatuses") or []:
                    if "running" in (s.get("state") or {}):
                        os.kill(container_pid(s["containerID"]), signal.SIGKILL)
        self.k.run("scale", f"deployment/{self.name}", "--replicas=0")
        self._wait_pods(0)

    def start(self) -> None:
        self.k.run("scale", f"deployment/{self.name}", "--replicas=1")
        self._wait_pods(1)

    def alive(self) -> bool:
        pods = self.pods()
        return len(pods) == 1 and all(
            s.get("ready") and not s.get("restartCount")
            for s in pods[0]["status"].get("containerStatuses") or [{}]
        )

    def log(self) -> str:
        return self.k.run("logs", f"deployment/{self.name}", "--tail=400", check=False).stdout

    def metrics(self, port: int) -> str:
        """The operator's /metrics (its ``--metrics`` listener on ``port``), from the host
        to the pod's IP."""
        (pod,) = [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]
        url = f"http://{pod['status']['podIP']}:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()


def helm(cluster: Cluster, home: pathlib.Path, *args: str, timeout: float = 300) -> str:
    """The real helm against the cluster, its cache and config under ``home``."""
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        (home / var.lower()).mkdir(parents=True, exist_ok=True)
        env[var] = str(home / var.lower())
    proc = subprocess.run(
        [str(HELM), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc.stdout
