"""The Helm chart as a user installs it, with real binaries.

On the real single-node cluster (e2e/cluster, the ``real_cluster`` fixture): real `helm`
installs, upgrades, uninstalls and reinstalls the chart, the chart's operator pod runs
(kubelet, the project's operator image, a namespace enforcing the ``restricted`` Pod
Security Standard), and a newer chart's CRD schema is applied and enforced. Helm
validates against the server's OpenAPI and uses server-side apply with strict field
validation; the API server enforces the CRD schema and its CEL rules. The chart installs
cluster-scoped objects (the CRD, a ClusterRole and its binding), and the session has one
cluster, where a fresh control plane per test would cost minutes: each test installs its
own release and, when it ends, deletes its fleets, uninstalls the release, and deletes
its namespaces, the kept CRDs and the monitoring CRDs it created, as a user who
uninstalls for good does, waiting for each, so the next test or module installs on a
clean cluster. Audit events are told apart by the time the test's release was installed.

The chart's operator pod runs with the token the kubelet mounts for the chart's
ServiceAccount, so the chart's RBAC is what the API server enforces on it; the API
server's audit log (service accounts' requests) shows every request it refused.

prometheus-operator's PrometheusRule CRD is a schema-less stand-in (see below).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml

from e2e.cluster.fixtures import _delete_kept_crds
from tests.unit.chart.chartlib import CHART, EVERYTHING_ON, REPO, helm, tool

RELEASE = "ef"
NAMESPACE = "eventfleet-system"
EXTERNAL_SERVICEMONITOR_CRD = "prometheus-operator/monitoring.coreos.com_servicemonitors.yaml"
WAIT = 60  # seconds; every wait below is bounded by this
POD_WAIT = 180  # seconds; `helm --wait` for the chart's pod on the real cluster

pytest_plugins = ["e2e.cluster.fixtures"]
pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def home(tmp_path):
    return tmp_path / "helm-home"


# Namespaces the tests create (the everything-on values name fleet-a, fleet-b and
# monitoring; "other" holds a fleet no operator watches) and the cluster-scoped kinds.
CLUSTER_NAMESPACES = (NAMESPACE, "fleet-a", "fleet-b", "monitoring", "other")
MONITORING_CRDS = (
    "servicemonitors.monitoring.coreos.com",
    "prometheusrules.monitoring.coreos.com",
)


@pytest.fixture
def on_cluster(real_cluster, home):
    """The real cluster's admin kubeconfig, left as the test found it.

    The release namespace enforces the ``restricted`` Pod Security Standard, as the other
    modules' do. Afterwards, as a user who uninstalls for good (docs/operator.md): the
    EventServers go first (their finalizer needs the operator), then the release, the
    namespaces and the CRDs the chart kept or the test created. Every deletion is waited
    for, so that the next test can create the same names.
    """
    kubeconfig = real_cluster.kubeconfig
    _delete_kept_crds(real_cluster)
    create_namespaces(kubeconfig, NAMESPACE)
    kubectl(
        kubeconfig, "label", "namespace", NAMESPACE,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    try:
        yield kubeconfig
    finally:
        if get(kubeconfig, "crd", "eventservers.eventfleet.io") is not None:
            real_cluster.kubectl(
                "delete", "eventservers", "--all", "-A", "--timeout=120s",
                check=False, timeout=130,
            )  # fmt: skip
        helm(home, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--kubeconfig",
             str(kubeconfig), timeout=POD_WAIT, check=False)  # fmt: skip
        real_cluster.kubectl(
            "delete", "namespace", *CLUSTER_NAMESPACES, "--ignore-not-found",
            "--timeout=180s", check=False, timeout=190,
        )  # fmt: skip
        _delete_kept_crds(real_cluster)  # every CRD of the chart (EventServerBackup too)
        real_cluster.kubectl(
            "delete", "crd", *MONITORING_CRDS, "--ignore-not-found", "--timeout=120s",
            check=False, timeout=130,
        )  # fmt: skip


def kubectl(kubeconfig: pathlib.Path, *args: str, check: bool = True, stdin: str | None = None):
    proc = subprocess.run(
        [tool("kubectl"), "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
    return proc


def get(kubeconfig, kind: str, name: str | None = None, namespace: str | None = None):
    """The object (or list items) as JSON, or None if absent."""
    args = ["get", kind, *([name] if name else []), "-o", "json"]
    args += ["-n", namespace] if namespace else ["-A"] if not name else []
    proc = kubectl(kubeconfig, *args, check=False)
    if proc.returncode != 0:
        assert "NotFound" in proc.stderr or "not found" in proc.stderr, proc.stderr
        return None
    doc = json.loads(proc.stdout)
    return doc if name else doc["items"]


def operator_pod(kubeconfig) -> dict:
    """The chart's one operator pod in the release namespace (fleets may run there too)."""
    proc = kubectl(kubeconfig, "get", "pods", "-n", NAMESPACE, "-o", "json",
                   "-l", "app.kubernetes.io/name=eventfleet-operator")  # fmt: skip
    (pod,) = json.loads(proc.stdout)["items"]
    return pod


