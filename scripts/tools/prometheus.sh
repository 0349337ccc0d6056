#!/usr/bin/env bash
# Installs Debian's `prometheus` package so the tests have a real `prometheus` and
# `promtool`, and links both into <repo>/.tools/bin.
#
# The tests only ever run the binaries themselves (on 127.0.0.1, with a temporary data
# directory); a system service is never wanted. The package's maintainer scripts may try
# to start one: while we install, a temporary policy-rc.d forbids service starts
# (invoke-rc.d honours it on sysvinit and on systemd), and afterwards we stop and disable
# whatever the package may still have started. Only when this run installed the package:
# an existing installation (and any service its owner runs) is left alone.
#
# Idempotent: a second run only checks that the binaries are there.
# Usage: scripts/tools/prometheus.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
bindir="$root/.tools/bin"
# shellcheck source=lib/apt.bash
source "$root/scripts/tools/lib/apt.bash"

link_binaries() {
    mkdir -p "$bindir"
    for name in prometheus promtool; do
        local found
        found="$(PATH="/usr/bin:/usr/sbin:/bin:$PATH" command -v "$name")"
        # Absolute symlink, replaced atomically: a concurrent test never finds it missing.
        ln -sfn "$found" "$bindir/.$name.tmp"
        mv -Tf "$bindir/.$name.tmp" "$bindir/$name"
    done
}

if PATH="/usr/bin:$PATH" command -v prometheus >/dev/null && PATH="/usr/bin:$PATH" command -v promtool >/dev/null; then
    link_binaries
    echo "prometheus: already installed ($("$bindir/promtool" --version 2>&1 | head -1))" >&2
    exit 0
fi

apt_need_root prometheus prometheus

# Forbid service starts for the duration of the install, unless the machine already has
# its own policy (then we respect it and rely on the clean-up below).
policy=/usr/sbin/policy-rc.d
own_policy=""
cleanup() {
    if [ -n "$own_policy" ]; then $sudo rm -f "$policy"; fi
}
trap cleanup EXIT
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# temporary, from eventfleet scripts/tools/prometheus.sh\nexit 101\n' \
        | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    own_policy=1
fi

apt_install prometheus prometheus

# Belt and braces: whatever the package started (policy-rc.d pre-existing and permissive,
# or a systemd that ignores it), stop it and keep it from starting at boot.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    $sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true
elif [ -x /etc/init.d/prometheus ]; then
    $sudo /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    if command -v update-rc.d >/dev/null; then
        $sudo update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
fi
pidfile=/run/prometheus/prometheus.pid
if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "prometheus: the package's service is still running (pid $(cat "$pidfile"))" >&2
    exit 1
fi

link_binaries
echo "prometheus: installed ($("$bindir/promtool" --version 2>&1 | head -1))" >&2
