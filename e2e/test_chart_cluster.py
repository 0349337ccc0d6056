"""The Helm chart on a real control plane, with real binaries.

Real `helm` and `kubectl` (scripts/tools/k8s-binaries.sh) install, upgrade, uninstall and
reinstall the chart on a real kube-apiserver with etcd and the controller manager
(``e2e.k8s.controlplane``, one fresh control plane per test, since the chart installs
cluster-scoped objects). Helm validates against the server's OpenAPI and uses
server-side apply with strict field validation; the API server enforces the CRD schema,
its CEL rules and RBAC. The real operator is started with exactly the command,
arguments and environment of the Deployment the chart installed, and with a token of
the chart's ServiceAccount, so the chart's RBAC is what the API server enforces on it.

Not real here: no kubelet runs the chart's Deployment (the operator runs as a local
process with the Deployment's command line instead; the chart's pod itself runs on the
real single-node cluster in e2e/test_cluster_fleet.py), and prometheus-operator's
PrometheusRule CRD is a schema-less stand-in (see below).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from e2e.k8s.controlplane import ControlPlane, available
from tests import parts
from tests.unit.chart.chartlib import CHART, EVERYTHING_ON, REPO, helm, tool

RELEASE = "ef"
NAMESPACE = "eventfleet-system"
EXTERNAL_SERVICEMONITOR_CRD = "prometheus-operator/monitoring.coreos.com_servicemonitors.yaml"
WAIT = 60  # seconds; every wait below is bounded by this


@pytest.fixture
def cluster(tmp_path):
    """A fresh control plane on 127.0.0.1: (admin kubeconfig path, the ControlPlane)."""
    reason = available()
    if reason:
        parts.skip_missing("control-plane", reason, "run scripts/tools/k8s-control-plane.sh")
    workdir = tmp_path / "controlplane"
    workdir.mkdir()
    plane = ControlPlane(workdir).start()
    try:
        yield plane.kubeconfig, plane
    finally:
        plane.stop()


@pytest.fixture
def home(tmp_path):
    return tmp_path / "helm-home"


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


def chart_helm(home, kubeconfig, *args: str):
    return helm(home, *args, "--kubeconfig", str(kubeconfig), timeout=WAIT)


def install(home, kubeconfig, *extra: str, command: str = "install"):
    return chart_helm(
        home,
        kubeconfig,
        command,
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        *extra,
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


def test_install_upgrade_uninstall_reinstall(cluster, home):
    kubeconfig, _ = cluster
    create_namespaces(kubeconfig, NAMESPACE, "fleet-a", "fleet-b", "monitoring")

    # Install with the defaults.
    out = install(home, kubeconfig).stdout
    assert "STATUS: deployed" in out and "kind: EventServer" in out  # NOTES printed
    full = f"{RELEASE}-eventfleet-operator"
    deploy = get(kubeconfig, "deployment", full, NAMESPACE)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(url: str, port: int) -> str:
    """http://0.0.0.0:P/path -> http://127.0.0.1:port/path."""
    assert url.startswith("http://0.0.0.0:"), url
    return f"http://127.0.0.1:{port}/" + url.split("/", 3)[3]


def operator_command(deployment: dict, kubeconfig: pathlib.Path, ports: dict[str, int]):
    """argv and environment of the operator container, made runnable on this machine.

    The pod's listeners bind 0.0.0.0 inside its own network namespace; here that would
    be every interface of the test machine, so only their address and port change
    (`ports`: "health" and "metrics" -> a free loopback port). Everything else is used
    exactly as the chart rendered it.
    """
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    argv = list(container["command"]) + list(container["args"])
    # The console script the image puts on PATH is the one installed in this venv.
    executable = pathlib.Path(sys.executable).parent / argv[0]
    assert executable.exists(), f"{argv[0]} is not installed next to {sys.executable}"
    argv[0] = str(executable)
    (i,) = [n for n, a in enumerate(argv) if a.startswith("--liveness=")]
    argv[i] = "--liveness=" + _local(argv[i].partition("=")[2], ports["health"])
    env = {"PATH": os.environ["PATH"], "KUBECONFIG": str(kubeconfig), "HOME": os.environ["HOME"]}
    downward = {"metadata.name": f"{RELEASE}-operator-0", "metadata.namespace": NAMESPACE}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
    if "EVENTFLEET_OPERATOR_METRICS" in env:
        env["EVENTFLEET_OPERATOR_METRICS"] = _local(
            env["EVENTFLEET_OPERATOR_METRICS"], ports["metrics"]
        )
    return argv, env


@contextlib.contextmanager
def running(argv, env, log: pathlib.Path):
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(what: str, check, proc, log: pathlib.Path):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the operator exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        result = check()
        if result:
            return result
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