def chart_helm(home, kubeconfig, *args: str, timeout: float = WAIT):
    return helm(home, *args, "--kubeconfig", str(kubeconfig), timeout=timeout)


def install(home, kubeconfig, *extra: str, command: str = "install", timeout: float = WAIT):
    return chart_helm(
        home,
        kubeconfig,
        command,
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        *extra,
        timeout=timeout,
    )


def create_namespaces(kubeconfig, *names: str) -> None:
    for name in names:
        kubectl(kubeconfig, "create", "namespace", name)


def apply_example(kubeconfig, namespace: str) -> None:
    kubectl(
        kubeconfig,
        "apply",
        "-n",
        namespace,
        "-f",
        str(CHART / "examples" / "eventserver.yaml"),
    )


def names(items) -> set[str]:
    return {i["metadata"]["name"] for i in items or []}


def _servicemonitor_crd() -> pathlib.Path:
    path = REPO.parent / "shared" / "external-crds" / EXTERNAL_SERVICEMONITOR_CRD
    return path if path.exists() else REPO / "e2e" / "k8s" / "external-crds" / path.name


# A stand-in for prometheus-operator's PrometheusRule CRD, which is not among the
# upstream CRDs the project keeps: it only makes the kind exist (no schema), so the
# chart's PrometheusRule can be installed. Its content is checked by
# tests/unit/chart/test_chart_alerts.py with promtool instead.
PROMETHEUSRULE_STANDIN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "prometheusrules.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "kind": "PrometheusRule",
            "listKind": "PrometheusRuleList",
            "plural": "prometheusrules",
            "singular": "prometheusrule",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def install_monitoring_crds(kubeconfig) -> None:
    """The prometheus-operator kinds the everything-on values create."""
    kubectl(kubeconfig, "create", "-f", str(_servicemonitor_crd()))
    kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(PROMETHEUSRULE_STANDIN_CRD))
    for crd in ("servicemonitors", "prometheusrules"):
        kubectl(
            kubeconfig, "wait", "--for=condition=Established", f"crd/{crd}.monitoring.coreos.com"
        )


