"""Where the cluster's parts are and which addresses it uses.

The address ranges are inside 198.18.0.0/15, the block reserved for benchmark testing
(RFC 2544): never the private ranges (10/8, 172.16/12, 192.168/16), whose traffic is
flagged on the CI machines even when it stays local.
"""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools"
CONTROL_PLANE_BIN = TOOLS / "k8s" / "bin"  # scripts/tools/k8s-control-plane.sh
NODE_BIN = TOOLS / "k8s" / "node" / "bin"  # scripts/tools/k8s-node.sh
IMAGE_CACHE = TOOLS / "k8s" / "images"  # docker archives of the project's images
PODMAN = TOOLS / "bin" / "efpodman"  # scripts/tools/images.sh
CONTAINERS = TOOLS / "containers"
KUBECTL = TOOLS / "bin" / "kubectl"  # scripts/tools/k8s-binaries.sh
HELM = TOOLS / "bin" / "helm"

CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
NODE_BINARIES = (
    "kubelet",
    "kube-scheduler",
    "kube-proxy",
    "pause",
    "provisioner",
    "sandbox-sweep",
    "coredns",
    "kube-router",
)
# Debian packages (scripts/tools/k8s-node.sh installs them).
SYSTEM_BINARIES = ("containerd", "ctr", "runc", "ipset", "iptables", "ip6tables", "ip")
CNI_BIN = pathlib.Path("/usr/lib/cni")

NODE_NAME = "eventfleet-node"
BRIDGE = "efk8s0"
NODE_IP = "198.18.0.1"  # the bridge's address: node IP, pods' gateway, API server address
POD_CIDR = "198.18.0.0/24"
SERVICE_CIDR = "198.18.1.0/24"
API_SERVICE_IP = "198.18.1.1"  # the `kubernetes` Service: first address of the range
DNS_SERVICE_IP = "198.18.1.10"
CLUSTER_DOMAIN = "cluster.local"

# Host-wide: the kubelet's and kube-proxy's iptables chains and the kubelet's cgroups have
# fixed names, so one cluster per machine. This directory is the lock (created with
# mkdir by `up`, removed last by `down`) and holds containerd's socket and runtime state;
# its `workdir` file names the cluster that owns it.
RUN_DIR = pathlib.Path("/run/eventfleet-cluster")
CONTAINERD_SOCKET = RUN_DIR / "containerd.sock"

STORAGE_CLASS = "standard"
PROVISIONER_NAME = "eventfleet.local/hostpath"
PAUSE_IMAGE = "localhost/eventfleet-cluster/pause:1"
COREDNS_IMAGE = "localhost/eventfleet-cluster/coredns:1.14.7"
# The project's images, by the names the chart and the operator use by default
# (eventfleet/<name>:<version>, i.e. docker.io/...): scripts/tools/images.sh tags them so.
PROJECT_IMAGES = ("server", "operator")

# Disk. The kubelet reclaims (deletes every unused image, the pause image included) only
# when less than this is left; `up` refuses to start with less than DISK_NEEDED_GIB free
# (a CI run's peak, measured: 4.2 GB for the images unpacked in containerd, the Spark
# image with its class archive among them, volumes and logs).
EVICTION_DISK_FREE = "512Mi"
DISK_NEEDED_GIB = 6.0


def missing() -> list[str]:
    """What the cluster needs and this machine lacks, each with the command that provides it."""
    import shutil

    out = [
        f"{CONTROL_PLANE_BIN / b} (scripts/tools/k8s-control-plane.sh)"
        for b in CONTROL_PLANE_BINARIES
        if not (CONTROL_PLANE_BIN / b).exists()
    ]
    out += [
        f"{NODE_BIN / b} (scripts/tools/k8s-node.sh)"
        for b in NODE_BINARIES
        if not (NODE_BIN / b).exists()
    ]
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    out += [
        f"{b} (scripts/tools/k8s-node.sh installs it from Debian)"
        for b in SYSTEM_BINARIES
        if shutil.which(b, path=path) is None
    ]
    out += [
        f"{CNI_BIN / p} (scripts/tools/k8s-node.sh: containernetworking-plugins)"
        for p in ("bridge", "host-local")
        if not (CNI_BIN / p).exists()
    ]
    out += [f"{t} (scripts/tools/k8s-binaries.sh)" for t in (KUBECTL, HELM) if not t.exists()]
    return out
