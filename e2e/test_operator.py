"""The operator end to end on the real single-node cluster (e2e/cluster, docs/operator.md).

Installed as a user does: ``helm install`` of the chart into a namespace enforcing the
``restricted`` Pod Security Standard, the operator running as the chart's Deployment and
ServiceAccount (RBAC enforced by the API server, every request in its audit log). The
API server validates and defaults (OpenAPI, CEL), the real StatefulSet, garbage-collector,
disruption and PV controllers act, the kubelet runs the server image, and the replicas
find each other by DNS name and are reached by the operator through its own URL
template. Nothing the operator renders is rewritten.

One fleet (``demo``, three replicas, the Event BUS on) carries the scenarios on real
replicas in order — created and wired, scaled up, edited, repaired, deleted with its
claims; the API-level scenarios use small fleets of their own.
"""

from __future__ import annotations

import base64
import json

import kubernetes_validate
import pytest
import yaml

from e2e.cluster.clients import ClusterKubectl
from e2e.cluster.layout import ROOT
from e2e.cluster.replicas import Replicas
from e2e.operator_helpers import (
    condition,
    config_hash,
    event_reasons,
    eventserver,
    peers_of,
    strip_server_fields,
    wait_condition,
    wait_for,
)

pytest_plugins = ["e2e.cluster.fixtures"]
pytestmark = pytest.mark.timeout(900)

EXTERNAL_CRDS = ROOT / "e2e" / "k8s" / "external-crds"
METRICS_PORT = 8081
CHILDREN = (
    "statefulset/{n}",
    "service/{n}",
    "service/{n}-peers",
    "configmap/{n}-config",
    "secret/{n}-token",
    "secret/{n}-peer-token",
    "poddisruptionbudget/{n}",
    "networkpolicy/{n}",
)


@pytest.fixture(scope="module")
def operator_values() -> tuple[str, ...]:
    # A short resync and the operator's metrics on, as a user would set them.
    return ("--set", "operator.resyncSeconds=2", "--set", "metrics.enabled=true")


@pytest.fixture(scope="module")
def kubectl(ckubectl: ClusterKubectl) -> ClusterKubectl:
    return ckubectl


@pytest.fixture(scope="module")
def operator(operator_pod):
    return operator_pod


@pytest.fixture(scope="module")
def demo(kubectl, operator_release, tmp_path_factory) -> Replicas:
    return Replicas(kubectl, "demo", tmp_path_factory.mktemp("demo"))


