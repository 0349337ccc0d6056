"""`helm test`: the hook objects, and the check script they run.

The script (files/helm-test.py) is taken from the rendered pod's command, so what is
tested is what ships. It is run against a stand-in API server and operator health
endpoint on loopback (no cluster runs in the unit suite); the stand-in answers the
three requests the script makes, with the documents the API server returns for them.
"""

from __future__ import annotations

import http.server
import json
import pathlib
import subprocess
import sys
import threading
import urllib.parse

import kubernetes_validate
import pytest
import yaml

from tests.unit.chart.chartlib import KUBE_VERSION, REPO, one, render


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("helm-home")


@pytest.fixture(scope="module")
def hooks(home):
    installed = render(home)
    with_tests = render(home, tests=True)
    return [d for d in with_tests if d not in installed], installed


def test_hooks_are_test_hooks_and_valid_kubernetes(hooks):
    tests, installed = hooks
    assert sorted(d["kind"] for d in tests) == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    for doc in tests:
        assert doc["metadata"]["annotations"]["helm.sh/hook"] == "test"
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    # Installing the chart creates none of them.
    assert not any(
        (d.get("metadata", {}).get("annotations") or {}).get("helm.sh/hook") for d in installed
    )


def _env(pod):
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def _selector_matches(selector: str, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (p.split("=", 1) for p in selector.split(",")))


def test_pod_checks_the_operator_the_chart_installs(hooks):
    tests, installed = hooks
    pod = one(tests, "Pod")
    env = _env(pod)
    deployment = one(installed, "Deployment")
    assert env["OPERATOR_DEPLOYMENT"] == deployment["metadata"]["name"]
    template = deployment["spec"]["template"]
    assert _selector_matches(env["OPERATOR_SELECTOR"], template["metadata"]["labels"])
    # ... and not the test pod itself, which would then probe its own /healthz.
    assert not _selector_matches(env["OPERATOR_SELECTOR"], pod["metadata"]["labels"])
    (operator,) = template["spec"]["containers"]
    assert f"--liveness=http://0.0.0.0:{env['OPERATOR_HEALTH_PORT']}/healthz" in operator["args"]
    assert pod["spec"]["containers"][0]["image"] == operator["image"]  # the project's image
    plurals = sorted(
        yaml.safe_load(p.read_text())["spec"]["names"]["plural"]
        for p in (REPO / "crds").glob("*.yaml")
    )
    assert sorted(env["CRD_RESOURCES"].split(",")) == plurals
    # Restricted like the operator: non-root, read-only root, no capabilities.
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # Its own account, bound to a Role that reads only what the script reads.
    assert pod["spec"]["serviceAccountName"] == one(tests, "ServiceAccount")["metadata"]["name"]
    binding = one(tests, "RoleBinding")
    assert binding["subjects"][0]["name"] == pod["spec"]["serviceAccountName"]
    assert one(tests, "Role")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
    ]


class StandIn:
    """The API server's answers to the script's three requests, and the operator's /healthz."""

    def __init__(self, tmp: pathlib.Path):
        self.served = ["eventservers", "eventserverbackups"]
        self.available = 1
        self.healthy = True
        self.terminating = False  # an old operator pod, being deleted, listed first
        self.requests: list[str] = []
        self.sa_dir = tmp / "sa"
        self.sa_dir.mkdir()
        (self.sa_dir / "token").write_text("test-token\n")
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stand_in.requests.append(self.path)
                status, body = stand_in.answer(self.path, self.headers.get("Authorization"))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, auth: str | None):
        url = urllib.parse.urlsplit(path)
        if url.path == "/healthz":
            return (200, {}) if self.healthy else (500, {"status": "failing"})
        if auth != "Bearer test-token":
            return 401, {"kind": "Status", "code": 401}
        if url.path == "/apis/eventfleet.io/v1":
            resources = [{"name": n, "namespaced": True} for n in self.served]
            return 200, {"kind": "APIResourceList", "resources": resources}
        deployments = "/apis/apps/v1/namespaces/eventfleet-system/deployments"
        if url.path == f"{deployments}/ef-eventfleet-operator":
            status = {"availableReplicas": self.available} if self.available else {}
            return 200, {"spec": {"replicas": 1}, "status": status}
        if url.path == "/api/v1/namespaces/eventfleet-system/pods":
            selector = urllib.parse.parse_qs(url.query)["labelSelector"][0]
            assert "app.kubernetes.io/component=operator" in selector
            pod = {
                "metadata": {"name": "ef-eventfleet-operator-abc"},
                "status": {"phase": "Running", "podIP": "127.0.0.1"},
            }
            items = [pod]
            if self.terminating:
                # Its network is gone: nothing answers on 127.0.0.2 (refused at once).
                old = {
                    "metadata": {
                        "name": "ef-eventfleet-operator-old",
                        "deletionTimestamp": "2026-11-30T02:48:00Z",
                    },
                    "status": {"phase": "Running", "podIP": "127.0.0.2"},
                }
                items = [old, pod]
            return 200, {"kind": "PodList", "items": items}
        return 404, {"kind": "Status", "code": 404}

    def run(self, pod) -> subprocess.CompletedProcess:
        command = pod["spec"]["containers"][0]["command"]
        assert command[:2] == ["python", "-c"]
        env = {
            **_env(pod),
            "OPERATOR_HEALTH_PORT": str(self.port),  # the stand-in serves /healthz too
            "KUBERNETES_API": f"http://127.0.0.1:{self.port}",
            "SERVICEACCOUNT_DIR": str(self.sa_dir),
        }
        return subprocess.run(
            [sys.executable, "-c", command[2]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in(tmp_path):
    s = StandIn(tmp_path)
    yield s
    s.close()


def test_script_passes_when_everything_answers(hooks, stand_in):
    proc = stand_in.run(one(hooks[0], "Pod"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "ok: eventfleet.io/v1 serves eventservers, eventserverbackups",
        "ok: deployment ef-eventfleet-operator has 1 of 1 pods available",
        f"ok: operator pod ef-eventfleet-operator-abc answers "
        f"http://127.0.0.1:{stand_in.port}/healthz",
    ]
    assert stand_in.requests[-1] == "/healthz"


def test_script_leaves_out_a_pod_being_deleted(hooks, stand_in):
    # Right after an upgrade or a reinstall the old pod still reads Running (seen on the
    # real cluster: its /healthz gave "No route to host" and the test failed).
    stand_in.terminating = True
    proc = stand_in.run(one(hooks[0], "Pod"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "skipped: operator pod ef-eventfleet-operator-old is being deleted" in lines
    assert lines[-1].startswith("ok: operator pod ef-eventfleet-operator-abc answers")


@pytest.mark.parametrize(
    ("break_it", "expected"),
    [
        (
            lambda s: setattr(s, "served", ["eventservers"]),
            "FAIL: the API server does not serve eventserverbackups (eventfleet.io/v1)",
        ),
        (
            lambda s: setattr(s, "served", []),
            "FAIL: the API server does not serve eventservers, eventserverbackups",
        ),
        (
            lambda s: setattr(s, "available", 0),
            "FAIL: deployment ef-eventfleet-operator: 0 of 1 operator pods available",
        ),
        (
            lambda s: setattr(s, "healthy", False),
            "FAIL: operator pod ef-eventfleet-operator-abc does not answer",
        ),
    ],
)
def test_script_fails_with_one_line_naming_the_problem(hooks, stand_in, break_it, expected):
    break_it(stand_in)
    proc = stand_in.run(one(hooks[0], "Pod"))
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1].startswith(expected), proc.stdout
    assert "Traceback" not in proc.stderr
