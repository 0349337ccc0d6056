"""The apply rule: what the operator stops setting disappears from the children."""

from __future__ import annotations

import copy

import pytest
from eventfleet_operator import naming
from eventfleet_operator.reconcilers.children import up_to_date, with_applied_hash
from op_fakes import FULL_SPEC
from op_pass import Harness


def _pod(h):
    return h.sts()["spec"]["template"]


# (spec key removed, where it lived on the StatefulSet, a probe that is truthy while present)
REMOVALS = [
    ("podLabels", lambda t: t["metadata"]["labels"].get("team")),
    ("podAnnotations", lambda t: t["metadata"]["annotations"].get("example.com/owner")),
    ("priorityClassName", lambda t: t["spec"].get("priorityClassName")),
    ("resources", lambda t: t["spec"]["containers"][0].get("resources")),
    ("nodeSelector", lambda t: t["spec"].get("nodeSelector")),
    ("tolerations", lambda t: t["spec"].get("tolerations")),
    ("imagePullSecrets", lambda t: t["spec"].get("imagePullSecrets")),
    (
        "affinity",
        lambda t: (t["spec"].get("affinity") or {}).get("nodeAffinity"),
    ),
]


def _spec_without_optional_children():
    spec = copy.deepcopy(FULL_SPEC)
    spec.pop("token")  # generated Secret: no user Secret to provide
    spec["monitoring"]["serviceMonitor"]["enabled"] = False
    spec["aggregation"]["enabled"] = False
    return spec


@pytest.mark.parametrize(("field", "probe"), REMOVALS, ids=[r[0] for r in REMOVALS])
async def test_removing_an_optional_field_removes_it_from_the_statefulset(field, probe):
    spec = _spec_without_optional_children()
    h = Harness(spec)
    await h.run()
    assert probe(_pod(h)), f"{field} should be rendered first"
    del spec[field]
    h.set_spec(spec)
    await h.run()
    assert not probe(_pod(h)), f"{field} was removed from the spec but stays on the StatefulSet"
    # And the next pass has nothing to do (no write loop).
    writes = len(h.kube.writes)
    await h.run()
    assert [w for w in h.kube.writes[writes:] if w[0] == "apply"] == []


async def test_removing_a_resource_limit_keeps_the_request():
    spec = _spec_without_optional_children()
    h = Harness(spec)
    await h.run()
    spec["resources"] = {"requests": {"cpu": "250m"}}
    h.set_spec(spec)
    await h.run()
    assert _pod(h)["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "250m"}}


async def test_a_steady_fleet_causes_no_writes_and_a_hand_edit_is_repaired():
    h = Harness({"replicas": 3})
    await h.run()
    first = len(h.kube.writes)
    await h.run()
    assert [w for w in h.kube.writes[first:] if w[0] == "apply"] == []
    # A hand edit of an owned field keeps the applied hash but breaks the subset check.
    h.kube.objects[("StatefulSet", "ns", "demo")]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ] = 5
    await h.run()
    assert _pod(h)["spec"]["terminationGracePeriodSeconds"] == 60


def test_applied_hash_changes_with_any_removal_and_is_stable():
    base = {"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1", "b": "2"}}
    smaller = {"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1"}}
    a, b = with_applied_hash(base), with_applied_hash(smaller)
    key = naming.APPLIED_HASH_ANNOTATION
    assert a["metadata"]["annotations"][key] != b["metadata"]["annotations"][key]
    assert with_applied_hash(base) == a
    # The live object still carries `b`, so a subset check alone would say "nothing to do".
    assert not up_to_date(b, a)
    assert up_to_date(a, a)
    assert not up_to_date(a, None)