def test_apply_gives_valid_wired_children_and_truthful_status(kubectl, operator, demo):
    kubectl.apply(eventserver("demo", 3))
    es = kubectl.get("eventserver", "demo")
    for child in CHILDREN:
        doc = wait_for(
            lambda c=child: kubectl.get(*c.format(n="demo").split("/")), timeout=60, what=child
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

    # The kubelet runs real replicas from that ConfigMap and Secret.
    wait_condition(kubectl, "demo", "Ready")
    wait_condition(kubectl, "demo", "PeersSynced")
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
    ns = kubectl.namespace
    gauge = f'eventfleet_operator_fleet_ready_replicas{{name="demo",namespace="{ns}"}} 3.0'
    scraped = wait_for(
        lambda: (m := operator.metrics(METRICS_PORT)) and gauge in m and m,
        timeout=60,
        what="the operator's metrics",
    )
    assert 'eventfleet_operator_reconciles_total{result="ok"}' in scraped
    reasons = event_reasons(kubectl, "demo")
    assert {"Created", "AllReplicasReady"} <= reasons, reasons


def test_scale_up_rewrites_peers_without_restarting_replicas(kubectl, operator, demo):
    wait_condition(kubectl, "demo", "Ready")
    before_hash = config_hash(kubectl, "demo")
    containers = [demo.container(i) for i in range(3)]

    kubectl.run("scale", "eventserver/demo", "--replicas=4")
    wait_for(
        lambda: len(peers_of(kubectl, "demo")) == 4, timeout=60, what="4 peers in the ConfigMap"
    )
    wait_for(
        lambda: kubectl.get("statefulset", "demo")["spec"]["replicas"] == 4,
        timeout=60,
        what="sts 4",
    )
    wait_condition(kubectl, "demo", "Ready")
    wait_condition(kubectl, "demo", "PeersSynced")
    # Peers are hot-reloaded: no new config hash, the first three replicas never restarted.
    assert config_hash(kubectl, "demo") == before_hash
    assert [demo.container(i) for i in range(3)] == containers
    status = wait_for(
        lambda: (s := demo.status(0)) and len(s["peers"]) == 3 and s,
        timeout=60,
        what="demo-0's status with 3 peers",
    )
    assert {p["name"] for p in status["peers"]} == {"demo-1", "demo-2", "demo-3"}


def test_spec_edit_updates_children_and_restarts_only_for_restart_settings(kubectl, operator, demo):
    wait_condition(kubectl, "demo", "Ready")
    generation = kubectl.get("eventserver", "demo")["metadata"]["generation"]
    hash_before, containers = config_hash(kubectl, "demo"), [demo.container(i) for i in range(4)]

    kubectl.run(
        "patch",
        "eventserver/demo",
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
        cm = yaml.safe_load(kubectl.get("configmap", "demo-config")["data"]["config.yaml"])
        return (
            cm["storage"]["synchronous"] == "NORMAL"
            and cm["storage"]["retention"]["max_events"] == 5000
        )

    wait_for(updated, timeout=60, what="the ConfigMap to carry the new storage settings")
    sts = kubectl.get("statefulset", "demo")
    assert sts["spec"]["template"]["metadata"]["labels"]["team"] == "events"
    assert config_hash(kubectl, "demo") != hash_before  # storage settings need a restart
    # The template changed: every pod is replaced (the operator's managed rollout).
    wait_for(
        lambda: all(demo.container(i) not in (None, containers[i]) for i in range(4)),
        timeout=600,
        what="rolled pods",
    )
    wait_condition(kubectl, "demo", "Ready")
    es = kubectl.get("eventserver", "demo")
    assert es["status"]["observedGeneration"] == es["metadata"]["generation"] == generation + 1
    for i in range(4):
        assert kubectl.get("pod", f"demo-{i}")["metadata"]["labels"]["team"] == "events"


def test_hand_deleted_and_hand_edited_children_are_repaired(kubectl, operator, demo):
    original_uid = kubectl.get("configmap", "demo-config")["metadata"]["uid"]
    token = kubectl.get("secret", "demo-token")["data"]["token"]

    kubectl.run("delete", "configmap", "demo-config")
    kubectl.run("delete", "service", "demo-peers")
    kubectl.run(
        "patch",
        "statefulset",
        "demo",
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
            (kubectl.get("configmap", "demo-config") or {}).get("metadata", {}).get("uid")
            not in (None, original_uid)
        ),
        timeout=60,
        what="the ConfigMap to be recreated",
    )
    wait_for(
        lambda: kubectl.get("service", "demo-peers"),
        timeout=60,
        what="the peer Service to be recreated",
    )

    def image_repaired():
        sts = kubectl.get("statefulset", "demo")
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        return container["image"].startswith("eventfleet/server:")

    wait_for(image_repaired, timeout=60, what="the StatefulSet template to be brought back")
    assert kubectl.get("secret", "demo-token")["data"]["token"] == token  # never regenerated
    # No pod ever ran the hand-set image (the StatefulSet's OnDelete strategy).
    for i in range(4):
        image = kubectl.get("pod", f"demo-{i}")["spec"]["containers"][0]["image"]
        assert "evil" not in image, image

    # A hand scale-up is real here: the StatefulSet controller creates pods and claims and
    # the kubelet runs them. The operator scales back only once it has verified that the
    # extra replicas hold no event that is not elsewhere (safe scale-down).
    kubectl.run("patch", "statefulset", "demo", "--type=merge", "-p", '{"spec":{"replicas":5}}')
    wait_for(
        lambda: kubectl.get("statefulset", "demo")["spec"]["replicas"] == 4,
        timeout=300,
        what="the StatefulSet to be scaled back to 4",
    )
    wait_for(lambda: demo.pod(4) is None, timeout=180, what="demo-4 to go")
    wait_condition(kubectl, "demo", "Ready")

    # Volume claim templates are immutable (only their size may grow, which the cluster's
    # default class allows: e2e/test_operator_day2_cluster.py): a new storage class is
    # refused, the rest still applies, Ready says why.
    kubectl.run(
        "patch",
        "eventserver/demo",
        "--type=merge",
        "-p",
        '{"spec":{"storage":{"storageClassName":"fast-ssd"},"logLevel":"DEBUG"}}',
    )

    def immutable_reported():
        ready = condition(kubectl.get("eventserver", "demo"), "Ready")
        return ready.get("reason") == "ImmutableFieldChanged" and ready

    ready = wait_for(immutable_reported, timeout=60, what="ImmutableFieldChanged")
    assert ready["message"].startswith("spec.storage")
    sts = kubectl.get("statefulset", "demo")
    (template,) = sts["spec"]["volumeClaimTemplates"]
    assert template["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert template["spec"].get("storageClassName") != "fast-ssd"
    config = yaml.safe_load(kubectl.get("configmap", "demo-config")["data"]["config.yaml"])
    assert config["log"]["level"] == "DEBUG"


def test_delete_cleans_up_children_and_claims(kubectl, operator, demo):
    kubectl.run(
        "patch", "eventserver/demo", "--type=merge", "-p",
        '{"spec":{"storage":{"retentionPolicy":{"whenDeleted":"Delete"}}}}',
    )  # fmt: skip
    wait_for(
        lambda: (
            kubectl.get("statefulset", "demo")["spec"]
            .get("persistentVolumeClaimRetentionPolicy", {})
            .get("whenDeleted")
            == "Delete"
        ),
        timeout=60,
        what="the retention policy on the StatefulSet",
    )
    listed = kubectl.json("get", "pvc")["items"]
    claims = [c for c in listed if c["metadata"]["name"].startswith("data-demo-")]
    assert len(claims) >= 4  # made by the StatefulSet controller
    kubectl.run("delete", "eventserver", "demo", "--timeout=120s", timeout=130)
    for child in CHILDREN:
        kind, name = child.format(n="demo").split("/")
        assert kubectl.get(kind, name) is None, child
    wait_for(lambda: all(demo.pod(i) is None for i in range(5)), timeout=180, what="replicas gone")
    # Claims go once no pod uses them (the pvc-protection finalizer is real here).
    wait_for(
        lambda: not [
            c for c in kubectl.json("get", "pvc")["items"]
            if c["metadata"]["name"].startswith("data-demo-")
        ],
        timeout=180,
        what="claims deleted",
    )  # fmt: skip


def test_bad_input_is_rejected_or_reported_and_the_operator_keeps_running(
    kubectl, operator, operator_release
):
    # The API server rejects what the CRD schema can catch: OpenAPI bounds ...
    bad = kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(eventserver("bad", 0)), check=False)
    assert bad.returncode != 0 and "spec.replicas" in bad.stderr, bad.stderr
    # ... and its CEL rules, evaluated by the server (x-kubernetes-validations).
    long_name = "n" * 53
    bad = kubectl.run(
        "apply", "-f", "-", stdin=yaml.safe_dump(eventserver(long_name, 1)), check=False
    )
    assert bad.returncode != 0 and "metadata.name must be at most 52" in bad.stderr, bad.stderr
    window = eventserver(
        "window", 1, aggregation={"enabled": True, "bucketSeconds": 600, "windowSeconds": 60}
    )
    bad = kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(window), check=False)
    assert bad.returncode != 0 and "windowSeconds must be at least bucketSeconds" in bad.stderr
    # The same rule holds only when aggregation is on (and its default {} is valid).
    window["spec"]["aggregation"]["enabled"] = False
    kubectl.apply(window)
    # The hat-compatible mode's networks: CEL's isCIDR/isIP, and only with the switch on.
    hat = eventserver("hat", 1, clients={"allowTokenless": True, "tokenlessNetworks": ["10.1/16"]})
    bad = kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(hat), check=False)
    assert bad.returncode != 0 and "must be an IP address or a CIDR" in bad.stderr, bad.stderr
    hat["spec"]["clients"] = {"tokenlessNetworks": ["10.1.0.0/16"]}
    bad = kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(hat), check=False)
    assert bad.returncode != 0 and "applies only with clients.allowTokenless" in bad.stderr
    hat["spec"]["clients"] = {"allowTokenless": True, "tokenlessNetworks": ["10.1.0.0/16", "::1"]}
    kubectl.apply(hat)
    # The Event BUS PLAIN listeners beside CURVE: only with curve on, networks only with
    # them, and networks that are networks.
    for curve, why in (
        ({"plainPort": 23040}, "PLAIN listeners beside CURVE need curve.enabled: true"),
        ({"enabled": True, "plainNetworks": ["10.1.0.0/16"]}, "applies only with curve.plainPort"),
        ({"enabled": True, "plainPort": 23040, "plainNetworks": ["10.1/16"]}, "CIDR network"),
    ):
        plain = eventserver("plain", 1, protocols={"bus": {"curve": curve}})
        bad = kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(plain), check=False)
        assert bad.returncode != 0 and why in bad.stderr, bad.stderr
    # Strict field validation: a misspelt field is an error, not silently dropped.
    typo = eventserver("typo", 1)
    typo["spec"]["replicaz"] = 2
    bad = kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(typo), check=False)
    assert bad.returncode != 0 and "replicaz" in bad.stderr, bad.stderr
    assert kubectl.get("eventserver", long_name) is None
    assert kubectl.get("eventserver", "typo") is None

    # What the schema cannot catch gives Ready=False with the field; nothing is created.
    kubectl.apply(eventserver("clash", 1, ports={"eventer": 24000, "http": 24000}))

    def reported():
        ready = condition(kubectl.get("eventserver", "clash"), "Ready")
        return ready.get("reason") == "InvalidSpec" and ready

    ready = wait_for(reported, timeout=60, what="InvalidSpec")
    assert ready["status"] == "False" and ready["message"].startswith("spec.ports.")
    assert kubectl.get("statefulset", "clash") is None
    assert kubectl.get("eventserver", "clash")["status"]["phase"] == "Failed"
    kubectl.apply(eventserver("cron", 1, aggregation={"enabled": True, "schedule": "every hour"}))
    wait_for(
        lambda: (
            "spec.aggregation.schedule"
            in condition(kubectl.get("eventserver", "cron"), "Ready").get("message", "")
        ),
        timeout=60,
        what="the bad schedule to be named",
    )

    # The operator still serves good fleets, and fixing the spec heals the bad one.
    kubectl.apply(eventserver("good", 1))
    wait_for(lambda: kubectl.get("statefulset", "good"), timeout=60, what="the good fleet")
    kubectl.run(
        "patch", "eventserver/clash", "--type=merge", "-p", '{"spec":{"ports":{"http":24080}}}'
    )
    wait_for(lambda: kubectl.get("statefulset", "clash"), timeout=60, what="the fixed fleet")
    assert operator.alive()
    for name in ("window", "hat", "clash", "cron", "good"):
        kubectl.run("delete", "eventserver", name, "--timeout=120s", timeout=130)


