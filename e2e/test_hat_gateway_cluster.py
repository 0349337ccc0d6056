"""The real hat-gateway 0.6.48 (PyPI) against a fleet the operator runs on the real
control plane: the EventServer admits token-less Eventer clients only from loopback
(``spec.clients``, the hat-compatible mode), the gateway connects to replica 0 (the
node agent runs pods on the host network, so the pod sees 127.0.0.1), a device
enabled through the CLI with the client token reports its status, and that status
reaches replica 1 over the Syncer mesh.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from e2e.k8s.harness import wait_for
from e2e.test_operator import eventserver
from tests.integration.test_hat_gateway import DEVICE, gateway_conf

pytest_plugins = ["e2e.k8s.cluster_fixtures"]
pytestmark = pytest.mark.timeout(300)


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
        timeout=20,
    )
    return out.stdout


def test_real_hat_gateway_in_hat_compatible_mode_on_kubernetes(
    kubectl, operator, kubelet, tmp_path
):
    clients = {"allowTokenless": True, "tokenlessNetworks": ["127.0.0.1/32"]}
    kubectl.apply(eventserver("hat", 2, clients=clients))
    pods = kubelet("hat")
    kubectl.run("wait", "--for=condition=Ready", "eventserver/hat", "--timeout=120s", timeout=130)
    host, port = pods.eventer(0).rsplit(":", 1)
    assert host == "127.0.0.1"
    conf = tmp_path / "gateway.yaml"
    conf.write_text(yaml.safe_dump(gateway_conf(int(port))))
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

        first = wait_for(lambda: status_on(0), timeout=60, what="the gateway's device status")
        assert first[0]["payload"]["json"] in ("CONNECTING", "CONNECTED", "DISCONNECTED")
        # Replicated to the other replica through the Syncer mesh.
        wait_for(lambda: status_on(1), timeout=60, what="the status on replica 1")
    finally:
        gw.terminate()
        try:
            gw.wait(10)
        except subprocess.TimeoutExpired:
            gw.kill()
        log.close()