def test_install_upgrade_uninstall_reinstall(on_cluster, home):
    kubeconfig = on_cluster
    create_namespaces(kubeconfig, "fleet-a", "fleet-b", "monitoring")

    # Install with the defaults; the chart's operator pod runs (restricted namespace).
    out = install(home, kubeconfig, "--wait", "--timeout", f"{POD_WAIT}s", timeout=POD_WAIT + 10)
    assert "STATUS: deployed" in out.stdout and "kind: EventServer" in out.stdout  # NOTES
    full = f"{RELEASE}-eventfleet-operator"
    deploy = get(kubeconfig, "deployment", full, NAMESPACE)
    pod = operator_pod(kubeconfig)
    assert pod["spec"]["serviceAccountName"] == full
    assert pod["status"]["phase"] == "Running"
    assert all(s["ready"] for s in pod["status"]["containerStatuses"])
    # Namespaced by default: the release namespace, its rights bound only there.
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={NAMESPACE}" in args and "--all-namespaces" not in args
    assert get(kubeconfig, "rolebinding", full, NAMESPACE)["roleRef"]["name"] == full
    assert get(kubeconfig, "serviceaccount", full, NAMESPACE)
    crd = get(kubeconfig, "crd", "eventservers.eventfleet.io")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert f"{full}-cluster" in names(get(kubeconfig, "clusterrolebinding"))
    assert full not in names(get(kubeconfig, "clusterrolebinding"))

    # Upgrade to everything on. The ServiceMonitor kind must exist first, as on a real
    # cluster without prometheus-operator the upgrade would rightly fail.
    install_monitoring_crds(kubeconfig)
    chart_helm(
        home,
        kubeconfig,
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--values",
        str(EVERYTHING_ON),
    )
    args = get(kubeconfig, "deployment", full, NAMESPACE)["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    assert "--namespace=fleet-a" in args and "--all-namespaces" not in args
    for ns in ("fleet-a", "fleet-b"):
        assert get(kubeconfig, "rolebinding", full, ns)["roleRef"]["name"] == full
    # The cluster-wide binding of the namespaced rules is gone; the cluster-scoped stays.
    assert names(get(kubeconfig, "clusterrolebinding")) >= {f"{full}-cluster"}
    assert full not in names(get(kubeconfig, "clusterrolebinding"))
    assert get(kubeconfig, "servicemonitor", full, NAMESPACE)
    assert get(kubeconfig, "prometheusrule", f"{full}-alerts", NAMESPACE)
    assert get(kubeconfig, "poddisruptionbudget", full, NAMESPACE)
    assert get(kubeconfig, "configmap", f"{full}-dashboard", "monitoring")
    history = chart_helm(home, kubeconfig, "history", RELEASE, "-n", NAMESPACE, "-o", "json")
    assert [r["status"] for r in json.loads(history.stdout)] == ["superseded", "deployed"]

    # A fleet exists when the chart goes away: uninstall must leave the CRD, and so it.
    apply_example(kubeconfig, "fleet-a")
    chart_helm(home, kubeconfig, "uninstall", RELEASE, "-n", NAMESPACE)
    assert get(kubeconfig, "deployment", full, NAMESPACE) is None
    assert get(kubeconfig, "rolebinding", full, "fleet-a") is None
    assert not names(get(kubeconfig, "clusterrole")) & {full, f"{full}-cluster"}
    assert get(kubeconfig, "crd", "eventservers.eventfleet.io") is not None
    assert get(kubeconfig, "eventserver", "demo", "fleet-a") is not None

    # Installing again adopts the kept CRD (same release name and namespace).
    install(home, kubeconfig)
    assert get(kubeconfig, "deployment", full, NAMESPACE)


def wait_for(what: str, check, real_cluster):
    """Poll ``check`` until truthy (bounded by WAIT); the failure shows the operator's log."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    log = real_cluster.kubectl(
        "logs", "-n", NAMESPACE, f"deployment/{RELEASE}-eventfleet-operator", "--tail=100",
        check=False,
    )  # fmt: skip
    pytest.fail(f"timed out waiting for {what}; the operator's log:\n{log.stdout}{log.stderr}")


def _fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode() if r.status == 200 else None
    except OSError:
        return None


# The everything-on values name an image in an example registry; on the cluster the pod
# runs the project's operator image, which the cluster imported (the chart's default).
LOCAL_IMAGE = ("--set", "image.repository=eventfleet/operator", "--set", "image.digest=",
               "--set", "image.pullPolicy=IfNotPresent")  # fmt: skip

VARIANTS = {
    # id: (helm arguments, namespaces the operator reconciles; None: every namespace)
    "defaults": ((), {NAMESPACE}),
    "all-namespaces": (("--set", "operator.allNamespaces=true"), None),
    "watch-namespaces": (("--set", "operator.watchNamespaces[0]=fleet-a"), {"fleet-a"}),
    "everything-on": (("--values", str(EVERYTHING_ON), *LOCAL_IMAGE), {"fleet-a"}),
}


def _audit_time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_operator_runs_with_the_chart_arguments_within_the_chart_rbac(
    on_cluster, real_cluster, home, variant
):
    """The chart's operator pod, run by the kubelet with the token of the chart's
    ServiceAccount, reconciles the watched namespaces, leaves the others alone and is
    never denied a request by the chart's RBAC (the API server's audit log)."""
    kubeconfig = on_cluster
    helm_args, watched = VARIANTS[variant]
    create_namespaces(kubeconfig, "fleet-a", "fleet-b", "monitoring", "other")
    if variant == "everything-on":
        install_monitoring_crds(kubeconfig)
    started = datetime.datetime.now(datetime.UTC)
    install(home, kubeconfig, *helm_args, "--wait", "--timeout", f"{POD_WAIT}s",
            timeout=POD_WAIT + 10)  # fmt: skip
    full = f"{RELEASE}-eventfleet-operator"
    deployment = get(kubeconfig, "deployment", full, NAMESPACE)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    pod = operator_pod(kubeconfig)
    assert pod["spec"]["serviceAccountName"] == account
    assert pod["status"]["phase"] == "Running"
    # A fleet outside the watched namespaces must be left alone.
    if watched:
        apply_example(kubeconfig, "other")
    fleet_ns = min(watched) if watched else "fleet-a"
    apply_example(kubeconfig, fleet_ns)
    wait_for(
        f"the StatefulSet of {fleet_ns}/demo",
        lambda: get(kubeconfig, "statefulset", "demo", fleet_ns),
        real_cluster,
    )
    status = wait_for(
        "the EventServer status",
        lambda: get(kubeconfig, "eventserver", "demo", fleet_ns).get("status"),
        real_cluster,
    )
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "PeersSynced"}
    if watched:
        assert get(kubeconfig, "statefulset", "demo", "other") is None
        assert "status" not in get(kubeconfig, "eventserver", "demo", "other")
    if variant == "everything-on":
        # What the chart's ServiceMonitor scrapes: the metrics port, path /metrics, of the
        # operator's pod (from the host to the pod's IP).
        monitor = get(kubeconfig, "servicemonitor", full, NAMESPACE)
        (endpoint,) = monitor["spec"]["endpoints"]
        (container,) = pod["spec"]["containers"]
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == endpoint["port"]]
        url = f"http://{pod['status']['podIP']}:{port}{endpoint['path']}"

        def counted() -> str | None:
            text = _fetch(url)
            ok = text and 'eventfleet_operator_reconciles_total{result="ok"}' in text
            return text if ok else None

        text = wait_for("a reconcile counted in the operator metrics", counted, real_cluster)
        assert "eventfleet_operator_fleet_desired_replicas" in text
    (state,) = operator_pod(kubeconfig)["status"]["containerStatuses"]
    assert state["ready"] and not state["restartCount"], state

    # The API server enforced the chart's RBAC on every request of the operator's
    # ServiceAccount: none was forbidden (its audit log records each one, with the
    # authorizer's decision).
    user = f"system:serviceaccount:{NAMESPACE}:{account}"
    requests = [
        e for e in real_cluster.audit()
        if e["user"]["username"] == user and _audit_time(e["requestReceivedTimestamp"]) >= started
    ]  # fmt: skip
    assert requests, "the audit log saw no request from the operator"
    decision = "authorization.k8s.io/decision"
    decisions = [(e.get("annotations") or {}).get(decision) for e in requests]
    assert set(decisions) <= {"allow", "forbid"}, set(decisions)
    denied = sorted(
        {
            (e["verb"], e.get("objectRef", {}).get("apiGroup", ""),
             e.get("objectRef", {}).get("resource", e["requestURI"]),
             e.get("objectRef", {}).get("namespace"))
            for e, verdict in zip(requests, decisions, strict=True)
            if verdict == "forbid"
        }
    )  # fmt: skip
    assert denied == [], f"requests the chart's RBAC forbade: {denied}"
    # A request RBAC allowed may still be refused by admission: right after `helm install`
    # the owner-reference check may not yet know the new CRD's kind (403, "cannot find
    # RESTMapping"). The operator must then have retried it with success.
    for refused in [e for e in requests if e["responseStatus"]["code"] == 403]:
        later = [
            e for e in requests
            if (e["verb"], e["requestURI"]) == (refused["verb"], refused["requestURI"])
            and e["stageTimestamp"] > refused["stageTimestamp"]
            and 200 <= e["responseStatus"]["code"] < 300
        ]  # fmt: skip
        assert later, f"refused and never retried with success: {refused}"
    # And the grants are no wider than the variant says: outside the watched namespaces
    # the operator's identity may not write StatefulSets.
    if watched:
        can = kubectl(kubeconfig, "auth", "can-i", "create", "statefulsets", "-n", "other",
                      f"--as={user}", check=False)  # fmt: skip
        assert can.stdout.strip() == "no"


def test_helm_upgrade_upgrades_the_crd(on_cluster, home, tmp_path):
    """The point of shipping the CRD as a template: a newer chart's schema is applied.

    (Helm would install a chart's crds/ directory once and never upgrade it.)
    """
    kubeconfig = on_cluster
    install(home, kubeconfig, "--wait", "--timeout", f"{POD_WAIT}s", timeout=POD_WAIT + 10)
    newer = tmp_path / "chart"
    shutil.copytree(CHART, newer)
    crd_file = newer / "files" / "crds" / "eventfleet.io_eventservers.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["addedInANewerRelease"] = {"type": "string", "default": "yes"}
    crd_file.write_text(yaml.safe_dump(crd))
    chart_helm(
        home,
        kubeconfig,
        "upgrade",
        RELEASE,
        str(newer),
        "--namespace",
        NAMESPACE,
    )
    live = get(kubeconfig, "crd", "eventservers.eventfleet.io")
    (served,) = [v for v in live["spec"]["versions"] if v.get("storage")]
    assert (
        "addedInANewerRelease"
        in served["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    )
    # And the API server applies the new schema: the new default appears on new objects.
    apply_example(kubeconfig, NAMESPACE)
    stored = get(kubeconfig, "eventserver", "demo", NAMESPACE)
    assert stored["spec"]["addedInANewerRelease"] == "yes"
