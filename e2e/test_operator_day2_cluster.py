"""Operator day 2 on the real single-node cluster (e2e/cluster, docs/operator.md).

The operator is installed by ``helm install`` of the chart into a namespace enforcing the
``restricted`` Pod Security Standard and runs as the chart's Deployment, within the
chart's RBAC; the replicas are the project's server image run by the kubelet and
containerd, reached by the operator through its own URL template. Nothing of what the
operator renders is rewritten.

One fleet (``day2``, three replicas, the Event BUS on with CURVE and PLAIN listeners for
reference clients from the node's address) carries the module's scenarios in order:
pause, hibernate and wake (the runbook's blocks; and the stale-Ready regression: the
StatefulSet's status held back while the fleet wakes); a peer-token rotation by hand and
the runbook's token rotation blocks (peer, by the operator, then client; with the
operator's resync turned off for them: its watch on the Secrets does it), PLAIN clients
beside CURVE, and the runbook's BUS CURVE server key rotation, each reaching the replicas
through the kubelet's refresh of the mounted Secret; the ``kubectl eventfleet`` plugin; a managed
rollout of a crash-looping image reverted without manual steps, and a restart request.
Deletion with ``whenDeleted: Retain`` and volume growth use fleets of their own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import kubernetes_validate
import pytest
import yaml
from eventfleet_operator import buskeys
from eventfleet_server.bus.curve import token_keypair

from e2e.bus_client import BusClient, wait_live
from e2e.cluster.clients import ClusterKubectl, helm
from e2e.cluster.cluster import Cluster, _start_time
from e2e.cluster.fixtures import CHART
from e2e.cluster.layout import CONTAINERD_SOCKET, NODE_IP, PAUSE_IMAGE, PROVISIONER_NAME
from e2e.cluster.replicas import Replicas, register, secret_token
from e2e.doc_blocks import DocShell, block_places, cluster_blocks
from e2e.operator_helpers import (
    condition,
    event_reasons,
    eventserver,
    restarted_events,
    strip_server_fields,
    wait_condition,
    wait_for,
)
from e2e.test_bus_curve import CurveBusClient, refused

pytest_plugins = ["e2e.cluster.fixtures"]
# Rollouts replace pods one at a time, each waiting for ready + in sync: minutes on a
# busy 2-core machine.
pytestmark = pytest.mark.timeout(900)

FLEET = "day2"
RUNBOOK = pathlib.Path(__file__).resolve().parents[1] / "docs" / "runbook.md"
SECTION = "Rotate the Event BUS CURVE server key"
PLAIN_PORT = 23040  # spec.protocols.bus.curve.plainPort: after the CURVE block 23030..23032
# A crash-looping "image": the cluster's pause image under another name. The kubelet
# starts it with the replica's command (``eventfleet server``), which it does not have.
BAD_IMAGE = "docker.io/bad/server:crashloop"


@pytest.fixture(scope="module")
def operator_values() -> tuple[str, ...]:
    # A short resync, as a user impatient for status would set it: the scenarios below
    # wait for the operator's reactions to replicas (it has no watch on their /status).
    return ("--set", "operator.resyncSeconds=2")


@pytest.fixture(scope="module")
def kubectl(ckubectl: ClusterKubectl) -> ClusterKubectl:
    return ckubectl


@pytest.fixture(scope="module")
def pods(
    kubectl: ClusterKubectl, operator_release: str, tmp_path_factory: pytest.TempPathFactory
) -> Replicas:
    """The module's fleet, Ready and in sync."""
    # PLAIN beside CURVE for reference clients, only from the node: the host's
    # connections through the client Service come from its bridge address.
    curve = {"enabled": True, "plainPort": PLAIN_PORT, "plainNetworks": [f"{NODE_IP}/32"]}
    kubectl.apply(eventserver(FLEET, 3, protocols={"bus": {"enabled": True, "curve": curve}}))
    wait_condition(kubectl, FLEET, "Ready")
    wait_condition(kubectl, FLEET, "PeersSynced")
    return Replicas(kubectl, FLEET, tmp_path_factory.mktemp("replicas"))


def own_ids(pods: Replicas, ordinal: int, of: int) -> dict:
    """The last event ids of server ``of`` that replica ``ordinal`` holds."""
    return wait_for(
        lambda: (pods.status(ordinal) or {}).get("last_ids", {}).get(str(of)),
        timeout=60,
        what=f"replica {ordinal}'s ids of server {of}",
    )


def doc_steps(
    kubectl: ClusterKubectl, cluster: Cluster, workdir: pathlib.Path, heading: str
) -> list[Callable[[], str]]:
    """The runbook section's marked blocks, each run as written when called (the
    fleet's name for ``demo``), in this module's namespace."""
    shell = DocShell(cluster.kubeconfig, kubectl.namespace, workdir)
    blocks = cluster_blocks(RUNBOOK, heading)
    places = block_places(RUNBOOK, heading)
    return [
        functools.partial(shell.run, body.replace("demo", FLEET), where=place)
        for (_, body), place in zip(blocks, places, strict=True)
    ]


