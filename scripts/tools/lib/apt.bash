# Shared by the tool scripts that install a Debian package (chromium.sh, prometheus.sh).
# Sourced, never run: it lives below scripts/tools/lib/ so that scripts/test, which runs
# every scripts/tools/*.sh, does not pick it up.
#
#   apt_need_root NAME PKG...   sets $sudo ("" as root, "sudo -n" with password-less
#                               sudo), else exits 1 saying which command to run as root;
#                               exits 1 too when there is no apt-get (not Debian-like).
#                               NAME is the part's name (tests/parts.py): a developer's
#                               EVENTFLEET_ALLOW_MISSING=NAME makes both exit 0, loudly.
#   apt_install NAME PKG...     installs PKG... non-interactively, without recommends,
#                               waiting up to 300 s for another apt's lock; the package
#                               lists are updated only when apt does not know the first
#                               package yet (a fresh CI image has none).
#
# NAME prefixes every message. Both assume the caller's `set -euo pipefail`.

# shellcheck source=missing.bash
source "${BASH_SOURCE[0]%/*}/missing.bash"

apt_need_root() {
    local name="$1"
    shift
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            part_missing "$name" "$name" \
                "not installed, and installing it needs root (or password-less sudo)" \
                "as root: apt-get install --no-install-recommends $*"
        fi
    fi
    if ! command -v apt-get >/dev/null; then
        part_missing "$name" "$name" "not installed and this is not a Debian-like system (no apt-get)" \
            "install $* with this system's package manager"
    fi
}

apt_install() {
    local name="$1"
    shift
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show "$1" >/dev/null 2>&1; then
        echo "$name: apt-get update" >&2
        $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
    fi
    echo "$name: apt-get install $*" >&2
    $sudo apt-get install -qq -o DPkg::Lock::Timeout=300 -y --no-install-recommends "$@" >/dev/null
}
