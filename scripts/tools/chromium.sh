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
# shellcheck source=lib/apt.bash
source "$root/scripts/tools/lib/apt.bash"

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

apt_need_root chromium chromium
echo "chromium: installing (a few minutes)" >&2
apt_install chromium chromium fonts-liberation
link_binary
echo "chromium: installed ($(chromium --version 2>/dev/null | head -1))" >&2
