"""The real hat-gateway 0.6.48 (PyPI) against a fleet the operator runs on the real
single-node cluster (the chart installed with ``helm install``): the EventServer admits
token-less Eventer clients only from the node's address (``spec.clients``, the
hat-compatible mode; the gateway runs on the host, which reaches the pods from the
bridge address 198.18.0.1), the gateway connects through the fleet's client Service
(its ClusterIP, routed by kube-proxy), a device enabled through the CLI with the client
token reports its status, and that status reaches every replica over the Syncer mesh.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from e2e.cluster.layout import NODE_IP
from e2e.cluster.replicas import Replicas
from e2e.operator_helpers import eventserver, wait_condition, wait_for
from tests.integration.test_hat_gateway import DEVICE, gateway_conf

pytest_plugins = ["e2e.cluster.fixtures"]
pytestmark = pytest.mark.timeout(600)


def cli(pods, ordinal: int, *args: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventfleet_cli",
            *args[:1],
            "--eventer",
            pods.eventer(ordinal),
            "--token-file",
            str(pods.token_file(ordinal)),
            *args[1:],
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout


def test_real_hat_gateway_in_hat_compatible_mode_on_kubernetes(
    ckubectl, operator_release, tmp_path
):
    kubectl = ckubectl
    clients = {"allowTokenless": True, "tokenlessNetworks": [f"{NODE_IP}/32"]}
    kubectl.apply(eventserver("hat", 2, clients=clients))
    pods = Replicas(kubectl, "hat", tmp_path / "replicas")
    wait_condition(kubectl, "hat", "Ready")
    # The client Service, as the docs tell Hat users to connect.
    service = kubectl.get("service", "hat")
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "eventer"]
    conf = tmp_path / "gateway.yaml"
    settings = gateway_conf(port)
    settings["event_server"]["eventer_server"]["host"] = service["spec"]["clusterIP"]
    conf.write_text(yaml.safe_dump(settings))
    log = open(tmp_path / "gateway.log", "w")
    gw = subprocess.Popen(
        [sys.executable, "-m", "hat.gateway", "--conf", str(conf)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # The gateway registers its own events on init; the client token is not needed.
        cli(pods, 0, "register", "/".join((*DEVICE, "system", "enable")), "--json", "true")
        status_type = "/".join((*DEVICE, "gateway", "status"))

        def status_on(ordinal):
            assert gw.poll() is None, (tmp_path / "gateway.log").read_text()[-2000:]
            lines = cli(pods, ordinal, "query", "latest", status_type).splitlines()
            return [json.loads(line) for line in lines if line.strip()] or None

        # The Service picked one replica for the gateway; the status reaches both (the
        # other one over the Syncer mesh).
        for ordinal in (0, 1):
            first = wait_for(
                lambda o=ordinal: status_on(o), timeout=120, what=f"the status on replica {ordinal}"
            )
            assert first[0]["payload"]["json"] in ("CONNECTING", "CONNECTED", "DISCONNECTED")
    finally:
        gw.terminate()
        try:
            gw.wait(10)
        except subprocess.TimeoutExpired:
            gw.kill()
        log.close()
