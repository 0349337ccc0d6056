"""The project's container images, built by scripts/tools/images.sh, run with podman.

Each image starts with its own ENTRYPOINT/CMD, as its non-root uid, with a read-only
root filesystem where the chart or the operator sets one:

* server: serves Eventer (register and query from the host) and ``/readyz``, stops
  gracefully on SIGTERM as PID 1;
* operator: ``--help`` and its uid and read-only root (the image reconciling in-cluster,
  as the chart's Deployment, is e2e/test_cluster_fleet.py's and every operator module's
  on the real single-node cluster);
* spark: ``spark-submit --version`` and the job's ``--help``.

Containers use the host network and bind 127.0.0.1 only; each is removed by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid

import pytest
import yaml

from e2e.cluster.layout import PODMAN, ROOT
from e2e.operator_helpers import wait_for
from e2e.ports import free_port
from tests import parts

pytestmark = pytest.mark.timeout(300)
IMAGES = ROOT / ".tools" / "containers"


def podman_available() -> str | None:
    """None if containers can run here, else why not (what to run to get them)."""
    if not PODMAN.exists() or shutil.which("podman") is None:
        return f"no {PODMAN}: run scripts/tools/images.sh (needs root and Debian's podman)"
    return None


def image(name: str) -> str:
    reason = podman_available()
    if reason:
        parts.skip_missing("podman", reason, "run scripts/tools/images.sh")
    ref = IMAGES / f"{name}.image"
    if not ref.exists():
        parts.skip_missing("podman", f"no {name} image", "run scripts/tools/images.sh")
    return ref.read_text().strip()


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(PODMAN), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.returncode} {result.stderr}")
    return result


@contextlib.contextmanager
def container(name_prefix: str, *run_args: str):
    """``podman run -d``; yields the container name, removes it afterwards."""
    name = f"{name_prefix}-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, "--network", "host", *run_args)
    try:
        yield name
    finally:
        # Clean-up only: a test that checks a graceful stop does its own `podman stop`
        # first. Without -t 0, the operator test's idle `sleep` (PID 1, which ignores
        # SIGTERM) would hold the removal for the whole timeout.
        podman("rm", "-f", "-t", "0", name, check=False)


def uid_of(name: str) -> str:
    """uid:gid of the container's processes, read from inside it."""
    script = "import os; print(f'{os.getuid()}:{os.getgid()}')"
    return podman("exec", name, "python", "-c", script).stdout.strip()


def root_is_read_only(name: str, path: str) -> bool:
    script = f"open({path!r}, 'w')"
    result = podman("exec", name, "python", "-c", script, check=False)
    return result.returncode != 0 and "Read-only file system" in result.stderr


def test_server_image_serves_eventer_and_readyz_as_non_root_on_a_read_only_root(tmp_path):
    ref = image("server")
    data, conf, secret = tmp_path / "data", tmp_path / "conf", tmp_path / "secret"
    for d in (data, conf, secret):
        d.mkdir()
    os.chown(data, 10001, 10001)  # the volume, as fsGroup would leave it
    (secret / "token").write_text("image-test-token")
    (secret / "token").chmod(0o444)
    eventer, syncer, http = free_port(), free_port(), free_port()
    config = {
        "host": "127.0.0.1",
        "server_id": 1,
        "data_dir": "/var/lib/eventfleet",
        "token_file": "/var/run/secrets/eventfleet/token",
        "eventer": {"port": eventer},
        "syncer": {"port": syncer},
        "http": {"port": http},
    }
    (conf / "config.yaml").write_text(yaml.safe_dump(config))
    # The image's own ENTRYPOINT and CMD: `eventfleet server --config /etc/eventfleet/...`.
    with container(
        "ef-server",
        "--read-only",
        "--tmpfs", "/tmp",
        "-v", f"{data}:/var/lib/eventfleet",
        "-v", f"{conf}:/etc/eventfleet:ro",
        "-v", f"{secret}:/var/run/secrets/eventfleet:ro",
        ref,
    ) as name:  # fmt: skip

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/readyz", timeout=2) as r:
                return r.status == 200

        try:
            wait_for(ready, timeout=60, what="the server container's /readyz")
        except TimeoutError:
            raise AssertionError(podman("logs", name, check=False).stderr[-3000:]) from None
        assert uid_of(name) == "10001:10001"
        assert root_is_read_only(name, "/opt/eventfleet/probe")

        cli = [sys.executable, "-m", "eventfleet_cli"]
        auth = ["--eventer", f"127.0.0.1:{eventer}", "--token-file", str(secret / "token")]
        registered = subprocess.run(
            [*cli, "register", *auth, "image/test", "--json", '{"from": "host"}'],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        event = json.loads(registered.stdout)
        queried = subprocess.run(
            [*cli, "query", *auth, "latest", "image/test"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        (found,) = [json.loads(line) for line in queried.stdout.splitlines() if line.strip()]
        assert found["id"] == event["id"] and found["payload"] == {"json": {"from": "host"}}
        # Its store is on the volume, written as the non-root user.
        assert any(p.stat().st_uid == 10001 for p in data.iterdir())

        # PID 1 handles SIGTERM itself: a graceful stop well within the grace period.
        stopped = podman("stop", "-t", "30", name)
        assert stopped.returncode == 0
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, state


def test_operator_image_help_uid_and_read_only_root():
    ref = image("operator")
    helped = podman("run", "--rm", "--read-only", "--tmpfs", "/tmp", ref, "operator", "--help")
    assert "Reconcile EventServer resources" in helped.stdout
    with container(
        "ef-operator-idle", "--read-only", "--tmpfs", "/tmp", "--entrypoint", "sleep", ref, "60"
    ) as name:
        assert uid_of(name) == "10001:10001"
        assert root_is_read_only(name, "/opt/eventfleet/probe")


def test_spark_image_runs_spark_submit_and_the_job():
    ref = image("spark")
    # One run only: with vfs storage each new container copies the whole ~1 GB image.
    # As the image's user, every step on a read-only root with a /tmp tmpfs.
    marker = "-- the job --help --"
    ran = podman(
        "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--entrypoint", "sh", ref, "-c",
        f"set -e; id -u; spark-submit --version 2>&1; echo '{marker}'; "
        "exec /opt/spark/bin/spark-submit /opt/eventfleet/aggregate.py --help",
        timeout=300,
    )  # fmt: skip
    version, found, helped = ran.stdout.partition(f"\n{marker}\n")
    assert found, ran.stdout + ran.stderr[-2000:]
    uid, _, rest = version.partition("\n")
    assert uid == "185", version
    assert "version 4.0.1" in rest, rest
    assert "usage" in helped.lower(), helped + ran.stderr[-2000:]
