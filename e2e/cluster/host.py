"""The cluster's changes to the host: checked absent before `up`, undone by `down`.

What a single-node cluster changes outside its work directory, and who does it:

- the bridge (ours) with its address and the route keeping Service traffic on it (ours);
  the pods' veth pairs and ``/run/netns/cni-*`` network namespaces (containerd's CRI
  plugin, through the CNI bridge plugin);
- iptables/ip6tables chains named ``KUBE-*`` and the rules jumping to them (kubelet,
  kube-proxy, kube-router) and ipsets (kube-router);
- cgroups named ``kubepods`` in every cgroup v1 hierarchy (kubelet);
- mounts below the work directory and the run directory (kubelet volumes, containerd
  root filesystems and sandbox files);
- ``/var/log/containers`` symlinks (kubelet, a fixed path);
- sysctls: ``vm.overcommit_memory``, ``kernel.panic``, ``kernel.panic_on_oops``
  (kubelet) and ``net.ipv4.ip_forward`` (CNI bridge plugin as the pods' gateway).

Names that only a cluster makes (``KUBE-*`` chains, ``kubepods`` cgroups, the bridge,
``cni-*`` namespaces) must not exist before `up` — :func:`preconditions` says which do —
so `down` can remove every one of them without touching anything else (podman's
``CNI-*`` chains and ``netns-*`` namespaces are not ours and are left alone). Values that
existed before (sysctls, ``/var/log/containers``) are snapshotted by `up` and restored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import shlex
import subprocess

from .layout import BRIDGE, NODE_IP, SERVICE_CIDR

log = logging.getLogger("e2e.cluster.host")

SYSCTLS = (
    "vm.overcommit_memory",
    "kernel.panic",
    "kernel.panic_on_oops",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
)
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle", "raw")
CHAIN_PREFIX = "KUBE-"
IPSET_PREFIXES = ("KUBE-", "kube-router")
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
CGROUP_NAME = "kubepods"
NETNS_DIR = pathlib.Path("/run/netns")
NETNS_PREFIX = "cni-"
CONTAINER_LOGS = pathlib.Path("/var/log/containers")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _sysctl_path(name: str) -> pathlib.Path:
    return pathlib.Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    out = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = _sysctl_path(name).read_text().strip()
    return out


def chains() -> dict[str, list[str]]:
    """``{"iptables/nat": ["KUBE-SERVICES", ...], ...}``: the cluster's chains now."""
    out: dict[str, list[str]] = {}
    for binary in IPTABLES:
        for table in TABLES:
            proc = run(binary, "-w", "5", "-t", table, "-S", check=False)
            names = [
                line.split()[1]
                for line in proc.stdout.splitlines()
                if line.startswith("-N ") and line.split()[1].startswith(CHAIN_PREFIX)
            ]
            if names:
                out[f"{binary}/{table}"] = names
    return out


def ipsets() -> list[str]:
    proc = run("ipset", "list", "-n", check=False)
    return [s for s in proc.stdout.split() if s.startswith(IPSET_PREFIXES)]


def cgroups() -> list[pathlib.Path]:
    if not CGROUP_ROOT.is_dir():
        return []
    # cpu and cpuacct are links to cpu,cpuacct (and so on): each hierarchy once.
    return sorted({p.resolve() for p in CGROUP_ROOT.glob(f"*/{CGROUP_NAME}") if p.is_dir()})


def netns() -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(NETNS_PREFIX))


def link_exists(name: str) -> bool:
    return run("ip", "link", "show", name, check=False).returncode == 0


def preconditions() -> list[str]:
    """What is already on the host that only a cluster makes (empty: `up` may start)."""
    found = []
    if link_exists(BRIDGE):
        found.append(f"network link {BRIDGE}")
    found += [f"{where} chain {c}" for where, names in chains().items() for c in names]
    found += [f"ipset {s}" for s in ipsets()]
    found += [f"cgroup {p}" for p in cgroups()]
    found += [f"network namespace {NETNS_DIR / n}" for n in netns()]
    return found


def snapshot() -> dict[str, object]:
    """What `down` restores: sysctl values and whether /var/log/containers existed."""
    return {"sysctls": read_sysctls(), "container_logs_existed": CONTAINER_LOGS.exists()}