def test_pause_hibernate_and_wake_with_real_replicas(kubectl, pods, real_cluster, tmp_path):
    """The runbook's "Pause the operator for one fleet" and "Hibernate and wake a
    fleet" blocks as written, with what each promises checked between them."""
    pause, resume = doc_steps(kubectl, real_cluster, tmp_path, "Pause the operator for one fleet")
    hibernate, wake = doc_steps(kubectl, real_cluster, tmp_path, "Hibernate and wake a fleet")
    register(pods, 1, 3)  # events only replica 1 created: hibernation must flush them
    own = own_ids(pods, 1, 2)

    # Paused: a spec change is not applied, the status says why.
    pause()
    kubectl.run(
        "patch", f"eventserver/{FLEET}", "--type=merge", "-p", '{"spec":{"logLevel":"DEBUG"}}'
    )
    time.sleep(6)  # several resyncs (2 s): none may write the ConfigMap
    config = yaml.safe_load(kubectl.get("configmap", f"{FLEET}-config")["data"]["config.yaml"])
    assert config["log"]["level"] == "INFO"
    resume()
    wait_for(
        lambda: "DEBUG" in kubectl.get("configmap", f"{FLEET}-config")["data"]["config.yaml"],
        timeout=60,
        what="the change applied after resume",
    )
    wait_condition(kubectl, FLEET, "Ready")

    # Hibernate: replica 0 must hold replica 1's events before anything stops.
    out = hibernate()
    assert re.findall(rf"^(data-{FLEET}-\d+)\s", out, re.M) == [
        f"data-{FLEET}-{i}" for i in range(3)
    ], out  # "the claims stay"
    es = kubectl.get("eventserver", FLEET)
    assert es["status"]["phase"] == "Hibernated"
    assert es["spec"]["replicas"] == 3
    assert kubectl.get("statefulset", FLEET)["spec"]["replicas"] == 0
    wait_for(lambda: all(pods.pod(i) is None for i in range(3)), timeout=120, what="the pods gone")
    for ordinal in range(3):
        assert kubectl.get("persistentvolumeclaim", f"data-{FLEET}-{ordinal}")  # claims kept

    # Wake: the count comes back and replica 0 still holds replica 1's events.
    wake()
    assert kubectl.get("statefulset", FLEET)["spec"]["replicas"] == 3
    held = own_ids(pods, 0, 2)
    assert (held["session"], held["instance"]) >= (own["session"], own["instance"])
    reasons = event_reasons(kubectl, FLEET)
    assert {"Paused", "NotPaused", "Hibernated", "NotHibernating"} <= reasons, reasons


@contextlib.contextmanager
def controller_manager_stopped(cluster: Cluster):
    """SIGSTOP the cluster's kube-controller-manager (its pid from the cluster's
    state.json, checked against its start time) and SIGCONT it on the way out, whatever
    happened: the StatefulSet controller neither creates pods nor updates the
    StatefulSet's status meanwhile."""
    process = cluster.state["processes"]["kube-controller-manager"]
    pid = process["pid"]
    assert _start_time(pid) == process["started"], "kube-controller-manager is not running"
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_ready_is_not_reported_from_a_stale_statefulset_status_while_waking(
    real_cluster, kubectl, pods
):
    """Issue 26: after ``hibernate: false`` Ready must wait for replicas that serve.

    The stale window, made deterministic: the StatefulSet controller is held still
    (kube-controller-manager SIGSTOPped) through a whole hibernate and wake, and the test
    does its part by hand — deleting the pods, which the kubelet stops gracefully — so
    the StatefulSet's status still says 3 of 3 ready, of a generation two behind, while
    no pod exists. That is the status the operator once derived Ready from (Ready at
    once, the first replica serving 23 s later). Ready must stay False throughout, and
    when it turns True every replica must answer on its own port."""
    wait_condition(kubectl, FLEET, "Ready")
    seen: list[tuple[str, str, str]] = []
    with controller_manager_stopped(real_cluster):
        kubectl.run(
            "patch", f"eventserver/{FLEET}", "--type=merge", "-p", '{"spec":{"hibernate":true}}'
        )
        wait_for(
            lambda: kubectl.get("statefulset", FLEET)["spec"]["replicas"] == 0,
            timeout=120,
            what="the operator to flush and scale the StatefulSet to 0",
        )
        # The StatefulSet controller's part: the pods go.
        kubectl.run(
            "delete", "pod", *(f"{FLEET}-{i}" for i in range(3)), "--timeout=120s", timeout=130
        )
        kubectl.run(
            "patch", f"eventserver/{FLEET}", "--type=merge", "-p", '{"spec":{"hibernate":false}}'
        )
        wait_for(
            lambda: kubectl.get("statefulset", FLEET)["spec"]["replicas"] == 3,
            timeout=60,
            what="the operator to scale the StatefulSet back to 3",
        )
        # Several operator passes (resync 2 s) with only the stale status to go by.
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            es = kubectl.get("eventserver", FLEET)
            ready = condition(es, "Ready")
            seen.append((ready.get("status", ""), ready.get("reason", ""), es["status"]["phase"]))
            time.sleep(1)
        # The window really was stale: the status of two generations ago, no pod at all.
        sts = kubectl.get("statefulset", FLEET)
        assert sts["status"].get("readyReplicas") == 3, sts["status"]
        assert sts["status"]["observedGeneration"] <= sts["metadata"]["generation"] - 2
        assert all(pods.pod(i) is None for i in range(3))
    assert seen and all(status != "True" for status, _, _ in seen), seen

    def ready_and_serving():
        if condition(kubectl.get("eventserver", FLEET), "Ready").get("status") != "True":
            return None
        # Ready has just been read as True: every replica must serve now.
        return [pods.status(i) for i in range(3)]

    statuses = wait_for(ready_and_serving, timeout=300, what="Ready=True")
    assert all(s is not None for s in statuses), statuses
    wait_condition(kubectl, FLEET, "PeersSynced")


