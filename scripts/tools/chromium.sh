#!/usr/bin/env bash
# Installs Debian's `chromium` for the real-browser test of the Jetstream demo page
# (driven by playwright-core from scripts/tools/jetstream.sh; Playwright's own browser
# download is not reachable from these machines), and links it as <repo>/.tools/bin/chromium.
#
# Idempotent: a second run only checks that the binary is there.
# Usage: scripts/tools/chromium.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
bindir="$root/.tools/bin"

link_binary() {
    mkdir -p "$bindir"
    ln -sfn "$(PATH="/usr/bin:$PATH" command -v chromium)" "$bindir/.chromium.tmp"
    mv -Tf "$bindir/.chromium.tmp" "$bindir/chromium"
}

if PATH="/usr/bin:$PATH" command -v chromium >/dev/null; then
    link_binary
    echo "chromium: already installed ($(chromium --version 2>/dev/null | head -1))" >&2
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        sudo="sudo -n"
    else
        echo "chromium: not installed, and installing it needs root (or password-less sudo):" >&2
        echo "  apt-get install --no-install-recommends chromium" >&2
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null; then
    echo "chromium: not installed and this is not a Debian-like system (no apt-get)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show chromium >/dev/null 2>&1; then
    echo "chromium: apt-get update" >&2
    $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
fi
echo "chromium: apt-get install chromium (a few minutes)" >&2
$sudo apt-get install -qq -o DPkg::Lock::Timeout=300 -y --no-install-recommends \
    chromium fonts-liberation >/dev/null
link_binary
echo "chromium: installed ($(chromium --version 2>/dev/null | head -1))" >&2