def _https_endpoint(monitor):
    endpoints = (monitor or {}).get("spec", {}).get("endpoints", [])
    return next((e for e in endpoints if e.get("scheme") == "https"), None)


def test_optional_crds_missing_gives_a_condition_then_children_appear(
    kubectl, operator, operator_release
):
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
        timeout=60,
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
            lambda: kubectl.get("servicemonitor", "extras"), timeout=60, what="ServiceMonitor"
        )
        app = wait_for(
            lambda: kubectl.get("scheduledsparkapplication", "extras-agg"),
            timeout=60,
            what="Spark app",
        )
        assert sm["metadata"]["labels"]["release"] == "p"
        assert app["spec"]["concurrencyPolicy"] == "Forbid"
        wait_for(
            lambda: conditions() == ("Applied", "Applied"), timeout=60, what="Applied conditions"
        )
        assert sm["spec"]["endpoints"][0]["scheme"] == "http"
        # TLS on the HTTP port: the ServiceMonitor follows (https, the fleet CA), and the
        # API server accepts the tlsConfig against the real upstream schema.
        kubectl.run(
            "patch", "eventserver/extras", "--type=merge", "-p", '{"spec":{"tls":{"enabled":true}}}'
        )
        endpoint = wait_for(
            lambda: _https_endpoint(kubectl.get("servicemonitor", "extras")),
            timeout=60,
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
            timeout=60,
            what="ServiceMonitor gone",
        )
    finally:
        kubectl.run("delete", "eventserver", "extras", "--timeout=120s", timeout=130, check=False)
        for crd in crds:
            kubectl.run("delete", "-f", str(crd), "--wait=false", check=False)


