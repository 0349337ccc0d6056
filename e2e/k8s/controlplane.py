"""A real Kubernetes control plane for the e2e tests: etcd, kube-apiserver and
kube-controller-manager, built from Go modules by scripts/tools/k8s-control-plane.sh.

This is the "envtest" approach: real binaries on loopback, a throwaway etcd, and
certificates, service-account keys and an admin identity generated here. What runs is the
real API server (OpenAPI, validation, CEL rules, RBAC, admission, server-side apply,
watch) and the real controllers the operator relies on (garbage collector, StatefulSet,
PodDisruptionBudget, namespace, service accounts). There is no kubelet and no scheduler:
pods stay unbound (the chart tests need none; pods run on the single-node cluster of
:mod:`e2e.cluster`, which uses this control plane's binaries).

Every process binds 127.0.0.1 on a free port, logs into the work directory and is stopped
by its pid; every wait is bounded.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import yaml

from e2e.cluster import configs
from e2e.ports import free_port

from .harness import ROOT, stop_process, wait_for

BIN = ROOT / ".tools" / "k8s" / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
# Inside 198.18.0.0/15 (benchmark testing), never a private range: traffic to those is
# flagged on the CI machines even when local. Distinct from the single-node cluster's
# 198.18.1.0/24, so both tiers can run in one session.
SERVICE_CIDR = "198.19.0.0/24"
API_SERVICE_IP = "198.19.0.1"  # the kubernetes Service: the range's first address
# The controllers the operator's behaviour depends on (and what they need to run).
CONTROLLERS = (
    "garbage-collector-controller",
    "statefulset-controller",
    "disruption-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    # Claims carry the kubernetes.io/pvc-protection finalizer (admission adds it).
    "persistentvolumeclaim-protection-controller",
    # Binds claims to the volumes the node agent provisions (a CSI driver's part, for
    # the StorageClasses it serves), so claims can be resized for real.
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    # Pods bound to a Node that is gone (a node agent that stopped) are removed.
    "pod-garbage-collector-controller",
    # The chart's Deployment (the operator's own pod).
    "deployment-controller",
    "replicaset-controller",
)


def available() -> str | None:
    """None if the binaries are built, else why not (a skip reason)."""
    missing = [b for b in BINARIES if not (BIN / b).exists()]
    if missing:
        return f"no {', '.join(missing)} in {BIN}: run scripts/tools/k8s-control-plane.sh"
    return None


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d: pathlib.Path) -> None:
    """A CA, a serving certificate for 127.0.0.1/localhost and the service-account keys."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=d)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-days", "2", "-subj", "/CN=e2e-ca",
        "-out", "ca.crt", cwd=d,
    )  # fmt: skip
    _openssl("genrsa", "-out", "server.key", "2048", cwd=d)
    _openssl(
        "req", "-new", "-key", "server.key", "-subj", "/CN=kube-apiserver",
        "-out", "server.csr", cwd=d,
    )  # fmt: skip
    (d / "server.ext").write_text(
        f"subjectAltName=IP:127.0.0.1,IP:{API_SERVICE_IP},DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt", cwd=d,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig(server: str, ca: pathlib.Path, token: str, namespace: str = "default") -> str:
    """A kubeconfig for one bearer-token identity."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": "e2e", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "e2e",
                    "context": {"cluster": "e2e", "user": "e2e", "namespace": namespace},
                }
            ],
            "current-context": "e2e",
        }
    )


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager in one work directory."""

    def __init__(self, workdir: pathlib.Path) -> None:
        self.workdir = workdir
        self.pki = workdir / "pki"
        self.kubeconfig = workdir / "admin.kubeconfig"
        self.audit_log = workdir / "audit.jsonl"
        self.admin_token = secrets.token_hex(16)
        self.procs: dict[str, subprocess.Popen] = {}
        self.url = ""
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 120.0) -> ControlPlane:
        t0 = time.monotonic()
        make_pki(self.pki)
        try:
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            self._start_controller_manager(timeout)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        # Controllers first, etcd last: nothing writes to a store that is gone.
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_process(proc, grace=15)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")  # lives with the process
        proc = subprocess.Popen(
            [str(BIN / name), *args], cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
        )
        self.procs[name] = proc
        return proc

    def log(self, name: str, tail: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def _wait(self, name: str, check, timeout: float) -> None:
        """Until ``check()`` is truthy; fails at once if the process exits."""
        t0 = time.monotonic()
        proc = self.procs[name]
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{self.log(name)}")
            try:
                if check():
                    break
            except Exception:  # not up yet: connection refused, 500 while starting
                pass
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{name} not ready after {timeout} s:\n{self.log(name)}")
            time.sleep(0.3)
        self.timings[name] = time.monotonic() - t0

    def _start_etcd(self, timeout: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
                # A throwaway store: durability buys nothing and fsync costs seconds.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"

        self._wait("etcd", healthy, timeout)

    def _start_apiserver(self, timeout: float) -> None:
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f'{self.admin_token},e2e-admin,e2e-admin,"system:masters"\n')
        tokens.chmod(0o600)
        self.kubeconfig.write_text(kubeconfig(self.url, self.pki / "ca.crt", self.admin_token))
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={p / 'server.crt'}",
                f"--tls-private-key-file={p / 'server.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--allow-privileged=true",
                # Off by default; on here so the tests prove the operator's RBAC covers the
                # blockOwnerDeletion it sets (update on eventservers/finalizers).
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                f"--audit-policy-file={self._audit_policy()}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--profiling=false",
                # Fewer moving parts on a 2-core machine shared by many tests.
                "--enable-priority-and-fairness=false",
                "--endpoint-reconciler-type=none",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", lambda: self.get("/readyz", raw=True) == "ok", timeout)

    def _audit_policy(self) -> pathlib.Path:
        """Audit what service accounts do (the operator under test), nothing else."""
        path = self.workdir / "audit-policy.yaml"
        path.write_text(configs.audit_policy())
        return path

    def audit(self) -> list[dict[str, Any]]:
        """The audit events so far (service accounts only)."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line]

    def _start_controller_manager(self, timeout: float) -> None:
        port = free_port()
        kcm = self.workdir / "controller-manager.kubeconfig"
        kcm.write_text(kubeconfig(self.url, self.pki / "ca.crt", self.admin_token))
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                # Collect orphans promptly: the tests wait for garbage collection.
                "--concurrent-gc-syncs=5",
                "--profiling=false",
                "--v=1",
            ],
        )
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # its self-signed serving cert; only /healthz is read

        def healthy() -> bool:
            url = f"https://127.0.0.1:{port}/healthz"
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                return r.read() == b"ok"

        self._wait("kube-controller-manager", healthy, timeout)
        # The namespace "default" gets its ServiceAccount from the controller: proof that
        # controllers really run, not only that the process answers.
        wait_for(
            lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default"),
            timeout=timeout,
            what="the serviceaccount controller",
        )

    # ------------------------------------------------------------------ client

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki / "ca.crt"))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        *,
        token: str | None = None,
        raw: bool = False,
    ) -> Any:
        """One API call as the admin (or ``token``); None on 404."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ssl_context()) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise RuntimeError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from e
        return text.decode() if raw else json.loads(text or b"null")

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def service_account_kubeconfig(
        self, namespace: str, name: str, path: pathlib.Path, *, seconds: int = 3600
    ) -> pathlib.Path:
        """A kubeconfig holding a TokenRequest token of one ServiceAccount."""
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        path.write_text(
            kubeconfig(self.url, self.pki / "ca.crt", answer["status"]["token"], namespace)
        )
        return path

    def env(self) -> dict[str, str]:
        """Environment for a client of this cluster (never an in-cluster account)."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        return env
