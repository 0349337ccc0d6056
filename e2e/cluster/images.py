"""Container images for the cluster's containerd: no registry is reachable, so every
image is imported from a docker archive (``ctr images import``).

- the pause and CoreDNS images: one layer holding one static binary, written here;
- the project's images (scripts/tools/images.sh, in podman's storage): ``podman save``,
  one image per archive (podman 4.3 given two names without ``-m`` writes one image
  with both tags), cached under .tools/k8s/images by image id.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import subprocess
import tarfile
import time

from .layout import CONTAINERS, IMAGE_CACHE, PODMAN


def single_binary_archive(binary: pathlib.Path, ref: str, out: pathlib.Path) -> pathlib.Path:
    """A docker-archive of ``ref``: ``binary`` as ``/<name>``, its entrypoint, user 65535."""
    dest = "/" + binary.name
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tar.gettarinfo(str(binary), arcname=dest.lstrip("/"))
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        info.mode = 0o755
        with binary.open("rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Entrypoint": [dest], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "e2e.cluster.images"}],
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
    ).encode()
    with tarfile.open(out, "w") as tar:
        for name, data in (
            (config_name, config),
            (layer_name, layer_bytes),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out


def project_image_ref(name: str) -> str:
    """``docker.io/eventfleet/<name>:<version>``: how images.sh tags the newest build,
    and what the chart and the operator name by default."""
    from eventfleet_operator import __version__

    return f"docker.io/eventfleet/{name}:{__version__}"


def project_archive(name: str) -> pathlib.Path:
    """The docker archive of a project image, saved once per image id."""
    if not (CONTAINERS / f"{name}.image").exists() or not PODMAN.exists():
        raise RuntimeError(f"no {name} image: run scripts/tools/images.sh (the test command does)")
    ref = project_image_ref(name)
    proc = subprocess.run(
        [str(PODMAN), "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"podman has no image {ref} (scripts/tools/images.sh): {proc.stderr}")
    image_id = proc.stdout.strip()[:16]
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    archive = IMAGE_CACHE / f"{name}-{image_id}.tar"
    if not archive.exists():
        for old in IMAGE_CACHE.glob(f"{name}-*.tar"):
            old.unlink()
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        subprocess.run(
            [str(PODMAN), "save", "--format", "docker-archive", "-o", str(partial), ref],
            capture_output=True, text=True, timeout=900, check=True,
        )  # fmt: skip
        partial.rename(archive)
    return archive


def import_archives(ctr: list[str], archives: list[pathlib.Path]) -> dict[str, float]:
    """``ctr -n k8s.io images import`` each archive; seconds per archive."""
    took = {}
    for archive in archives:
        t0 = time.monotonic()
        proc = subprocess.run(
            [*ctr, "-n", "k8s.io", "images", "import", str(archive)],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"ctr images import {archive}: {proc.stderr.strip()}")
        took[archive.name] = round(time.monotonic() - t0, 1)
    return took