@contextlib.contextmanager
def operator_resync(
    cluster: Cluster, kubectl: ClusterKubectl, release: str, home: pathlib.Path, seconds: int
):
    """The module's operator with another ``operator.resyncSeconds`` (``helm upgrade``,
    as a user changes it: the Deployment is recreated), the module's 2 s back on the way
    out, whatever happened."""

    def upgrade(value: int) -> None:
        helm(
            cluster, home, "upgrade", release, str(CHART), "--namespace", kubectl.namespace,
            "--reuse-values", "--set", f"operator.resyncSeconds={value}",
            "--wait", "--timeout", "180s",
        )  # fmt: skip

    upgrade(seconds)
    try:
        yield
    finally:
        upgrade(2)


# Longer than the whole test: no periodic pass happens while it runs, so only the
# operator's watch on the Secrets its fleets read (and its re-reads of the replicas
# while tokens travel) can move TokensLoaded and the rotation's steps.
NO_RESYNC = 3600
# One step reaches every replica within the kubelet's refresh of the Secret volume
# (syncFrequency 2 s here, e2e/cluster/configs.py) plus the replica's poll of the file
# (token_reload_interval, 10 s); the margin is for a loaded 2-core machine. Far below
# NO_RESYNC: a step that waited for a resync fails here.
STEP_TIMEOUT = 120


def test_a_peer_token_rotation_reaches_every_replica_without_a_restart(
    kubectl, pods, real_cluster, operator_release, operator_pod, tmp_path
):
    """The runbook's peer rotation on the generated Secret: each step reaches the real
    replicas through the kubelet's refresh of the mounted Secret volume (its ``..data``
    symlink swap, after the kubelet's sync delay) and the replica's poll of the file; the
    operator's TokensLoaded condition follows it, nothing restarts, and the operator's
    /flush works with the new token alone at the end. Then the runbook's "Rotate the
    tokens" blocks as written (the fleet's name for ``demo``): the peer rotation by the
    operator, then the client token's three steps, after which only the new client token
    is accepted.

    All of it with the operator's resync set far beyond the test's length
    (``NO_RESYNC``): the operator notices each Secret change through its watch and
    follows the replicas' reload by itself, within seconds (printed: the seconds from
    each Secret write to the operator's new ``tokensDigest`` and to TokensLoaded)."""
    with operator_resync(real_cluster, kubectl, operator_release, tmp_path / "helm", NO_RESYNC):
        args = kubectl.get("deployment", f"{operator_release}-eventfleet-operator")
        (container,) = args["spec"]["template"]["spec"]["containers"]
        assert f"--resync-seconds={NO_RESYNC}" in container["args"], container["args"]
        try:
            _rotate_tokens(kubectl, pods, real_cluster, tmp_path)
        except Exception:
            # What the operator did (or failed to do) with each Secret event.
            print(
                "operator log (last 150 lines):", *operator_pod.log().splitlines()[-150:], sep="\n"
            )
            raise


