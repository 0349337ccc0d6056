"""The chart through the real helm binary: lint, render, and validate what it renders."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.unit.chart.chartlib import (
    CHART,
    EVERYTHING_ON,
    KUBE_VERSION,
    by_kind,
    crd_version_schema,
    external_crd,
    helm,
    one,
    render,
    structural_to_jsonschema,
)

# Kinds the chart may render that are not in Kubernetes' own OpenAPI schemas; each is
# validated against its CRD instead.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
# Everything the chart can add on top of the operator itself.
OPTIONAL_KINDS = ("ServiceMonitor", "PrometheusRule", "PodDisruptionBudget", "ConfigMap", "Service")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("helm-home")


@pytest.fixture(scope="module")
def default_docs(home):
    return render(home)


@pytest.fixture(scope="module")
def everything_docs(home):
    return render(home, EVERYTHING_ON)


@pytest.mark.parametrize("values", [None, EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_helm_lint_strict(home, values):
    args = ["lint", "--strict", str(CHART)]
    if values:
        args += ["--values", str(values)]
    out = helm(home, *args)
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("which", ["default_docs", "everything_docs"])
def test_rendered_objects_are_valid_kubernetes_1_33(which, request):
    docs = request.getfixturevalue(which)
    assert docs, "nothing rendered"
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        # strict=True rejects fields the 1.33 schema does not know, which is how a typo
        # in a template (e.g. `imagePullPolicy` at the wrong level) gets caught.
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_default_render_has_exactly_the_expected_objects(default_docs):
    kinds = sorted(d["kind"] for d in default_docs)
    assert "CustomResourceDefinition" in kinds
    assert kinds.count("Deployment") == 1
    assert kinds.count("ServiceAccount") == 1
    # Everything optional is off by default.
    for kind in OPTIONAL_KINDS:
        assert kind not in kinds, f"{kind} rendered although it is off by default"


def test_everything_on_renders_every_optional_object(everything_docs):
    kinds = {d["kind"] for d in everything_docs}
    assert set(OPTIONAL_KINDS) <= kinds


def test_service_monitor_is_valid_against_prometheus_operator_crd(everything_docs):
    crd = external_crd("prometheus-operator/monitoring.coreos.com_servicemonitors.yaml")
    schema = structural_to_jsonschema(crd_version_schema(crd, "v1"))
    monitor = one(everything_docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    jsonschema.validate(monitor, schema)
    # The monitor must select the metrics Service by its labels and scrape its named port.
    service = one(everything_docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_crd_is_rendered_with_keep_policy_and_is_the_repository_crd(default_docs):
    crds = by_kind(default_docs, "CustomResourceDefinition")
    assert crds
    names = {c["metadata"]["name"] for c in crds}
    assert "eventservers.eventfleet.io" in names
    sources = {}
    for path in sorted((CHART / "files" / "crds").glob("*.yaml")):
        src = yaml.safe_load(path.read_text())
        sources[src["metadata"]["name"]] = src
    for crd in crds:
        # Helm must never delete the CRD: that would delete every EventServer.
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        # Apart from the added labels and annotation, the rendered CRD is the source.
        src = sources[crd["metadata"]["name"]]
        assert crd["spec"] == src["spec"]


def test_crds_can_be_left_out_and_keep_can_be_turned_off(home):
    docs = render(home, sets=("crds.create=false",))
    assert not by_kind(docs, "CustomResourceDefinition")
    docs = render(home, sets=("crds.keep=false",))
    for crd in by_kind(docs, "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_the_default_install_is_namespaced(default_docs):
    args = one(default_docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    namespace = one(default_docs, "Deployment")["metadata"]["namespace"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == [f"--namespace={namespace}"]
    namespaced = [
        rb for rb in by_kind(default_docs, "RoleBinding") if rb["roleRef"]["kind"] == "ClusterRole"
    ]
    assert [rb["metadata"]["namespace"] for rb in namespaced] == [namespace]
    # Cluster-wide only what must be: reading CRDs and namespaces.
    for crb in by_kind(default_docs, "ClusterRoleBinding"):
        assert crb["roleRef"]["name"].endswith("-cluster")


def test_all_namespaces_binds_cluster_wide(home):
    docs = render(home, sets=("operator.allNamespaces=true",))
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args
    assert not any(a.startswith("--namespace") for a in args)
    assert not by_kind(docs, "RoleBinding") or all(
        rb["roleRef"]["kind"] == "Role" for rb in by_kind(docs, "RoleBinding")
    )
    bound = {b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")}
    assert bound == {r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")}


def test_operator_knows_its_own_labels_for_the_network_policies(default_docs):
    deploy = one(default_docs, "Deployment")
    env = {e["name"]: e for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    pairs = dict(p.split("=") for p in env["EVENTFLEET_OPERATOR_SELF_LABELS"]["value"].split(","))
    assert pairs == deploy["spec"]["selector"]["matchLabels"]
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_watched_namespaces_get_one_rolebinding_each(everything_docs):
    container = one(everything_docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--namespace=fleet-a" in container["args"]
    assert "--namespace=fleet-b" in container["args"]
    assert "--all-namespaces" not in container["args"]
    namespaced = [
        rb
        for rb in by_kind(everything_docs, "RoleBinding")
        if rb["roleRef"]["kind"] == "ClusterRole"
    ]
    assert sorted(rb["metadata"]["namespace"] for rb in namespaced) == ["fleet-a", "fleet-b"]
    # Only cluster-scoped rules stay bound cluster-wide.
    for crb in by_kind(everything_docs, "ClusterRoleBinding"):
        assert crb["roleRef"]["name"].endswith("-cluster")


def test_every_binding_names_the_rendered_service_account(everything_docs):
    sa = one(everything_docs, "ServiceAccount")["metadata"]
    pod = one(everything_docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["name"]
    for binding in by_kind(everything_docs, "RoleBinding") + by_kind(
        everything_docs, "ClusterRoleBinding"
    ):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
        ]


def test_operator_pod_is_locked_down(default_docs):
    pod = one(default_docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert container["command"] == ["eventfleet"] and container["args"][0] == "operator"
    assert one(default_docs, "Deployment")["spec"]["strategy"]["type"] == "Recreate"


def test_metrics_endpoint_is_passed_by_environment_and_matches_the_service(everything_docs):
    container = one(everything_docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = next(p for p in container["ports"] if p["name"] == "metrics")["containerPort"]
    assert env["EVENTFLEET_OPERATOR_METRICS"] == f"http://0.0.0.0:{port}/metrics"
    assert "--verbose" in container["args"] and "--log-format=json" in container["args"]
    assert container["args"][-1] == "--status-timeout=5"  # extraArgs come last


def test_image_digest_wins_over_tag(everything_docs, default_docs):
    image = one(everything_docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == (
        "registry.example.com/eventfleet/operator@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = one(default_docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == f"eventfleet/operator:{chart['appVersion']}"


def test_dashboard_configmap_holds_the_dashboard_json(everything_docs):
    cm = one(everything_docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["eventfleet.json"] == (CHART / "files" / "dashboard.json").read_text().strip()


def test_pdb_never_blocks_eviction_of_an_unhealthy_operator(everything_docs):
    pdb = one(everything_docs, "PodDisruptionBudget")
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["minAvailable"] == 1
    assert "maxUnavailable" not in pdb["spec"]


def test_example_eventserver_is_valid_against_the_chart_crd():
    crd = next(
        yaml.safe_load(p.read_text())
        for p in (CHART / "files" / "crds").glob("*.yaml")
        if yaml.safe_load(p.read_text())["spec"]["names"]["kind"] == "EventServer"
    )
    example = yaml.safe_load((CHART / "examples" / "eventserver.yaml").read_text())
    group = crd["spec"]["group"]
    served = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
    api_group, _, version = example["apiVersion"].partition("/")
    assert api_group == group and version in served
    jsonschema.validate(example, structural_to_jsonschema(crd_version_schema(crd, version)))


def test_notes_tell_the_user_what_to_apply_next(home):
    out = helm(
        home,
        "install",
        "ef",
        str(CHART),
        "--namespace",
        "eventfleet-system",
        "--dry-run=client",
    ).stdout
    notes = out.split("NOTES:", 1)[1]
    assert "kind: EventServer" in notes
    assert "kubectl" in notes and "apply -f -" in notes
    assert "wait --for=condition=Ready" in notes


def test_packaged_chart_renders_the_same_as_the_directory(home, tmp_path, default_docs):
    # Templates read files/ and examples/ through .Files; a .helmignore rule that drops
    # them would only show up once the chart is packaged and installed from a repository.
    helm(home, "package", str(CHART), "--destination", str(tmp_path))
    (tgz,) = tmp_path.glob("eventfleet-operator-*.tgz")
    out = helm(
        home,
        "template",
        "ef",
        str(tgz),
        "--namespace",
        "eventfleet-system",
        "--include-crds",
        "--kube-version",
        KUBE_VERSION,
        "--skip-tests",
    ).stdout
    assert [d for d in yaml.safe_load_all(out) if d] == default_docs


def test_oldest_supported_kubernetes_accepts_everything(home):
    """Chart.yaml's kubeVersion floor is real: the everything-on render is valid there."""
    floor = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    version = floor.removeprefix(">=").removesuffix("-0")
    out = helm(
        home,
        "template",
        "ef",
        str(CHART),
        "--include-crds",
        "--kube-version",
        version,
        "--values",
        str(EVERYTHING_ON),
    ).stdout
    for doc in (d for d in yaml.safe_load_all(out) if d):
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)
    # And one minor below the floor is refused by Helm itself.
    major, minor, _ = version.split(".")
    below = f"{major}.{int(minor) - 1}.0"
    proc = helm(home, "template", "ef", str(CHART), "--kube-version", below, check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr
