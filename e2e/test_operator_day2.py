"""Operator day 2, end to end on the API emulator: the real operator process, the real
kubectl.

What runs here: the API-level scenarios (also run on the real control plane by
``e2e/test_operator_day2_cluster.py``, which imports them) and the check that every API
call of this module is allowed by rbac.yaml. The pod-level scenarios (pause, hibernate,
rollouts, the plugin, token rotation, Retain, volume growth) run on the real control
plane only (``e2e/test_operator_day2_cluster.py``).
"""

from __future__ import annotations

import json
import time

import kubernetes_validate
import pytest

# The emulator's fixtures, defined in this module only (not a global plugin): the
# control-plane modules register e2e.k8s.cluster_fixtures globally under the same names.
from e2e.k8s.fixtures import *  # noqa: F403
from e2e.k8s.harness import operator_calls_beyond_rbac, wait_for
from e2e.test_operator import condition, eventserver, strip_server_fields

# Rollouts replace pods one at a time, each waiting for ready + in sync: minutes on a
# busy 2-core machine.
pytestmark = pytest.mark.timeout(420)


def template(kubectl, name: str) -> dict:
    return kubectl.get("statefulset", name)["spec"]["template"]


def test_fields_the_operator_stops_setting_are_removed(kubectl, operator):
    optional = {
        "podLabels": {"team": "events"},
        "podAnnotations": {"example.com/owner": "events"},
        "priorityClassName": "high",
        "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"disktype": "ssd"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    }
    kubectl.apply(eventserver("rm", 1, **optional))

    def rendered():
        t = template(kubectl, "rm")
        return (
            t["metadata"]["labels"].get("team") == "events"
            and t["spec"].get("priorityClassName") == "high"
            and t["spec"]["containers"][0].get("resources", {}).get("limits")
        )

    wait_for(rendered, timeout=20, what="the optional fields on the StatefulSet")
    kubectl.apply(eventserver("rm", 1))  # kubectl apply drops every field left out

    def left() -> list[str]:
        t = template(kubectl, "rm")
        spec, container = t["spec"], t["spec"]["containers"][0]
        return [
            name
            for name, present in (
                ("podLabels", "team" in t["metadata"]["labels"]),
                ("podAnnotations", "example.com/owner" in t["metadata"]["annotations"]),
                ("priorityClassName", "priorityClassName" in spec),
                ("nodeSelector", "nodeSelector" in spec),
                ("tolerations", "tolerations" in spec),
                # A real API server always shows the (struct) field, empty when unset.
                ("resources", bool(container.get("resources"))),
            )
            if present
        ]

    try:
        wait_for(lambda: not left(), timeout=20, what="the removed fields to leave the StatefulSet")
    except TimeoutError as e:
        out = kubectl.run("get", "statefulset", "rm", "-o", "json", "--show-managed-fields")
        managers = [
            (m.get("manager"), m.get("operation"))
            for m in json.loads(out.stdout)["metadata"].get("managedFields", [])
        ]
        raise AssertionError(f"{e}: still there: {left()}; field managers: {managers}") from None
    ready = condition(kubectl.get("eventserver", "rm"), "Ready")
    assert ready.get("reason") != "ApplyFailed", ready


def restarted_events(kubectl, name: str) -> list[str]:
    events = kubectl.json("get", "events", "--field-selector", f"involvedObject.name={name}")
    items = sorted(
        events["items"], key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""
    )
    return [e["message"] for e in items if e["reason"] == "ReplicaRestarted"]


def test_a_foreign_object_is_never_adopted_and_the_fleet_gets_a_network_policy(kubectl, operator):
    theirs = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "owned-config", "labels": {"app": "someone-else"}},
        "data": {"config.yaml": "theirs: true\n"},
    }
    kubectl.apply(theirs)
    before = kubectl.get("configmap", "owned-config")
    kubectl.apply(eventserver("owned", 1))

    def refused():
        ready = condition(kubectl.get("eventserver", "owned"), "Ready")
        return ready.get("reason") == "ChildNotOwned" and ready

    ready = wait_for(refused, timeout=30, what="Ready=False/ChildNotOwned")
    assert "ConfigMap owned-config" in ready["message"]
    assert kubectl.get("eventserver", "owned")["status"]["phase"] == "Failed"
    time.sleep(2)  # more passes: still nothing written
    after = kubectl.get("configmap", "owned-config")
    assert after["data"] == before["data"] and "ownerReferences" not in after["metadata"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert kubectl.get("statefulset", "owned") is None
    assert kubectl.get("secret", "owned-token") is None
    events = kubectl.json("get", "events", "--field-selector", "involvedObject.name=owned")
    assert any(
        e["reason"] == "ChildNotOwned" and e["type"] == "Warning" for e in events["items"]
    ), events

    # Once their object is gone the fleet is built, NetworkPolicy included.
    kubectl.run("delete", "configmap", "owned-config")
    wait_for(lambda: kubectl.get("statefulset", "owned"), timeout=30, what="the StatefulSet")
    policy = wait_for(
        lambda: kubectl.get("networkpolicy", "owned"), timeout=30, what="the NetworkPolicy"
    )
    kubernetes_validate.validate(strip_server_fields(policy), "1.33.0", strict=True)
    syncer = next(
        r for r in policy["spec"]["ingress"] if r["ports"] == [{"protocol": "TCP", "port": 23013}]
    )
    assert syncer["from"] == [
        {"podSelector": {"matchLabels": policy["spec"]["podSelector"]["matchLabels"]}}
    ]

    # Turning it off deletes it; deleting the EventServer leaves a foreign object alone.
    kubectl.run(
        "patch",
        "eventserver/owned",
        "--type=merge",
        "-p",
        '{"spec":{"networkPolicy":{"enabled":false}}}',
    )
    wait_for(lambda: kubectl.get("networkpolicy", "owned") is None, timeout=30, what="no policy")
    # Paused, so that the operator does not recreate its Service before theirs exists.
    kubectl.run("annotate", "eventserver/owned", "eventfleet.io/reconcile=paused")
    kubectl.run(
        "wait", "--for=condition=ReconcilePaused", "eventserver/owned", "--timeout=30s", timeout=40
    )
    kubectl.run("delete", "service", "owned-peers")
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "owned-peers"},
         "spec": {"ports": [{"port": 1}]}}
    )  # fmt: skip
    kubectl.run("delete", "eventserver", "owned", "--timeout=60s", timeout=70)
    assert kubectl.get("statefulset", "owned") is None
    assert kubectl.get("service", "owned-peers") is not None


def test_every_api_call_of_this_module_is_allowed_by_the_rbac(emulator):
    """Last in the module: replay every day-2 call (claim patches, storage classes,
    NetworkPolicies...) against operator/deploy/rbac.yaml. The pod-level scenarios (pod
    deletes among them) run on the real control plane, where the API server itself
    enforces rbac.yaml on the operator's ServiceAccount."""
    made, missing = operator_calls_beyond_rbac(emulator.audit())
    # The day-2 paths of this module really ran.
    assert {("networking.k8s.io", "networkpolicies", "delete")} <= made, sorted(made)
    assert missing == [], f"RBAC lacks {missing}"
