#!/usr/bin/env bash
# Builds and installs what the single-node test cluster (e2e/cluster, scripts/cluster)
# adds to the control plane of scripts/tools/k8s-control-plane.sh:
#
#   - from Debian: containerd (with its CRI plugin), runc, the CNI plugins (bridge,
#     host-local), ipset (for kube-router) and iptables;
#   - from Go modules (no release downloads are reachable, only the module proxy), into
#     <repo>/.tools/k8s/node/bin:
#       e2e/cluster/go/node         kubelet, kube-scheduler, kube-proxy (k8s.io/kubernetes,
#                                   the control plane's version and build cache), pause,
#                                   provisioner (sig-storage-lib-external-provisioner),
#                                   sandbox-sweep (CRI clean-up at teardown)
#       e2e/cluster/go/coredns      CoreDNS with the plugins the cluster's Corefile uses
#       e2e/cluster/go/kube-router  kube-router, run as the NetworkPolicy firewall only
#
# A stamp keyed on the Go modules and this script makes a second run a no-op. Builds run
# under `nice -n 19` and print their timings. Without Go, root or apt this fails: the
# real-cluster tests cannot run without these, and must not be silently skipped.
#
# Usage: scripts/tools/k8s-node.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
src="$root/e2e/cluster/go"
tools="$root/.tools/k8s"
bindir="$tools/node/bin"
log() { echo "k8s-node: $*" >&2; }
# shellcheck source=lib/apt.bash
source "$root/scripts/tools/lib/apt.bash"
# shellcheck source=lib/k8s-build.bash
source "$root/scripts/tools/lib/k8s-build.bash"
start=$(date +%s)

# --- 1. Debian packages -----------------------------------------------------------------
have_packages() {
    PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH" command -v containerd >/dev/null &&
        PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH" command -v ctr >/dev/null &&
        PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH" command -v runc >/dev/null &&
        PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH" command -v ipset >/dev/null &&
        PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH" command -v iptables >/dev/null &&
        [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ]
}
packages=(containerd runc containernetworking-plugins ipset iptables)
if ! have_packages; then
    apt_need_root k8s-node "${packages[@]}"
    # The containerd package must not start its own system service: the cluster runs
    # containerd with its own configuration, socket and state. A temporary policy-rc.d
    # forbids service starts while we install (unless the machine has a policy already).
    policy=/usr/sbin/policy-rc.d
    own_policy=""
    trap '[ -z "$own_policy" ] || $sudo rm -f "$policy"' EXIT
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# temporary, from eventfleet scripts/tools/k8s-node.sh\nexit 101\n' |
            $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
        own_policy=1
    fi
    t0=$(date +%s)
    apt_install k8s-node "${packages[@]}"
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        $sudo systemctl disable --now containerd.service >/dev/null 2>&1 || true
    fi
    have_packages || { log "FAILED: ${packages[*]} installed but a binary is missing"; exit 1; }
    log "packages installed in $(($(date +%s) - t0)) s"
fi

# --- 2. Go binaries ----------------------------------------------------------------------
if ! command -v go >/dev/null; then
    log "FAILED: no 'go' on PATH; the single-node cluster is built from Go modules (Go >= 1.24)"
    exit 1
fi
key="$(cat "$0" $(find "$src" -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) | sort) |
    sha256sum | cut -c1-16)"
stamp="$bindir/.built-$key"
binaries=(kubelet kube-scheduler kube-proxy pause provisioner sandbox-sweep coredns kube-router)
if k8s_built "$bindir" "$key" "${binaries[@]}"; then
    log "up to date in $bindir ($key)"
    exit 0
fi

k8s_go_env "$src/node/go.mod" "$tools" "$bindir"
build() { # build MODULE-DIR OUTPUT-NAME PACKAGE [go build flags...]
    local dir="$1" name="$2" target="$3" t0
    shift 3
    t0=$(date +%s)
    log "building $name ($target, nice -n 19) ..."
    (cd "$src/$dir" && nice -n 19 go build -trimpath "$@" -o "$out/$name" "$target")
    log "built $name in $(($(date +%s) - t0)) s"
}
for dir in node coredns kube-router; do
    t0=$(date +%s)
    (cd "$src/$dir" && go mod download)
    log "modules of $dir ready after $(($(date +%s) - t0)) s"
done
build node kubelet k8s.io/kubernetes/cmd/kubelet -tags providerless -ldflags "$ldflags"
build node kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler -tags providerless -ldflags "$ldflags"
build node kube-proxy k8s.io/kubernetes/cmd/kube-proxy -tags providerless -ldflags "$ldflags"
build node pause ./cmd/pause -ldflags "-s -w"
build node provisioner ./cmd/provisioner -ldflags "-s -w"
build node sandbox-sweep ./cmd/sandbox-sweep -ldflags "-s -w"
build coredns coredns . -ldflags "-s -w"
build kube-router kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router -ldflags "-s -w"
k8s_install "$bindir" "${binaries[@]}"
"$bindir/kubelet" --version >&2
touch "$stamp"
log "node binaries built in $(($(date +%s) - start)) s into $bindir"
