#!/usr/bin/env bash
# Builds the project's container images (images/*.Dockerfile) with Debian's buildah, so
# the tests can run them with podman. No Docker engine runs here and no registry is
# reachable, so:
#   - podman, buildah, runc and debootstrap come from Debian's packages;
#   - the base image is made with debootstrap (Debian bookworm, Python 3.11, the same
#     major/minor as python:3.11-slim-bookworm) and `podman import`ed, and passed to the
#     unchanged Dockerfiles through their build arguments (PYTHON_IMAGE, SPARK_IMAGE,
#     UV_IMAGE). Users with Docker and a registry build them exactly as the Dockerfiles
#     say; nothing here changes what they mean.
#   - containers run with the flags verified on these machines: vfs storage, runc with
#     cgroupfs (crun refuses the hybrid cgroup hierarchy), no default ulimits (podman's
#     nofile default exceeds the hard limit here).
#
# Everything lives under <repo>/.tools/containers (gitignored): the storage, the
# configuration, and the wrappers .tools/bin/efpodman and .tools/bin/efbuildah that the
# tests use. Each image is tagged with a key of everything it is built from; a second run
# finds the tags and does nothing. Builds run under `nice -n 19`.
#
# Usage: scripts/tools/images.sh [server|operator ...]   (default: both)
#        env EVENTFLEET_IMAGES_SKIP=1 skips everything.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
ctr="$root/.tools/containers"
bindir="$root/.tools/bin"
log() { echo "images: $*" >&2; }
t_start=$(date +%s)
elapsed() { echo "$(($(date +%s) - ${1:-$t_start})) s"; }

if [ "${EVENTFLEET_IMAGES_SKIP:-}" = 1 ]; then
    log "skipped (EVENTFLEET_IMAGES_SKIP=1)"
    exit 0
fi

# --- 1. Debian packages ------------------------------------------------------------
missing=()
for cmd in podman buildah runc debootstrap; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        # Containers need root here; without it the image tests skip with this reason.
        log "missing ${missing[*]} and cannot apt-get install them (not root / no apt); image tests will skip"
        exit 0
    fi
    t0=$(date +%s)
    log "installing podman buildah runc debootstrap uidmap from Debian"
    export DEBIAN_FRONTEND=noninteractive
    pkgs=(podman buildah runc debootstrap uidmap)
    if ! nice -n 19 apt-get install -y -q "${pkgs[@]}" >"$root/.tools/apt-images.log" 2>&1; then
        log "apt-get install failed; updating the package lists and retrying"
        apt-get update -q >>"$root/.tools/apt-images.log" 2>&1 || true
        nice -n 19 apt-get install -y -q "${pkgs[@]}" >>"$root/.tools/apt-images.log" 2>&1 || {
            tail -20 "$root/.tools/apt-images.log" >&2
            log "FAILED: apt-get install ${pkgs[*]}"
            exit 1
        }
    fi
    log "packages installed in $(elapsed "$t0")"
fi

# --- 2. Configuration and wrappers --------------------------------------------------
mkdir -p "$ctr" "$bindir"
# The run root must not survive a reboot (podman keeps locks and state there), so it is
# on /run, one per checkout.
runroot="/run/eventfleet-containers-$(echo "$ctr" | sha256sum | cut -c1-12)"
cat >"$ctr/storage.conf.tmp" <<EOF
[storage]
driver = "vfs"
graphroot = "$ctr/storage"
runroot = "$runroot"
EOF
cat >"$ctr/containers.conf.tmp" <<'EOF'
[containers]
# podman's default nofile limit exceeds the hard limit on these machines: setrlimit EPERM.
default_ulimits = []

[engine]
# crun refuses the hybrid (v1) cgroup hierarchy here; runc with cgroupfs works.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
cat >"$ctr/registries.conf.tmp" <<'EOF'
# No registry is reachable: never try one for a short name.
unqualified-search-registries = []
short-name-mode = "permissive"
EOF
for f in storage.conf containers.conf registries.conf; do mv -f "$ctr/$f.tmp" "$ctr/$f"; done
for tool in podman buildah; do
    cat >"$bindir/ef$tool.tmp" <<EOF
#!/bin/sh
# $tool with the project's container configuration (written by scripts/tools/images.sh).
export CONTAINERS_CONF="$ctr/containers.conf"
export CONTAINERS_STORAGE_CONF="$ctr/storage.conf"
export CONTAINERS_REGISTRIES_CONF="$ctr/registries.conf"
exec $tool "\$@"
EOF
    chmod 755 "$bindir/ef$tool.tmp"
    mv -f "$bindir/ef$tool.tmp" "$bindir/ef$tool"
