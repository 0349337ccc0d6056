"""One EventServer's replicas on the real cluster, by ordinal: the tests' view of its pods.

Everything here reads what the cluster really runs — the pod objects the kubelet reports,
containerd's tasks, the replicas' own HTTP and Eventer ports at their pod IPs (the host
reaches them over the cluster's bridge) — and acts as an outage would: SIGSTOP/SIGCONT on
a container's process, the way a hung node looks to its peers.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import signal
import ssl
import subprocess
import sys
import urllib.request
from typing import Any

from .clients import ClusterKubectl
from .layout import CONTAINERD_SOCKET


def container_pid(container_id: str) -> int:
    """The host pid of a running container's task (``containerd://<id>`` or ``<id>``)."""
    container_id = container_id.removeprefix("containerd://")
    tasks = subprocess.run(
        ["ctr", "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io", "task", "ls"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    pids = [int(line.split()[1]) for line in tasks.splitlines() if line.startswith(container_id)]
    if len(pids) != 1:
        raise AssertionError(f"container {container_id}: tasks {pids} in\n{tasks}")
    return pids[0]


def secret_token(k: ClusterKubectl, secret: str, key: str = "token") -> str:
    data = (k.get("secret", secret) or {}).get("data") or {}
    if key not in data:
        raise AssertionError(f"secret {secret} has no key {key!r}")
    return base64.b64decode(data[key]).decode()


class Replicas:
    """The pods ``<name>-<ordinal>`` of one EventServer."""

    def __init__(self, k: ClusterKubectl, name: str, workdir: pathlib.Path) -> None:
        self.k, self.name, self.workdir = k, name, workdir
        workdir.mkdir(parents=True, exist_ok=True)

    def pod(self, ordinal: int) -> dict[str, Any] | None:
        return self.k.get("pod", f"{self.name}-{ordinal}")

    def _running(self, ordinal: int) -> dict[str, Any] | None:
        """The replica container's status while its pod is not being deleted and the
        container runs; None otherwise."""
        pod = self.pod(ordinal)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        status = next((s for s in statuses if s["name"] == "replica"), None)
        if status is None or "running" not in (status.get("state") or {}):
            return None
        return status

    def container(self, ordinal: int) -> str | None:
        """The running replica's identity (pod uid + container id): it changes whenever
        the process is replaced — the pod recreated or the container restarted — and is
        None while nothing runs. The real cluster's counterpart of a pid."""
        status = self._running(ordinal)
        if status is None:
            return None
        pod = self.pod(ordinal)
        return f"{pod['metadata']['uid']}/{status.get('containerID', '')}"

    # The node agent's name for the same thing, so the tests read as they did.
    pid = container

    @property
    def restarts(self) -> dict[int, int]:
        """Container restarts by ordinal (only pods whose container restarted), as the
        kubelet reports them."""
        listed = self.k.run(
            "get", "pods", "-l", f"app.kubernetes.io/instance={self.name}", "-o", "json"
        )  # fmt: skip
        out = {}
        for pod in json.loads(listed.stdout)["items"]:
            ordinal = pod["metadata"]["name"].removeprefix(f"{self.name}-")
            for s in (pod.get("status") or {}).get("containerStatuses") or []:
                if s["name"] == "replica" and s.get("restartCount") and ordinal.isdigit():
                    out[int(ordinal)] = s["restartCount"]
        return out

    def _port(self, ordinal: int, name: str) -> int:
        pod = self.pod(ordinal)
        if pod is None:
            raise AssertionError(f"no pod {self.name}-{ordinal}")
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "replica"]
        for port in container.get("ports", []):
            if port.get("name") == name:
                return port["containerPort"]
        raise AssertionError(f"pod {self.name}-{ordinal} has no port named {name!r}")

    def ip(self, ordinal: int) -> str:
        pod = self.pod(ordinal) or {}
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            raise AssertionError(f"pod {self.name}-{ordinal} has no IP yet")
        return ip

    def eventer(self, ordinal: int) -> str:
        return f"{self.ip(ordinal)}:{self._port(ordinal, 'eventer')}"

    def http(self, ordinal: int, scheme: str = "http") -> str:
        return f"{scheme}://{self.ip(ordinal)}:{self._port(ordinal, 'http')}"

    def _secret_of_volume(self, ordinal: int, volume: str) -> str:
        pod = self.pod(ordinal) or {}
        for v in pod.get("spec", {}).get("volumes", []):
            if v["name"] == volume:
                return v["secret"]["secretName"]
        raise AssertionError(f"pod {self.name}-{ordinal} has no volume {volume!r}")

    def token_file(self, ordinal: int) -> pathlib.Path:
        """The client token the replica's pod mounts, copied to a file for the CLI."""
        token = secret_token(self.k, self._secret_of_volume(ordinal, "token"))
        path = self.workdir / f"{self.name}-{ordinal}.token"
        path.write_text(token)
        path.chmod(0o600)
        return path

    def store_file(self, ordinal: int) -> pathlib.Path:
        """The replica's SQLite store on the host: in the hostPath volume the cluster's
        provisioner made for its claim ``data-<name>-<ordinal>``."""
        claim = self.k.get("persistentvolumeclaim", f"data-{self.name}-{ordinal}")
        if claim is None or not claim["spec"].get("volumeName"):
            raise AssertionError(f"claim data-{self.name}-{ordinal} is not bound")
        volume = self.k.get("persistentvolume", claim["spec"]["volumeName"])
        return pathlib.Path(volume["spec"]["hostPath"]["path"]) / "events.sqlite"

    def status(self, ordinal: int, ca_file: str | None = None) -> dict[str, Any] | None:
        """``GET /status`` with the peer token (the operator's view: ``last_ids``...);
        None while the replica does not answer."""
        try:
            peer = secret_token(self.k, self._secret_of_volume(ordinal, "peer-token"))
            # During a rotation the file lists both tokens; either is accepted.
            token = next(line for line in peer.splitlines() if line.strip()).strip()
            url = self.http(ordinal, "https" if ca_file else "http") + "/status"
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            context = ssl.create_default_context(cafile=ca_file) if ca_file else None
            if context is not None:
                context.check_hostname = False  # the pod IP is not in the certificate
            with urllib.request.urlopen(request, timeout=3, context=context) as r:
                return json.loads(r.read())
        except (OSError, AssertionError, ValueError):
            return None

    def pause(self, ordinal: int) -> None:
        """SIGSTOP the replica's process: it holds its sockets and answers nothing (a hung
        node, to its peers and the operator). Its liveness probe will restart it if it
        stays paused longer than the probe allows."""
        status = self._running(ordinal)
        assert status is not None, f"{self.name}-{ordinal} is not running"
        os.kill(container_pid(status["containerID"]), signal.SIGSTOP)

    def resume(self, ordinal: int) -> None:
        status = self._running(ordinal)
        if status is not None:
            os.kill(container_pid(status["containerID"]), signal.SIGCONT)


def register(
    pods: Replicas,
    ordinal: int,
    count: int,
    *,
    tls: tuple[str, str] | None = None,
    first: int = 0,
    event_type: str = "e2e/test",
) -> None:
    """Register events on one replica through the real Eventer client (the CLI), from the
    host to the pod's IP; ``tls``: (CA file, the name its certificate carries)."""
    tls_args = ["--tls-ca", tls[0], "--tls-server-name", tls[1]] if tls else []
    token = pods.token_file(ordinal)
    for i in range(first, first + count):
        proc = subprocess.run(
            [
                sys.executable, "-m", "eventfleet_cli", "register",
                "--eventer", pods.eventer(ordinal), "--token-file", str(token), *tls_args,
                event_type, "--json", json.dumps({"i": i}),
            ],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(f"register on {pods.name}-{ordinal}: {proc.stderr}")
