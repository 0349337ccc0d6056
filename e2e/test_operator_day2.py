"""Operator day 2, end to end: the real operator process, the real kubectl.

Runs on the API emulator (``e2e/k8s``, see docs/operator.md); every check goes through
kubectl and the API only, so the same tests run on a real control plane by swapping the
``kubectl``/``operator``/``kubelet`` fixtures.
"""

from __future__ import annotations

import pytest

from e2e.k8s.harness import wait_for
from e2e.test_operator import condition, eventserver

pytest_plugins = ["e2e.k8s.fixtures"]

pytestmark = pytest.mark.timeout(180)


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

    def removed():
        t = template(kubectl, "rm")
        spec, container = t["spec"], t["spec"]["containers"][0]
        return (
            "team" not in t["metadata"]["labels"]
            and "example.com/owner" not in t["metadata"]["annotations"]
            and "priorityClassName" not in spec
            and "nodeSelector" not in spec
            and "tolerations" not in spec
            and "resources" not in container
        )

    wait_for(removed, timeout=20, what="the removed fields to leave the StatefulSet")
    ready = condition(kubectl.get("eventserver", "rm"), "Ready")
    assert ready.get("reason") != "ApplyFailed", ready
