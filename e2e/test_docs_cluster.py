"""The docs' Kubernetes journeys, run as written on the real single-node cluster.

The marked shell blocks (``<!-- test: cluster -->``, e2e/doc_blocks.py) of the chart
README (install from the checkout, then from the packaged chart, ``helm test``), of
docs/quickstart.md (load an image without a registry, install the operator, create a
fleet, what the operator made, use it through a port-forward and from a pod, the
plugin, back it up, scale, watch and delete) and of docs/runbook.md (back up by the
operator and by hand, replace a lost volume, upgrade the operator and the replicas,
turn on TLS, grow the volumes, scale, restore the whole fleet from a backup, find that backup in the
bucket alone with the AWS CLI, restore by hand from a copy on disk) run through bash as a reader
pastes them, with
the cluster admin's kubeconfig, in the namespaces the docs name (``eventfleet-system``
for the operator, ``default`` for the quick start's fleet). A command that drifts from
the code fails here, naming the block (``docs/runbook.md:LINE 'Heading'``).

What the reader fills in comes from the test: ``$REGISTRY`` is where the cluster's
images are (``docker.io/eventfleet``: the project's images are imported into containerd
under the names the chart and the operator use by default) and replaces the quick
start's ``registry.example.com/eventfleet`` in ``demo.yaml``; the backup target is moto's
S3 server on the node's address (the quick start's bucket name, its ``endpointURL``
added as the page tells MinIO users to; the restore's MinIO address replaced by it and
its example backup name by the runbook's backup). Ports of a ``kubectl port-forward``
are mapped to free local ones. The runbook's upgrade target ``0.1.1`` is this build's
images tagged so in containerd (there is no second release to upgrade to); the image
load runs ``docker``/``sudo`` as podman/the test's root.

One fleet, the quick start's ``demo``, carries the quick start's and the runbook's
journeys in the pages' order, the deletion and then the restore from a backup last; the
chart README's example fleet (also ``demo``, in the operator's namespace) is checked and
deleted first. The runbook's pause, hibernate/wake and token rotation blocks run in
e2e/test_operator_day2_cluster.py, in the scenarios that already do the same there
(its token rotation with the operator's resync turned off: the operator's watch on the
Secrets alone moves it).
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
from e2e.cluster.layout import CONTAINERD_SOCKET, NODE_IP, ROOT
from e2e.doc_blocks import DocShell, block_places, cluster_blocks, section
from e2e.operator_helpers import condition, wait_for
from tests.s3server import ACCESS_KEY as S3_ACCESS_KEY
from tests.s3server import SECRET_KEY as S3_SECRET_KEY
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
NEW = "0.1.1"  # the runbook's upgrade target: this build's images under that tag


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
def journey() -> dict[str, str]:
    """What one journey leaves for a later one (the runbook's backup, for the restore)."""
    return {}


def run_doc(reader: DocShell, path: pathlib.Path, heading: str, **kw) -> list[str]:
    """Every marked block of a section in order, as written; their outputs."""
    blocks = cluster_blocks(path, heading)
    places = block_places(path, heading)
    pairs = zip(blocks, places, strict=True)
    return [reader.run(body, where=place, **kw) for (_, body), place in pairs]


def ctr(*args: str) -> str:
    return subprocess.run(
        ["ctr", "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io", *args],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip


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
    reader: DocShell, system: ClusterKubectl, default: ClusterKubectl, real_cluster: Cluster
):
    try:
        _chart_readme_journey(reader, system, real_cluster)
    except BaseException:
        # A failed journey leaves its release, fleet and volumes behind: every later one
        # then failed with "cannot reuse a name" (a cascade of ten). Cleared, the first
        # failure is the one reported.
        remove_everything(real_cluster, system, default, reader.workdir)
        raise


def _chart_readme_journey(reader: DocShell, system: ClusterKubectl, real_cluster: Cluster) -> None:
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


def test_quickstart_loads_an_image_without_a_registry(reader: DocShell):
    """The containerd way of "Images without a registry", with the image the test
    command built (scripts/tools/images.sh, buildah, in podman's storage): ``docker`` is
    podman there (the same CLI), ``sudo`` is the test itself (root), and ``ctr`` talks to
    the cluster's containerd. The server image is removed from containerd first, so the
    quick start's fleet below runs on the image this block loaded."""
    ((_, load),) = cluster_blocks(QUICKSTART, "Images without a registry")
    (place,) = block_places(QUICKSTART, "Images without a registry")
    ref = f"{REGISTRY}/server:0.1.0"
    stand_ins = reader.workdir / "stand-ins"
    stand_ins.mkdir(exist_ok=True)
    for name, body in (("docker", 'exec efpodman "$@"'), ("sudo", 'exec "$@"')):
        (stand_ins / name).write_text(f"#!/bin/sh\n{body}\n")
        (stand_ins / name).chmod(0o755)
    ctr("images", "rm", ref)
    assert ref not in ctr("images", "ls", "-q")
    out = reader.run(
        f'export PATH="$PWD/stand-ins:$PATH" CONTAINERD_ADDRESS={CONTAINERD_SOCKET}\n' + load,
        where=place,
    )
    assert re.search(rf"^{re.escape(ref)}\s", out, re.M), out
    assert ref in ctr("images", "ls", "-q").split()
    (reader.workdir / "server.tar").unlink()


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

    out, in_cluster = run_doc(reader, QUICKSTART, "Use it")
    events = [e for e in event_lines(out) if e["type"] == ["a", "b"]]
    assert len(events) >= 2, out  # registered, then queried back through the Service
    assert all(e["payload"] == {"json": 1} for e in events), events
    status = json.loads(out.splitlines()[-1])  # curl's /status: one line of JSON
    assert status["server_id"] in (1, 2, 3) and status["ready"] is True, status
    # The same event from a pod, through the Service's cluster DNS name.
    events = [e for e in event_lines(in_cluster) if e["type"] == ["a", "b"]]
    assert events and events[0]["payload"] == {"json": 1}, in_cluster
    assert default.get("pod", "demo-client") is None  # deleted by the block

    ((_, plugin),) = cluster_blocks(QUICKSTART, "The `kubectl eventfleet` plugin")
    out = reader.run(plugin, where="the plugin")
    for ordinal in range(3):
        assert f"demo-{ordinal}" in out, out


def test_quickstart_and_runbook_backups(
    reader: DocShell, default: ClusterKubectl, s3: S3Server, journey: dict[str, str]
):
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
    journey["backup"] = name
    body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == digest

    reader.run(by_hand, where="the runbook's backup by hand")
    (copy,) = reader.workdir.glob("demo-*.sqlite")
    with sqlite3.connect(copy) as db:
        assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] >= 1
    left = default.run("exec", "demo-0", "--", "ls", "/var/lib/eventfleet").stdout
    assert "backup.sqlite" not in left.split(), left


