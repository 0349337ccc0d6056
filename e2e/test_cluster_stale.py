"""A cluster left up by a runner that was killed (no `down`) must not block the next run,
and a cluster that still runs must never be taken down by another one.

Stop 29's CI failed this way: the runner before it was killed mid-run, its run directory
stayed, and every cluster test of the next run refused to start.
"""

from __future__ import annotations

import json
import os
import pathlib

from e2e.cluster import cluster as cl


def _state(workdir: pathlib.Path, processes: dict[str, dict]) -> pathlib.Path:
    workdir.mkdir(parents=True)
    state = {"workdir": str(workdir), "processes": processes}
    (workdir / "state.json").write_text(json.dumps(state))
    return workdir


def test_a_cluster_with_a_running_process_is_never_reclaimed(tmp_path):
    me = os.getpid()
    owner = _state(tmp_path / "owner", {"etcd": {"pid": me, "started": cl._start_time(me)}})
    assert cl.Cluster(tmp_path / "new")._reclaim_stale(str(owner)) is False


def test_an_owner_without_state_is_never_reclaimed(tmp_path):
    assert cl.Cluster(tmp_path / "new")._reclaim_stale(str(tmp_path / "nothing")) is False
    assert cl.Cluster(tmp_path / "new")._reclaim_stale("unknown") is False


def test_a_reused_pid_does_not_count_as_running(tmp_path):
    """A pid recorded with another start time is some other process now: the owner is gone."""
    me = os.getpid()
    owner = cl.Cluster(_state(tmp_path / "owner", {"etcd": {"pid": me, "started": "1"}}))
    assert not owner._alive("etcd")