def _rotate_tokens(kubectl, pods, real_cluster, tmp_path) -> None:
    wait_condition(kubectl, FLEET, "TokensLoaded", STEP_TIMEOUT)
    containers = [pods.container(i) for i in range(3)]
    old = base64.b64decode(kubectl.get("secret", f"{FLEET}-peer-token")["data"]["token"])
    old = old.decode().strip()
    client = base64.b64decode(kubectl.get("secret", f"{FLEET}-token")["data"]["token"]).decode()
    assert old and old != client.strip()

    def step(number: int, text: str) -> None:
        before = kubectl.get("eventserver", FLEET)["status"]["tokensDigest"]
        data = base64.b64encode(text.encode()).decode()
        written = time.monotonic()
        kubectl.run(
            "patch", f"secret/{FLEET}-peer-token", "-p", json.dumps({"data": {"token": data}})
        )
        seen: list[float] = []

        def loaded():
            es = kubectl.get("eventserver", FLEET)
            c = condition(es, "TokensLoaded")
            if es["status"].get("tokensDigest") != before and not seen:
                seen.append(time.monotonic() - written)
            return es["status"].get("tokensDigest") != before and c.get("status") == "True"

        # The kubelet refreshes Secret volumes on its sync period plus its cache TTL.
        wait_for(loaded, timeout=STEP_TIMEOUT, what=f"every replica to load {text!r}")
        print(
            f"peer token step {number} by hand: the operator saw the Secret after "
            f"{seen[0]:.1f} s, TokensLoaded after {time.monotonic() - written:.1f} s"
        )

    step(1, f"{old}\nrotated-peer\n")
    step(2, f"rotated-peer\n{old}\n")
    step(3, "rotated-peer\n")
    # The same three steps, taken by the operator (eventfleet.io/rotate-peer-token), as
    # the runbook's block asks for them and waits.
    rotate_client, rotate_peer = doc_steps(kubectl, real_cluster, tmp_path, "Rotate the tokens")
    started = time.monotonic()
    rotate_peer()
    print(f"peer token rotation by the operator: Done after {time.monotonic() - started:.1f} s")
    done = kubectl.get("eventserver", FLEET)["status"]["peerTokenRotation"]
    assert done["step"] == "Done", done
    (auto,) = base64.b64decode(
        kubectl.get("secret", f"{FLEET}-peer-token")["data"]["token"]
    ).split()
    assert auto.decode() not in (old, "rotated-peer")
    assert [pods.container(i) for i in range(3)] == containers and not pods.restarts
    reasons = event_reasons(kubectl, FLEET)
    assert {"TokensChanged", "TokensReloading"} <= reasons, reasons
    # Only the new token is valid now: the operator's flush (POST /flush) still works.
    register(pods, 1, 2)
    kubectl.run("annotate", f"eventserver/{FLEET}", "eventfleet.io/flush=after-rotation")

    def flushed():
        last = kubectl.get("eventserver", FLEET)["status"].get("lastFlush") or {}
        return last if last.get("requested") == "after-rotation" else None

    assert wait_for(flushed, timeout=60, what="the flush after the rotation")["result"] == (
        "Verified"
    )

    # The client token's three steps: afterwards every replica accepts the new token
    # alone (the block's last wait is TokensLoaded on the Secret's new content).
    first = secret_token(kubectl, f"{FLEET}-token").splitlines()[0]
    started = time.monotonic()
    rotate_client()
    print(f"client token rotation (two Secret writes): {time.monotonic() - started:.1f} s")
    (new,) = secret_token(kubectl, f"{FLEET}-token").split()
    assert new != first
    for ordinal in range(3):
        register(pods, ordinal, 1, event_type="e2e/new-client-token")  # the Secret's token
        old = tmp_path / "old.token"
        old.write_text(first)
        proc = subprocess.run(
            [
                sys.executable, "-m", "eventfleet_cli", "query", "--eventer",
                pods.eventer(ordinal), "--token-file", str(old), "latest", "*",
            ],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert proc.returncode != 0, (ordinal, proc.stdout)
    assert [pods.container(i) for i in range(3)] == containers and not pods.restarts


def test_bus_plain_listeners_beside_curve_for_reference_clients(kubectl, pods):
    """spec.protocols.bus.curve.plainPort on the real cluster: the client Service and
    the NetworkPolicy carry the PLAIN ports (only from plainNetworks); a PLAIN client
    with the fleet token (what a reference BUS client can do) publishes and receives
    through them, sees what a CURVE client publishes (one BUS, two doors); a PLAIN client
    with a wrong token or none is refused."""
    plain = {"plain-snapshot": PLAIN_PORT, "plain-publisher": PLAIN_PORT + 1}
    plain["plain-collector"] = PLAIN_PORT + 2
    service = kubectl.get("service", FLEET)
    assert {p["name"]: p["port"] for p in service["spec"]["ports"] if p["name"] in plain} == plain
    ingress = kubectl.get("networkpolicy", FLEET)["spec"]["ingress"]
    (rule,) = [r for r in ingress if {"protocol": "TCP", "port": PLAIN_PORT} in r["ports"]]
    assert rule["from"] == [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}]
    key = wait_for(
        lambda: kubectl.get("eventserver", FLEET)["status"].get("busCurve", {}).get("publicKey"),
        timeout=60,
        what="status.busCurve.publicKey",
    )
    config = yaml.safe_load(kubectl.get("configmap", f"{FLEET}-config")["data"]["config.yaml"])
    assert config["bus"]["curve"]["plain_port"] == PLAIN_PORT
    ip = service["spec"]["clusterIP"]
    token = base64.b64decode(kubectl.get("secret", f"{FLEET}-token")["data"]["token"])
    token = token.decode().splitlines()[0].strip()

    async def scenario() -> None:
        reference = BusClient(PLAIN_PORT, plain=("reference", token), host=ip)
        curve = CurveBusClient(config["bus"]["port"], key.encode(), token_keypair(token), host=ip)
        wrong = BusClient(PLAIN_PORT, plain=("reference", token + "x"), host=ip)
        anonymous = BusClient(PLAIN_PORT, host=ip)
        try:
            reference.subscribe("/p/")
            await wait_live(reference, reference, "/p/plain", timeout=60)
            await wait_live(reference, curve, "/p/from-curve", timeout=60)
            # The snapshot port too; it may be another replica's (the Service balances
            # connections), which has the events once the Syncer brought them.
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                events, _ = await reference.syncstart("/p/", timeout=10.0)
                topics = {e.topic for e in events}
                if {"/p/plain", "/p/from-curve"} <= topics:
                    break
                assert asyncio.get_running_loop().time() < deadline, topics
                await asyncio.sleep(0.5)
            await refused(wrong, "/p/wrong")
            await refused(anonymous, "/p/anonymous")
        finally:
            for client in (reference, curve, wrong, anonymous):
                client.close()

    asyncio.run(scenario())