def setup_bridge() -> None:
    """The bridge whose address is the node IP, and the route for the Service range.

    Without the route, a connection to a ClusterIP that no iptables rule matched yet
    (a Service with no endpoints, kube-proxy not synced) would follow the default route
    off the machine; with it, it stays on the bridge and fails locally.
    """
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    run("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP)


class Undo:
    """Undoes the host changes; every action is logged and kept in ``done``."""

    def __init__(self, saved: dict[str, object], workdir: pathlib.Path, run_dir: pathlib.Path):
        self.saved = saved
        self.workdir = workdir
        self.run_dir = run_dir
        self.done: list[str] = []
        self.failed: list[str] = []

    def _record(self, what: str, ok: bool = True, detail: str = "") -> None:
        (self.done if ok else self.failed).append(what + (f": {detail}" if detail else ""))
        log.info("%s%s", "" if ok else "FAILED ", what + (f": {detail}" if detail else ""))

    def _try(self, what: str, *argv: str) -> None:
        proc = run(*argv, check=False)
        self._record(what, proc.returncode == 0, proc.stderr.strip()[:300])

    def all(self) -> list[str]:
        """Undo everything (after every cluster process has stopped); returns the failures."""
        self.mounts()
        self.network_namespaces()
        self.iptables()
        self.ipsets()
        self.links()
        self.cgroups()
        self.container_logs()
        self.sysctls()
        return self.failed

    def mounts(self) -> None:
        prefixes = tuple(str(p.resolve()) + "/" for p in (self.workdir, self.run_dir))
        points = []
        for line in pathlib.Path("/proc/self/mounts").read_text().splitlines():
            point = line.split()[1].encode().decode("unicode_escape")
            if (point + "/").startswith(prefixes):
                points.append(point)
        for point in sorted(set(points), key=len, reverse=True):  # deepest first
            self._try(f"unmount {point}", "umount", "-l", point)

    def network_namespaces(self) -> None:
        for name in netns():
            path = NETNS_DIR / name
            run("umount", "-l", str(path), check=False)
            try:
                path.unlink()
                self._record(f"remove network namespace {path}")
            except OSError as e:
                self._record(f"remove network namespace {path}", False, str(e))

    def iptables(self) -> None:
        for binary in IPTABLES:
            for table in TABLES:
                rules = run(binary, "-w", "5", "-t", table, "-S", check=False).stdout.splitlines()
                ours = {
                    line.split()[1]
                    for line in rules
                    if line.startswith("-N ") and line.split()[1].startswith(CHAIN_PREFIX)
                }
                # Rules in other chains that jump to ours or match our ipsets (an
                # ``iptables -S`` line, quotes and all, is its own -D argument list).
                for line in rules:
                    parts = line.split()
                    if parts[:1] != ["-A"] or parts[1] in ours:
                        continue
                    if CHAIN_PREFIX in line:
                        self._try(
                            f"{binary} -t {table} delete rule {line}",
                            binary, "-w", "5", "-t", table, "-D", *shlex.split(line)[1:],
                        )  # fmt: skip
                for chain in sorted(ours):
                    run(binary, "-w", "5", "-t", table, "-F", chain, check=False)
                for chain in sorted(ours):
                    self._try(
                        f"{binary} -t {table} delete chain {chain}",
                        binary, "-w", "5", "-t", table, "-X", chain,
                    )  # fmt: skip

    def ipsets(self) -> None:
        names = ipsets()
        for name in names:  # lists first: a set in use by a list cannot be destroyed
            run("ipset", "flush", name, check=False)
        for name in names:
            self._try(f"destroy ipset {name}", "ipset", "destroy", name)

    def links(self) -> None:
        if not link_exists(BRIDGE):
            return
        ports = json.loads(run("ip", "-j", "link", "show", "master", BRIDGE).stdout or "[]")
        for port in ports:
            self._try(f"delete link {port['ifname']}", "ip", "link", "del", port["ifname"])
        run("ip", "route", "del", SERVICE_CIDR, "dev", BRIDGE, check=False)
        self._try(
            f"delete link {BRIDGE} (and its route for {SERVICE_CIDR})", "ip", "link", "del", BRIDGE
        )

    def cgroups(self) -> None:
        for top in cgroups():
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                try:
                    d.rmdir()
                except OSError as e:
                    self._record(f"remove cgroup {d}", False, str(e))
            if not top.exists():
                self._record(f"remove cgroup {top} and below")

    def container_logs(self) -> None:
        if not CONTAINER_LOGS.is_dir():
            return
        ours = str(self.workdir.resolve()) + "/"
        for link in CONTAINER_LOGS.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(ours):
                link.unlink()
        if not self.saved.get("container_logs_existed") and not any(CONTAINER_LOGS.iterdir()):
            CONTAINER_LOGS.rmdir()
        self._record(f"remove the cluster's links in {CONTAINER_LOGS}")

    def sysctls(self) -> None:
        before = self.saved.get("sysctls") or {}
        assert isinstance(before, dict)
        now = read_sysctls()
        for name, value in before.items():
            if now.get(name) != value:
                try:
                    _sysctl_path(name).write_text(value + "\n")
                    self._record(f"sysctl {name}={value} (was set to {now.get(name)})")
                except OSError as e:
                    self._record(f"sysctl {name}={value}", False, str(e))


def leftovers(workdir: pathlib.Path, run_dir: pathlib.Path) -> list[str]:
    """What of the cluster is still on the host (empty after a clean `down`)."""
    found = preconditions()
    prefixes = tuple(str(p.resolve()) + "/" for p in (workdir, run_dir))
    for line in pathlib.Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1]
        if (point + "/").startswith(prefixes):
            found.append(f"mount {point}")
    if run_dir.exists():
        found.append(f"directory {run_dir}")
    return found