STORE_FACTS = """
import json, sqlite3
db = sqlite3.connect('file:/var/lib/eventfleet/events.sqlite?mode=ro', uri=True)
last = dict(db.execute('SELECT server, max(instance) FROM events GROUP BY server').fetchall())
print(json.dumps({'count': db.execute('SELECT count(*) FROM events').fetchone()[0],
                  'last': {str(k): v for k, v in last.items()}}))
"""


def store(k: ClusterKubectl, pod: str) -> dict:
    """How many events a replica's store holds and the highest id of each server's."""
    return json.loads(k.run("exec", pod, "--", "python", "-c", STORE_FACTS).stdout)


def pods(k: ClusterKubectl) -> dict[str, tuple[str, int, str]]:
    """The fleet's pods: uid, restarts and image of each."""
    items = k.json("get", "pods", "-l", "app.kubernetes.io/instance=demo")["items"]
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or []),
            p["spec"]["containers"][0]["image"],
        )
        for p in items
    }


def test_runbook_replaces_a_lost_volume(reader: DocShell, default: ClusterKubectl):
    lost = default.get("pvc", "data-demo-2")["metadata"]["uid"]
    try:
        (_,) = run_doc(reader, RUNBOOK, "Replace a lost volume")
    except AssertionError as e:
        # What holds the claim or the pod: finalizers, node, the namespace's events.
        seen = default.run(
            "get", "pvc/data-demo-2", "pod/demo-2", "-o", "yaml", check=False
        ).stdout[-4000:]
        events = default.run("get", "events", "--sort-by=.lastTimestamp", check=False)
        raise AssertionError(
            f"{e}\n--- claim and pod\n{seen}\n--- events\n{events.stdout[-3000:]}"
        ) from None
    assert default.get("pvc", "data-demo-2")["metadata"]["uid"] != lost
    # Refilled from its peers: what demo-0 holds, its own server id's events included.
    wait_for(
        lambda: store(default, "demo-2") == store(default, "demo-0"),
        timeout=60,
        what="demo-2 holding what demo-0 holds",
    )


