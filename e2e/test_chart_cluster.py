"""The Helm chart against the project's Kubernetes API emulator, with real binaries.

Real `helm` and `kubectl` (scripts/tools/k8s-binaries.sh) install, upgrade and uninstall
the chart, and the real operator is started with exactly the command, arguments and
environment of the Deployment the chart installed. The emulator (e2e/k8s/) stores and
serves objects like an API server but runs no controllers: no pod ever starts, so these
tests prove that the API server accepts what the chart renders, that Helm's release
lifecycle works, and that the operator starts and reconciles with the chart's arguments
and within the chart's RBAC — not that a fleet comes up.

Two things differ from a real cluster, both because the emulator serves no OpenAPI
document: `helm` runs with `--disable-openapi-validation` and without
`--create-namespace` (Helm validates the namespace it creates even with that flag), and
`kubectl apply` runs with `--validate=false`.
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

from e2e.k8s.harness import EmulatorProcess
from tests.unit.chart.chartlib import CHART, EVERYTHING_ON, REPO, helm, tool

RELEASE = "ef"
NAMESPACE = "eventfleet-system"
EXTERNAL_SERVICEMONITOR_CRD = "prometheus-operator/monitoring.coreos.com_servicemonitors.yaml"
WAIT = 60  # seconds; every wait below is bounded by this


@pytest.fixture
def emulator(tmp_path):
    """A fresh emulator process on 127.0.0.1: (kubeconfig path, audit log path)."""
    proc = EmulatorProcess(tmp_path).start(timeout=WAIT)
    try:
        yield proc.kubeconfig, proc.audit_log
    finally:
        proc.stop()


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
        "--disable-openapi-validation",
        *extra,
    )


def create_namespaces(kubeconfig, *names: str) -> None:
    for name in names:
        kubectl(kubeconfig, "create", "namespace", name)


def apply_example(kubeconfig, namespace: str) -> None:
    kubectl(
        kubeconfig,
        "apply",
        "--validate=false",
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
# upstream CRDs the project keeps: it only makes the kind exist in the emulator (no
# schema), so the chart's PrometheusRule can be installed. Its content is checked by
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
    kubectl(kubeconfig, "create", "--validate=false", "-f", str(_servicemonitor_crd()))
    kubectl(
        kubeconfig,
        "create",
        "--validate=false",
        "-f",
        "-",
        stdin=json.dumps(PROMETHEUSRULE_STANDIN_CRD),
    )


def test_install_upgrade_uninstall_reinstall(emulator, home):
    kubeconfig, _ = emulator
    create_namespaces(kubeconfig, NAMESPACE, "fleet-a", "fleet-b", "monitoring")

    # Install with the defaults.
    out = install(home, kubeconfig).stdout
    assert "STATUS: deployed" in out and "kind: EventServer" in out  # NOTES printed
    full = f"{RELEASE}-eventfleet-operator"
    deploy = get(kubeconfig, "deployment", full, NAMESPACE)
    assert "--all-namespaces" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert get(kubeconfig, "serviceaccount", full, NAMESPACE)
    crd = get(kubeconfig, "crd", "eventservers.eventfleet.io")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert {full, f"{full}-cluster"} <= names(get(kubeconfig, "clusterrolebinding"))

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
        "--disable-openapi-validation",
        "--values",
        str(EVERYTHING_ON),
        # Client-side apply for this step only: with server-side apply Helm asks for
        # strict field validation, and the emulator then refuses `metadata` on custom
        # resources whose CRD lists it (the ServiceMonitor's does); a real API server
        # accepts it. Every other helm call here uses Helm 4's default server-side apply.
        "--server-side=false",
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


def granted(manifest: list[dict]):
    """(namespace or None for cluster-wide, PolicyRule) for every rule the chart binds."""
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in manifest
    }
    out = []
    for b in manifest:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        ref = b["roleRef"]
        ref_ns = b["metadata"]["namespace"] if ref["kind"] == "Role" else None
        role = roles[(ref["kind"], ref_ns, ref["name"])]
        scope = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        out += [(scope, rule) for rule in role.get("rules", [])]
    return out


def allowed(entry: dict, grants) -> bool:
    for scope, rule in grants:
        if scope is not None and entry["namespace"] != scope:
            continue
        if not {entry["group"], "*"} & set(rule.get("apiGroups", [])):
            continue
        if not {entry["resource"], "*"} & set(rule.get("resources", [])):
            continue
        if {entry["verb"], "*"} & set(rule["verbs"]):
            return True
    return False


VARIANTS = {
    # id: (helm arguments, namespaces the operator reconciles)
    "defaults": ((), None),
    "watch-namespaces": (("--set", "operator.watchNamespaces[0]=fleet-a"), {"fleet-a"}),
    # See the upgrade above for --server-side=false (the ServiceMonitor).
    "everything-on": (("--values", str(EVERYTHING_ON), "--server-side=false"), {"fleet-a"}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_operator_runs_with_the_chart_arguments_within_the_chart_rbac(
    emulator, home, tmp_path, variant
):
    kubeconfig, audit = emulator
    helm_args, watched = VARIANTS[variant]
    create_namespaces(kubeconfig, NAMESPACE, "fleet-a", "fleet-b", "monitoring", "other")
    if variant == "everything-on":
        install_monitoring_crds(kubeconfig)
    install(home, kubeconfig, *helm_args)
    deployment = get(kubeconfig, "deployment", f"{RELEASE}-eventfleet-operator", NAMESPACE)
    ports = {"health": _free_port(), "metrics": _free_port()}
    argv, env = operator_command(deployment, kubeconfig, ports)
    log = tmp_path / "operator.log"
    audit.write_text("")  # only what the operator does from here on counts below

    with running(argv, env, log) as proc:
        health = f"http://127.0.0.1:{ports['health']}/healthz"
        wait_for("the liveness endpoint", lambda: _fetch(health) is not None, proc, log)
        # A fleet outside the watched namespaces must be left alone.
        if watched:
            apply_example(kubeconfig, "other")
        apply_example(kubeconfig, "fleet-a")
        wait_for(
            "the StatefulSet of fleet-a/demo",
            lambda: get(kubeconfig, "statefulset", "demo", "fleet-a"),
            proc,
            log,
        )
        status = wait_for(
            "the EventServer status",
            lambda: get(kubeconfig, "eventserver", "demo", "fleet-a").get("status"),
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

    # Every API request the operator made is one the chart's RBAC grants in that scope.
    manifest = chart_helm(home, kubeconfig, "get", "manifest", RELEASE, "-n", NAMESPACE)
    grants = granted([d for d in yaml.safe_load_all(manifest.stdout) if d])
    requests = [
        json.loads(line)
        for line in audit.read_text().splitlines()
        if json.loads(line)["userAgent"].startswith(("kopf/", "eventfleet-operator/"))
    ]
    assert requests, "the audit log saw no request from the operator"
    denied = {
        (r["verb"], r["group"], r["resource"], r["namespace"])
        for r in requests
        if not allowed(r, grants)
    }
    assert denied == set(), f"requests the chart's RBAC would forbid: {sorted(denied)}"


def test_helm_upgrade_upgrades_the_crd(emulator, home, tmp_path):
    """The point of shipping the CRD as a template: a newer chart's schema is applied.

    (Helm would install a chart's crds/ directory once and never upgrade it.)
    """
    kubeconfig, _ = emulator
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
        "--disable-openapi-validation",
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