def test_garbage_collector_removes_children_of_an_eventserver_deleted_without_operator(
    kubectl, operator, tmp_path
):
    """Children carry ownerReferences: with the operator gone, the real GC still cleans up."""
    kubectl.apply(eventserver("orphan", 1))
    orphan = Replicas(kubectl, "orphan", tmp_path)
    wait_condition(kubectl, "orphan", "Ready")
    operator.stop()
    try:
        # The operator is uninstalled: nobody will run its cleanup, so its finalizer is
        # dropped by hand (what `kubectl patch` users do) and only ownerReferences remain.
        kubectl.run(
            "patch", "eventserver/orphan", "--type=json",
            "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
        )  # fmt: skip
        kubectl.run("delete", "eventserver", "orphan", "--timeout=60s", timeout=70)

        def children_left():
            return [
                c for c in CHILDREN if kubectl.get(*c.format(n="orphan").split("/")) is not None
            ]

        wait_for(lambda: children_left() == [], timeout=120, what="the GC to delete the children")
        # The pods went with their StatefulSet (the GC again), and the kubelet stopped them.
        wait_for(lambda: orphan.pod(0) is None, timeout=120, what="the replica to go")
    finally:
        operator.start()


def test_every_api_call_of_the_operator_is_allowed_by_its_rbac(real_cluster, kubectl, operator):
    """Last: the operator runs as the chart's ServiceAccount with the chart's RBAC; the API
    server enforces it, and its audit log shows no request of the module's operator
    forbidden (but the transient refusals of a seconds-old CRD, retried at once)."""
    (pod,) = [p for p in operator.pods() if not p["metadata"].get("deletionTimestamp")]
    user = f"system:serviceaccount:{kubectl.namespace}:{pod['spec']['serviceAccountName']}"
    calls = [e for e in real_cluster.audit() if e["user"]["username"] == user and "objectRef" in e]
    verbs = {(e["objectRef"]["resource"], e["verb"]) for e in calls}
    # It really did its work through this identity (not through an admin kubeconfig).
    assert {("statefulsets", "patch"), ("eventservers", "watch"), ("pods", "patch")} <= verbs, verbs
    forbidden = sorted(
        {
            (e["objectRef"].get("apiGroup", ""), e["objectRef"]["resource"], e["verb"])
            for e in calls
            if e["responseStatus"]["code"] == 403
            and "cannot find RESTMapping" not in e["responseStatus"].get("message", "")
        }
    )
    assert forbidden == [], f"RBAC lacks {forbidden}"
    # And the server does enforce it: the operator's identity may not, say, read nodes.
    denied = kubectl.run("auth", "can-i", "list", "nodes", f"--as={user}", check=False)
    assert denied.stdout.strip() == "no"
