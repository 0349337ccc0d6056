# Shared by k8s-control-plane.sh and k8s-node.sh, which build Kubernetes binaries from
# Go modules into <repo>/.tools/k8s. Sourced, never run (see lib/apt.bash for why it
# lives in lib/). The caller defines log().
#
#   k8s_built BINDIR KEY BINARY...
#       true when BINDIR/.built-KEY is there (a build of exactly these inputs finished)
#       and every BINARY is in BINDIR, executable.
#   k8s_go_env GOMOD TOOLS BINDIR
#       $k8s_version: the k8s.io/kubernetes version GOMOD requires (exit 1 naming GOMOD
#       without one); $ldflags: the version stamps `kubectl version` and helm's
#       kubeVersion checks read (an unstamped build reports v0.0.0-master and charts with
#       a kubeVersion constraint fail); exports the Go settings both builds share
#       (GOCACHE in TOOLS/go-build: the node's kubelet & co. share most packages with
#       the control plane); $out: BINDIR/.partial, emptied, where the binaries are built.
#   k8s_install BINDIR BINARY...
#       moves each BINARY from $out into BINDIR, removes $out and every old stamp (the
#       caller touches the new one once the binaries answer).
#
# Assumes the caller's `set -euo pipefail`.

k8s_built() {
    local bindir="$1" key="$2" b
    shift 2
    [ -f "$bindir/.built-$key" ] || return 1
    for b in "$@"; do [ -x "$bindir/$b" ] || return 1; done
}

k8s_go_env() {
    local gomod="$1" tools="$2" bindir="$3" minor pkg
    k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$gomod")"
    [ -n "$k8s_version" ] || { log "no k8s.io/kubernetes requirement in $gomod"; exit 1; }
    minor="$(echo "$k8s_version" | cut -d. -f2)"
    export GOCACHE="$tools/go-build"
    export GOFLAGS="-mod=readonly -buildvcs=false"
    export CGO_ENABLED=0
    mkdir -p "$bindir" "$GOCACHE"
    pkg=k8s.io/component-base/version
    ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    out="$bindir/.partial"
    rm -rf "$out"
    mkdir -p "$out"
}

k8s_install() {
    local bindir="$1" b
    shift
    for b in "$@"; do mv -f "$out/$b" "$bindir/$b"; done
    rm -rf "$out"
    rm -f "$bindir"/.built-*
}
