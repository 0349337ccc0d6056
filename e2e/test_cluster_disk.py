"""The cluster and a full disk: stop 30's CI failed because the shared disk fell under the
kubelet's eviction threshold (then 1%, i.e. 2.5 GiB of a 252 GiB disk). The kubelet deleted
every unused image, the pause image among them, and every pod after that failed to start
with an error that named neither the disk nor the kubelet.

Now: the threshold is absolute and small, `up` refuses a disk that is too full and says so,
and a failing test on the cluster names the reclaim when one happened.
"""

from __future__ import annotations

import shutil

import yaml

from e2e.cluster import cluster as cl
from e2e.cluster import configs, layout

# Lines of the kubelet's log from that run (trimmed), and one ordinary line.
KUBELET_LOG = "".join(
    line + "\n"
    for line in (
        'I1127 09:57:22.014363 1753 kubelet_volumes.go:163] "Cleaned up orphaned pod volumes dir"',
        'I1127 09:57:27.113719 1753 eviction_manager.go:376] "Eviction manager: attempting to '
        'reclaim" resourceName="ephemeral-storage"',
        'I1127 09:57:27.201095 1753 image_gc_manager.go:514] "Removing image to free bytes" '
        'imageID="sha256:405db7e9" size=1434363 runtimeHandler=""',
        'I1127 09:57:33.430376 1753 eviction_manager.go:383] "Eviction manager: able to reduce '
        'resource pressure without evicting pods." resourceName="ephemeral-storage"',
    )
)


def test_the_kubelet_reclaims_disk_only_when_almost_none_is_left(tmp_path):
    config = yaml.safe_load(configs.kubelet_config(tmp_path, {"kubelet": 1, "kubelet-healthz": 2}))
    hard = config["evictionHard"]
    for signal in ("nodefs.available", "imagefs.available"):
        assert not hard[signal].endswith("%"), hard  # a share of a big disk is gigabytes
        assert hard[signal] == layout.EVICTION_DISK_FREE == "512Mi"
    assert config["imageGCHighThresholdPercent"] == 100


def test_up_refuses_a_disk_without_room_and_names_what_it_found(tmp_path, monkeypatch):
    free_gib = shutil.disk_usage(tmp_path).free / 2**30
    if free_gib > layout.DISK_NEEDED_GIB + 1:  # a directory not made yet: its parent counts
        assert cl.disk_shortfall(tmp_path / "not" / "made" / "yet") is None
    monkeypatch.setattr(cl, "DISK_NEEDED_GIB", free_gib + 100)
    why = cl.disk_shortfall(tmp_path / "cluster0")
    assert why is not None
    assert why.startswith(f"{free_gib + 100:.0f} GiB free on the disk of {tmp_path / 'cluster0'}")
    assert "(it has " in why
    monkeypatch.setattr(cl.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cl, "missing", list)
    # Were the check gone, up() must still stop before it touches the host.
    monkeypatch.setattr(cl, "RUN_DIR", tmp_path / "run")
    monkeypatch.setattr(cl, "OWNER_FILE", tmp_path / "run" / "workdir")
    monkeypatch.setattr(cl.host, "preconditions", lambda: ["(test) past the disk check"])
    try:
        cl.Cluster(tmp_path / "cluster0").up()
    except cl.ClusterError as e:
        assert "GiB free on the disk of" in str(e)
    else:
        raise AssertionError("up() started on a disk it said was too full")
    assert not (tmp_path / "cluster0").exists()


def test_a_reclaim_in_the_kubelet_log_is_found(tmp_path):
    cluster = cl.Cluster(tmp_path)
    assert cluster.disk_reclaims() == []  # no log yet
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "kubelet.log").write_text(KUBELET_LOG.splitlines()[0] + "\n")
    assert cluster.disk_reclaims() == []
    (tmp_path / "logs" / "kubelet.log").write_text(KUBELET_LOG)
    found = cluster.disk_reclaims()
    assert len(found) == 2
    assert "attempting to reclaim" in found[0] and "Removing image" in found[1]