def test_bus_curve_server_key_rotation_as_the_runbook_says_without_a_restart(
    kubectl, pods, real_cluster, tmp_path
):
    """docs/runbook.md, "Rotate the Event BUS CURVE server key", run as written (the
    fleet's name for ``demo``): a CURVE BUS client on the host, connected through the
    client Service before the rotation, keeps its session; the new key reaches every
    replica through the kubelet's refresh of the mounted Secret and is served without a
    restart; a new client needs the new public key, which status.busCurve publishes,
    and one with the old key is refused."""
    wait_for(
        lambda: kubectl.get("eventserver", FLEET)["status"]["busCurve"].get("replicasServing") == 3,
        timeout=60,
        what="every replica counted as serving the key",
    )
    es = kubectl.get("eventserver", FLEET)
    old = es["status"]["busCurve"]["publicKey"]
    assert es["status"]["busCurve"]["secretName"] == f"{FLEET}-bus-curve"
    stored = kubectl.get("secret", f"{FLEET}-bus-curve")["data"]
    assert base64.b64decode(stored["server.pub"]).decode().strip() == old
    assert "server.key" in stored
    config = yaml.safe_load(kubectl.get("configmap", f"{FLEET}-config")["data"]["config.yaml"])
    port = config["bus"]["port"]
    ip = kubectl.get("service", FLEET)["spec"]["clusterIP"]
    token = base64.b64decode(kubectl.get("secret", f"{FLEET}-token")["data"]["token"])
    keypair = token_keypair(token.decode().splitlines()[0].strip())

    def served_key(ordinal: int) -> str | None:
        bus = ((pods.status(ordinal) or {}).get("protocols") or {}).get("bus") or {}
        return (bus.get("curve") or {}).get("public_key")

    for ordinal in range(3):
        wait_for(lambda o=ordinal: served_key(o) == old, timeout=60, what=f"{FLEET}-{ordinal}")
    containers = [pods.container(i) for i in range(3)]
    shell = DocShell(real_cluster.kubeconfig, kubectl.namespace, tmp_path / "reader")
    rotate, show = (b.replace("demo", FLEET) for _, b in cluster_blocks(RUNBOOK, SECTION))

    async def scenario() -> str:
        established = CurveBusClient(port, old.encode(), keypair, host=ip)
        clients = [established]
        try:
            established.subscribe("/c/")
            await wait_live(established, established, "/c/before", timeout=60)
            await asyncio.to_thread(shell.run, rotate, where="the rotation step")
            written = base64.b64decode(
                kubectl.get("secret", f"{FLEET}-bus-curve")["data"]["server.key"]
            )
            new = buskeys.from_secret(written.decode()).public_z85
            assert new != old

            def published():
                status = kubectl.get("eventserver", FLEET)["status"]["busCurve"]
                pub = kubectl.get("secret", f"{FLEET}-bus-curve")["data"]["server.pub"]
                return status["publicKey"] == new == base64.b64decode(pub).decode().strip()

            await asyncio.to_thread(
                wait_for, published, timeout=120, what="status.busCurve with the new key"
            )
            for ordinal in range(3):
                # The kubelet refreshes Secret volumes on its sync period plus its cache TTL.
                await asyncio.to_thread(
                    wait_for,
                    lambda o=ordinal: served_key(o) == new,
                    timeout=240,
                    what=f"{FLEET}-{ordinal} serving the new key (kubelet volume refresh)",
                )

            def counted():
                status = kubectl.get("eventserver", FLEET)["status"]["busCurve"]
                return status["publicKey"] == new and status.get("replicasServing") == 3

            await asyncio.to_thread(
                wait_for, counted, timeout=120, what="status.busCurve.replicasServing 3"
            )
            shown = await asyncio.to_thread(shell.run, show, where="the public key step")
            assert shown.split() == [new, "3/3"], shown
            fresh = CurveBusClient(port, new.encode(), keypair, host=ip)
            stale = CurveBusClient(port, old.encode(), keypair, host=ip)
            clients += [fresh, stale]
            fresh.subscribe("/c/")
            await wait_live(fresh, fresh, "/c/after", timeout=60)
            # The session made before the rotation still publishes and subscribes.
            await wait_live(established, established, "/c/established", timeout=60)
            await refused(stale, "/c/stale")
            return new
        finally:
            for client in clients:
                client.close()

    asyncio.run(scenario())
    assert [pods.container(i) for i in range(3)] == containers and not pods.restarts
    for ordinal in range(3):
        bus = pods.status(ordinal)["protocols"]["bus"]
        assert bus["curve"]["rotations"] >= 1, bus


