"""Bring the single-node cluster up and down.

``Cluster(workdir).up()`` starts, in order: containerd (images imported), etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, the volume
provisioner, CoreDNS and the default StorageClass, kube-router. Every process is recorded
in ``<workdir>/state.json`` (pid and kernel start time, so a recycled pid is never
signalled) the moment it starts; ``down()`` — in this process or another one
(``scripts/cluster down``) — stops each by its pid, removes the pods' sandboxes through
the CRI first, and then undoes the host changes (:mod:`e2e.cluster.host`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import yaml

from e2e.ports import free_port

from . import configs, host, images, pki
from .layout import (
    API_SERVICE_IP,
    CONTAINERD_SOCKET,
    CONTROL_PLANE_BIN,
    COREDNS_IMAGE,
    DISK_NEEDED_GIB,
    KUBECTL,
    NODE_BIN,
    NODE_IP,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_CIDR,
    PROJECT_IMAGES,
    PROVISIONER_NAME,
    RUN_DIR,
    SERVICE_CIDR,
    missing,
)

log = logging.getLogger("e2e.cluster")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OWNER_FILE = RUN_DIR / "workdir"
# Stop order: nothing may recreate pods while they are removed; the API server last.
FIRST_STOPPED = ("kube-controller-manager", "kube-scheduler", "provisioner", "kubelet")


def disk_shortfall(workdir: pathlib.Path) -> str | None:
    """Why the disk under ``workdir`` is too full for a cluster, or None when it is not."""
    probe = workdir
    while not probe.exists():
        probe = probe.parent
    free_gib = shutil.disk_usage(probe).free / 2**30
    if free_gib >= DISK_NEEDED_GIB:
        return None
    return (
        f"{DISK_NEEDED_GIB:.0f} GiB free on the disk of {workdir} (it has {free_gib:.1f} GiB): "
        "containerd unpacks the project's images there, and the kubelet deletes images "
        "when the disk runs out; free some space (old /tmp/pytest-of-* directories, caches)"
    )


class ClusterError(RuntimeError):
    """The cluster cannot come up (or go down) here; the message says why and what to do."""


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), None if gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return fields[19]


def _gone(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
    return _start_time(pid) is None


def stop_pid(pid: int, started: str | None, grace: float = 20.0) -> str:
    """SIGTERM, then SIGKILL after ``grace``; only if ``pid`` is still the process we
    started (same start time). Returns what happened."""
    if started is not None and _start_time(pid) != started:
        return "already gone"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if _gone(pid):
            return "stopped"
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _gone(pid):
            return "killed"
        time.sleep(0.1)
    return "still running"


def wait_until(
    check: Callable[[], Any], timeout: float, what: str, detail: Callable[[], str] = str
) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # keep polling; report the last one
            last = e
        if time.monotonic() > deadline:
            raise ClusterError(
                f"timed out after {timeout:.0f} s waiting for {what}{detail()}"
                + (f" ({last!r})" if last else "")
            )
        time.sleep(0.3)


class Cluster:
    """One single-node cluster; its files (configs, PKI, logs, etcd, containerd's and
    the kubelet's roots, volumes) under ``workdir``."""

    def __init__(self, workdir: pathlib.Path) -> None:
        self.workdir = workdir.resolve()
        self.state_file = self.workdir / "state.json"
        self.state: dict[str, Any] = {}
        if self.state_file.exists():
            self.state = json.loads(self.state_file.read_text())

    # -- facts -------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> pathlib.Path:
        """The cluster admin's kubeconfig (system:masters)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def api_server(self) -> str:
        return f"https://{NODE_IP}:{self.state['ports']['apiserver']}"

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    @property
    def audit_log(self) -> pathlib.Path:
        return self.workdir / "audit.jsonl"

    def audit(self) -> list[dict[str, Any]]:
        """The API server's audit events so far (service accounts' requests only)."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line]

    def import_project_images(self, *names: str) -> dict[str, float]:
        """Import more of the project's images into the running cluster's containerd
        (seconds per archive): the Spark image (1.2 GB) only for the modules that run
        it, not at every ``up``."""
        ctr = ["ctr", "--address", str(CONTAINERD_SOCKET)]
        return images.import_archives(ctr, [images.project_archive(n) for n in names])

    def disk_reclaims(self) -> list[str]:
        """The kubelet's log lines where disk pressure made it delete images or evict pods
        (empty when it never did): every pod started after one may fail for that reason."""
        path = self.workdir / "logs" / "kubelet.log"
        if not path.exists():
            return []
        with path.open(errors="replace") as f:
            return [
                line.rstrip()[:300]
                for line in f
                if "Eviction manager: attempting to reclaim" in line
                or "Removing image to free bytes" in line
                or "Evicting pod" in line
            ]

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        tmp.rename(self.state_file)

    # -- processes ---------------------------------------------------------------------
    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        with (logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={"PATH": SYSTEM_PATH, "HOME": str(self.workdir), **(env or {})},
                start_new_session=True,  # survives the `scripts/cluster up` that started it
            )
        self.state["processes"][name] = {
            "pid": proc.pid,
            "started": _start_time(proc.pid),
            "argv": argv,
        }
        self._save()
        log.info("started %s (pid %d)", name, proc.pid)

    def _alive(self, name: str) -> bool:
        p = self.state.get("processes", {}).get(name)
        return bool(p) and _start_time(p["pid"]) == p["started"] and p["started"] is not None

    def _check_alive(self, *names: str) -> bool:
        for name in names:
            if not self._alive(name):
                raise ClusterError(f"{name} exited; its log ends:\n{self.log_tail(name)}")
        return True

    def _step(self, what: str, t0: float) -> None:
        self.state["timings"][what] = round(time.monotonic() - t0, 1)
        self._save()
        log.info("%s after %.1f s", what, time.monotonic() - t0)

    # -- up ----------------------------------------------------------------------------
    def up(self, project_images: tuple[str, ...] = PROJECT_IMAGES, timeout: float = 180) -> Cluster:
        """Start everything; on any failure, undo what was done and raise ClusterError."""
        absent = missing()
        if os.geteuid() != 0:
            absent.insert(0, "root (the kubelet, containerd and the network setup need it)")
        short = disk_shortfall(self.workdir)
        if short:
            absent.append(short)
        if absent:
            raise ClusterError(
                "the single-node cluster cannot start, missing:\n  " + "\n  ".join(absent)
            )
        try:
            RUN_DIR.mkdir(mode=0o700)
        except FileExistsError:
            owner = OWNER_FILE.read_text().strip() if OWNER_FILE.exists() else "unknown"
            if not self._reclaim_stale(owner):
                raise ClusterError(
                    f"a cluster is already up on this machine (work directory {owner}; "
                    f"{RUN_DIR} exists): one per machine. Stop it with "
                    f"`scripts/cluster down --workdir {owner}`"
                ) from None
            RUN_DIR.mkdir(mode=0o700)
        OWNER_FILE.write_text(str(self.workdir) + "\n")
        found = host.preconditions()
        if found:
            shutil.rmtree(RUN_DIR)
            raise ClusterError(
                "the host has what only a cluster makes (another cluster, or one not taken "
                "down; nothing was changed): " + "; ".join(found)
            )
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.state = {
                "workdir": str(self.workdir),
                "host": host.snapshot(),
                "processes": {},
                "timings": {},
                "ports": {
                    n: free_port()
                    for n in (
                        "etcd",
                        "etcd-peer",
                        "apiserver",
                        "controller-manager",
                        "scheduler",
                        "kubelet",
                        "kubelet-healthz",
                        "proxy-healthz",
                        "proxy-metrics",
                    )
                },
            }
            self._save()
            self._up(project_images, timeout)
        except BaseException:
            log.exception("cluster up failed; taking down what was started")
            with contextlib.suppress(Exception):
                self.down()
            raise
        return self

    def _reclaim_stale(self, owner: str) -> bool:
        """Take down a cluster whose every process is gone (its runner was killed before
        `down`, e.g. a CI job's time limit): True when the host is free again.

        A cluster with any process still running is never touched; nor is a run
        directory whose owner left no state (nothing says what to undo).
        """
        stale = Cluster(pathlib.Path(owner)) if owner != "unknown" else None
        if stale is None or not stale.state.get("processes"):
            return False
        alive = [n for n in stale.state["processes"] if stale._alive(n)]
        if alive:
            return False
        log.warning(
            "a cluster in %s was left up by a runner that is gone (none of its processes "
            "runs): taking it down before starting this one",
            owner,
        )
        report = stale.down()
        if report["failed"] or report["leftovers"] or RUN_DIR.exists():
            raise ClusterError(
                f"could not take down the stale cluster in {owner}: failed {report['failed']}, "
                f"left on the host {report['leftovers']}"
            )
        return True

    def _up(self, project_images: tuple[str, ...], timeout: float) -> None:
        t0 = time.monotonic()
        w, ports = self.workdir, self.state["ports"]
        host.setup_bridge()
        self.state["bridge"] = True
        self._save()

        # Identities and configuration files.
        pki.make(w / "pki")
        tokens = pki.identities(w, self.api_server)
        (w / "cni").mkdir(exist_ok=True)
        (w / "cni" / "10-eventfleet.conflist").write_text(configs.cni_conflist(w / "cni-ipam"))
        (w / "containerd.toml").write_text(configs.containerd_toml(w / "containerd", w / "cni"))
        (w / "kubelet.yaml").write_text(configs.kubelet_config(w, ports))
        (w / "kube-proxy.yaml").write_text(configs.kube_proxy_config(w / "proxy.kubeconfig", ports))
        (w / "scheduler.yaml").write_text(configs.scheduler_config(w / "scheduler.kubeconfig"))
        (w / "volumes").mkdir(exist_ok=True)
        (w / "audit-policy.yaml").write_text(configs.audit_policy())
        self._step("configuration", t0)

        # The control plane starts while containerd imports the images.
        cp, nb = CONTROL_PLANE_BIN, NODE_BIN
        self._start("etcd", [
            str(cp / "etcd"), "--name=eventfleet", f"--data-dir={w / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{ports['etcd']}",
            f"--advertise-client-urls=http://127.0.0.1:{ports['etcd']}",
            f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
            f"--initial-cluster=eventfleet=http://127.0.0.1:{ports['etcd-peer']}",
            "--unsafe-no-fsync", "--log-level=warn",
        ])  # fmt: skip
        pkid = w / "pki"
        self._start("kube-apiserver", [
            str(cp / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
            f"--bind-address={NODE_IP}", f"--advertise-address={NODE_IP}",
            f"--secure-port={ports['apiserver']}", f"--cert-dir={w / 'apiserver-certs'}",
            f"--tls-cert-file={pkid / 'apiserver.crt'}",
            f"--tls-private-key-file={pkid / 'apiserver.key'}",
            f"--client-ca-file={pkid / 'ca.crt'}", f"--token-auth-file={tokens}",
            "--authorization-mode=Node,RBAC",
            # The admission plugins a production cluster runs on top of the defaults
            # (PodSecurity is one of those): the operator's owner references are checked.
            "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pkid / 'sa.pub'}",
            f"--service-account-signing-key-file={pkid / 'sa.key'}",
            f"--kubelet-client-certificate={pkid / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pkid / 'apiserver-kubelet-client.key'}",
            f"--audit-policy-file={w / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}", "--audit-log-format=json",
            "--kubelet-preferred-address-types=InternalIP", "--profiling=false",
            "--enable-priority-and-fairness=false", "--v=1",
        ])  # fmt: skip
        self._start("containerd", ["containerd", "--config", str(w / "containerd.toml")])
        ctr = ["ctr", "--address", str(CONTAINERD_SOCKET)]
        wait_until(
            lambda: self._check_alive("containerd")
            and subprocess.run([*ctr, "version"], capture_output=True, timeout=10).returncode == 0,
            30, "containerd",
        )  # fmt: skip
        self._step("containerd up", t0)
        archives = [
            images.single_binary_archive(nb / "pause", PAUSE_IMAGE, w / "pause.tar"),
            images.single_binary_archive(nb / "coredns", COREDNS_IMAGE, w / "coredns.tar"),
            *(images.project_archive(name) for name in project_images),
        ]
        self.state["imports"] = images.import_archives(ctr, archives)
        self._step("images imported", t0)

        ca = str(pkid / "ca.crt")
        wait_until(
            lambda: self._check_alive("etcd", "kube-apiserver")
            and subprocess.run(
                ["curl", "-sf", "--cacert", ca, f"{self.api_server}/readyz"],
                capture_output=True, timeout=10,
            ).returncode == 0,
            timeout, "the API server to be ready",
        )  # fmt: skip
        self._step("API server ready", t0)
        self._start("kube-controller-manager", [
            str(cp / "kube-controller-manager"),
            f"--kubeconfig={w / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={w / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={w / 'controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['controller-manager']}",
            f"--cert-dir={w / 'controller-manager-certs'}",
            "--controllers=*,-cloud-node-lifecycle-controller,-node-route-controller,-service-lb-controller",
            f"--service-account-private-key-file={pkid / 'sa.key'}", f"--root-ca-file={ca}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", f"--cluster-cidr={POD_CIDR}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            "--profiling=false", "--v=1",
        ])  # fmt: skip
        self._start("kube-scheduler", [
            str(nb / "kube-scheduler"), f"--config={w / 'scheduler.yaml'}",
            f"--authentication-kubeconfig={w / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={w / 'scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['scheduler']}",
            # A pod refused for an unbound PVC in the instant its volume binds can miss
            # its requeue and wait the default 5 min (seen in CI: orphan-0 never ran);
            # the flag is honoured with --config and bounds that wait.
            "--pod-max-in-unschedulable-pods-duration=15s",
            "--profiling=false", "--v=1",
        ])  # fmt: skip
        self._start("kubelet", [
            str(nb / "kubelet"), f"--config={w / 'kubelet.yaml'}",
            f"--kubeconfig={w / 'kubelet.kubeconfig'}", f"--root-dir={w / 'kubelet'}",
            f"--cert-dir={w / 'kubelet-pki'}", f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}", "--v=1",
        ])  # fmt: skip
        self._start(
            "kube-proxy", [str(nb / "kube-proxy"), f"--config={w / 'kube-proxy.yaml'}", "--v=1"]
        )
        self._start("provisioner", [
            str(nb / "provisioner"), f"--kubeconfig={w / 'provisioner.kubeconfig'}",
            f"--dir={w / 'volumes'}", f"--name={PROVISIONER_NAME}",
        ])  # fmt: skip

        def node_ready() -> bool:
            self._check_alive("kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
            out = self.kubectl(
                "get", "node", NODE_NAME, "-o",
                'jsonpath={.status.conditions[?(@.type=="Ready")].status}', check=False,
            ).stdout  # fmt: skip
            return out == "True"

        wait_until(
            node_ready,
            timeout,
            f"node {NODE_NAME} to be Ready",
            lambda: "; the kubelet's log ends:\n" + self.log_tail("kubelet"),
        )
        self._step("node Ready", t0)
        # The NetworkPolicy firewall only; routing and Services stay with the bridge and
        # kube-proxy. It reads its node (for the node IP) at start.
        self._start("kube-router", [
            str(nb / "kube-router"), f"--kubeconfig={w / 'kube-router.kubeconfig'}",
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--health-port=0", f"--hostname-override={NODE_NAME}",
        ])  # fmt: skip
        wait_until(
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            timeout, "the default ServiceAccount",
        )  # fmt: skip
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(configs.addons()))
        wait_until(
            lambda: self._check_alive("kube-router", "provisioner")
            and self.kubectl(
                "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=5s",
                check=False,
            ).returncode == 0,
            timeout, "CoreDNS to be ready",
            lambda: "\n" + self.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
            + self.kubectl("-n", "kube-system", "get", "events", check=False).stdout[-3000:],
        )  # fmt: skip
        self._step("cluster up", t0)

    # -- down --------------------------------------------------------------------------
    def _stop(self, name: str) -> None:
        p = self.state.get("processes", {}).get(name)
        if not p or p.get("stopped"):
            return
        outcome = stop_pid(p["pid"], p["started"])
        p["stopped"] = outcome
        self._save()
        log.info("%s (pid %d): %s", name, p["pid"], outcome)

    def _ours_by_cmdline(self, needle: str) -> list[int]:
        """Pids whose command line names ``needle`` (containerd's shims name our socket)."""
        pids = []
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
        return pids

    def down(self) -> dict[str, Any]:
        """Stop every process by pid and undo the host changes; returns a report with
        ``failed`` (undo steps that failed) and ``leftovers`` (what is still on the host)."""
        t0 = time.monotonic()
        report: dict[str, Any] = {"stopped": {}, "undone": [], "failed": []}
        procs = self.state.get("processes", {})
        for name in FIRST_STOPPED:
            self._stop(name)
        if self._alive("containerd"):
            sweep = subprocess.run(
                [str(NODE_BIN / "sandbox-sweep"), f"unix://{CONTAINERD_SOCKET}"],
                capture_output=True, text=True, timeout=180, check=False,
            )  # fmt: skip
            report["sandboxes"] = sweep.stdout.strip().splitlines()
            if sweep.returncode != 0:
                report["failed"].append(f"sandbox-sweep: {sweep.stderr.strip()[:500]}")
        shims = self._ours_by_cmdline(str(CONTAINERD_SOCKET))
        self._stop("containerd")
        # Shims whose containers are gone exit by themselves; any left are ours (they name
        # our socket), as is any process left in the kubelet's pod cgroups.
        leftover = [p for p in shims if _start_time(p) is not None]
        for cg in host.cgroups():
            for tasks in cg.rglob("tasks"):
                with contextlib.suppress(OSError):
                    leftover += [int(x) for x in tasks.read_text().split()]
        for pid in sorted(set(leftover)):
            report["stopped"][f"leftover pid {pid}"] = stop_pid(pid, _start_time(pid), grace=5)
        self._stop("kube-proxy")
        if "kube-proxy" in procs:
            subprocess.run(
                [str(NODE_BIN / "kube-proxy"), "--cleanup"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        self._stop("kube-router")
        if "kube-router" in procs:
            subprocess.run(
                [str(NODE_BIN / "kube-router"), "--cleanup-config"],
                capture_output=True, timeout=60, check=False, env={"PATH": SYSTEM_PATH},
            )  # fmt: skip
        for name in reversed(list(procs)):
            self._stop(name)  # the API server before etcd (it cannot finish without it)
        report["stopped"].update({n: p.get("stopped") for n, p in procs.items()})
        undo = host.Undo(self.state.get("host") or {}, self.workdir, RUN_DIR)
        report["failed"] += undo.all()
        report["undone"] = undo.done
        if RUN_DIR.exists() and not any(m.startswith(str(RUN_DIR)) for m in _mounts()):
            owner = OWNER_FILE.read_text().strip() if OWNER_FILE.exists() else ""
            if owner in ("", str(self.workdir)):
                shutil.rmtree(RUN_DIR, ignore_errors=True)
        report["leftovers"] = host.leftovers(self.workdir, RUN_DIR)
        report["running"] = [n for n in procs if self._alive(n)]
        if not (report["leftovers"] or report["running"]):
            # The bulk (unpacked images, etcd, volumes); the logs and state.json stay.
            for bulky in ("containerd", "etcd", "volumes", "kubelet"):
                shutil.rmtree(self.workdir / bulky, ignore_errors=True)
        report["seconds"] = round(time.monotonic() - t0, 1)
        self.state["down"] = report
        if self.workdir.exists():
            self._save()
        return report

    def status(self) -> dict[str, Any]:
        return {
            "workdir": str(self.workdir),
            "kubeconfig": str(self.kubeconfig),
            "api_server": self.api_server if "ports" in self.state else None,
            "processes": {
                n: ("running" if self._alive(n) else "not running")
                for n in self.state.get("processes", {})
            },
            "timings": self.state.get("timings", {}),
            "addresses": {
                "node": NODE_IP,
                "pods": POD_CIDR,
                "services": SERVICE_CIDR,
                "kubernetes": API_SERVICE_IP,
            },
        }


def _mounts() -> list[str]:
    return [line.split()[1] for line in pathlib.Path("/proc/self/mounts").read_text().splitlines()]


def current_workdir() -> pathlib.Path | None:
    """The work directory of the cluster that is up on this machine, if any."""
    if OWNER_FILE.exists():
        return pathlib.Path(OWNER_FILE.read_text().strip())
    return None