def _fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode() if r.status == 200 else None
    except OSError:
        return None


VARIANTS = {
    # id: (helm arguments, namespaces the operator reconciles; None: every namespace)
    "defaults": ((), {NAMESPACE}),
    "all-namespaces": (("--set", "operator.allNamespaces=true"), None),
    "watch-namespaces": (("--set", "operator.watchNamespaces[0]=fleet-a"), {"fleet-a"}),
    "everything-on": (("--values", str(EVERYTHING_ON)), {"fleet-a"}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_operator_runs_with_the_chart_arguments_within_the_chart_rbac(
    cluster, home, tmp_path, variant
):
    kubeconfig, plane = cluster
    helm_args, watched = VARIANTS[variant]
    create_namespaces(kubeconfig, NAMESPACE, "fleet-a", "fleet-b", "monitoring", "other")
    if variant == "everything-on":
        install_monitoring_crds(kubeconfig)
    install(home, kubeconfig, *helm_args)
    full = f"{RELEASE}-eventfleet-operator"
    deployment = get(kubeconfig, "deployment", full, NAMESPACE)
    ports = {"health": _free_port(), "metrics": _free_port()}
    # The Deployment's ServiceAccount, as the kubelet would mount it: RBAC is the chart's.
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    sa_kubeconfig = plane.service_account_kubeconfig(
        NAMESPACE, account, tmp_path / "operator.kubeconfig"
    )
    argv, env = operator_command(deployment, sa_kubeconfig, ports)
    log = tmp_path / "operator.log"

    with running(argv, env, log) as proc:
        health = f"http://127.0.0.1:{ports['health']}/healthz"
        wait_for("the liveness endpoint", lambda: _fetch(health) is not None, proc, log)
        # A fleet outside the watched namespaces must be left alone.
        if watched:
            apply_example(kubeconfig, "other")
        fleet_ns = min(watched) if watched else "fleet-a"
        apply_example(kubeconfig, fleet_ns)
        wait_for(
            f"the StatefulSet of {fleet_ns}/demo",
            lambda: get(kubeconfig, "statefulset", "demo", fleet_ns),
            proc,
            log,
        )
        status = wait_for(
            "the EventServer status",
            lambda: get(kubeconfig, "eventserver", "demo", fleet_ns).get("status"),
            proc,
            log,
        )
        assert {c["type"] for c in status["conditions"]} >= {"Ready", "PeersSynced"}
        if watched:
            assert get(kubeconfig, "statefulset", "demo", "other") is None
            assert "status" not in get(kubeconfig, "eventserver", "demo", "other")
        if variant == "everything-on":
            # What the chart's ServiceMonitor scrapes: the metrics port, path /metrics.
            monitor = get(kubeconfig, "servicemonitor", f"{RELEASE}-eventfleet-operator", NAMESPACE)
            path = monitor["spec"]["endpoints"][0]["path"]
            url = f"http://127.0.0.1:{ports['metrics']}{path}"

            def counted() -> str | None:
                text = _fetch(url)
                ok = text and 'eventfleet_operator_reconciles_total{result="ok"}' in text
                return text if ok else None

            text = wait_for(
                "a reconcile counted in the operator metrics",
                counted,
                proc,
                log,
            )
            assert "eventfleet_operator_fleet_desired_replicas" in text

    # The API server enforced the chart's RBAC on every request of the operator's
    # ServiceAccount: none was forbidden (its audit log records each one).
    user = f"system:serviceaccount:{NAMESPACE}:{account}"
    requests = [e for e in plane.audit() if e["user"]["username"] == user]
    assert requests, "the audit log saw no request from the operator"
    denied = sorted(
        {
            (e["verb"], e.get("objectRef", {}).get("apiGroup", ""),
             e.get("objectRef", {}).get("resource", e["requestURI"]),
             e.get("objectRef", {}).get("namespace"))
            for e in requests
            if e["responseStatus"]["code"] == 403
        }
    )  # fmt: skip
    assert denied == [], f"requests the chart's RBAC forbade: {denied}"
    # And the grants are no wider than the variant says: outside the watched namespaces
    # the operator's identity may not write StatefulSets.
    if watched:
        can = kubectl(kubeconfig, "auth", "can-i", "create", "statefulsets", "-n", "other",
                      f"--as={user}", check=False)  # fmt: skip
        assert can.stdout.strip() == "no"


def test_helm_upgrade_upgrades_the_crd(cluster, home, tmp_path):
    """The point of shipping the CRD as a template: a newer chart's schema is applied.

    (Helm would install a chart's crds/ directory once and never upgrade it.)
    """
    kubeconfig, _ = cluster
    create_namespaces(kubeconfig, NAMESPACE)
    install(home, kubeconfig)
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