def test_kubectl_eventfleet_plugin(kubectl, pods, tmp_path):
    """The plugin as kubectl finds it: an executable kubectl-eventfleet on PATH, run
    from the host with the cluster admin's kubeconfig."""
    shim = tmp_path / "bin" / "kubectl-eventfleet"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m eventfleet_operator.plugin "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}"}
    ns = kubectl.namespace

    def plugin(*args, check=True):
        # kubectl refuses flags before a plugin's name: they go after it, to the plugin.
        cmd = [kubectl.binary, "eventfleet", "--kubeconfig", str(kubectl.kubeconfig)]
        result = subprocess.run(
            [*cmd, "-n", ns, *args], capture_output=True, text=True, timeout=300, env=env
        )
        assert result.returncode == 0 or not check, result.stderr
        return result

    wait_condition(kubectl, FLEET, "Ready")
    wait_condition(kubectl, FLEET, "PeersSynced")
    table = plugin("status", FLEET).stdout.splitlines()
    assert table[0] == f"EventServer {ns}/{FLEET}: Running"
    rows = {line.split()[0]: line.split() for line in table if line.startswith(f"{FLEET}-")}
    assert sorted(rows) == [f"{FLEET}-{i}" for i in range(3)]
    assert all(r[2:4] == ["yes", "synced"] for r in rows.values())
    data = json.loads(plugin("status", FLEET, "-o", "json").stdout)
    assert (data["replicas"], data["readyReplicas"], data["phase"]) == (3, 3, "Running")
    assert data["updatedReplicas"] == 3 and data["updateRevision"] == data["currentRevision"]

    # Options after the command, as users type them with kubectl.
    after = subprocess.run(
        [kubectl.binary, "eventfleet", "status", FLEET, "-n", ns,
         "--kubeconfig", str(kubectl.kubeconfig), "-o", "json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["namespace"] == ns

    register(pods, 1, 2)
    flushed = plugin("flush", FLEET, "--timeout", "120")
    assert "flushed: all 3 replicas hold each other's events" in flushed.stdout
    assert flushed.stderr.startswith("flush requested (eventfleet.io/flush="), flushed.stderr
    assert kubectl.get("eventserver", FLEET)["status"]["lastFlush"]["result"] == "Verified"

    plugin("pause", FLEET)
    wait_condition(kubectl, FLEET, "ReconcilePaused", 60)
    assert "(paused)" in plugin("status", FLEET).stdout.splitlines()[0]
    plugin("resume", FLEET)
    wait_condition(kubectl, FLEET, "ReconcilePaused=False", 60)

    containers = {i: pods.container(i) for i in range(3)}
    plugin("restart", FLEET)
    wait_for(
        lambda: all(pods.container(i) not in (None, containers[i]) for i in range(3)),
        timeout=600,
        what="every pod replaced",
    )
    wait_condition(kubectl, FLEET, "Ready")

    plugin("hibernate", FLEET)
    wait_condition(kubectl, FLEET, "Hibernated", 120)
    assert "no replica reports" in plugin("status", FLEET).stdout
    plugin("wake", FLEET)
    wait_condition(kubectl, FLEET, "Ready")

    missing = plugin("status", "nope", check=False)
    assert missing.returncode == 1
    assert f'eventserver "nope" not found in namespace "{ns}"' in missing.stderr


def test_managed_rollout_of_a_bad_image_is_reverted_without_manual_steps(
    real_cluster, kubectl, pods
):
    wait_condition(kubectl, FLEET, "Ready")
    sts = kubectl.get("statefulset", FLEET)
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    good_image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    good = kubectl.get("eventserver", FLEET)["status"]["updateRevision"]
    containers = {i: pods.container(i) for i in range(3)}
    subprocess.run(
        ["ctr", "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io", "images", "tag",
         "--force", PAUSE_IMAGE, BAD_IMAGE],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip

    # A bad image: the highest ordinal is replaced first and crash-loops; the others
    # keep running their old revision and Ready says a rollout is incomplete.
    kubectl.run(
        "patch", f"eventserver/{FLEET}", "--type=merge", "-p",
        json.dumps({"spec": {"image": BAD_IMAGE}}),
    )  # fmt: skip

    def stuck():
        es = kubectl.get("eventserver", FLEET)
        return (
            condition(es, "Progressing").get("status") == "True"
            and condition(es, "Ready").get("reason") == "RolloutInProgress"
            and pods.restarts.get(2, 0) >= 1
            and es
        )

    es = wait_for(stuck, timeout=300, what=f"the rollout stuck on {FLEET}-2")
    assert es["status"]["updateRevision"] != good
    time.sleep(8)  # several resyncs: nothing else may be replaced while 2 is broken
    assert (pods.container(0), pods.container(1)) == (containers[0], containers[1])
    assert condition(kubectl.get("eventserver", FLEET), "Ready")["status"] == "False"

    # Revert: the stuck pod is replaced at once, nothing else restarts.
    kubectl.run(
        "patch", f"eventserver/{FLEET}", "--type=json", "-p",
        '[{"op":"remove","path":"/spec/image"}]',
    )  # fmt: skip
    wait_for(
        lambda: (
            (s := kubectl.get("eventserver", FLEET)["status"])["updateRevision"] == good
            and s.get("currentRevision") == good
            and s.get("updatedReplicas") == 3
            and condition(kubectl.get("eventserver", FLEET), "Ready").get("status") == "True"
        ),
        timeout=600,
        what="the rollout reverted and Ready",
    )
    es = kubectl.get("eventserver", FLEET)
    status = es["status"]
    assert (status["updateRevision"], status["currentRevision"], status["updatedReplicas"]) == (
        good,
        good,
        3,
    )
    assert condition(es, "Progressing")["reason"] == "RolloutComplete"
    assert (pods.container(0), pods.container(1)) == (containers[0], containers[1])
    assert kubectl.get("pod", f"{FLEET}-2")["spec"]["containers"][0]["image"] == good_image
    messages = restarted_events(kubectl, FLEET)
    assert any(BAD_IMAGE in m for m in messages), messages
    assert any("not ready" in m for m in messages), messages

    # A restart request replaces every pod, one at a time, highest ordinal first.
    containers = {i: pods.container(i) for i in range(3)}
    kubectl.run(
        "annotate", "--overwrite", f"eventserver/{FLEET}",
        "eventfleet.io/restart=2026-11-23T18:40:00Z",
    )  # fmt: skip
    wait_for(
        lambda: all(pods.container(i) not in (None, containers[i]) for i in range(3)),
        timeout=600,
        what="every pod replaced",
    )
    wait_condition(kubectl, FLEET, "Ready")
    messages = [
        m for m in restarted_events(kubectl, FLEET) if "restart=" in m and "2026-11-23T18:40" in m
    ]
    order = [m.split(f"pod {FLEET}-")[1][0] for m in messages]
    assert order == ["2", "1", "0"], messages


def test_deleting_with_retain_keeps_the_claims_and_the_users_token_secrets(
    kubectl, operator_release, tmp_path: pathlib.Path
):
    """``whenDeleted: Retain``: the EventServer's children go, its volume claims and the
    Secrets the user gave stay. (Generated Secrets going with the fleet:
    e2e/test_operator.py's cleanup test and the unit tests.)"""
    for name, token in (("keep-client", "client-secret\n"), ("keep-peers", "peer-secret\n")):
        kubectl.run("create", "secret", "generic", name, f"--from-literal=token={token}")
    kubectl.apply(
        eventserver(
            "keep",
            2,
            token={"secretRef": {"name": "keep-client"}},
            peerToken={"secretRef": {"name": "keep-peers"}},
            storage={"retentionPolicy": {"whenDeleted": "Retain"}},
        )
    )
    keep = Replicas(kubectl, "keep", tmp_path)
    wait_condition(kubectl, "keep", "Ready")
    register(keep, 0, 3)
    claims = {"data-keep-0", "data-keep-1"}
    listed = {c["metadata"]["name"] for c in kubectl.json("get", "pvc")["items"]}
    assert claims <= listed and not {c for c in listed if c.startswith("data-keep-")} - claims
    assert kubectl.get("secret", "keep-token") is None  # the user's Secrets are used
    assert kubectl.get("secret", "keep-peer-token") is None

    kubectl.run("delete", "eventserver", "keep", "--timeout=120s", timeout=130)
    wait_for(lambda: keep.pod(0) is None and keep.pod(1) is None, timeout=180, what="the pods gone")
    for kind, name in (
        ("statefulset", "keep"),
        ("service", "keep"),
        ("service", "keep-peers"),
        ("configmap", "keep-config"),
    ):
        assert kubectl.get(kind, name) is None, (kind, name)
    # Kept: every claim (the data) and the user's Secrets, untouched.
    time.sleep(3)  # a deletion of the claims would follow the pods at once
    listed = {c["metadata"]["name"] for c in kubectl.json("get", "pvc")["items"]}
    assert claims <= listed
    for name in claims:
        assert not kubectl.get("pvc", name)["metadata"].get("deletionTimestamp"), name
    for name, token in (("keep-client", "client-secret\n"), ("keep-peers", "peer-secret\n")):
        secret = kubectl.get("secret", name)
        assert secret is not None, name
        assert base64.b64decode(secret["data"]["token"]).decode() == token


def test_fields_the_operator_stops_setting_are_removed(kubectl, operator_release):
    optional = {
        "podLabels": {"team": "events"},
        "podAnnotations": {"example.com/owner": "events"},
        "priorityClassName": "high",
        "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"disktype": "ssd"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    }
    kubectl.apply(eventserver("rm", 1, **optional))

    def template() -> dict:
        return kubectl.get("statefulset", "rm")["spec"]["template"]

    def rendered():
        t = template()
        return (
            t["metadata"]["labels"].get("team") == "events"
            and t["spec"].get("priorityClassName") == "high"
            and t["spec"]["containers"][0].get("resources", {}).get("limits")
        )

    wait_for(rendered, timeout=60, what="the optional fields on the StatefulSet")
    kubectl.apply(eventserver("rm", 1))  # kubectl apply drops every field left out

    def left() -> list[str]:
        t = template()
        spec, container = t["spec"], t["spec"]["containers"][0]
        return [
            name
            for name, present in (
                ("podLabels", "team" in t["metadata"]["labels"]),
                ("podAnnotations", "example.com/owner" in t["metadata"]["annotations"]),
                ("priorityClassName", "priorityClassName" in spec),
                ("nodeSelector", "nodeSelector" in spec),
                ("tolerations", "tolerations" in spec),
                # A real API server always shows the (struct) field, empty when unset.
                ("resources", bool(container.get("resources"))),
            )
            if present
        ]

    try:
        wait_for(lambda: not left(), timeout=60, what="the removed fields to leave the StatefulSet")
    except TimeoutError as e:
        out = kubectl.run("get", "statefulset", "rm", "-o", "json", "--show-managed-fields")
        managers = [
            (m.get("manager"), m.get("operation"))
            for m in json.loads(out.stdout)["metadata"].get("managedFields", [])
        ]
        raise AssertionError(f"{e}: still there: {left()}; field managers: {managers}") from None
    ready = condition(kubectl.get("eventserver", "rm"), "Ready")
    assert ready.get("reason") != "ApplyFailed", ready
    kubectl.run("delete", "eventserver", "rm", "--timeout=120s", timeout=130)


def test_a_foreign_object_is_never_adopted_and_the_fleet_gets_a_network_policy(
    kubectl, operator_release
):
    theirs = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "owned-config", "labels": {"app": "someone-else"}},
        "data": {"config.yaml": "theirs: true\n"},
    }
    kubectl.apply(theirs)
    before = kubectl.get("configmap", "owned-config")
    kubectl.apply(eventserver("owned", 1))

    def refused():
        ready = condition(kubectl.get("eventserver", "owned"), "Ready")
        return ready.get("reason") == "ChildNotOwned" and ready

    ready = wait_for(refused, timeout=60, what="Ready=False/ChildNotOwned")
    assert "ConfigMap owned-config" in ready["message"]
    assert kubectl.get("eventserver", "owned")["status"]["phase"] == "Failed"
    time.sleep(5)  # more passes (resync 2 s): still nothing written
    after = kubectl.get("configmap", "owned-config")
    assert after["data"] == before["data"] and "ownerReferences" not in after["metadata"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert kubectl.get("statefulset", "owned") is None
    assert kubectl.get("secret", "owned-token") is None
    events = kubectl.json("get", "events", "--field-selector", "involvedObject.name=owned")
    assert any(
        e["reason"] == "ChildNotOwned" and e["type"] == "Warning" for e in events["items"]
    ), events

    # Once their object is gone the fleet is built, NetworkPolicy included.
    kubectl.run("delete", "configmap", "owned-config")
    wait_for(lambda: kubectl.get("statefulset", "owned"), timeout=60, what="the StatefulSet")
    policy = wait_for(
        lambda: kubectl.get("networkpolicy", "owned"), timeout=60, what="the NetworkPolicy"
    )
    kubernetes_validate.validate(strip_server_fields(policy), "1.33.0", strict=True)
    syncer = next(
        r for r in policy["spec"]["ingress"] if r["ports"] == [{"protocol": "TCP", "port": 23013}]
    )
    assert syncer["from"] == [
        {"podSelector": {"matchLabels": policy["spec"]["podSelector"]["matchLabels"]}}
    ]

    # Turning it off deletes it; deleting the EventServer leaves a foreign object alone.
    kubectl.run(
        "patch", "eventserver/owned", "--type=merge", "-p",
        '{"spec":{"networkPolicy":{"enabled":false}}}',
    )  # fmt: skip
    wait_for(lambda: kubectl.get("networkpolicy", "owned") is None, timeout=60, what="no policy")
    # Paused, so that the operator does not recreate its Service before theirs exists.
    kubectl.run("annotate", "eventserver/owned", "eventfleet.io/reconcile=paused")
    wait_condition(kubectl, "owned", "ReconcilePaused", 60)
    kubectl.run("delete", "service", "owned-peers")
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "owned-peers"},
         "spec": {"ports": [{"port": 1}]}}
    )  # fmt: skip
    kubectl.run("delete", "eventserver", "owned", "--timeout=120s", timeout=130)
    assert kubectl.get("statefulset", "owned") is None
    assert kubectl.get("service", "owned-peers") is not None
    kubectl.run("delete", "service", "owned-peers")


