"""Safe scale-down and operator restarts on the real single-node cluster (e2e/cluster).

The operator is the chart's Deployment (``helm install`` into a restricted namespace);
the replicas are the server image run by the kubelet, syncing over the real Syncer by
their DNS names; the operator decides from their ``/status`` and ``POST /flush`` (its own
URL template), never from canned JSON. A replica is "lost" by SIGSTOP on its process; the
operator "dies" by SIGKILL on its process and the Deployment scaled to 0.

What the real cluster adds to the node agent's version: a hung replica is restarted by
its liveness probe (~30 s), so the lost replica may come back by a restart rather than by
SIGCONT; either way it catches up over the Syncer before the scale-down completes.
"""

from __future__ import annotations

import signal

import pytest
import yaml

from e2e.cluster.clients import ClusterKubectl
from e2e.cluster.replicas import Replicas, register
from e2e.operator_helpers import condition, eventserver, wait_condition, wait_for

pytest_plugins = ["e2e.cluster.fixtures"]
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def operator_values() -> tuple[str, ...]:
    return ("--set", "operator.resyncSeconds=2")


@pytest.fixture(scope="module")
def kubectl(ckubectl: ClusterKubectl) -> ClusterKubectl:
    return ckubectl


def peer_names(kubectl, name: str) -> list[str]:
    config = yaml.safe_load(kubectl.get("configmap", f"{name}-config")["data"]["config.yaml"])
    return [p["name"] for p in config["peers"]]


def covers(held: dict | None, own: dict) -> bool:
    return held is not None and (held["session"], held["instance"]) >= (
        own["session"],
        own["instance"],
    )


def test_scale_down_is_held_until_the_leaving_replicas_events_are_elsewhere(
    kubectl, operator_pod, tmp_path
):
    kubectl.apply(eventserver("shrink", 3))
    pods = Replicas(kubectl, "shrink", tmp_path)
    wait_condition(kubectl, "shrink", "Ready")
    wait_condition(kubectl, "shrink", "PeersSynced")

    # A replica that stays is lost (its node hangs); meanwhile clients write to the
    # replica that is about to leave, so only it and shrink-0 hold those events.
    pods.pause(1)
    try:
        register(pods, 2, 5)
        own = pods.status(2)["last_ids"]["3"]
        kubectl.run("scale", "eventserver/shrink", "--replicas=2")

        def held():
            c = condition(kubectl.get("eventserver", "shrink"), "ScaleDownHeld")
            return c.get("status") == "True" and c

        c = wait_for(held, timeout=60, what="ScaleDownHeld=True")
        assert "shrink-1" in c["message"], c
        assert kubectl.get("statefulset", "shrink")["spec"]["replicas"] == 3
        assert peer_names(kubectl, "shrink") == ["shrink-0", "shrink-1", "shrink-2"]
        assert pods.container(2) is not None
        # The leaving replica gets no new clients meanwhile: out of the client Service.
        serving = "{.metadata.labels.eventfleet\\.io/serving}"
        wait_for(
            lambda: (
                kubectl.run("get", "pod", "shrink-2", "-o", f"jsonpath={serving}").stdout == "false"
            ),
            timeout=30,
            what="shrink-2 to be labelled serving=false",
        )
        assert kubectl.run("get", "pod", "shrink-0", "-o", f"jsonpath={serving}").stdout == "true"

        def served() -> set[str]:
            slices = kubectl.json(
                "get", "endpointslices", "-l", "kubernetes.io/service-name=shrink"
            )["items"]  # fmt: skip
            return {
                e.get("targetRef", {}).get("name") for s in slices for e in s.get("endpoints") or []
            }

        wait_for(
            lambda: "shrink-2" not in served() and "shrink-0" in served(),
            timeout=60,
            what="shrink-2 out of the client Service's endpoints",
        )
        ready = condition(kubectl.get("eventserver", "shrink"), "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ScaleDownHeld")
        events = kubectl.json("get", "events", "--field-selector", "involvedObject.name=shrink")
        assert any(
            e["reason"] == "ScaleDownHeld" and e["type"] == "Warning" for e in events["items"]
        )

        # The operator dies mid-way; the lost replica comes back and catches up meanwhile.
        operator_pod.stop(sig=signal.SIGKILL)
    finally:
        pods.resume(1)
    try:
        wait_for(
            lambda: covers((pods.status(1) or {}).get("last_ids", {}).get("3"), own),
            timeout=180,
            what="shrink-1 to receive shrink-2's events over the Syncer",
        )
    finally:
        operator_pod.start()

    wait_for(
        lambda: kubectl.get("statefulset", "shrink")["spec"]["replicas"] == 2,
        timeout=180,
        what="the StatefulSet to be lowered once it is safe",
    )
    wait_for(
        lambda: peer_names(kubectl, "shrink") == ["shrink-0", "shrink-1"],
        timeout=60,
        what="2 peers",
    )
    # The pass that lowered the StatefulSet says ScaleDownVerified; the next pass has
    # nothing to scale down and says NotScalingDown: reading the condition once races
    # with that, the Event it posted does not.
    c = condition(kubectl.get("eventserver", "shrink"), "ScaleDownHeld")
    assert c["status"] == "False" and c["reason"] in ("ScaleDownVerified", "NotScalingDown"), c
    events = kubectl.json("get", "events", "--field-selector", "involvedObject.name=shrink")
    assert any(
        e["reason"] == "ScaleDownVerified" and e["type"] == "Normal" for e in events["items"]
    )
    wait_for(lambda: pods.pod(2) is None, timeout=120, what="shrink-2 to go")
    for ordinal in (0, 1):
        assert covers(pods.status(ordinal)["last_ids"].get("3"), own), ordinal
    wait_condition(kubectl, "shrink", "Ready")
    kubectl.run("delete", "eventserver", "shrink", "--timeout=120s", timeout=130)


def test_changes_made_while_the_operator_is_down_converge_on_restart(kubectl, operator_pod):
    kubectl.apply(eventserver("before", 2))
    kubectl.apply(eventserver("doomed", 1))
    wait_for(
        lambda: kubectl.get("statefulset", "before") and kubectl.get("statefulset", "doomed"),
        timeout=60,
        what="children",
    )
    operator_pod.stop()
    try:
        kubectl.run(
            "patch", "eventserver/before", "--type=merge", "-p",
            '{"spec":{"replicas":4,"logLevel":"DEBUG"}}',
        )  # fmt: skip
        kubectl.apply(eventserver("after", 1))
        # The finalizer keeps it until an operator cleans up.
        kubectl.run("delete", "eventserver", "doomed", "--wait=false")
        assert kubectl.get("eventserver", "doomed")["metadata"].get("deletionTimestamp")
    finally:
        operator_pod.start()
    wait_for(
        lambda: kubectl.get("statefulset", "after"), timeout=60, what="the new fleet's children"
    )
    wait_for(
        lambda: kubectl.get("statefulset", "before")["spec"]["replicas"] == 4,
        timeout=60,
        what="scaled up",
    )
    config = yaml.safe_load(kubectl.get("configmap", "before-config")["data"]["config.yaml"])
    assert config["log"]["level"] == "DEBUG" and len(config["peers"]) == 4
    wait_for(
        lambda: kubectl.get("eventserver", "doomed") is None,
        timeout=60,
        what="the deletion to finish",
    )
    assert kubectl.get("statefulset", "doomed") is None
    assert kubectl.get("configmap", "doomed-config") is None
    for name in ("before", "after"):
        kubectl.run("delete", "eventserver", name, "--timeout=120s", timeout=130)
