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
# Without podman and no way to install it (not root, no apt) it fails: the container
# tests cannot run. A developer may go on without it: EVENTFLEET_ALLOW_MISSING=podman, then
# those tests skip and the run says so loudly (tests/parts.py). CI never sets it.
#
# Usage: scripts/tools/images.sh [server|operator|spark ...]   (default: all three)
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib/missing.bash
source "$root/scripts/tools/lib/missing.bash"
ctr="$root/.tools/containers"
bindir="$root/.tools/bin"
log() { echo "images: $*" >&2; }
t_start=$(date +%s)
elapsed() { echo "$(($(date +%s) - ${1:-$t_start})) s"; }

# --- 1. Debian packages ------------------------------------------------------------
missing=()
for cmd in podman buildah runc debootstrap; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        part_missing images podman "missing ${missing[*]} and cannot apt-get install them (not root / no apt)" \
            "as root: apt-get install podman buildah runc debootstrap uidmap; then run $0"
    fi
    t0=$(date +%s)
    log "installing podman buildah runc debootstrap uidmap from Debian"
    export DEBIAN_FRONTEND=noninteractive
    pkgs=(podman buildah runc debootstrap uidmap)
    if ! nice -n 19 apt-get -o DPkg::Lock::Timeout=300 install -y -q "${pkgs[@]}" >"$root/.tools/apt-images.log" 2>&1; then
        log "apt-get install failed; updating the package lists and retrying"
        apt-get -o DPkg::Lock::Timeout=300 update -q >>"$root/.tools/apt-images.log" 2>&1 || true
        nice -n 19 apt-get -o DPkg::Lock::Timeout=300 install -y -q "${pkgs[@]}" >>"$root/.tools/apt-images.log" 2>&1 || {
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
# podman's own temporary state, per checkout too (its default /run/libpod is shared).
echo "tmp_dir = \"$runroot/libpod-tmp\"" >>"$ctr/containers.conf.tmp"
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
    local tag="$1" include="$2" fixup="$3" dir dlog slot t0
    if image_exists "$tag"; then
        log "base $tag present"
        return
    fi
    t0=$(date +%s)
    # Per base: the two bases are built at the same time (below).
    slot="$(echo "$tag" | sha256sum | cut -c1-8)"
    dir="$ctr/rootfs-$slot.tmp"
    dlog="$ctr/debootstrap-$slot.log"
    rm -rf "$dir"
    log "debootstrap bookworm ($include) ..."
    nice -n 19 debootstrap --variant=minbase --include="$include" bookworm "$dir" "$mirror" \
        >"$dlog" 2>&1 || {
        tail -20 "$dlog" >&2
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

# --- 4. The project's images --------------------------------------------------------
context_key() {
    # Everything a build reads: its Dockerfile and ignore file, the sources the ignore
    # file lets through, and the base images' ids.
    local name="$1"
    {
        # Bump when the way images are built changes (not for edits of this script that
        # leave the result alone, which would rebuild everything for nothing).
        echo "build-recipe 1"
        cat "$root/images/$name.Dockerfile" "$root/images/$name.Dockerfile.dockerignore"
        (cd "$root" && find pyproject.toml setup.py README.md server operator spark -type f \
            -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*.egg-info/*' -not -name '*.so' \
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
        # Builds reach PyPI through this machine's network: its CA certificates and pip
        # configuration, and for uv (which otherwise trusts only its built-in roots) a
        # system uv.toml asking for the system's certificates. Build-time mounts only:
        # nothing of them ends up in an image.
        local mounts=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
        [ -f /etc/pip.conf ] && mounts+=(-v /etc/pip.conf:/etc/pip.conf:ro)
        mounts+=(-v "$ctr/uv.toml:/etc/uv/uv.toml:ro")
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
    # The stable name the tests use, always pointing at the newest build; and the name
    # the chart and the operator refer to by default (eventfleet/<name>:<version>, i.e.
    # docker.io/...), as if preloaded onto a node, so pods run it with --pull never.
    "$podman" tag "$tag" "localhost/eventfleet/$name:test" "docker.io/eventfleet/$name:$version"
    echo "$tag" >"$ctr/$name.image"
    # Older builds of this image are never used again; with vfs each costs its full size.
    local old
    for old in $("$podman" images --format '{{.Repository}}:{{.Tag}}'); do
        case "$old" in
        "$tag" | "localhost/eventfleet/$name:test") ;;
        "localhost/eventfleet/$name:"*) "$podman" rmi "$old" >/dev/null 2>&1 || true ;;
        esac
    done
}

# --- 5. The Spark image's stand-in bases -----------------------------------------------
# images/spark.Dockerfile builds FROM the official Apache Spark image and copies uv from
# ghcr.io/astral-sh/uv; neither registry is reachable. Stand-ins with the same layout:
#   - uv: the uv binary from its PyPI wheel (same version as the Dockerfile's UV_IMAGE);
#   - spark: Debian bookworm with OpenJDK 17 and Python 3, and /opt/spark assembled from
#     the PyPI pyspark sdist of the Spark release the operator schedules (bin, sbin, jars,
#     python/lib/pyspark.zip and the py4j zip spark-submit puts on PYTHONPATH), the
#     `spark` user 185 and /opt/spark/work-dir. Not in the stand-in: the official
#     /opt/entrypoint.sh (driver/executor dispatch for spark-on-k8s), so its ENTRYPOINT
#     is unset and the tests name spark-submit explicitly.
#   - The Dockerfile's `uv venv --python 3.11` only accepts a uv-managed Python
#     (UV_PYTHON_PREFERENCE=only-managed) and python-build-standalone downloads are not
#     reachable: the stand-in carries Debian's CPython 3.11 laid out as a uv-managed
#     installation under /opt/eventfleet/python, so uv finds it instead of downloading.
spark_version="${EVENTFLEET_SPARK_VERSION:-4.0.1}"
py4j_version="${EVENTFLEET_PY4J_VERSION:-0.10.9.9}"
uv_version="${EVENTFLEET_UV_VERSION:-0.8.22}"
pip_python="$root/.venv/bin/python"
[ -x "$pip_python" ] || pip_python=python3
downloads="$root/.tools/downloads"

pip_fetch() { # pip_fetch SPEC [pip download options...]: into .tools/downloads, once
    local spec="$1" stamp
    shift
    stamp="$downloads/.got-$(echo "$spec $*" | tr -c 'A-Za-z0-9._=-' _)"
    [ -f "$stamp" ] && return
    mkdir -p "$downloads"
    log "downloading $spec from PyPI"
    "$pip_python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --dest "$downloads" "$@" "$spec"
    touch "$stamp"
}

uv_image="localhost/eventfleet-base/uv:$uv_version"
build_uv_base() {
    image_exists "$uv_image" && { log "base $uv_image present"; return; }
    pip_fetch "uv==$uv_version" --only-binary=:all:
    local dir="$ctr/uv.tmp"
    rm -rf "$dir" && mkdir -p "$dir/out"
    (cd "$dir" && python3 -m zipfile -e "$downloads"/uv-"$uv_version"-*manylinux*x86_64*.whl wheel)
    install -m 755 "$dir"/wheel/uv-"$uv_version".data/scripts/uv "$dir/out/uv"
    tar -C "$dir/out" -c . | "$podman" import - "$uv_image" >/dev/null
    rm -rf "$dir"
    log "base $uv_image built"
}

spark_fixup() {
    local dir="$1" src="$ctr/spark-src.tmp" py
    pip_fetch "pyspark==$spark_version" --no-binary=:all:
    pip_fetch "py4j==$py4j_version" --only-binary=:all:
    rm -rf "$src" && mkdir -p "$src"
    tar -C "$src" -xzf "$downloads/pyspark-$spark_version.tar.gz"
    local s="$src/pyspark-$spark_version" spark="$dir/opt/spark"
    mkdir -p "$spark/python/lib" "$spark/work-dir"
    cp -a "$s/deps/bin" "$s/deps/sbin" "$s/deps/jars" "$spark/"
    (cd "$s" && python3 -m zipfile -c "$spark/python/lib/pyspark.zip" pyspark)
    mkdir -p "$src/py4j"
    (cd "$src/py4j" && python3 -m zipfile -e "$downloads"/py4j-"$py4j_version"-*.whl . \
        && python3 -m zipfile -c "$spark/python/lib/py4j-$py4j_version-src.zip" py4j)
    rm -rf "$src"
    chroot "$dir" groupadd --system --gid 185 spark
    chroot "$dir" useradd --system --uid 185 --gid 185 --home-dir /opt/spark \
        --no-create-home --shell /usr/sbin/nologin spark
    chroot "$dir" chown 185:185 /opt/spark/work-dir
    # Debian's CPython as a uv-managed installation (see above): its own binary, and
    # the standard library where getpath finds it from that binary's location.
    py="$(chroot "$dir" python3 -c 'import platform; print(platform.python_version())')"
    local managed="$dir/opt/eventfleet/python/cpython-$py-linux-x86_64-gnu"
    mkdir -p "$managed/bin" "$managed/lib"
    cp -a "$dir/usr/bin/python3.11" "$managed/bin/python3.11"
    ln -s python3.11 "$managed/bin/python3"
    ln -s python3.11 "$managed/bin/python"
    ln -s /usr/lib/python3.11 "$managed/lib/python3.11"
    python_fixup "$dir"
}

build_spark() {
    local recipe key tag
    recipe="bookworm minbase openjdk-17-jre-headless,python3,python3-venv,procps spark=$spark_version py4j=$py4j_version v1"
    key="$(echo "$recipe" | sha256sum | cut -c1-12)"
    tag="localhost/eventfleet-base/spark:$spark_version-$key"
    build_uv_base
    if ! image_exists "$tag"; then
        debootstrap_image "$tag.tmp" openjdk-17-jre-headless,python3,python3-venv,procps,ca-certificates spark_fixup
        # The official image's environment, on top of the imported root filesystem.
        local c
        c="$("$buildah" from "$tag.tmp")"
        "$buildah" config --env SPARK_HOME=/opt/spark \
            --env JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
            --env PATH=/opt/spark/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            --workingdir /opt/spark/work-dir --user 185 "$c"
        "$buildah" commit --quiet "$c" "$tag" >/dev/null
        "$buildah" rm "$c" >/dev/null
        "$podman" rmi "$tag.tmp" >/dev/null
    fi
    build_image spark SPARK_IMAGE "$tag" UV_IMAGE "$uv_image"
}

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -1)"
want=("$@")
[ ${#want[@]} -gt 0 ] || want=(server operator spark)
python_lane=()
spark_lane=""
for name in "${want[@]}"; do
    case "$name" in
    server | operator) python_lane+=("$name") ;;
    spark) spark_lane=1 ;;
    *) log "unknown image $name"; exit 2 ;;
    esac
done
printf 'native-tls = true\n' >"$ctr/uv.toml"
build_python_lane() {
    [ ${#python_lane[@]} -gt 0 ] || return 0
    debootstrap_image "$python_image" python3,python3-venv,python3-pip,ca-certificates python_fixup
    local name
    for name in "${python_lane[@]}"; do build_image "$name" PYTHON_IMAGE "$python_image"; done
}
# Two lanes at the same time: the Python base then the server and operator images, and
# the Spark base then the Spark image. Each is mostly one process waiting on downloads,
# dpkg or a single-threaded build step, so on 2 cores the two together take about as long
# as the longer one (the Spark lane) instead of their sum.
lanes=()
trap 'for p in "${lanes[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
(build_python_lane) &
lanes+=($!)
if [ -n "$spark_lane" ]; then
    (build_spark) &
    lanes+=($!)
fi
failed=0
for p in "${lanes[@]}"; do wait "$p" || failed=1; done
lanes=()
[ "$failed" = 0 ] || { log "FAILED (see above)"; exit 1; }
log "done in $(elapsed)"
