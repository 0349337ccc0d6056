"""Declarative backup and restore, end to end: the real operator process, the real
kubectl, real replica processes, and a real S3-compatible server (moto in server mode
on loopback, tests/s3server.py; no mocked client).

Runs on the real control plane (``e2e/k8s/cluster_fixtures.py``): the real API server
and StatefulSet controller, the operator as its ServiceAccount (RBAC enforced by the
server), and the project's server image run by the node agent with podman on the host
network, so the pods reach moto on 127.0.0.1 and read the S3 credentials Secret from
their mounted volume like on any node.
"""

from __future__ import annotations

import base64
import sqlite3

import pytest
from eventfleet_server.storage.snapshot import events_digest

from e2e.k8s.harness import wait_for
from e2e.test_operator import condition, eventserver, register
from tests.s3server import ACCESS_KEY, SECRET_KEY, running_s3

pytest_plugins = ["e2e.k8s.cluster_fixtures"]
# Two fleets of real pods, then a schedule that must run and prune: minutes on 2 cores.
pytestmark = pytest.mark.timeout(420)


def creds_secret(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {
            "AWS_ACCESS_KEY_ID": base64.b64encode(ACCESS_KEY.encode()).decode(),
            "AWS_SECRET_ACCESS_KEY": base64.b64encode(SECRET_KEY.encode()).decode(),
        },
    }


def digest_of(pods, ordinal: int, upto: dict[int, int]) -> str:
    conn = sqlite3.connect(f"file:{pods.store_file(ordinal)}?mode=ro", uri=True)
    try:
        return events_digest(conn, upto)
    finally:
        conn.close()


def test_backup_resource_and_a_fleet_bootstrapped_from_it(kubectl, operator, kubelet):
    with running_s3() as s3:
        kubectl.apply(creds_secret("s3-creds"))
        target = {
            "endpointURL": s3.endpoint_url,
            "bucket": s3.bucket,
            "credentialsSecret": {"name": "s3-creds"},
        }
        kubectl.apply(eventserver("bk", 2, backup={"s3": target}))
        pods = kubelet("bk")
        kubectl.run("wait", "--for=condition=Ready", "eventserver/bk", "--timeout=90s", timeout=100)
        register(pods, 0, 4)
        register(pods, 1, 3)
        wait_for(
            lambda: (
                condition(kubectl.get("eventserver", "bk"), "PeersSynced").get("status") == "True"
            ),
            timeout=60,
            what="bk in sync",
        )

        kubectl.apply(
            {
                "apiVersion": "eventfleet.io/v1",
                "kind": "EventServerBackup",
                "metadata": {"name": "bk-first"},
                "spec": {"eventServer": "bk"},
            }
        )

        def finished():
            st = (kubectl.get("eventserverbackup", "bk-first") or {}).get("status") or {}
            return st if st.get("phase") in ("Completed", "Failed") else None

        status = wait_for(finished, timeout=90, what="the EventServerBackup to finish")
        assert status["phase"] == "Completed", status
        assert status["replica"] in ("bk-0", "bk-1")
        assert status["objectKey"] == f"{kubectl.namespace}/bk/bk-first.sqlite"
        assert status["startedAt"] and status["finishedAt"]
        digest = status["digest"]
        assert digest["events"] >= 7 and len(digest["sha256"]) == 64
        assert s3.keys() == [status["objectKey"]]
        head = s3.client().head_object(Bucket=s3.bucket, Key=status["objectKey"])
        assert head["Metadata"]["sha256"] == digest["sha256"]
        upto = {int(k): v for k, v in digest["lastIds"].items()}
        # The copy holds what the source replica held: the same events as its store.
        assert digest_of(pods, 0, upto) == digest["eventsSha256"]

        # A new fleet from the copy: every replica restores it, verified, then starts.
        from_backup = {"s3": target, "key": status["objectKey"], "sha256": digest["sha256"]}
        kubectl.apply(eventserver("rs", 2, bootstrap={"fromBackup": from_backup}))
        restored = kubelet("rs")
        kubectl.run("wait", "--for=condition=Ready", "eventserver/rs", "--timeout=90s", timeout=100)
        for ordinal in (0, 1):
            assert digest_of(restored, ordinal, upto) == digest["eventsSha256"], ordinal
        # The restored replicas continue their ids above the copy's.
        register(restored, 0, 1)
        own = wait_for(
            lambda: ((restored.status(0) or {}).get("last_ids") or {}).get("1"),
            timeout=20,
            what="rs-0's own ids",
        )
        assert own["instance"] > upto[1]

        # The schedule: a backup every 10 s, one kept; the on-demand one is never pruned.
        kubectl.run(
            "patch",
            "eventserver/bk",
            "--type=merge",
            "-p",
            '{"spec": {"backup": {"schedule": "@every 10s", "retention": 1}}}',
        )

        def scheduled():
            items = kubectl.json("get", "eventserverbackups")["items"]
            return sorted(
                (b["metadata"]["name"], (b.get("status") or {}).get("phase"))
                for b in items
                if (b["metadata"].get("labels") or {}).get("eventfleet.io/scheduled") == "true"
            )

        first = wait_for(
            lambda: (s := scheduled()) and s[0][1] == "Completed" and s[0],
            timeout=60,
            what="a scheduled backup",
        )
        first_key = f"{kubectl.namespace}/bk/{first[0]}.sqlite"
        assert first_key in s3.keys()
        # A later one completes, and the first goes: its object, then its resource.
        wait_for(
            lambda: (
                first[0] not in [n for n, _ in scheduled()]
                and any(p == "Completed" for _, p in scheduled())
            ),
            timeout=90,
            what="the first scheduled backup pruned",
        )
        assert first_key not in s3.keys()
        assert status["objectKey"] in s3.keys()  # on demand: kept
        kubectl.run("patch", "eventserver/bk", "--type=merge", "-p", '{"spec": {"backup": null}}')


def test_every_api_call_of_this_module_was_allowed_by_the_rbac(emulator):
    """Last in the module: the API server enforced operator/deploy/rbac.yaml on the
    operator's ServiceAccount; its audit log shows the backup calls made, none denied."""
    user = "system:serviceaccount:eventfleet-system:eventfleet-operator"
    calls = [e for e in emulator.audit() if e["user"]["username"] == user]
    made = {
        (
            e["objectRef"].get("apiGroup", ""),
            e["objectRef"]["resource"]
            + (f"/{e['objectRef']['subresource']}" if e["objectRef"].get("subresource") else ""),
            e["verb"],
        )
        for e in calls
        if e.get("objectRef")
    }
    assert {
        ("eventfleet.io", "eventserverbackups", "get"),
        ("eventfleet.io", "eventserverbackups", "list"),
        ("eventfleet.io", "eventserverbackups", "create"),
        ("eventfleet.io", "eventserverbackups", "delete"),
        ("eventfleet.io", "eventserverbackups/status", "patch"),
    } <= made, sorted(made)
    denied = sorted({e["requestURI"] for e in calls if e["responseStatus"]["code"] == 403})
    assert denied == [], f"requests the RBAC forbade: {denied}"
