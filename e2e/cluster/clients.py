"""kubectl and helm against the cluster, as its admin."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

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
