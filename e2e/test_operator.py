"""The operator end to end on a real control plane, with real replicas.

Real etcd, kube-apiserver and kube-controller-manager (``e2e.k8s.controlplane``, built
by scripts/tools/k8s-control-plane.sh): the server validates and defaults (OpenAPI, CEL),
enforces RBAC (the operator runs as its own ServiceAccount with operator/deploy/rbac.yaml)
and runs the StatefulSet, garbage-collector and disruption controllers. The validating
kubectl applies. The node agent (``e2e.k8s.node``) plays the kubelet: it runs the pods
the StatefulSet controller creates, as podman containers from the built images or as
host processes. See docs/operator.md for what is real and what is simulated.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from e2e.k8s.harness import ROOT, wait_for

pytest_plugins = ["e2e.k8s.cluster_fixtures"]

pytestmark = pytest.mark.timeout(300)

EXTERNAL_CRDS = ROOT / "e2e" / "k8s" / "external-crds"
CHILDREN = (
    "statefulset/{n}",
    "service/{n}",
    "service/{n}-peers",
    "configmap/{n}-config",
    "secret/{n}-token",
    "secret/{n}-peer-token",
    "poddisruptionbudget/{n}",
)


def eventserver(name: str, replicas: int = 3, **spec) -> dict:
    return {
        "apiVersion": "eventfleet.io/v1",
        "kind": "EventServer",
        "metadata": {"name": name},
        # No ZeroMQ Event BUS in these tests: each would need three ports per replica.
        "spec": {"replicas": replicas, "protocols": {"bus": {"enabled": False}}, **spec},
    }


def condition(es: dict, type_: str) -> dict:
    return next(
        (c for c in (es.get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )


def peers_of(kubectl, name: str) -> list[dict]:
    cm = kubectl.get("configmap", f"{name}-config")
    return yaml.safe_load(cm["data"]["config.yaml"])["peers"] if cm else []


def config_hash(kubectl, name: str) -> str:
    sts = kubectl.get("statefulset", name)
    return sts["spec"]["template"]["metadata"]["annotations"]["eventfleet.io/config-hash"]


def strip_server_fields(doc: dict) -> dict:
    """What a client would send back: no status, no server-set metadata."""
    doc = json.loads(json.dumps(doc))
    doc.pop("status", None)
    for key in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
        doc["metadata"].pop(key, None)
    return doc


def register(
    kubelet, ordinal: int, count: int, *, tls: tuple[str, str] | None = None, first: int = 0
) -> None:
    """Register events on one replica through the real Eventer client (the CLI);
    ``tls``: (CA file, the name its certificate carries) for a fleet with ``spec.tls``."""
    tls_args = ["--tls-ca", tls[0], "--tls-server-name", tls[1]] if tls else []
    for i in range(first, first + count):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "eventfleet_cli",
                "register",
                "--eventer",
                kubelet.eventer(ordinal),
                "--token-file",
                str(kubelet.token_file(ordinal)),
                *tls_args,
                "e2e/test",
                "--json",
                json.dumps({"i": i}),
            ],
            check=True,
            capture_output=True,
            timeout=20,
        )


def test_apply_gives_valid_wired_children_and_truthful_status(kubectl, operator, kubelet):
    kubectl.apply(eventserver("demo", 3))
    es = kubectl.get("eventserver", "demo")
    for child in CHILDREN:
        doc = wait_for(
            lambda c=child: kubectl.get(*c.format(n="demo").split("/")), timeout=20, what=child
        )
        # What the operator created is valid Kubernetes 1.33 (as stored, minus server fields).
        kubernetes_validate.validate(strip_server_fields(doc), "1.33.0", strict=True)
        (owner,) = doc["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "EventServer",
            "demo",
            es["metadata"]["uid"],
        )
    assert [(p["name"], p["server_id"]) for p in peers_of(kubectl, "demo")] == [
        ("demo-0", 1),
        ("demo-1", 2),
        ("demo-2", 3),
    ]
    assert peers_of(kubectl, "demo")[1]["host"] == f"demo-1.demo-peers.{kubectl.namespace}.svc"
    token = kubectl.get("secret", "demo-token")["data"]["token"]
    assert len(base64.b64decode(token)) >= 32

    kubelet("demo")  # real replicas start from that ConfigMap and Secret
    kubectl.run("wait", "--for=condition=Ready", "eventserver/demo", "--timeout=120s", timeout=130)
    kubectl.run(
        "wait", "--for=condition=PeersSynced", "eventserver/demo", "--timeout=120s", timeout=130
    )
    es = kubectl.get("eventserver", "demo")
    status = es["status"]
    assert status["observedGeneration"] == es["metadata"]["generation"]
    assert (status["replicas"], status["readyReplicas"], status["phase"]) == (3, 3, "Running")
    assert status["selector"] == (
        "app.kubernetes.io/name=eventfleet,app.kubernetes.io/instance=demo,app.kubernetes.io/component=replica"
    )
    assert [p["serverId"] for p in status["peers"]] == [1, 2, 3]
    assert all(
        p["reachable"] and p["ready"] and p["syncState"] == "synced" for p in status["peers"]
    )
    assert condition(es, "AggregationScheduled")["reason"] == "Disabled"
    # The scale subresource answers with an autoscaling/v1 Scale carrying the selector.
    scale = json.loads(
        kubectl.run(
            "get",
            "--raw",
            f"/apis/eventfleet.io/v1/namespaces/{kubectl.namespace}/eventservers/demo/scale",
        ).stdout
    )
    assert (scale["kind"], scale["spec"]["replicas"], scale["status"]["selector"]) == (
        "Scale",
        3,
        status["selector"],
    )
    scraped = operator.metrics()
    assert 'eventfleet_operator_reconciles_total{result="ok"}' in scraped
    ns = kubectl.namespace
    assert (
        f'eventfleet_operator_fleet_ready_replicas{{name="demo",namespace="{ns}"}} 3.0' in scraped
    )
    events = kubectl.json("get", "events", "--field-selector", "involvedObject.name=demo")["items"]
    reasons = {e["reason"] for e in events}
    assert {"Created", "AllReplicasReady"} <= reasons, reasons


def test_scale_up_rewrites_peers_without_restarting_replicas(kubectl, operator, kubelet):
    kubectl.apply(eventserver("grow", 2))
    pods = kubelet("grow")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/grow", "--timeout=120s", timeout=130)
    before_hash = config_hash(kubectl, "grow")
    pids = [pods.pid(0), pods.pid(1)]

    kubectl.run("scale", "eventserver/grow", "--replicas=4")
    wait_for(
        lambda: len(peers_of(kubectl, "grow")) == 4, timeout=20, what="4 peers in the ConfigMap"
    )
    wait_for(
        lambda: kubectl.get("statefulset", "grow")["spec"]["replicas"] == 4,
        timeout=20,
        what="sts 4",
    )
    kubectl.run("wait", "--for=condition=Ready", "eventserver/grow", "--timeout=120s", timeout=130)
    kubectl.run(
        "wait", "--for=condition=PeersSynced", "eventserver/grow", "--timeout=120s", timeout=130
    )
    # Peers are hot-reloaded: no new config hash, the first two replicas never restarted.
    assert config_hash(kubectl, "grow") == before_hash
    assert [pods.pid(0), pods.pid(1)] == pids
    status = pods.status(0)
    assert {p["name"] for p in status["peers"]} == {"grow-1", "grow-2", "grow-3"}


def test_spec_edit_updates_children_and_restarts_only_for_restart_settings(
    kubectl, operator, kubelet
):
    kubectl.apply(eventserver("edit", 2))
    pods = kubelet("edit")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/edit", "--timeout=120s", timeout=130)
    hash_before, pids = config_hash(kubectl, "edit"), [pods.pid(0), pods.pid(1)]

    kubectl.run(
        "patch",
        "eventserver/edit",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "spec": {
                    "podLabels": {"team": "events"},
                    "storage": {"synchronous": "NORMAL"},
                    "retention": {"maxEvents": 5000},
                }
            }
        ),
    )

    def updated():
        cm = yaml.safe_load(kubectl.get("configmap", "edit-config")["data"]["config.yaml"])
        return (
            cm["storage"]["synchronous"] == "NORMAL"
            and cm["storage"]["retention"]["max_events"] == 5000
        )

    wait_for(updated, timeout=20, what="the ConfigMap to carry the new storage settings")
    sts = kubectl.get("statefulset", "edit")
    assert sts["spec"]["template"]["metadata"]["labels"]["team"] == "events"
    assert config_hash(kubectl, "edit") != hash_before  # storage settings need a restart
    # The real StatefulSet controller rolls the pods because the template changed.
    wait_for(
        lambda: all(pods.pid(i) not in (None, pids[i]) for i in range(2)),
        timeout=60,
        what="rolled pods",
    )
    kubectl.run("wait", "--for=condition=Ready", "eventserver/edit", "--timeout=120s", timeout=130)
    es = kubectl.get("eventserver", "edit")
    assert es["status"]["observedGeneration"] == es["metadata"]["generation"] == 2


def test_hand_deleted_and_hand_edited_children_are_repaired(kubectl, operator, kubelet):
    kubectl.apply(eventserver("fix", 3))
    pods = kubelet("fix")
    wait_for(lambda: kubectl.get("configmap", "fix-config"), timeout=20, what="children")
    original_uid = kubectl.get("configmap", "fix-config")["metadata"]["uid"]
    token = kubectl.get("secret", "fix-token")["data"]["token"]

    kubectl.run("delete", "configmap", "fix-config")
    kubectl.run("delete", "service", "fix-peers")
    kubectl.run(
        "patch",
        "statefulset",
        "fix",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "spec": {
                    "template": {
                        "spec": {"containers": [{"name": "replica", "image": "evil/image:latest"}]}
                    }
                }
            }
        ),
    )
    wait_for(
        lambda: (
            (kubectl.get("configmap", "fix-config") or {}).get("metadata", {}).get("uid")
            not in (None, original_uid)
        ),
        timeout=20,
        what="the ConfigMap to be recreated",
    )
    wait_for(
        lambda: kubectl.get("service", "fix-peers"),
        timeout=20,
        what="the peer Service to be recreated",
    )

    def image_repaired():
        sts = kubectl.get("statefulset", "fix")
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        return container["image"].startswith("eventfleet/server:")

    wait_for(image_repaired, timeout=20, what="the StatefulSet template to be brought back")
    assert kubectl.get("secret", "fix-token")["data"]["token"] == token  # never regenerated

    # A hand scale-up is real here: the StatefulSet controller creates pods and claims and
    # the node runs them. The operator scales back only once it has verified that the
    # extra replicas hold no event that is not elsewhere (safe scale-down).
    kubectl.run("patch", "statefulset", "fix", "--type=merge", "-p", '{"spec":{"replicas":5}}')
    wait_for(
        lambda: kubectl.get("statefulset", "fix")["spec"]["replicas"] == 3,
        timeout=150,
        what="the StatefulSet to be scaled back to 3",
    )
    wait_for(lambda: pods.pid(4) is None, timeout=60, what="fix-4 to stop")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/fix", "--timeout=90s", timeout=100)

    # Volume claim templates are immutable: the rest still applies, Ready says why.
    kubectl.run(
        "patch",
        "eventserver/fix",
        "--type=merge",
        "-p",
        '{"spec":{"storage":{"size":"5Gi"},"logLevel":"DEBUG"}}',
    )

    def immutable_reported():
        ready = condition(kubectl.get("eventserver", "fix"), "Ready")
        return ready.get("reason") == "ImmutableFieldChanged" and ready

    ready = wait_for(immutable_reported, timeout=20, what="ImmutableFieldChanged")
    assert ready["message"].startswith("spec.storage")
    sts = kubectl.get("statefulset", "fix")
    assert (
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    )
    config = yaml.safe_load(kubectl.get("configmap", "fix-config")["data"]["config.yaml"])
    assert config["log"]["level"] == "DEBUG"


def test_bad_input_is_rejected_or_reported_and_the_operator_keeps_running(kubectl, operator):
    # The API server rejects what the CRD schema can catch: OpenAPI bounds ...
    bad = kubectl.run("apply", "-f", "-", input=yaml.safe_dump(eventserver("bad", 0)), check=False)
    assert bad.returncode != 0 and "spec.replicas" in bad.stderr, bad.stderr
    # ... and its CEL rules, evaluated by the server (x-kubernetes-validations).
    long_name = "n" * 53
    bad = kubectl.run(
        "apply", "-f", "-", input=yaml.safe_dump(eventserver(long_name, 1)), check=False
    )
    assert bad.returncode != 0 and "metadata.name must be at most 52" in bad.stderr, bad.stderr
    window = eventserver(
        "window", 1, aggregation={"enabled": True, "bucketSeconds": 600, "windowSeconds": 60}
    )
    bad = kubectl.run("apply", "-f", "-", input=yaml.safe_dump(window), check=False)
    assert bad.returncode != 0 and "windowSeconds must be at least bucketSeconds" in bad.stderr
    # The same rule holds only when aggregation is on (and its default {} is valid).
    window["spec"]["aggregation"]["enabled"] = False
    kubectl.apply(window)
    # The hat-compatible mode's networks: CEL's isCIDR/isIP, and only with the switch on.
    hat = eventserver("hat", 1, clients={"allowTokenless": True, "tokenlessNetworks": ["10.1/16"]})
    bad = kubectl.run("apply", "-f", "-", input=yaml.safe_dump(hat), check=False)
    assert bad.returncode != 0 and "must be an IP address or a CIDR" in bad.stderr, bad.stderr
    hat["spec"]["clients"] = {"tokenlessNetworks": ["10.1.0.0/16"]}
    bad = kubectl.run("apply", "-f", "-", input=yaml.safe_dump(hat), check=False)
    assert bad.returncode != 0 and "applies only with clients.allowTokenless" in bad.stderr
    hat["spec"]["clients"] = {"allowTokenless": True, "tokenlessNetworks": ["10.1.0.0/16", "::1"]}
    kubectl.apply(hat)
    # Strict field validation: a misspelt field is an error, not silently dropped.
    typo = eventserver("typo", 1)
    typo["spec"]["replicaz"] = 2
    bad = kubectl.run("apply", "-f", "-", input=yaml.safe_dump(typo), check=False)
    assert bad.returncode != 0 and "replicaz" in bad.stderr, bad.stderr
    assert kubectl.get("eventserver", long_name) is None
    assert kubectl.get("eventserver", "typo") is None

    # What the schema cannot catch gives Ready=False with the field; nothing is created.
    kubectl.apply(eventserver("clash", 1, ports={"eventer": 24000, "http": 24000}))

    def reported():
        ready = condition(kubectl.get("eventserver", "clash"), "Ready")
        return ready.get("reason") == "InvalidSpec" and ready

    ready = wait_for(reported, timeout=20, what="InvalidSpec")
    assert ready["status"] == "False" and ready["message"].startswith("spec.ports.")
    assert kubectl.get("statefulset", "clash") is None
    assert kubectl.get("eventserver", "clash")["status"]["phase"] == "Failed"
    kubectl.apply(eventserver("cron", 1, aggregation={"enabled": True, "schedule": "every hour"}))
    wait_for(
        lambda: (
            "spec.aggregation.schedule"
            in condition(kubectl.get("eventserver", "cron"), "Ready").get("message", "")
        ),
        timeout=20,
        what="the bad schedule to be named",
    )

    # The operator still serves good fleets, and fixing the spec heals the bad one.
    kubectl.apply(eventserver("good", 1))
    wait_for(lambda: kubectl.get("statefulset", "good"), timeout=20, what="the good fleet")
    kubectl.run(
        "patch", "eventserver/clash", "--type=merge", "-p", '{"spec":{"ports":{"http":24080}}}'
    )
    wait_for(lambda: kubectl.get("statefulset", "clash"), timeout=20, what="the fixed fleet")
    assert operator.alive()


def _https_endpoint(monitor):
    endpoints = (monitor or {}).get("spec", {}).get("endpoints", [])
    return next((e for e in endpoints if e.get("scheme") == "https"), None)


def test_optional_crds_missing_gives_a_condition_then_children_appear(kubectl, operator):
    kubectl.apply(
        eventserver(
            "extras",
            1,
            monitoring={"serviceMonitor": {"enabled": True, "labels": {"release": "p"}}},
            aggregation={"enabled": True},
        )
    )

    def conditions():
        es = kubectl.get("eventserver", "extras")
        return (
            condition(es, "MonitoringConfigured").get("reason"),
            condition(es, "AggregationScheduled").get("reason"),
        )

    wait_for(
        lambda: conditions() == ("PrometheusOperatorNotInstalled", "SparkOperatorNotInstalled"),
        timeout=20,
        what="NotInstalled conditions",
    )
    assert condition(kubectl.get("eventserver", "extras"), "Ready").get("reason") != "InvalidSpec"

    crds = [
        EXTERNAL_CRDS / "monitoring.coreos.com_servicemonitors.yaml",
        EXTERNAL_CRDS / "sparkoperator.k8s.io_scheduledsparkapplications.yaml",
    ]
    for crd in crds:  # `create`, not `apply`: the last-applied annotation would be too big
        kubectl.run("create", "-f", str(crd))
    try:
        # The API server validates them against those real upstream CRD schemas.
        sm = wait_for(
            lambda: kubectl.get("servicemonitor", "extras"), timeout=30, what="ServiceMonitor"
        )
        app = wait_for(
            lambda: kubectl.get("scheduledsparkapplication", "extras-agg"),
            timeout=30,
            what="Spark app",
        )
        assert sm["metadata"]["labels"]["release"] == "p"
        assert app["spec"]["concurrencyPolicy"] == "Forbid"
        wait_for(
            lambda: conditions() == ("Applied", "Applied"), timeout=20, what="Applied conditions"
        )
        assert sm["spec"]["endpoints"][0]["scheme"] == "http"
        # TLS on the HTTP port: the ServiceMonitor follows (https, the fleet CA), and the
        # API server accepts the tlsConfig against the real upstream schema.
        kubectl.run(
            "patch", "eventserver/extras", "--type=merge", "-p", '{"spec":{"tls":{"enabled":true}}}'
        )
        endpoint = wait_for(
            lambda: _https_endpoint(kubectl.get("servicemonitor", "extras")),
            timeout=30,
            what="ServiceMonitor scraping https",
        )
        assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "extras-tls", "key": "ca.crt"}}
        # Turning monitoring off removes the ServiceMonitor (level-based).
        kubectl.run(
            "patch",
            "eventserver/extras",
            "--type=merge",
            "-p",
            '{"spec":{"monitoring":{"serviceMonitor":{"enabled":false}}}}',
        )
        wait_for(
            lambda: kubectl.get("servicemonitor", "extras") is None,
            timeout=20,
            what="ServiceMonitor gone",
        )
    finally:
        for crd in crds:
            kubectl.run("delete", "-f", str(crd), "--wait=false", check=False)


def test_delete_cleans_up_children_and_claims(kubectl, operator, kubelet):
    kubectl.apply(eventserver("gone", 2, storage={"retentionPolicy": {"whenDeleted": "Delete"}}))
    pods = kubelet("gone")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/gone", "--timeout=120s", timeout=130)
    assert len(kubectl.json("get", "pvc")["items"]) == 2  # made by the StatefulSet controller
    kubectl.run("delete", "eventserver", "gone", "--timeout=30s", timeout=40)
    for child in CHILDREN:
        kind, name = child.format(n="gone").split("/")
        assert kubectl.get(kind, name) is None, child
    wait_for(
        lambda: pods.pid(0) is None and pods.pid(1) is None, timeout=60, what="replicas stopped"
    )
    # Claims go once no pod uses them (the pvc-protection finalizer is real here).
    wait_for(lambda: kubectl.json("get", "pvc")["items"] == [], timeout=60, what="claims deleted")


def test_garbage_collector_removes_children_of_an_eventserver_deleted_without_operator(
    kubectl, operator, kubelet
):
    """Children carry ownerReferences: with the operator gone, the real GC still cleans up."""
    kubectl.apply(eventserver("orphan", 1))
    pods = kubelet("orphan")
    kubectl.run(
        "wait", "--for=condition=Ready", "eventserver/orphan", "--timeout=120s", timeout=130
    )
    operator.stop()
    # The operator is uninstalled: nobody will run its cleanup, so its finalizer is dropped
    # by hand (what `kubectl patch` users do) and only ownerReferences remain.
    kubectl.run(
        "patch", "eventserver/orphan", "--type=json",
        "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )  # fmt: skip
    kubectl.run("delete", "eventserver", "orphan", "--timeout=30s", timeout=40)

    def children_left():
        return [c for c in CHILDREN if kubectl.get(*c.format(n="orphan").split("/")) is not None]

    wait_for(lambda: children_left() == [], timeout=60, what="the GC to delete the children")
    # The pods went with their StatefulSet (the GC again), and the node agent stopped them.
    wait_for(lambda: pods.pid(0) is None, timeout=60, what="the replica to stop")
    wait_for(lambda: kubectl.json("get", "pods")["items"] == [], timeout=60, what="pods deleted")


def test_every_api_call_of_the_operator_is_allowed_by_its_rbac(
    control_plane, kubectl, operator, kubelet
):
    """The operator runs as its ServiceAccount with operator/deploy/rbac.yaml: the API
    server enforces it, and its audit log shows no call of the operator was forbidden."""
    user = "system:serviceaccount:eventfleet-system:eventfleet-operator"
    ns = kubectl.namespace
    kubectl.apply(eventserver("rbac", 2, monitoring={"serviceMonitor": {"enabled": True}}))
    kubelet("rbac")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/rbac", "--timeout=120s", timeout=130)
    kubectl.run("scale", "eventserver/rbac", "--replicas=1")
    wait_for(
        lambda: kubectl.get("statefulset", "rbac")["spec"]["replicas"] == 1,
        timeout=60,
        what="scaled down",
    )
    kubectl.run("delete", "eventserver", "rbac", "--timeout=30s", timeout=40)

    calls = [
        e
        for e in control_plane.audit()
        if e["user"]["username"] == user
        and "objectRef" in e
        and e["objectRef"].get("namespace") in (ns, None)
    ]
    verbs = {(e["objectRef"]["resource"], e["verb"]) for e in calls}
    # It really did its work through this identity (not through an admin kubeconfig).
    assert {("statefulsets", "patch"), ("eventservers", "watch"), ("pods", "patch")} <= verbs, verbs
    forbidden = sorted(
        {
            (e["objectRef"].get("apiGroup", ""), e["objectRef"]["resource"], e["verb"])
            for e in calls
            if e["responseStatus"]["code"] == 403
        }
    )
    assert forbidden == [], f"RBAC lacks {forbidden}"
    # And the server does enforce it: the operator's identity may not, say, read nodes.
    denied = kubectl.run("auth", "can-i", "list", "nodes", f"--as={user}", check=False)
    assert denied.stdout.strip() == "no"
