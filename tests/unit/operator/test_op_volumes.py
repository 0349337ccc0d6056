"""Volume growth: quantities, the resize steps, and passes against the in-memory API."""

from __future__ import annotations

import decimal

import pytest
from eventfleet_operator import kube, volumes
from eventfleet_operator.volumes import Claim
from op_pass import Harness

GI = 2**30


@pytest.mark.parametrize(
    ("text", "value"),
    [("1Gi", GI), ("1024Mi", GI), ("10G", 10**10), ("1.5Gi", 3 * GI // 2), ("500m", "0.5")],
)
def test_quantities(text, value):
    assert volumes.quantity(text) == decimal.Decimal(value)


def test_a_bad_quantity_names_itself():
    with pytest.raises(ValueError, match="'ten gigs'"):
        volumes.quantity("ten gigs")


def claim(name, requested, capacity, pending=False):
    return Claim(name, volumes.quantity(requested), volumes.quantity(capacity), pending)


def test_resize_steps():
    want = volumes.quantity("2Gi")
    step = volumes.plan(want, [claim("a", "1Gi", "1Gi"), claim("b", "2Gi", "1Gi")], False)
    assert (step.patch, step.expanding, step.recreate) == (("a",), ("b",), False)
    step = volumes.plan(want, [claim("a", "2Gi", "2Gi"), claim("b", "2Gi", "1Gi", True)], False)
    assert (step.fs_pending, step.recreate) == (("b",), True)  # the controller part is done
    step = volumes.plan(want, [claim("a", "2Gi", "2Gi")], True)
    assert step.done and not step.recreate


def storage_class(h, expandable=True, default=True):
    h.kube.put(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": "standard",
                "namespace": "",
                "annotations": {volumes.DEFAULT_CLASS_ANNOTATION: str(default).lower()},
            },
            "provisioner": "example.com/csi",
            "allowVolumeExpansion": expandable,
        }
    )


def claims(h, n, size="1Gi"):
    labels = {
        "app.kubernetes.io/name": "eventfleet",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/component": "replica",
    }
    for i in range(n):
        h.kube.put(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"data-demo-{i}", "namespace": "ns", "labels": labels},
                "spec": {"resources": {"requests": {"storage": size}}},
                "status": {"capacity": {"storage": size}},
            }
        )


def expand(h):
    """The storage controller: capacity follows the request."""
    for (kind, _, _), obj in h.kube.objects.items():
        if kind == "PersistentVolumeClaim":
            obj["status"] = {
                "capacity": {"storage": obj["spec"]["resources"]["requests"]["storage"]}
            }


async def grown_to_5gi() -> Harness:
    """Two replicas with bound 1Gi claims, then spec.storage.size raised to 5Gi (one
    pass applied: the claims are patched, nothing expanded yet)."""
    h = Harness({"replicas": 2})
    storage_class(h)
    await h.run()
    claims(h, 2)
    h.set_spec({"replicas": 2, "storage": {"size": "5Gi"}})
    await h.run()
    return h


def template_size(h):
    return volumes.template_size(h.sts())


async def test_growing_the_volumes_end_to_end_of_the_passes():
    h = await grown_to_5gi()
    for i in range(2):
        assert h.kube.obj("PersistentVolumeClaim", f"data-demo-{i}")["spec"]["resources"] == {
            "requests": {"storage": "5Gi"}
        }
    resizing = h.condition("StorageResizing")
    assert (resizing["status"], resizing["reason"]) == ("True", "Resizing")
    assert template_size(h) == "1Gi"  # not yet: the claims are still expanding
    assert h.condition("Ready")["reason"] != "ImmutableFieldChanged"
    expand(h)
    await h.run()
    # Recreated with the pods orphaned, and at once with the new template.
    assert ("StatefulSet", "demo", "Orphan") in h.kube.propagations
    assert template_size(h) == "5Gi"
    await h.run()
    resizing = h.condition("StorageResizing")
    assert (resizing["status"], resizing["reason"]) == ("False", "Resized")
    await h.run()
    assert h.condition("StorageResizing")["reason"] == "Resized"  # kept until the next one


