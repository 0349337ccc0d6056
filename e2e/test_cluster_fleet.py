"""The operator's production configuration on a real single-node cluster (e2e/cluster).

Installed as a user does — ``helm install`` of the chart into a namespace that enforces
the ``restricted`` Pod Security Standard — with the images scripts/tools/images.sh built,
imported into the cluster's containerd under the names the chart and the operator use by
default. Nothing of what the operator renders is rewritten: the replicas listen on every
interface of their pod, find their peers by DNS name through the headless peer Service,
serve the Event BUS, and the operator reaches them by its own URL template. Clients go
through the client Service, as the docs tell users to; kube-router enforces the
NetworkPolicy the operator writes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time
import uuid

import pytest
import yaml

from e2e.bus_client import BusClient, wait_live
from e2e.cluster.clients import ClusterKubectl
from e2e.cluster.images import project_image_ref
from e2e.cluster.layout import (
    CONTAINERD_SOCKET,
    PROVISIONER_NAME,
    ROOT,
    SERVICE_CIDR,
    STORAGE_CLASS,
)

pytest_plugins = ["e2e.cluster.fixtures"]

FLEET = "demo"
REPLICAS = 3
EVENTER, BUS, HTTP = 23012, 23030, 23080
WAIT = 300  # seconds; every wait below is bounded by this
HTTP_ALLOWED = {"eventfleet.io/e2e-http": "allowed"}
EVENTFLEET = str(ROOT / ".venv" / "bin" / "eventfleet")


def wait_for(what: str, check, timeout: float = WAIT, on_timeout=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{on_timeout()}")
        time.sleep(1)


def conditions(k: ClusterKubectl) -> dict[str, str]:
    status = (k.get("eventserver", FLEET) or {}).get("status") or {}
    return {c["type"]: c["status"] for c in status.get("conditions", [])}


def diagnostics(k: ClusterKubectl) -> str:
    out = [
        k.run(
            "get", "eventserver,statefulset,pods,svc,networkpolicy,pvc", "-o", "wide", check=False
        ).stdout,
        k.run("get", "eventserver", FLEET, "-o", "jsonpath={.status}", check=False).stdout,
        k.run("logs", "deployment/ef-eventfleet-operator", "--tail=60", check=False).stdout,
        k.run("get", "events", "--sort-by=.lastTimestamp", check=False).stdout[-4000:],
    ]
    return "\n".join(out)


def client_pod(name: str, labels: dict[str, str]) -> dict:
    """A pod of the server image that only waits (the CLI is in it), within `restricted`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "e2e-client", **labels}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "client",
                    "image": project_image_ref("server"),
                    "command": ["sleep", "infinity"],
                    "env": [
                        {
                            "name": "EVENTFLEET_TOKEN",
                            "valueFrom": {
                                "secretKeyRef": {"name": f"{FLEET}-token", "key": "token"}
                            },
                        }
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def fleet(ckubectl: ClusterKubectl, operator_release: str, restricted_namespace: str) -> str:
    """An EventServer of three replicas with the Event BUS on, Ready and PeersSynced;
    HTTP admitted from pods labelled HTTP_ALLOWED besides the operator."""
    ckubectl.apply(
        {
            "apiVersion": "eventfleet.io/v1",
            "kind": "EventServer",
            "metadata": {"name": FLEET},
            "spec": {
                "replicas": REPLICAS,
                "protocols": {"bus": {"enabled": True}},
                # The CRD's minimum, not its 60 s default: the kubelet gives the hung
                # replica's SIGSTOPped process (test_a_hung_replica_...) the whole grace
                # period after the SIGTERM of its liveness kill before it sends SIGKILL.
                "terminationGracePeriodSeconds": 10,
                "networkPolicy": {
                    "http": {"from": [{"podSelector": {"matchLabels": HTTP_ALLOWED}}]}
                },
            },
        }
    )
    wait_for(
        "Ready=True and PeersSynced=True",
        lambda: (
            (c := conditions(ckubectl)).get("Ready") == "True" and c.get("PeersSynced") == "True"
        ),
        on_timeout=lambda: diagnostics(ckubectl),
    )
    for name, labels in (("outsider", {}), ("insider", HTTP_ALLOWED)):
        ckubectl.apply(client_pod(name, labels))
    ckubectl.run(
        "wait",
        "--for=condition=Ready",
        "pod/outsider",
        "pod/insider",
        f"--timeout={WAIT}s",
        timeout=WAIT + 10,
    )
    return FLEET


def in_pod(
    k: ClusterKubectl, pod: str, *argv: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return k.run("exec", pod, "--", *argv, check=check)


def test_replicas_sync_over_dns_names_with_the_rendered_configuration(
    ckubectl: ClusterKubectl, fleet: str, restricted_namespace: str
):
    ns = restricted_namespace
    # What the operator rendered is what runs: all interfaces, peers by DNS name, BUS on.
    config_map = ckubectl.get("configmap", f"{fleet}-config")
    (text,) = config_map["data"].values()
    config = yaml.safe_load(text)
    assert config["host"] == "0.0.0.0" and config["bus"]["enabled"] is True
    assert [p["host"] for p in config["peers"]] == [
        f"{fleet}-{i}.{fleet}-peers.{ns}.svc" for i in range(REPLICAS)
    ]
    # The pods run the operator's pod template unchanged, under `restricted`.
    statefulset = ckubectl.get("statefulset", fleet)
    for i in range(REPLICAS):
        pod = ckubectl.get("pod", f"{fleet}-{i}")
        assert (
            pod["spec"]["containers"][0]["image"]
            == statefulset["spec"]["template"]["spec"]["containers"][0]["image"]
        )
        assert pod["spec"]["nodeName"] and pod["status"]["podIP"].startswith("198.18.0.")
        probes = {k for k in pod["spec"]["containers"][0] if k.endswith("Probe")}
        assert probes == {"startupProbe", "livenessProbe", "readinessProbe"}

    # Each replica's volume: a claim of the default StorageClass, bound to a volume the
    # provisioner made.
    claims = json.loads(ckubectl.run("get", "pvc", "-o", "json").stdout)["items"]
    assert len(claims) == REPLICAS
    for claim in claims:
        assert claim["status"]["phase"] == "Bound"
        assert claim["spec"]["storageClassName"] == STORAGE_CLASS
        volume = ckubectl.get("pv", claim["spec"]["volumeName"])
        assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == (
            PROVISIONER_NAME
        )

    # A real client registers through the client Service (by its DNS name, from a pod)...
    event_type = f"e2e/cluster/{uuid.uuid4().hex[:8]}"
    registered = in_pod(
        ckubectl, "outsider", "eventfleet", "register", "--eventer", f"{fleet}.{ns}.svc:{EVENTER}",
        event_type, "--json", json.dumps({"value": 1}),
    )  # fmt: skip
    assert json.loads(registered.stdout)["payload"] == {"json": {"value": 1}}, registered.stdout

    # ... and reads it back from every replica, each by its own DNS name: the event went
    # to one of them and reached the others over Syncer.
    marker = event_type.rsplit("/", 1)[1]  # the CLI prints types as lists of segments
    seen: dict[int, str] = {}

    def everywhere() -> bool:
        for i in range(REPLICAS):
            proc = in_pod(
                ckubectl, "outsider", "eventfleet", "query", "--eventer",
                f"{fleet}-{i}.{fleet}-peers.{ns}.svc:{EVENTER}", "latest", event_type, check=False,
            )  # fmt: skip
            seen[i] = proc.stdout + proc.stderr
            if marker not in seen[i]:
                return False
        return True

    wait_for(f"{event_type} on every replica", everywhere, timeout=60, on_timeout=lambda: seen)


def test_event_bus_through_the_client_service(ckubectl: ClusterKubectl, fleet: str):
    """PUB and SUB through the client Service's ClusterIP (kube-proxy picks a replica per
    connection): what one replica's COLLECTOR takes is broadcast by whichever replica the
    subscriber reached, over Syncer when they differ."""
    service = ckubectl.get("service", fleet)
    ip = service["spec"]["clusterIP"]
    assert ip.startswith(SERVICE_CIDR.rsplit(".", 2)[0]), ip
    secret = ckubectl.get("secret", f"{fleet}-token")
    token = base64.b64decode(secret["data"]["token"]).decode().strip()

    async def exchange() -> None:
        async with (
            BusClient(BUS, host=ip, plain=("e2e", token)) as sub,
            BusClient(BUS, host=ip, plain=("e2e", token)) as pub,
        ):
            sub.subscribe("/e2e/")
            # Publishes probes until one comes back (raises TimeoutError if none does).
            await wait_live(sub, pub, f"/e2e/bus/{uuid.uuid4().hex[:8]}", timeout=60)

    asyncio.run(exchange())


def test_network_policy_refuses_outsiders_and_serves_allowed_pods(
    ckubectl: ClusterKubectl, fleet: str, restricted_namespace: str
):
    ns = restricted_namespace
    target = f"{fleet}-0.{fleet}-peers.{ns}.svc"
    probe = (
        "import socket, sys\n"
        "try:\n"
        "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
        "    print('open')\n"
        "except OSError as e:\n"
        "    print('closed', type(e).__name__, e)\n"
    )

    def reach(pod: str, port: int) -> str:
        return in_pod(ckubectl, pod, "python", "-c", probe, target, str(port)).stdout.strip()

    # The HTTP port (peer token endpoints, /metrics) admits the operator and the pods
    # named in spec.networkPolicy.http.from; the client ports admit everyone.
    wait_for("the insider served on HTTP", lambda: reach("insider", HTTP) == "open", timeout=60)
    wait_for(
        "the outsider refused on HTTP",
        lambda: reach("outsider", HTTP).startswith("closed"),
        timeout=60,
    )
    assert reach("outsider", EVENTER) == "open"
    # Syncer only from the fleet's own pods.
    assert reach("insider", 23013).startswith("closed")
    status = in_pod(
        ckubectl, "insider", "python", "-c",
        "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)",
        f"http://{target}:{HTTP}/healthz",
    ).stdout.strip()  # fmt: skip
    assert status == "200"


def test_the_chart_runs_the_operator_image_as_a_pod_within_its_rbac(
    real_cluster, ckubectl: ClusterKubectl, operator_release: str, fleet: str
):
    """The chart's Deployment as the kubelet runs it: the image the chart names by
    default, in-cluster credentials from the token the API server's admission added, and
    no request refused by the chart's RBAC (the audit log of the API server) — except
    the transient refusals of a seconds-old CRD, which the operator retries at once."""
    listed = ckubectl.run(
        "get", "pods", "-l", "app.kubernetes.io/name=eventfleet-operator", "-o", "json"
    )  # fmt: skip
    (pod,) = json.loads(listed.stdout)["items"]
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] and status["image"] == project_image_ref("operator")
    assert any("projected" in v for v in pod["spec"]["volumes"])
    log = ckubectl.run("logs", pod["metadata"]["name"]).stdout
    assert "in-cluster service account" in log, log[-2000:]

    user = f"system:serviceaccount:{ckubectl.namespace}:{pod['spec']['serviceAccountName']}"
    requests = [e for e in real_cluster.audit() if e["user"]["username"] == user]
    assert requests, "the audit log saw no request from the operator"
    refused = [e for e in requests if e["responseStatus"]["code"] == 403]
    lasting = [
        (e["verb"], e["requestURI"], e["responseStatus"].get("message", ""))
        for e in refused
        if "cannot find RESTMapping" not in e["responseStatus"].get("message", "")
    ]
    assert lasting == [], f"requests the chart's RBAC forbade: {lasting}"


def test_a_hung_replica_is_restarted_by_its_liveness_probe(ckubectl: ClusterKubectl, fleet: str):
    """SIGSTOP on a replica's process (a hang: it holds its sockets and answers nothing):
    the kubelet's liveness probe on /healthz fails, the container is killed and started
    again, and the fleet is whole again."""
    pod = f"{fleet}-2"
    before = ckubectl.get("pod", pod)["status"]["containerStatuses"][0]
    container = before["containerID"].removeprefix("containerd://")
    tasks = subprocess.run(
        ["ctr", "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io", "task", "ls"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    (pid,) = [int(line.split()[1]) for line in tasks.splitlines() if line.startswith(container)]
    os.kill(pid, signal.SIGSTOP)

    def restarted() -> dict | None:
        status = ckubectl.get("pod", pod)["status"]["containerStatuses"][0]
        done = status["restartCount"] > before["restartCount"] and status["ready"]
        return status if done else None

    status = wait_for(
        f"{pod} restarted and Ready", restarted, on_timeout=lambda: diagnostics(ckubectl)
    )
    assert status["lastState"]["terminated"]["exitCode"] == 137  # killed, not exited
    events = ckubectl.run(
        "get", "events", "--field-selector", f"involvedObject.name={pod}", "-o", "json"
    ).stdout  # fmt: skip
    unhealthy = [e["message"] for e in json.loads(events)["items"] if e["reason"] == "Unhealthy"]
    assert any(m.startswith("Liveness probe failed") for m in unhealthy), unhealthy
    wait_for(
        "PeersSynced=True again",
        lambda: conditions(ckubectl).get("PeersSynced") == "True",
        on_timeout=lambda: diagnostics(ckubectl),
    )
