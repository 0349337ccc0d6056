"""The API emulator itself, checked with the real kubectl and plain HTTP.

Each test pins one of the kmock 0.8 gaps the emulator fixes (see e2e/k8s/emulator.py),
so a regression shows up here rather than as a confusing operator or chart failure.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

# The emulator's fixtures, defined in this module only (not a global plugin): the
# control-plane modules register e2e.k8s.cluster_fixtures globally under the same names.
from e2e.k8s.fixtures import *  # noqa: F403
from e2e.k8s.harness import ROOT

pytestmark = pytest.mark.timeout(60)


def es(name: str, **spec) -> dict:
    return {
        "apiVersion": "eventfleet.io/v1",
        "kind": "EventServer",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_discovery_and_version(kubectl, api):
    assert api.get("/api/v1")["groupVersion"] == "v1"
    version = json.loads(kubectl.run("version", "-o", "json").stdout)["serverVersion"]
    assert (version["major"], version["minor"]) == ("1", "33")
    resources = kubectl.run("api-resources", "--api-group=eventfleet.io", "-o", "wide").stdout
    assert "eventservers" in resources and "evs" in resources
    group = api.get("/apis/eventfleet.io/v1")
    names = {r["name"]: r for r in group["resources"]}
    assert names["eventservers/scale"]["kind"] == "Scale"
    assert names["eventservers/scale"]["group"] == "autoscaling"


def test_crds_come_and_go(kubectl, api):
    crd = yaml.safe_load(
        (ROOT / "e2e/k8s/external-crds/monitoring.coreos.com_servicemonitors.yaml").read_text()
    )
    crd["metadata"]["name"] = "widgets.test.example"
    crd["spec"]["group"] = "test.example"
    crd["spec"]["names"] = {
        "kind": "Widget",
        "plural": "widgets",
        "singular": "widget",
        "listKind": "WidgetList",
    }
    kubectl.run("create", "--validate=false", "-f", "-", input=json.dumps(crd))
    kubectl.run("wait", "--for=condition=Established", "crd/widgets.test.example", "--timeout=10s")
    assert api.get("/apis/test.example/v1") is not None
    kubectl.run("delete", "crd", "widgets.test.example")
    assert api.get("/apis/test.example/v1") is None


def test_protobuf_bodies_from_kubectl(kubectl):
    kubectl.run("create", "secret", "generic", "s1", "--from-literal=user=admin")
    kubectl.run("create", "configmap", "c1", "--from-literal=a=b")
    kubectl.run("create", "serviceaccount", "sa1")
    secret = kubectl.get("secret", "s1")
    assert secret["data"] == {"user": "YWRtaW4="} and secret["type"] == "Opaque"
    assert kubectl.get("configmap", "c1")["data"] == {"a": "b"}
    assert kubectl.get("serviceaccount", "sa1")["metadata"]["uid"]


def test_metadata_generation_and_status_subresource(kubectl, api):
    kubectl.apply(es("g1", replicas=2))
    first = kubectl.get("eventserver", "g1")
    meta = first["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    assert first["spec"]["storage"]["size"] == "1Gi"  # CRD defaults applied by the "server"
    path = f"/apis/eventfleet.io/v1/namespaces/{kubectl.namespace}/eventservers/g1"
    api.merge_patch(path + "/status", {"status": {"phase": "Running"}, "spec": {"replicas": 9}})
    after_status = kubectl.get("eventserver", "g1")
    assert after_status["status"]["phase"] == "Running" and after_status["spec"]["replicas"] == 2
    assert after_status["metadata"]["generation"] == 1  # status writes do not bump it
    api.merge_patch(path, {"spec": {"replicas": 3}, "status": {"phase": "ignored"}})
    after_spec = kubectl.get("eventserver", "g1")
    assert after_spec["metadata"]["generation"] == 2 and after_spec["status"]["phase"] == "Running"
    assert int(after_spec["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])


def test_scale_subresource_with_kubectl(kubectl):
    kubectl.apply(es("s1", replicas=1))
    kubectl.run("scale", "eventserver/s1", "--replicas=5")  # exits 0: the answer is a Scale
    assert kubectl.get("eventserver", "s1")["spec"]["replicas"] == 5


def test_watch_resumes_from_a_resource_version(kubectl, api, emulator):
    kubectl.apply(es("w1", replicas=1))
    start = kubectl.get("eventserver", "w1")["metadata"]["resourceVersion"]
    kubectl.run("label", "eventserver/w1", "step=one")
    kubectl.run("label", "eventserver/w1", "step=two", "--overwrite")
    url = (
        f"{emulator.url}/apis/eventfleet.io/v1/namespaces/{kubectl.namespace}/eventservers"
        f"?watch=true&resourceVersion={start}&timeoutSeconds=2"
    )
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/json")
        events = [json.loads(line) for line in response.read().splitlines() if line]
    labels = [(e["type"], e["object"]["metadata"]["labels"]["step"]) for e in events]
    assert labels == [("MODIFIED", "one"), ("MODIFIED", "two")]


def test_kubectl_get_watch_sees_live_changes(kubectl):
    kubectl.apply(es("live", replicas=1))
    result: dict = {}

    def watch():
        result["out"] = kubectl.run(
            "get",
            "eventserver",
            "live",
            "-w",
            "--output-watch-events",
            "-o",
            "json",
            "--request-timeout=3s",
            check=False,
            timeout=10,
        ).stdout

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(1)
    kubectl.run("patch", "eventserver/live", "--type=merge", "-p", '{"spec":{"replicas":2}}')
    t.join(15)
    events = [json.loads(line) for line in result["out"].splitlines() if line.strip()]
    assert [e["object"]["spec"]["replicas"] for e in events] == [1, 2]
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]


def test_patch_kinds_and_conflicts(kubectl, api):
    kubectl.apply(es("p1", replicas=1))
    path = f"/apis/eventfleet.io/v1/namespaces/{kubectl.namespace}/eventservers/p1"
    rv = kubectl.get("eventserver", "p1")["metadata"]["resourceVersion"]
    api.request(
        "PATCH",
        path,
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
        ],
        "application/json-patch+json",
    )
    with pytest.raises(RuntimeError, match="422"):
        api.request(
            "PATCH",
            path,
            [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}],
            "application/json-patch+json",
        )
    stale = kubectl.get("eventserver", "p1")
    stale["metadata"]["resourceVersion"] = rv
    with pytest.raises(RuntimeError, match="409"):
        api.request("PUT", path, stale)
    # Server-side apply: a field the manager stops applying is removed.
    body = {
        "apiVersion": "eventfleet.io/v1",
        "kind": "EventServer",
        "metadata": {"name": "p1", "labels": {"a": "1"}},
    }
    api.request("PATCH", path + "?fieldManager=t&force=true", body, "application/apply-patch+yaml")
    body["metadata"]["labels"] = {"b": "2"}
    api.request("PATCH", path + "?fieldManager=t&force=true", body, "application/apply-patch+yaml")
    assert kubectl.get("eventserver", "p1")["metadata"]["labels"] == {"b": "2"}
    # Finalizers hold a deletion until they are removed.
    kubectl.run("delete", "eventserver", "p1", "--wait=false")
    assert kubectl.get("eventserver", "p1")["metadata"]["deletionTimestamp"]
    kubectl.run("patch", "eventserver/p1", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    assert kubectl.get("eventserver", "p1") is None


def test_selectors_and_dry_run(kubectl):
    kubectl.apply(es("l1", replicas=1))
    kubectl.run("label", "eventserver/l1", "tier=a")
    kubectl.apply(es("l2", replicas=1))

    def names(*selector):
        return [
            i["metadata"]["name"] for i in kubectl.json("get", "eventservers", *selector)["items"]
        ]

    assert names("-l", "tier=a") == ["l1"]
    assert names("-l", "!tier") == ["l2"]
    assert names("--field-selector", "metadata.name=l2") == ["l2"]
    kubectl.run(
        "apply", "--validate=false", "--dry-run=server", "-f", "-", input=yaml.safe_dump(es("dry"))
    )
    assert kubectl.get("eventserver", "dry") is None


def test_printer_columns(kubectl):
    kubectl.apply(es("t1", replicas=4))
    out = kubectl.run("get", "eventservers").stdout.splitlines()
    assert out[0].split() == ["NAME", "REPLICAS", "READY", "PHASE", "AGE"]
    assert out[1].split()[:2] == ["t1", "4"]


def test_unknown_paths_are_kubernetes_errors(emulator):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{emulator.url}/apis/nope.example/v1/things", timeout=5)
    assert err.value.code == 404
    assert json.loads(err.value.read())["kind"] == "Status"
