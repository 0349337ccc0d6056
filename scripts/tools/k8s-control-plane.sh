#!/usr/bin/env bash
# Builds a real Kubernetes control plane for the e2e tests from Go modules:
# kube-apiserver and kube-controller-manager from k8s.io/kubernetes, and etcd from
# go.etcd.io/etcd/server/v3 (etcdmain), at the versions pinned by e2e/controlplane/go.mod
# (k8s.io/kubernetes cannot be `go install`ed on its own: its go.mod replaces the staging
# modules with local paths, so our module replaces each with its published version).
#
# No release download site is reachable here, only the Go module proxy. The binaries and
# the Go build cache live under <repo>/.tools/k8s (gitignored); a stamp keyed on the
# module files and this script makes a second run a no-op. Compiling on 2 cores takes
# minutes, so the build runs under `nice -n 19` and prints progress and timings.
#
# Without Go (and no up-to-date build) it fails: the control-plane tests cannot run.
# A developer may go on without it: EVENTFLEET_ALLOW_MISSING=go, then
# those tests skip and the run says so loudly (tests/parts.py). CI never sets it.
#
# Usage: scripts/tools/k8s-control-plane.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib/missing.bash
source "$root/scripts/tools/lib/missing.bash"
# shellcheck source=lib/k8s-build.bash
source "$root/scripts/tools/lib/k8s-build.bash"
mod="$root/e2e/controlplane"
tools="$root/.tools/k8s"
bindir="$tools/bin"
log() { echo "k8s-control-plane: $*" >&2; }

key="$(cat "$mod/go.mod" "$mod/go.sum" "$0" $(find "$mod/cmd" -name '*.go' | sort) | sha256sum | cut -c1-16)"
stamp="$bindir/.built-$key"
binaries=(etcd kube-apiserver kube-controller-manager)
if k8s_built "$bindir" "$key" "${binaries[@]}"; then
    log "up to date in $bindir ($key)"
    exit 0
fi
if ! command -v go >/dev/null; then
    part_missing k8s-control-plane go "no 'go' on PATH: cannot build etcd and kube-apiserver" \
        "install a Go toolchain (apt-get install golang-go, or go.dev/dl) and run $0"
fi

k8s_go_env "$mod/go.mod" "$tools" "$bindir"

start=$(date +%s)
log "downloading modules for k8s.io/kubernetes $k8s_version"
(cd "$mod" && go mod download)
log "modules ready after $(($(date +%s) - start)) s"

for target in ./cmd/etcd k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager; do
    t0=$(date +%s)
    log "building $target (nice -n 19) ..."
    (cd "$mod" && nice -n 19 go build -trimpath -tags providerless -ldflags "$ldflags" -o "$out/" "$target")
    log "built $target in $(($(date +%s) - t0)) s"
done
k8s_install "$bindir" "${binaries[@]}"
"$bindir/kube-apiserver" --version >&2
# sed reads the whole output: `head -1` may close the pipe while etcd still writes, and
# with pipefail the SIGPIPE (exit 141) would fail the whole test command.
"$bindir/etcd" --version | sed -n 1p >&2
touch "$stamp"
log "control plane built in $(($(date +%s) - start)) s into $bindir"
