"""Declarative backup and restore on the real single-node cluster (e2e/cluster): the
operator installed by ``helm install`` of the chart (its ServiceAccount and RBAC enforced
by the API server), the replicas run by the kubelet from the server image, and a real
S3-compatible server (moto in server mode, tests/s3server.py; no mocked client) bound on
the cluster's bridge address (198.18.0.1, the node as the pods see it), so the pods reach
it over the pod network and read the S3 credentials Secret from their mounted volume like
on any node. The stores are read on the host from the hostPath volumes the cluster's
provisioner made for the claims.
"""

from __future__ import annotations

import base64
import sqlite3

import pytest
from eventfleet_server.storage.snapshot import events_digest

from e2e.cluster.clients import ClusterKubectl
from e2e.cluster.layout import NODE_IP
from e2e.cluster.replicas import Replicas, register
from e2e.operator_helpers import condition, eventserver, wait_condition, wait_for
from tests.s3server import ACCESS_KEY, SECRET_KEY, running_s3

pytest_plugins = ["e2e.cluster.fixtures"]
# Two fleets of real pods, then a schedule that must run and prune: minutes on 2 cores.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def operator_values() -> tuple[str, ...]:
    return ("--set", "operator.resyncSeconds=2")


@pytest.fixture(scope="module")
def kubectl(ckubectl: ClusterKubectl) -> ClusterKubectl:
    return ckubectl


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


def test_backup_resource_and_a_fleet_bootstrapped_from_it(kubectl, operator_release, tmp_path):
    with running_s3(host=NODE_IP) as s3:
        kubectl.apply(creds_secret("s3-creds"))
        target = {
            "endpointURL": s3.endpoint_url,
            "bucket": s3.bucket,
            "credentialsSecret": {"name": "s3-creds"},
        }
        kubectl.apply(eventserver("bk", 2, backup={"s3": target}))
        pods = Replicas(kubectl, "bk", tmp_path / "bk")
        wait_condition(kubectl, "bk", "Ready")
        register(pods, 0, 4)
        register(pods, 1, 3)
        wait_for(
            lambda: (
                condition(kubectl.get("eventserver", "bk"), "PeersSynced").get("status") == "True"
            ),
            timeout=240,
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

        status = wait_for(finished, timeout=240, what="the EventServerBackup to finish")
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
        restored = Replicas(kubectl, "rs", tmp_path / "rs")
        wait_condition(kubectl, "rs", "Ready")
        for ordinal in (0, 1):
            assert digest_of(restored, ordinal, upto) == digest["eventsSha256"], ordinal
        # The restored replicas continue their ids above the copy's.
        register(restored, 0, 1)
        own = wait_for(
            lambda: ((restored.status(0) or {}).get("last_ids") or {}).get("1"),
            timeout=120,
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
            timeout=180,
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
            timeout=240,
            what="the first scheduled backup pruned",
        )
        assert first_key not in s3.keys()
        assert status["objectKey"] in s3.keys()  # on demand: kept
        kubectl.run("patch", "eventserver/bk", "--type=merge", "-p", '{"spec": {"backup": null}}')


def test_every_api_call_of_this_module_was_allowed_by_the_rbac(real_cluster, kubectl):
    """Last in the module: the API server enforced the chart's RBAC on the operator's
    ServiceAccount; its audit log shows the backup calls made, none denied (but the
    transient refusals of a seconds-old CRD, which the operator retries at once)."""
    (pod,) = kubectl.json(
        "get", "pods", "-l", "app.kubernetes.io/name=eventfleet-operator"
    )["items"]  # fmt: skip
    user = f"system:serviceaccount:{kubectl.namespace}:{pod['spec']['serviceAccountName']}"
    calls = [e for e in real_cluster.audit() if e["user"]["username"] == user]
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
    denied = sorted(
        {
            e["requestURI"]
            for e in calls
            if e["responseStatus"]["code"] == 403
            and "cannot find RESTMapping" not in e["responseStatus"].get("message", "")
        }
    )
    assert denied == [], f"requests the RBAC forbade: {denied}"
