"""The docs' Kubernetes journeys, run as written on the real single-node cluster.

The marked shell blocks (``<!-- test: cluster -->``, e2e/doc_blocks.py) of the chart
README (install from the checkout, then from the packaged chart, ``helm test``), of
docs/quickstart.md (install the operator, create a fleet, what the operator made, use
it through a port-forward, the plugin, back it up, scale, watch and delete) and of
docs/runbook.md (back up by the operator and by hand, turn on TLS, scale) run through
bash as a reader pastes them, with the cluster admin's kubeconfig, in the namespaces
the docs name (``eventfleet-system`` for the operator, ``default`` for the quick
start's fleet). A command that drifts from the code fails here.

What the reader fills in comes from the test: ``$REGISTRY`` is where the cluster's
images are (``docker.io/eventfleet``: the project's images are imported into containerd
under the names the chart and the operator use by default) and replaces the quick
start's ``registry.example.com/eventfleet`` in ``demo.yaml``; the backup target is moto's
S3 server on the node's address (the quick start's bucket name, its ``endpointURL``
added as the page tells MinIO users to). Ports of a ``kubectl port-forward`` are mapped
to free local ones.

One fleet, the quick start's ``demo``, carries the quick start's and the runbook's
journeys in the page's order, the deletion last; the chart README's example fleet
(also ``demo``, in the operator's namespace) is checked and deleted first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import pathlib
import re
import sqlite3
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from e2e.cluster.clients import ClusterKubectl, helm
from e2e.cluster.cluster import Cluster
from e2e.cluster.fixtures import _delete_kept_crds
from e2e.cluster.layout import NODE_IP, ROOT
from e2e.doc_blocks import DocShell, cluster_blocks, section
from e2e.operator_helpers import condition, wait_for
from tests.s3server import S3Server, running_s3

pytest_plugins = ["e2e.cluster.fixtures"]
# A TLS rollout of three replicas and a scale to five, each waiting for ready + in sync.
pytestmark = pytest.mark.timeout(1800)

CHART_README = ROOT / "charts" / "eventfleet-operator" / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"
RUNBOOK = ROOT / "docs" / "runbook.md"
SYSTEM = "eventfleet-system"  # the operator's namespace in every journey
RELEASE = "eventfleet-operator"
REGISTRY = "docker.io/eventfleet"  # e2e.cluster.images.project_image_ref


@pytest.fixture(scope="module")
def system(real_cluster: Cluster) -> ClusterKubectl:
    return ClusterKubectl(real_cluster, SYSTEM)


@pytest.fixture(scope="module")
def default(real_cluster: Cluster) -> ClusterKubectl:
    return ClusterKubectl(real_cluster, "default")


@pytest.fixture(scope="module")
def reader(
    real_cluster: Cluster,
    system: ClusterKubectl,
    default: ClusterKubectl,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DocShell]:
    """A reader's shell in ``default``; what the journeys leave is removed after them, as
    a user uninstalling for good does (fleets first: their finalizer needs the operator)."""
    home = tmp_path_factory.mktemp("reader")
    _delete_kept_crds(real_cluster)
    try:
        yield DocShell(real_cluster.kubeconfig, "default", home, REGISTRY=REGISTRY)
    finally:
        remove_everything(real_cluster, system, default, home)


def remove_everything(
    cluster: Cluster, system: ClusterKubectl, default: ClusterKubectl, home: pathlib.Path
) -> None:
    for k in (default, system):
        k.run("delete", "eventserverbackups,eventservers", "--all", "--timeout=180s",
              check=False, timeout=200)  # fmt: skip
    if RELEASE in helm(cluster, home / "helm", "list", "-n", SYSTEM, "-q"):
        helm(cluster, home / "helm", "uninstall", RELEASE, "-n", SYSTEM, "--wait")
    for k in (default, system):
        k.run("delete", "pvc", "-l", "app.kubernetes.io/name=eventfleet", "--timeout=120s",
              check=False)  # fmt: skip
    default.run("delete", "secret", "s3-creds", "--ignore-not-found", check=False)
    system.run("delete", "namespace", SYSTEM, "--ignore-not-found", "--timeout=180s",
               check=False, timeout=200)  # fmt: skip
    _delete_kept_crds(cluster)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """The quick start's bucket on an S3 server the pods reach (the node's address)."""
    with running_s3("eventfleet-backups", host=NODE_IP) as server:
        yield server


def ready(k: ClusterKubectl, name: str = "demo") -> bool:
    return condition(k.get("eventserver", name), "Ready").get("status") == "True"


def event_lines(out: str) -> list[dict]:
    """The events the eventfleet CLI printed (one JSON object a line)."""
    events = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if "type" in doc and "payload" in doc:
                events.append(doc)
    return events


def test_chart_readme_installs_from_the_checkout_and_from_the_packaged_chart(
    reader: DocShell, system: ClusterKubectl, real_cluster: Cluster
):
    quick, packaged, helm_test = (b for _, b in cluster_blocks(CHART_README, RELEASE))
    reader.run(quick, where="the chart README's install")
    assert ready(system), system.get("eventserver", "demo")
    assert system.get("eventserver", "demo")["status"]["readyReplicas"] == 3

    # The packaged chart replaces the checkout's release; `helm uninstall` keeps the CRD
    # (crds.keep) and so the fleet, which the new operator takes over.
    helm(real_cluster, reader.workdir / "helm", "uninstall", RELEASE, "-n", SYSTEM, "--wait")
    version = yaml.safe_load((CHART_README.parent / "Chart.yaml").read_text())["version"]
    assert f"dist/chart/{RELEASE}-{version}.tgz" in packaged, packaged
    reader.run(packaged, where="the packaged chart's install")
    system.run("rollout", "status", f"deployment/{RELEASE}", "--timeout=180s", timeout=200)
    out = reader.run(helm_test, where="helm test")
    assert re.search(r"^Phase:\s+Succeeded$", out, re.M), out
    deployment = system.get("deployment", RELEASE)
    assert deployment["metadata"]["labels"]["helm.sh/chart"] == f"{RELEASE}-{version}"
    # The new operator reconciles the fleet it found (only an operator writes conditions).
    system.run("annotate", "eventserver/demo", "eventfleet.io/reconcile=paused")
    wait_for(
        lambda: (
            condition(system.get("eventserver", "demo"), "ReconcilePaused").get("status") == "True"
        ),
        timeout=120,
        what="the packaged chart's operator reconciling the fleet",
    )
    system.run("annotate", "eventserver/demo", "eventfleet.io/reconcile-")

    # Done with this fleet: the quick start installs its own operator and fleet.
    system.run("delete", "eventserver", "demo", "--timeout=180s", timeout=200)
    system.run("delete", "pvc", "-l", "app.kubernetes.io/instance=demo", "--timeout=120s")
    helm(real_cluster, reader.workdir / "helm", "uninstall", RELEASE, "-n", SYSTEM, "--wait")


def test_quickstart_install_create_and_use(reader: DocShell, default: ClusterKubectl):
    ((_, install),) = cluster_blocks(QUICKSTART, "Install the operator")
    assert "$REGISTRY/operator" in install
    reader.run(install, where="Install the operator")

    (info, manifest), (_, create), (_, made) = cluster_blocks(QUICKSTART, "Create a fleet")
    assert info == "yaml" and manifest.startswith("# demo.yaml\n"), manifest
    # The reader's registry in place of the example's (the comment says so).
    assert "registry.example.com/eventfleet/" in manifest
    (reader.workdir / "demo.yaml").write_text(
        manifest.replace("registry.example.com/eventfleet", REGISTRY)
    )
    out = reader.run(create, where="Create a fleet")
    # The page's sample output: the same columns, and this fleet's row.
    text = section(QUICKSTART, "Create a fleet")
    sample = re.search(r"^```\n(NAME.*?)^```\n", text, re.M | re.S).group(1).splitlines()
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("NAME"))
    assert lines[header].split() == sample[0].split(), out
    assert lines[header + 1].split()[:4] == sample[1].split()[:4], out

    listed = reader.run(made, where="what the operator made")
    for child in (
        "statefulset.apps/demo",
        "service/demo",
        "service/demo-peers",
        "configmap/demo-config",
        "secret/demo-token",
        "poddisruptionbudget.policy/demo",
    ):
        assert re.search(rf"^{re.escape(child)}\s", listed, re.M), (child, listed)

    ((_, use),) = cluster_blocks(QUICKSTART, "Use it")
    out = reader.run(use, where="Use it")
    events = [e for e in event_lines(out) if e["type"] == ["a", "b"]]
    assert len(events) >= 2, out  # registered, then queried back through the Service
    assert all(e["payload"] == {"json": 1} for e in events), events
    status = json.loads(out.splitlines()[-1])  # curl's /status: one line of JSON
    assert status["server_id"] in (1, 2, 3) and status["ready"] is True, status

    ((_, plugin),) = cluster_blocks(QUICKSTART, "The `kubectl eventfleet` plugin")
    out = reader.run(plugin, where="the plugin")
    for ordinal in range(3):
        assert f"demo-{ordinal}" in out, out


def test_quickstart_and_runbook_backups(reader: DocShell, default: ClusterKubectl, s3: S3Server):
    ((_, block),) = cluster_blocks(QUICKSTART, "Back it up")
    documented = '"s3":{"bucket":"eventfleet-backups"'
    assert documented in block, block
    # S3-compatible storage other than AWS: endpointURL beside the bucket (the page says).
    here = f'"s3":{{"endpointURL":"{s3.endpoint_url}","bucket":"eventfleet-backups"'
    reader.run(block.replace(documented, here), where="Back it up")

    def completed():
        status = (default.get("eventserverbackup", "demo-first") or {}).get("status") or {}
        assert status.get("phase") != "Failed", status
        return status if status.get("phase") == "Completed" else None

    first = wait_for(completed, timeout=300, what="the quick start's backup")
    assert first["objectKey"] in s3.keys()

    operator, by_hand = (b for _, b in cluster_blocks(RUNBOOK, "Back up the fleet"))
    out = reader.run(operator, where="the runbook's backup")
    name, key, digest = out.strip().splitlines()[-1].split()
    assert name != "demo-first" and key in s3.keys(), out
    body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == digest

    reader.run(by_hand, where="the runbook's backup by hand")
    (copy,) = reader.workdir.glob("demo-*.sqlite")
    with sqlite3.connect(copy) as db:
        assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] >= 1
    left = default.run("exec", "demo-0", "--", "ls", "/var/lib/eventfleet").stdout
    assert "backup.sqlite" not in left.split(), left


def test_runbook_turns_on_tls(reader: DocShell, default: ClusterKubectl):
    ((_, block),) = cluster_blocks(RUNBOOK, "Turn on TLS, renew or replace the certificate")
    out = reader.run(block, timeout=1200, where="Turn on TLS")
    es = default.get("eventserver", "demo")
    assert es["status"]["tls"]["secretName"] == "demo-tls"
    assert es["status"]["tls"]["fingerprint"] in out
    # The quick start's event, read over TLS through the port-forward.
    assert [e for e in event_lines(out) if e["type"] == ["a", "b"]], out
    ca = base64.b64decode(default.get("secret", "demo-tls")["data"]["ca.crt"]).decode()
    assert (reader.workdir / "ca.crt").read_text() == ca


def test_runbook_and_quickstart_scale_then_delete(reader: DocShell, default: ClusterKubectl):
    ((_, up),) = cluster_blocks(RUNBOOK, "Scale")
    reader.run(up, where="the runbook's scale-up")
    assert default.get("statefulset", "demo")["spec"]["replicas"] == 5

    ((_, block),) = cluster_blocks(QUICKSTART, "Scale, watch, delete")
    out = reader.run(block, where="Scale, watch, delete")
    # jq's pretty-printed conditions, then what `kubectl delete` says.
    printed, _ = json.JSONDecoder().raw_decode(out[out.index("[") :])
    assert 'eventserver.eventfleet.io "demo" deleted' in out, out
    assert {c["type"] for c in printed} >= {"Ready", "PeersSynced", "ScaleDownHeld"}, out

    wait_for(
        lambda: default.get("statefulset", "demo") is None,
        timeout=180,
        what="the fleet's children deleted",
    )
    # "volumes stay": the claims of all five replicas (whenDeleted and whenScaled Retain).
    claims = default.json("get", "pvc", "-l", "app.kubernetes.io/instance=demo")["items"]
    assert sorted(c["metadata"]["name"] for c in claims) == [f"data-demo-{i}" for i in range(5)]


def test_blocks_are_found():
    """The marked blocks this module runs exist (a renamed heading or a dropped marker
    fails here at once, without a cluster)."""
    counts = {
        (CHART_README, RELEASE): 3,
        (QUICKSTART, "Install the operator"): 1,
        (QUICKSTART, "Create a fleet"): 3,
        (QUICKSTART, "Use it"): 1,
        (QUICKSTART, "The `kubectl eventfleet` plugin"): 1,
        (QUICKSTART, "Back it up"): 1,
        (QUICKSTART, "Scale, watch, delete"): 1,
        (RUNBOOK, "Back up the fleet"): 2,
        (RUNBOOK, "Turn on TLS, renew or replace the certificate"): 1,
        (RUNBOOK, "Scale"): 1,
        (RUNBOOK, "Rotate the Event BUS CURVE server key"): 2,
    }
    for (path, heading), count in counts.items():
        assert len(cluster_blocks(path, heading)) == count, (path.name, heading)
    shell = [b for (p, h) in counts for info, b in cluster_blocks(p, h) if info == "sh"]
    subprocess.run(["bash", "-n"], input="\n".join(shell), text=True, check=True, timeout=30)
