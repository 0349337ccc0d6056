"""Safe scale-down and operator restarts, end to end with real replicas.

On the real control plane (real StatefulSet controller, real API server); the replicas
are real processes or containers run by the node agent, syncing over the real Syncer;
the operator decides from their ``/status`` and ``POST /flush``, never from canned JSON.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import yaml

from e2e.k8s.harness import wait_for

pytest_plugins = ["e2e.k8s.cluster_fixtures"]
pytestmark = pytest.mark.timeout(300)


def eventserver(name: str, replicas: int, **spec) -> dict:
    return {
        "apiVersion": "eventfleet.io/v1",
        "kind": "EventServer",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "protocols": {"bus": {"enabled": False}}, **spec},
    }


def condition(es: dict | None, type_: str) -> dict:
    conditions = ((es or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def peer_names(kubectl, name: str) -> list[str]:
    config = yaml.safe_load(kubectl.get("configmap", f"{name}-config")["data"]["config.yaml"])
    return [p["name"] for p in config["peers"]]


def register(pods, ordinal: int, count: int) -> None:
    """Register events on one replica with the real Eventer client (the CLI)."""
    for i in range(count):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "eventfleet_cli",
                "register",
                "--eventer",
                pods.eventer(ordinal),
                "--token-file",
                str(pods.token_file(ordinal)),
                "e2e/scale",
                "--json",
                json.dumps({"i": i}),
            ],
            check=True,
            capture_output=True,
            timeout=20,
        )


def covers(held: dict | None, own: dict) -> bool:
    return held is not None and (held["session"], held["instance"]) >= (
        own["session"],
        own["instance"],
    )


def test_scale_down_is_held_until_the_leaving_replicas_events_are_elsewhere(
    kubectl, operator, kubelet
):
    kubectl.apply(eventserver("shrink", 3))
    pods = kubelet("shrink")
    kubectl.run(
        "wait", "--for=condition=Ready", "eventserver/shrink", "--timeout=120s", timeout=130
    )
    kubectl.run(
        "wait", "--for=condition=PeersSynced", "eventserver/shrink", "--timeout=120s", timeout=130
    )

    # A replica that stays is lost (its node went away); meanwhile clients write to the
    # replica that is about to leave, so only it and shrink-0 hold those events.
    pods.pause(1)
    register(pods, 2, 5)
    own = pods.status(2)["last_ids"]["3"]
    kubectl.run("scale", "eventserver/shrink", "--replicas=2")

    def held():
        c = condition(kubectl.get("eventserver", "shrink"), "ScaleDownHeld")
        return c.get("status") == "True" and c

    c = wait_for(held, timeout=30, what="ScaleDownHeld=True")
    assert "shrink-1" in c["message"], c
    assert kubectl.get("statefulset", "shrink")["spec"]["replicas"] == 3
    assert peer_names(kubectl, "shrink") == ["shrink-0", "shrink-1", "shrink-2"]  # still wired
    assert pods.pid(2) is not None
    # The leaving replica gets no new clients meanwhile: out of the client Service.
    serving = "{.metadata.labels.eventfleet\\.io/serving}"
    wait_for(
        lambda: (
            kubectl.run("get", "pod", "shrink-2", "-o", f"jsonpath={serving}").stdout == "false"
        ),
        timeout=10,
        what="shrink-2 to be labelled serving=false",
    )
    assert kubectl.run("get", "pod", "shrink-0", "-o", f"jsonpath={serving}").stdout == "true"
    ready = condition(kubectl.get("eventserver", "shrink"), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ScaleDownHeld")
    events = kubectl.json("get", "events", "--field-selector", "involvedObject.name=shrink")[
        "items"
    ]
    assert any(e["reason"] == "ScaleDownHeld" and e["type"] == "Warning" for e in events)

    # The operator dies mid-way; the lost replica comes back and catches up meanwhile.
    operator.stop(sig=signal.SIGKILL)
    pods.resume(1)
    wait_for(
        lambda: covers((pods.status(1) or {}).get("last_ids", {}).get("3"), own),
        timeout=60,
        what="shrink-1 to receive shrink-2's events over the Syncer",
    )
    operator.start()

    wait_for(
        lambda: kubectl.get("statefulset", "shrink")["spec"]["replicas"] == 2,
        timeout=60,
        what="the StatefulSet to be lowered once it is safe",
    )
    wait_for(
        lambda: peer_names(kubectl, "shrink") == ["shrink-0", "shrink-1"],
        timeout=20,
        what="2 peers",
    )
    # The pass that lowered the StatefulSet says ScaleDownVerified; the next pass (resync
    # is 1 s here) has nothing to scale down and says NotScalingDown: reading the
    # condition once races with that, the Event it posted does not.
    c = condition(kubectl.get("eventserver", "shrink"), "ScaleDownHeld")
    assert c["status"] == "False" and c["reason"] in ("ScaleDownVerified", "NotScalingDown"), c
    events = kubectl.json("get", "events", "--field-selector", "involvedObject.name=shrink")[
        "items"
    ]
    assert any(e["reason"] == "ScaleDownVerified" and e["type"] == "Normal" for e in events)
    wait_for(lambda: pods.pid(2) is None, timeout=30, what="shrink-2 to stop")
    for ordinal in (0, 1):
        assert covers(pods.status(ordinal)["last_ids"].get("3"), own), ordinal
    kubectl.run(
        "wait", "--for=condition=Ready", "eventserver/shrink", "--timeout=120s", timeout=130
    )


def test_changes_made_while_the_operator_is_down_converge_on_restart(kubectl, operator):
    kubectl.apply(eventserver("before", 2))
    kubectl.apply(eventserver("doomed", 1))
    wait_for(
        lambda: kubectl.get("statefulset", "before") and kubectl.get("statefulset", "doomed"),
        timeout=20,
        what="children",
    )
    operator.stop()

    kubectl.run(
        "patch",
        "eventserver/before",
        "--type=merge",
        "-p",
        '{"spec":{"replicas":4,"logLevel":"DEBUG"}}',
    )
    kubectl.apply(eventserver("after", 1))
    # The finalizer keeps it until an operator cleans up.
    kubectl.run("delete", "eventserver", "doomed", "--wait=false")
    assert kubectl.get("eventserver", "doomed")["metadata"].get("deletionTimestamp")

    operator.start()
    wait_for(
        lambda: kubectl.get("statefulset", "after"), timeout=20, what="the new fleet's children"
    )
    wait_for(
        lambda: kubectl.get("statefulset", "before")["spec"]["replicas"] == 4,
        timeout=20,
        what="scaled up",
    )
    config = yaml.safe_load(kubectl.get("configmap", "before-config")["data"]["config.yaml"])
    assert config["log"]["level"] == "DEBUG" and len(config["peers"]) == 4
    wait_for(
        lambda: kubectl.get("eventserver", "doomed") is None,
        timeout=20,
        what="the deletion to finish",
    )
    assert kubectl.get("statefulset", "doomed") is None
    assert kubectl.get("configmap", "doomed-config") is None
