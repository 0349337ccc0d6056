# Shared by the tool scripts: what to do when a script cannot provide its part.
# Sourced, never run (see lib/apt.bash for why it lives in lib/).
#
#   part_missing NAME PART WHAT FIX
#       The script cannot provide PART (a name of tests/parts.py: go, podman, ...).
#       Fails (exit 1) saying WHAT is wrong and FIX (what to run), unless the developer
#       listed PART (or `all`) in EVENTFLEET_ALLOW_MISSING: then it says loudly that the
#       part is allowed to be missing and exits 0. CI never sets EVENTFLEET_ALLOW_MISSING,
#       so there a missing part always fails the run instead of skipping its tests.
#
# Assumes the caller's `set -euo pipefail`.

part_allowed() {
    local part="$1" allowed=",${EVENTFLEET_ALLOW_MISSING:-},"
    allowed="${allowed// /}"
    [[ "$allowed" == *",$part,"* || "$allowed" == *",all,"* ]]
}

part_missing() {
    local name="$1" part="$2" what="$3" fix="$4"
    if part_allowed "$part"; then
        echo "$name: !!! $part MISSING, allowed by EVENTFLEET_ALLOW_MISSING: $what" >&2
        echo "$name: !!! the tests that need $part will skip: this is not a CI result" >&2
        exit 0
    fi
    echo "$name: FAILED: $what" >&2
    echo "$name: fix: $fix" >&2
    echo "$name: (a developer may set EVENTFLEET_ALLOW_MISSING=$part to go on without it; CI never does)" >&2
    exit 1
}