def test_growing_the_volumes_on_the_real_api_server(kubectl, operator_release, tmp_path):
    """Volume growth with the real API server's resize admission (a claim may grow only
    when bound and its StorageClass allows expansion), the real PV controller binding the
    volumes the cluster's provisioner made, and the real StatefulSet controller adopting
    the running pods into the recreated StatefulSet.

    The resize itself is the cluster provisioner's resizer (a hostPath volume has no size
    of its own: the PV's capacity, then the claim's ``status.capacity``). The class here
    is a second, expandable one of the same provisioner; the default class allows
    expansion too (the runbook's journey, e2e/test_docs_cluster.py)."""
    cls = f"expandable-{kubectl.namespace}"
    kubectl.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": cls},
            "provisioner": PROVISIONER_NAME,
            "allowVolumeExpansion": True,
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    )
    try:
        _grow(kubectl, cls, tmp_path)
    finally:
        kubectl.run("delete", "storageclass", cls, "--wait=false", check=False)


def _grow(kubectl: ClusterKubectl, cls: str, tmp_path: pathlib.Path) -> None:
    kubectl.apply(eventserver("grow", 2, storage={"size": "1Gi", "storageClassName": cls}))
    grow = Replicas(kubectl, "grow", tmp_path)
    wait_condition(kubectl, "grow", "Ready")
    for i in (0, 1):
        wait_for(
            lambda i=i: (
                (kubectl.get("persistentvolumeclaim", f"data-grow-{i}") or {})
                .get("status", {})
                .get("phase")
                == "Bound"
            ),
            timeout=120,
            what=f"claim data-grow-{i} bound by the PV controller",
        )
    register(grow, 0, 2)
    containers = {i: grow.container(i) for i in (0, 1)}
    sts_uid = kubectl.get("statefulset", "grow")["metadata"]["uid"]

    kubectl.run(
        "patch", "eventserver/grow", "--type=merge", "-p", '{"spec":{"storage":{"size":"3Gi"}}}'
    )

    def resized():
        c = condition(kubectl.get("eventserver", "grow"), "StorageResizing")
        return c.get("reason") == "Resized" and c

    wait_for(resized, timeout=300, what="StorageResizing=False/Resized")
    for i in (0, 1):
        claim = kubectl.get("persistentvolumeclaim", f"data-grow-{i}")
        assert claim["spec"]["resources"]["requests"]["storage"] == "3Gi"
        assert claim["status"]["capacity"]["storage"] == "3Gi"
        volume = kubectl.get("persistentvolume", claim["spec"]["volumeName"])
        assert volume["spec"]["capacity"]["storage"] == "3Gi"
    sts = wait_for(
        lambda: (s := kubectl.get("statefulset", "grow")) and s["metadata"]["uid"] != sts_uid and s,
        timeout=120,
        what="the StatefulSet recreated (orphan) with the new template",
    )
    template = sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]
    assert template["storage"] == "3Gi"
    assert {i: grow.container(i) for i in (0, 1)} == containers  # the pods kept running
    assert grow.restarts == {}
    wait_condition(kubectl, "grow", "Ready")
    # The running pods now belong to the new StatefulSet (its controller adopted them).
    for i in (0, 1):
        owner = kubectl.get("pod", f"grow-{i}")["metadata"]["ownerReferences"][0]
        assert owner["uid"] == sts["metadata"]["uid"]

    # Shrinking: refused by the CRD's CEL rule on the real API server.
    shrink = kubectl.run(
        "patch", "eventserver/grow", "--type=merge", "-p", '{"spec":{"storage":{"size":"2Gi"}}}',
        check=False,
    )  # fmt: skip
    assert shrink.returncode != 0 and "never shrink" in (shrink.stderr + shrink.stdout), shrink
    kubectl.run("delete", "eventserver", "grow", "--timeout=120s", timeout=130)