def test_runbook_upgrades_the_operator_then_the_replicas(
    reader: DocShell, system: ClusterKubectl, default: ClusterKubectl
):
    # The version upgraded to: this build's images under the runbook's new version.
    for name in ("operator", "server"):
        ctr("images", "tag", "--force", f"{REGISTRY}/{name}:0.1.0", f"{REGISTRY}/{name}:{NEW}")
    (_, operator), (_, replicas) = cluster_blocks(RUNBOOK, "Upgrade")
    first, second = block_places(RUNBOOK, "Upgrade")
    assert f"NEW={NEW} " in operator and f"NEW={NEW} " in replicas
    reader.run(operator, where=first)
    deployment = system.get("deployment", RELEASE)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"{REGISTRY}/operator:{NEW}"
    )
    assert deployment["status"].get("updatedReplicas") == 1, deployment["status"]

    out = reader.run(replicas, timeout=1200, where=second)
    es = default.get("eventserver", "demo")
    assert out.strip().splitlines()[-1] == f"3/3 on {es['status']['updateRevision']}", out
    assert {image for _, _, image in pods(default).values()} == {f"{REGISTRY}/server:{NEW}"}
    assert ready(default)


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


def test_runbook_grows_the_volumes(reader: DocShell, default: ClusterKubectl):
    """The page's size (20Gi) through the cluster provisioner's resizer (hostPath volumes:
    the claims' and volumes' capacity), with no pod restarted on the way."""
    before = pods(default)
    ((_, block),) = cluster_blocks(RUNBOOK, "Grow the volumes")
    out = reader.run(block, where="Grow the volumes")
    assert out.splitlines()[0] == "true", out  # the class allows expansion
    for i in range(3):
        claim = default.get("persistentvolumeclaim", f"data-demo-{i}")
        assert claim["status"]["capacity"]["storage"] == "20Gi", claim["status"]
        # What the page prints: each claim's request and capacity.
        assert [f"data-demo-{i}", "20Gi", "20Gi"] in [line.split() for line in out.splitlines()]
    assert condition(default.get("eventserver", "demo"), "StorageResizing")["reason"] == "Resized"
    assert pods(default) == before  # same pods (uids), no restarts
    wait_for(lambda: ready(default), timeout=300, what="demo Ready after the growth")


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


def test_runbook_restores_the_whole_fleet_from_a_backup(
    reader: DocShell, default: ClusterKubectl, s3: S3Server, journey: dict[str, str]
):
    # The whole fleet lost: the EventServer gone (the previous test) and every volume.
    default.run("delete", "pvc", "-l", "app.kubernetes.io/instance=demo", "--timeout=120s")
    backup = default.get("eventserverbackup", journey["backup"])["status"]
    # The section's first two blocks; the fallback by hand (its subsection) is the next test.
    (_, block), (_, from_bucket), *_ = cluster_blocks(RUNBOOK, "Restore")
    place, bucket_place, *_ = block_places(RUNBOOK, "Restore")
    # Without the EventServerBackup objects: the bucket alone names the same copy (the
    # journey's backup is the newest), through the AWS CLI as the page runs it.
    documented_s3 = "S3=http://minio.example.com:9000 "
    assert documented_s3 in from_bucket, from_bucket
    credentials = (
        f"export AWS_ACCESS_KEY_ID={S3_ACCESS_KEY} AWS_SECRET_ACCESS_KEY={S3_SECRET_KEY}"
        " AWS_DEFAULT_REGION=us-east-1\n"
    )  # a reader's `aws configure`
    out = reader.run(
        credentials + from_bucket.replace(documented_s3, f"S3={s3.endpoint_url} "),
        where=bucket_place,
    )
    assert out.strip().splitlines()[-1] == (
        f"KEY={backup['objectKey']} SHA256={backup['digest']['sha256']}"
    ), out
    documented = ("BACKUP=demo-202611210300 ", "http://minio.backup.svc:9000")
    assert all(d in block for d in documented), block
    reader.run(
        block.replace(documented[0], f"BACKUP={journey['backup']} ").replace(
            documented[1], s3.endpoint_url
        ),
        where=place,
    )
    es = default.get("eventserver", "demo")
    assert es["spec"]["bootstrap"]["fromBackup"]["sha256"] == backup["digest"]["sha256"]
    # Every replica starts from the copy: its events, every server's last id.
    want = {server: last for server, last in backup["digest"]["lastIds"].items()}
    for ordinal in range(3):
        facts = store(default, f"demo-{ordinal}")
        assert facts["count"] >= backup["digest"]["events"], (ordinal, facts, backup)
        assert all(facts["last"].get(s, 0) >= last for s, last in want.items()), (facts, want)


