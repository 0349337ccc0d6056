"""Operator day 2 on the real control plane: the real API server, controller-manager
and scheduler, the real operator process as its ServiceAccount (RBAC enforced by the
server), the real kubectl, and the project's images run by the node agent with podman
(``e2e/k8s/cluster_fixtures.py``, docs/operator.md).

The API-level scenarios are shared with ``e2e/test_operator_day2.py`` (imported below;
they also run there, on the API emulator). The pod-level ones live here only: pause,
hibernate and wake; a managed rollout of a bad image reverted without manual steps and a
restart request; the ``kubectl eventfleet`` plugin; a peer-token rotation; deletion with
``whenDeleted: Retain``; volume growth (the node agent plays the CSI driver of a
StorageClass with its provisioner).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from e2e.k8s.harness import wait_for
from e2e.test_operator import condition, eventserver, register
from e2e.test_operator_day2 import (
    restarted_events,
    test_a_foreign_object_is_never_adopted_and_the_fleet_gets_a_network_policy,
    test_fields_the_operator_stops_setting_are_removed,
)

pytest_plugins = ["e2e.k8s.cluster_fixtures"]
# Rollouts replace pods one at a time, each waiting for ready + in sync: minutes on a
# busy 2-core machine.
pytestmark = pytest.mark.timeout(420)

__all__ = [
    "test_a_foreign_object_is_never_adopted_and_the_fleet_gets_a_network_policy",
    "test_fields_the_operator_stops_setting_are_removed",
]


def test_pause_hibernate_and_wake_with_real_replicas(kubectl, operator, kubelet):
    kubectl.apply(eventserver("sleepy", 2))
    pods = kubelet("sleepy")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/sleepy", "--timeout=90s", timeout=100)
    register(pods, 1, 3)  # events only replica 1 created: hibernation must flush them
    own = wait_for(
        lambda: (pods.status(1) or {}).get("last_ids", {}).get("2"), timeout=20, what="own ids"
    )

    # Paused: a spec change is not applied, the status says why.
    kubectl.run("annotate", "eventserver/sleepy", "eventfleet.io/reconcile=paused")
    kubectl.run(
        "wait", "--for=condition=ReconcilePaused", "eventserver/sleepy", "--timeout=30s", timeout=40
    )
    kubectl.run(
        "patch", "eventserver/sleepy", "--type=merge", "-p", '{"spec":{"logLevel":"DEBUG"}}'
    )
    time.sleep(3)  # several resyncs (1 s): none may write the ConfigMap
    config = yaml.safe_load(kubectl.get("configmap", "sleepy-config")["data"]["config.yaml"])
    assert config["log"]["level"] == "INFO"
    kubectl.run("annotate", "eventserver/sleepy", "eventfleet.io/reconcile-")
    wait_for(
        lambda: "DEBUG" in kubectl.get("configmap", "sleepy-config")["data"]["config.yaml"],
        timeout=30,
        what="the change applied after resume",
    )
    kubectl.run("wait", "--for=condition=Ready", "eventserver/sleepy", "--timeout=90s", timeout=100)

    # Hibernate: replica 0 must hold replica 1's events before anything stops.
    kubectl.run("patch", "eventserver/sleepy", "--type=merge", "-p", '{"spec":{"hibernate":true}}')
    kubectl.run(
        "wait", "--for=condition=Hibernated", "eventserver/sleepy", "--timeout=60s", timeout=70
    )
    es = kubectl.get("eventserver", "sleepy")
    assert es["status"]["phase"] == "Hibernated"
    assert es["spec"]["replicas"] == 2
    assert kubectl.get("statefulset", "sleepy")["spec"]["replicas"] == 0
    wait_for(lambda: pods.pid(0) is None and pods.pid(1) is None, timeout=40, what="stopped pods")
    for ordinal in (0, 1):
        assert kubectl.get("persistentvolumeclaim", f"data-sleepy-{ordinal}")  # claims kept

    # Wake: the count comes back and replica 0 still holds replica 1's events.
    kubectl.run("patch", "eventserver/sleepy", "--type=merge", "-p", '{"spec":{"hibernate":false}}')
    kubectl.run("wait", "--for=condition=Ready", "eventserver/sleepy", "--timeout=90s", timeout=100)
    assert kubectl.get("statefulset", "sleepy")["spec"]["replicas"] == 2
    held = wait_for(
        lambda: (pods.status(0) or {}).get("last_ids", {}).get("2"), timeout=20, what="ids"
    )
    assert (held["session"], held["instance"]) >= (own["session"], own["instance"])
    reasons = {
        e["reason"]
        for e in kubectl.json("get", "events", "--field-selector", "involvedObject.name=sleepy")[
            "items"
        ]
    }
    assert {"Paused", "NotPaused", "Hibernated", "NotHibernating"} <= reasons, reasons


def test_managed_rollout_of_a_bad_image_is_reverted_without_manual_steps(
    kubectl, operator, kubelet
):
    kubectl.apply(eventserver("roll", 3))
    pods = kubelet("roll")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/roll", "--timeout=90s", timeout=100)
    sts = kubectl.get("statefulset", "roll")
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    good_image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    good = kubectl.get("eventserver", "roll")["status"]["updateRevision"]
    pids = {i: pods.pid(i) for i in range(3)}

    # A bad image: the highest ordinal is replaced first and crash-loops; the others
    # keep running their old revision and Ready says a rollout is incomplete.
    kubectl.run(
        "patch",
        "eventserver/roll",
        "--type=merge",
        "-p",
        '{"spec":{"image":"bad/server:crashloop"}}',
    )

    def stuck():
        es = kubectl.get("eventserver", "roll")
        return (
            condition(es, "Progressing").get("status") == "True"
            and condition(es, "Ready").get("reason") == "RolloutInProgress"
            and pods.restarts.get(2, 0) >= 1
            and es
        )

    es = wait_for(stuck, timeout=60, what="the rollout stuck on ordinal 2")
    assert es["status"]["updateRevision"] != good
    time.sleep(4)  # several resyncs: nothing else may be replaced while 2 is broken
    assert (pods.pid(0), pods.pid(1)) == (pids[0], pids[1])
    assert condition(kubectl.get("eventserver", "roll"), "Ready")["status"] == "False"

    # Revert: the stuck pod is replaced at once, nothing else restarts.
    kubectl.run(
        "patch", "eventserver/roll", "--type=json", "-p", '[{"op":"remove","path":"/spec/image"}]'
    )
    kubectl.run("wait", "--for=condition=Ready", "eventserver/roll", "--timeout=90s", timeout=100)
    es = kubectl.get("eventserver", "roll")
    status = es["status"]
    assert (status["updateRevision"], status["currentRevision"], status["updatedReplicas"]) == (
        good,
        good,
        3,
    )
    assert condition(es, "Progressing")["reason"] == "RolloutComplete"
    assert (pods.pid(0), pods.pid(1)) == (pids[0], pids[1])
    pod2 = kubectl.get("pod", "roll-2")
    assert pod2["spec"]["containers"][0]["image"] == good_image
    messages = restarted_events(kubectl, "roll")
    assert any("bad/server:crashloop" in m for m in messages), messages
    assert any("not ready" in m for m in messages), messages

    # A restart request replaces every pod, one at a time, highest ordinal first.
    kubectl.run("annotate", "eventserver/roll", "eventfleet.io/restart=2026-11-23T18:40:00Z")
    wait_for(
        lambda: all(pods.pid(i) not in (None, pids[i]) for i in (0, 1)),
        timeout=120,
        what="every pod replaced",
    )
    kubectl.run("wait", "--for=condition=Ready", "eventserver/roll", "--timeout=90s", timeout=100)
    messages = [m for m in restarted_events(kubectl, "roll") if "restart requested" in m]
    order = [m.split("pod roll-")[1][0] for m in messages]
    assert order == ["2", "1", "0"], messages


def test_kubectl_eventfleet_plugin(kubectl, operator, kubelet, tmp_path):
    """The plugin as kubectl finds it: an executable kubectl-eventfleet on PATH."""
    shim = tmp_path / "bin" / "kubectl-eventfleet"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m eventfleet_operator.plugin "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}"}

    def plugin(*args, check=True):
        # kubectl refuses flags before a plugin's name: they go after it, to the plugin.
        cmd = [kubectl.binary, "eventfleet", "--kubeconfig", str(kubectl.kubeconfig)]
        result = subprocess.run(
            [*cmd, "-n", kubectl.namespace, *args],
            capture_output=True,
            text=True,
            timeout=150,
            env=env,
        )
        assert result.returncode == 0 or not check, result.stderr
        return result

    kubectl.apply(eventserver("plug", 2))
    pods = kubelet("plug")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/plug", "--timeout=90s", timeout=100)
    kubectl.run(
        "wait", "--for=condition=PeersSynced", "eventserver/plug", "--timeout=60s", timeout=70
    )

    table = plugin("status", "plug").stdout.splitlines()
    assert table[0] == f"EventServer {kubectl.namespace}/plug: Running"
    rows = {line.split()[0]: line.split() for line in table if line.startswith("plug-")}
    assert sorted(rows) == ["plug-0", "plug-1"]
    assert all(r[2:4] == ["yes", "synced"] for r in rows.values())
    data = json.loads(plugin("status", "plug", "-o", "json").stdout)
    assert (data["replicas"], data["readyReplicas"], data["phase"]) == (2, 2, "Running")
    assert data["updatedReplicas"] == 2 and data["updateRevision"] == data["currentRevision"]

    # Options after the command, as users type them with kubectl.
    after = subprocess.run(
        [kubectl.binary, "eventfleet", "status", "plug", "-n", kubectl.namespace,
         "--kubeconfig", str(kubectl.kubeconfig), "-o", "json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["namespace"] == kubectl.namespace

    register(pods, 1, 2)
    flushed = plugin("flush", "plug", "--timeout", "60")
    assert "flushed: all 2 replicas hold each other's events" in flushed.stdout
    assert flushed.stderr.startswith("flush requested (eventfleet.io/flush="), flushed.stderr
    assert kubectl.get("eventserver", "plug")["status"]["lastFlush"]["result"] == "Verified"

    plugin("pause", "plug")
    kubectl.run(
        "wait", "--for=condition=ReconcilePaused", "eventserver/plug", "--timeout=30s", timeout=40
    )
    assert "(paused)" in plugin("status", "plug").stdout.splitlines()[0]
    plugin("resume", "plug")
    kubectl.run(
        "wait",
        "--for=condition=ReconcilePaused=False",
        "eventserver/plug",
        "--timeout=30s",
        timeout=40,
    )

    pids = {i: pods.pid(i) for i in (0, 1)}
    plugin("restart", "plug")
    wait_for(
        lambda: all(pods.pid(i) not in (None, pids[i]) for i in (0, 1)),
        timeout=120,
        what="both pods replaced",
    )
    kubectl.run("wait", "--for=condition=Ready", "eventserver/plug", "--timeout=90s", timeout=100)

    plugin("hibernate", "plug")
    kubectl.run(
        "wait", "--for=condition=Hibernated", "eventserver/plug", "--timeout=60s", timeout=70
    )
    assert "no replica reports" in plugin("status", "plug").stdout
    plugin("wake", "plug")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/plug", "--timeout=90s", timeout=100)

    missing = plugin("status", "nope", check=False)
    assert missing.returncode == 1
    assert f'eventserver "nope" not found in namespace "{kubectl.namespace}"' in missing.stderr


def test_a_peer_token_rotation_reaches_every_replica_without_a_restart(kubectl, operator, kubelet):
    """The runbook's peer rotation on the generated Secret: each step reaches the real
    replicas through their reload (the fake kubelet rewrites the mounted file and sends
    SIGHUP, as a refreshed Secret volume plus the replica's poll would), the operator's
    TokensLoaded condition follows it, nothing restarts, and the operator's /flush works
    with the new token alone at the end."""
    kubectl.apply(eventserver("rot", 2))
    pods = kubelet("rot")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/rot", "--timeout=90s", timeout=100)
    kubectl.run(
        "wait", "--for=condition=TokensLoaded", "eventserver/rot", "--timeout=30s", timeout=40
    )
    pids = [pods.pid(0), pods.pid(1)]
    secret = kubectl.get("secret", "rot-peer-token")
    old = base64.b64decode(secret["data"]["token"]).decode().strip()
    client = base64.b64decode(kubectl.get("secret", "rot-token")["data"]["token"]).decode()
    assert old and old != client.strip()

    def step(text: str) -> None:
        before = kubectl.get("eventserver", "rot")["status"]["tokensDigest"]
        data = base64.b64encode(text.encode()).decode()
        kubectl.run("patch", "secret/rot-peer-token", "-p", json.dumps({"data": {"token": data}}))

        def loaded():
            es = kubectl.get("eventserver", "rot")
            c = condition(es, "TokensLoaded")
            return es["status"].get("tokensDigest") != before and c.get("status") == "True"

        wait_for(loaded, timeout=40, what=f"every replica to load {text!r}")

    step(f"{old}\nrotated-peer\n")
    step(f"rotated-peer\n{old}\n")
    step("rotated-peer\n")
    # The same three steps, taken by the operator (eventfleet.io/rotate-peer-token).
    kubectl.run("annotate", "eventserver/rot", "eventfleet.io/rotate-peer-token=r1")
    rotation = wait_for(
        lambda: (
            (kubectl.get("eventserver", "rot")["status"].get("peerTokenRotation") or {})
            if (kubectl.get("eventserver", "rot")["status"].get("peerTokenRotation") or {}).get(
                "step"
            )
            in ("Done", "Refused")
            else None
        ),
        timeout=90,
        what="the operator's peer token rotation",
    )
    assert rotation["step"] == "Done", rotation
    (auto,) = base64.b64decode(kubectl.get("secret", "rot-peer-token")["data"]["token"]).split()
    assert auto.decode() not in (old, "rotated-peer")
    assert [pods.pid(0), pods.pid(1)] == pids and not pods.restarts
    reasons = {
        e["reason"]
        for e in kubectl.json("get", "events", "--field-selector", "involvedObject.name=rot")[
            "items"
        ]
    }
    # (TokensReloading may not be seen here: this kubelet reloads within a resync.)
    assert "TokensChanged" in reasons, reasons
    # Only the new token is valid now: the operator's flush (POST /flush) still works.
    register(pods, 1, 2)
    kubectl.run("annotate", "eventserver/rot", "eventfleet.io/flush=after-rotation")
    flushed = wait_for(
        lambda: (
            (kubectl.get("eventserver", "rot")["status"].get("lastFlush") or {}).get("requested")
            == "after-rotation"
            and kubectl.get("eventserver", "rot")["status"]["lastFlush"]
        ),
        timeout=60,
        what="the flush after the rotation",
    )
    assert flushed["result"] == "Verified", flushed


def test_deleting_with_retain_keeps_the_claims_and_the_users_token_secrets(
    kubectl, operator, kubelet
):
    """``whenDeleted: Retain``: the EventServer's children go, its volume claims and the
    Secrets the user gave stay. (Generated Secrets going with the fleet:
    e2e/test_operator.py's cleanup test and the unit tests.)"""
    for name, token in (("keep-client", "client-secret\n"), ("keep-peers", "peer-secret\n")):
        kubectl.run("create", "secret", "generic", name, f"--from-literal=token={token}")
    kubectl.apply(
        eventserver(
            "keep",
            2,
            token={"secretRef": {"name": "keep-client"}},
            peerToken={"secretRef": {"name": "keep-peers"}},
            storage={"retentionPolicy": {"whenDeleted": "Retain"}},
        )
    )
    pods = kubelet("keep")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/keep", "--timeout=120s", timeout=130)
    register(pods, 0, 3)
    claims = {"data-keep-0", "data-keep-1"}
    assert {c["metadata"]["name"] for c in kubectl.json("get", "pvc")["items"]} == claims
    assert kubectl.get("secret", "keep-token") is None  # the user's Secrets are used
    assert kubectl.get("secret", "keep-peer-token") is None

    kubectl.run("delete", "eventserver", "keep", "--timeout=60s", timeout=70)
    wait_for(lambda: pods.pid(0) is None and pods.pid(1) is None, timeout=60, what="stopped")
    for kind, name in (
        ("statefulset", "keep"),
        ("service", "keep"),
        ("service", "keep-peers"),
        ("configmap", "keep-config"),
    ):
        assert kubectl.get(kind, name) is None, (kind, name)
    # Kept: every claim (the data) and the user's Secrets, untouched.
    time.sleep(2)  # a deletion of the claims would follow the pods at once
    assert {c["metadata"]["name"] for c in kubectl.json("get", "pvc")["items"]} == claims
    for name, token in (("keep-client", "client-secret\n"), ("keep-peers", "peer-secret\n")):
        secret = kubectl.get("secret", name)
        assert secret is not None, name
        assert base64.b64decode(secret["data"]["token"]).decode() == token


def test_growing_the_volumes_on_the_real_api_server(kubectl, operator, kubelet):
    """Volume growth with the real API server's resize admission (a claim may grow only
    when bound and its StorageClass allows expansion) and the real PV controller binding
    the volumes; the node agent plays the CSI driver (provisioner and resizer)."""
    from e2e.k8s.node import PROVISIONER

    cls = f"expandable-{kubectl.namespace}"
    kubectl.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": cls},
            "provisioner": PROVISIONER,
            "allowVolumeExpansion": True,
        }
    )
    kubectl.apply(eventserver("grow", 2, storage={"size": "1Gi", "storageClassName": cls}))
    pods = kubelet("grow")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/grow", "--timeout=120s", timeout=130)
    for i in (0, 1):
        wait_for(
            lambda i=i: (
                (kubectl.get("persistentvolumeclaim", f"data-grow-{i}") or {})
                .get("status", {})
                .get("phase")
                == "Bound"
            ),
            timeout=60,
            what=f"claim data-grow-{i} bound by the PV controller",
        )
    register(pods, 0, 2)
    pids = {i: pods.pid(i) for i in (0, 1)}
    sts_uid = kubectl.get("statefulset", "grow")["metadata"]["uid"]

    kubectl.run(
        "patch", "eventserver/grow", "--type=merge", "-p", '{"spec":{"storage":{"size":"3Gi"}}}'
    )

    def resized():
        c = condition(kubectl.get("eventserver", "grow"), "StorageResizing")
        return c.get("reason") == "Resized" and c

    wait_for(resized, timeout=120, what="StorageResizing=False/Resized")
    for i in (0, 1):
        claim = kubectl.get("persistentvolumeclaim", f"data-grow-{i}")
        assert claim["spec"]["resources"]["requests"]["storage"] == "3Gi"
        assert claim["status"]["capacity"]["storage"] == "3Gi"
        volume = kubectl.get("persistentvolume", claim["spec"]["volumeName"])
        assert volume["spec"]["capacity"]["storage"] == "3Gi"
    sts = kubectl.get("statefulset", "grow")
    assert sts["metadata"]["uid"] != sts_uid  # recreated (orphan) with the new template
    template = sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]
    assert template["storage"] == "3Gi"
    assert {i: pods.pid(i) for i in (0, 1)} == pids  # the pods kept running
    assert pods.restarts == {}
    kubectl.run("wait", "--for=condition=Ready", "eventserver/grow", "--timeout=60s", timeout=70)
    # The adopted pods still belong to the new StatefulSet (its controller adopted them).
    for i in (0, 1):
        owner = kubectl.get("pod", f"grow-{i}")["metadata"]["ownerReferences"][0]
        assert owner["uid"] == sts["metadata"]["uid"]

    # Shrinking: refused by the CRD's CEL rule on the real API server.
    shrink = kubectl.run(
        "patch",
        "eventserver/grow",
        "--type=merge",
        "-p",
        '{"spec":{"storage":{"size":"2Gi"}}}',
        check=False,
    )
    assert shrink.returncode != 0 and "never shrink" in (shrink.stderr + shrink.stdout), shrink