done
podman="$bindir/efpodman"
buildah="$bindir/efbuildah"

image_exists() { "$podman" image exists "$1" 2>/dev/null; }

# --- 3. Base images from Debian -----------------------------------------------------
mirror="${EVENTFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# debootstrap_image TAG INCLUDE-PACKAGES FIXUP-FUNCTION
debootstrap_image() {
    local tag="$1" include="$2" fixup="$3" dir t0
    if image_exists "$tag"; then
        log "base $tag present"
        return
    fi
    t0=$(date +%s)
    dir="$ctr/rootfs.tmp"
    rm -rf "$dir"
    log "debootstrap bookworm ($include) ..."
    nice -n 19 debootstrap --variant=minbase --include="$include" bookworm "$dir" "$mirror" \
        >"$ctr/debootstrap.log" 2>&1 || {
        tail -20 "$ctr/debootstrap.log" >&2
        log "FAILED: debootstrap --variant=minbase --include=$include bookworm $dir $mirror"
        exit 1
    }
    "$fixup" "$dir"
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/var/log/*.log
    tar -C "$dir" -c . | nice -n 19 "$podman" import \
        --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$tag" >/dev/null
    rm -rf "$dir"
    log "base $tag built in $(elapsed "$t0")"
}

python_fixup() {
    # What python:3.11-slim gives that Debian's python3 does not: a `python` command, and
    # pip allowed to install outside a venv (Debian's PEP 668 marker forbids it).
    ln -sf python3 "$1/usr/bin/python"
    rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED
}

base_recipe="bookworm minbase python3,python3-venv,python3-pip,ca-certificates v1"
base_key="$(echo "$base_recipe" | sha256sum | cut -c1-12)"
python_image="localhost/eventfleet-base/python:3.11-bookworm-$base_key"
debootstrap_image "$python_image" python3,python3-venv,python3-pip,ca-certificates python_fixup

# --- 4. The project's images --------------------------------------------------------
context_key() {
    # Everything a build reads: its Dockerfile and ignore file, the sources the ignore
    # file lets through, this script and the base image's id.
    local name="$1"
    {
        cat "$root/images/$name.Dockerfile" "$root/images/$name.Dockerfile.dockerignore" "$0"
        (cd "$root" && find pyproject.toml README.md server operator spark -type f \
            -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*.egg-info/*' \
            -print0 | sort -z | xargs -0 sha256sum)
        shift
        for base in "$@"; do "$podman" image inspect --format '{{.Id}}' "$base"; done
    } | sha256sum | cut -c1-12
}

build_image() {
    local name="$1" key tag t0
    shift
    local bases=()
    local args=()
    while [ $# -gt 0 ]; do
        args+=(--build-arg "$1=$2")
        bases+=("$2")
        shift 2
    done
    key="$(context_key "$name" "${bases[@]}")"
    tag="localhost/eventfleet/$name:$key"
    if image_exists "$tag"; then
        log "$name image $tag present"
    else
        t0=$(date +%s)
        log "building $name image (nice -n 19) ..."
        local mounts=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
        [ -f /etc/pip.conf ] && mounts+=(-v /etc/pip.conf:/etc/pip.conf:ro)
        (cd "$root" && nice -n 19 "$buildah" bud --format docker --network host --layers=false \
            "${mounts[@]}" "${args[@]}" \
            --ignorefile "images/$name.Dockerfile.dockerignore" \
            -f "images/$name.Dockerfile" -t "$tag" . >"$ctr/build-$name.log" 2>&1) || {
            tail -30 "$ctr/build-$name.log" >&2
            log "FAILED: buildah bud -f images/$name.Dockerfile (log: $ctr/build-$name.log)"
            exit 1
        }
        log "$name image built in $(elapsed "$t0")"
    fi
    # The stable name the tests use, always pointing at the newest build.
    "$podman" tag "$tag" "localhost/eventfleet/$name:test"
    echo "$tag" >"$ctr/$name.image"
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(server operator)
for name in "${want[@]}"; do
    case "$name" in
    server | operator) build_image "$name" PYTHON_IMAGE "$python_image" ;;
    *) log "unknown image $name"; exit 2 ;;
    esac
done
log "done in $(elapsed)"