def test_every_request_of_the_operator_was_allowed_by_the_charts_rbac(real_cluster, kubectl):
    """Last: the API server's audit log of every request the operator's ServiceAccount
    made in this module (claims, pods, NetworkPolicies, Events...), none refused — except
    the transient refusals of a seconds-old CRD, which the operator retries at once."""
    (pod,) = kubectl.json(
        "get", "pods", "-l", "app.kubernetes.io/name=eventfleet-operator"
    )["items"]  # fmt: skip
    user = f"system:serviceaccount:{kubectl.namespace}:{pod['spec']['serviceAccountName']}"
    requests = [e for e in real_cluster.audit() if e["user"]["username"] == user]
    verbs = {(e["objectRef"]["resource"], e["verb"]) for e in requests if "objectRef" in e}
    # The day-2 paths really ran through this identity.
    assert {
        ("networkpolicies", "delete"),
        ("persistentvolumeclaims", "patch"),
        ("pods", "delete"),
        ("statefulsets", "patch"),
    } <= verbs, sorted(verbs)
    lasting = [
        (e["verb"], e["requestURI"], e["responseStatus"].get("message", ""))
        for e in requests
        if e["responseStatus"]["code"] == 403
        and "cannot find RESTMapping" not in e["responseStatus"].get("message", "")
    ]
    assert lasting == [], f"requests the chart's RBAC forbade: {lasting}"