def test_blocks_are_found():
    """The marked blocks this module runs exist (a renamed heading or a dropped marker
    fails here at once, without a cluster)."""
    counts = {
        (CHART_README, RELEASE): 3,
        (QUICKSTART, "Install the operator"): 1,
        (QUICKSTART, "Create a fleet"): 3,
        (QUICKSTART, "Images without a registry"): 1,
        (QUICKSTART, "Use it"): 2,
        (QUICKSTART, "The `kubectl eventfleet` plugin"): 1,
        (QUICKSTART, "Back it up"): 1,
        (QUICKSTART, "Scale, watch, delete"): 1,
        (RUNBOOK, "Back up the fleet"): 2,
        (RUNBOOK, "Turn on TLS, renew or replace the certificate"): 1,
        (RUNBOOK, "Scale"): 1,
        (RUNBOOK, "Pause the operator for one fleet"): 2,
        (RUNBOOK, "Hibernate and wake a fleet"): 2,
        (RUNBOOK, "Upgrade"): 2,
        (RUNBOOK, "Rotate the tokens"): 2,
        (RUNBOOK, "Restore"): 5,  # its own two blocks and its subsection's three
        (RUNBOOK, "By hand (fallback: a copy on disk)"): 3,
        (RUNBOOK, "Replace a lost volume"): 1,
        (RUNBOOK, "Grow the volumes"): 1,
        (RUNBOOK, "Rotate the Event BUS CURVE server key"): 2,
    }
    for (path, heading), count in counts.items():
        assert len(cluster_blocks(path, heading)) == count, (path.name, heading)
    shell = [b for (p, h) in counts for info, b in cluster_blocks(p, h) if info == "sh"]
    subprocess.run(["bash", "-n"], input="\n".join(shell), text=True, check=True, timeout=30)


def test_runbook_restores_by_hand_from_a_copy_on_disk(reader: DocShell, default: ClusterKubectl):
    """The runbook's fallback restore: the copy the backup by hand wrote (an earlier test
    of this module) put into the first replica's claim, a fleet of one started on it,
    then scaled to three that sync from it."""
    # The whole fleet lost again: the restored fleet of the previous test and its volumes.
    default.run("delete", "eventserver", "demo", "--timeout=180s", timeout=200)
    wait_for(
        lambda: default.get("statefulset", "demo") is None,
        timeout=180,
        what="the restored fleet's children deleted",
    )
    default.run("delete", "pvc", "-l", "app.kubernetes.io/instance=demo", "--timeout=120s")
    (copy,) = reader.workdir.glob("demo-*.sqlite")
    with sqlite3.connect(copy) as db:
        count = db.execute("SELECT count(*) FROM events").fetchone()[0]
        last = dict(db.execute("SELECT server, max(instance) FROM events GROUP BY server"))
    assert count >= 1 and last, (count, last)

    heading = "By hand (fallback: a copy on disk)"
    (_, fill), (_, create), (_, scale) = cluster_blocks(RUNBOOK, heading)
    places = block_places(RUNBOOK, heading)
    documented = "COPY=./demo-202501011200.sqlite "
    assert documented in fill, fill
    out = reader.run(fill.replace(documented, f"COPY=./{copy.name} "), where=places[0])
    assert "ok" in out.split(), out  # the quick_check the block prints
    assert default.get("pod", "restore-demo") is None

    reader.run(create, timeout=700, where=places[1])
    facts = store(default, "demo-0")
    assert facts["count"] >= count, (facts, count)
    assert all(facts["last"].get(str(s), 0) >= n for s, n in last.items()), (facts, last)

    reader.run(scale, timeout=1300, where=places[2])
    wait_for(
        lambda: store(default, "demo-1") == store(default, "demo-2") == store(default, "demo-0"),
        timeout=120,
        what="demo-1 and demo-2 holding what demo-0 holds",
    )