async def test_growth_refused_when_the_class_does_not_expand_and_shrinking_refused():
    h = Harness({"replicas": 1})
    storage_class(h, expandable=False)
    await h.run()
    claims(h, 1)
    h.set_spec({"replicas": 1, "storage": {"size": "5Gi"}})
    await h.run()
    assert h.kube.obj("PersistentVolumeClaim", "data-demo-0")["spec"]["resources"]["requests"] == {
        "storage": "1Gi"
    }
    assert h.condition("StorageResizing")["reason"] == "ExpansionNotAllowed"
    ready = h.condition("Ready")
    assert ready["reason"] == "ImmutableFieldChanged"
    assert "allowVolumeExpansion" in ready["message"]
    h.set_spec({"replicas": 1, "storage": {"size": "512Mi"}})
    await h.run()
    ready = h.condition("Ready")
    assert ready["reason"] == "ImmutableFieldChanged"
    assert ready["message"].startswith("spec.storage.size: volumes only grow")
    assert template_size(h) == "1Gi"


def test_the_crd_refuses_a_shrink_with_a_transition_rule():
    import pathlib

    import yaml

    crd = yaml.safe_load(
        (pathlib.Path(__file__).parents[3] / "crds" / "eventfleet.io_eventservers.yaml").read_text()
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    size = schema["properties"]["spec"]["properties"]["storage"]["properties"]["size"]
    (rule,) = size["x-kubernetes-validations"]
    assert "oldSelf" in rule["rule"] and "quantity(self)" in rule["rule"]


async def test_no_claims_yet_still_needs_an_expandable_class():
    h = Harness({"replicas": 1})
    await h.run()
    h.set_spec({"replicas": 1, "storage": {"size": "5Gi"}})
    await h.run()  # no StorageClass at all, no claims
    assert h.condition("StorageResizing")["reason"] == "ExpansionNotAllowed"
    assert template_size(h) == "1Gi"
    assert "(not found)" in h.condition("Ready")["message"]


async def test_an_orphan_delete_that_takes_time_is_waited_for_not_patched():
    """A real API server keeps an orphan-deleted StatefulSet (deletionTimestamp) until
    the garbage collector has released its pods, and refuses a new claim template on it:
    the operator neither writes it meanwhile nor loses the Resizing state."""
    h = await grown_to_5gi()
    expand(h)
    deleting: list[dict] = []
    real_delete = h.kube.delete

    async def slow_orphan_delete(resource, namespace, name, *, uid=None, propagation="Background"):
        if resource.kind == "StatefulSet" and propagation == "Orphan":
            obj = h.kube.obj("StatefulSet", name)
            obj["metadata"]["deletionTimestamp"] = "2026-11-26T12:00:00Z"
            deleting.append(obj)
            h.kube.propagations.append((resource.kind, name, propagation))
            return True
        return await real_delete(resource, namespace, name, uid=uid, propagation=propagation)

    h.kube.delete = slow_orphan_delete
    writes_before = len(h.kube.writes)
    await h.run()
    await h.run()  # a second pass while the garbage collector still works
    assert deleting and ("StatefulSet", "demo", "Orphan") in h.kube.propagations
    sts_writes = [w for w in h.kube.writes[writes_before:] if w[1] == "StatefulSet"]
    assert sts_writes == []  # the old object was never patched with the new template
    resizing = h.condition("StorageResizing")
    assert (resizing["status"], resizing["reason"]) == ("True", "Resizing")
    assert "waiting for the old StatefulSet" in resizing["message"]

    # The garbage collector is done: the next pass creates it with the new template.
    await real_delete(kube.STATEFULSETS, "ns", "demo")
    await h.run()
    assert template_size(h) == "5Gi"
    await h.run()
    resizing = h.condition("StorageResizing")
    assert (resizing["status"], resizing["reason"]) == ("False", "Resized")
