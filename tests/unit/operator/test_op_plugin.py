"""The kubectl plugin's commands against a recording stand-in for the API."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml
from eventfleet_operator import plugin

ES = {
    "apiVersion": "eventfleet.io/v1",
    "kind": "EventServer",
    "metadata": {"name": "demo", "namespace": "ns", "generation": 3, "annotations": {}},
    "spec": {"replicas": 2},
    "status": {
        "observedGeneration": 3,
        "phase": "Running",
        "readyReplicas": 2,
        "statefulSetReplicas": 2,
        "currentRevision": "abc",
        "updateRevision": "abc",
        "updatedReplicas": 2,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "2 of 2"},
            {"type": "PeersSynced", "status": "True", "reason": "AllPeersSynced", "message": ""},
        ],
        "peers": [
            {"name": "demo-0", "serverId": 1, "ready": True, "syncState": "synced",
             "lastEventId": {"server": 1, "session": 2, "instance": 40}, "lagEvents": 0,
             "lagSeconds": 0.0, "events": 75},
            {"name": "demo-1", "serverId": 2, "ready": False, "syncState": "syncing",
             "lastEventId": None, "lagEvents": 12, "lagSeconds": 1.5, "events": 63},
        ],
    },
}  # fmt: skip


class FakeApi:
    def __init__(self, es):
        self.es = json.loads(json.dumps(es))
        self.patches = []
        self.default_namespace = "ns"

    def get(self, namespace, name):
        if name != self.es["metadata"]["name"]:
            raise plugin.PluginError(f'eventserver "{name}" not found in namespace "{namespace}"')
        return json.loads(json.dumps(self.es))

    def patch(self, namespace, name, body):
        self.patches.append(body)
        return self.es


def run(api, *argv):
    args = plugin.parser().parse_args(list(argv))
    args.namespace = args.namespace or api.default_namespace
    return plugin.COMMANDS[args.command][0](api, args)


def test_status_table_shows_fleet_conditions_and_every_peer():
    text = run(FakeApi(ES), "status", "demo")
    lines = text.splitlines()
    assert lines[0] == "EventServer ns/demo: Running"
    assert "2/2 ready, StatefulSet at 2" in lines[1]
    assert "2 on abc (current abc, strategy Managed)" in lines[2]
    assert any(line.split()[:4] == ["Ready", "True", "AllReplicasReady", "2"] for line in lines)
    peer = next(line for line in lines if line.startswith("demo-1"))
    assert peer.split() == ["demo-1", "2", "no", "syncing", "-", "12", "1.5", "63"]
    assert next(line for line in lines if line.startswith("demo-0")).split()[4] == "1/2/40"


def test_status_json_and_flags():
    es = json.loads(json.dumps(ES))
    es["metadata"]["annotations"]["eventfleet.io/reconcile"] = "paused"
    es["spec"]["hibernate"] = True
    es["metadata"]["generation"] = 4
    out = json.loads(run(FakeApi(es), "status", "demo", "-o", "json"))
    assert (out["paused"], out["hibernate"], out["replicas"]) == (True, True, 2)
    assert [p["name"] for p in out["peers"]] == ["demo-0", "demo-1"]
    text = run(FakeApi(es), "status", "demo")
    assert "(paused, hibernate)" in text.splitlines()[0]
    assert "generation 3, the spec is at 4" in text


@pytest.mark.parametrize(
    ("command", "patch"),
    [
        ("pause", {"metadata": {"annotations": {"eventfleet.io/reconcile": "paused"}}}),
        ("resume", {"metadata": {"annotations": {"eventfleet.io/reconcile": None}}}),
        ("hibernate", {"spec": {"hibernate": True}}),
        ("wake", {"spec": {"hibernate": False}}),
    ],
)
def test_commands_patch_the_eventserver_only(command, patch):
    api = FakeApi(ES)
    run(api, command, "demo")
    assert api.patches == [patch]


def test_restart_sets_a_new_restart_value():
    api = FakeApi(ES)
    run(api, "restart", "demo")
    (patch,) = api.patches
    assert patch["metadata"]["annotations"]["eventfleet.io/restart"].endswith("Z")


def test_flush_waits_for_the_operators_answer_to_its_own_request():
    api = FakeApi(ES)

    def patch(namespace, name, body):
        token = body["metadata"]["annotations"]["eventfleet.io/flush"]
        api.es["status"]["lastFlush"] = {"requested": token, "result": "Verified", "message": "ok"}

    api.patch = patch
    assert "flushed: ok" in run(api, "flush", "demo", "--timeout", "5")
    api.es["status"]["lastFlush"] = {"requested": "x"}

    def failing(namespace, name, body):
        token = body["metadata"]["annotations"]["eventfleet.io/flush"]
        api.es["status"]["lastFlush"] = {
            "requested": token,
            "result": "FlushFailed",
            "message": "demo-1 unreachable",
        }

    api.patch = failing
    with pytest.raises(plugin.PluginError, match="FlushFailed: demo-1 unreachable"):
        run(api, "flush", "demo", "--timeout", "5")


def test_flush_times_out_without_an_operator():
    with pytest.raises(plugin.PluginError, match="no answer from the operator"):
        run(FakeApi(ES), "flush", "demo", "--timeout", "0.6")


def test_unknown_eventserver_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setattr(plugin, "Api", lambda *a: FakeApi(ES))
    assert plugin.main(["-n", "ns", "status", "nope"]) == 1
    assert 'eventserver "nope" not found in namespace "ns"' in capsys.readouterr().err


def test_backup_creates_an_on_demand_eventserverbackup_and_waits_for_it():
    es = json.loads(json.dumps(ES))
    es["spec"]["backup"] = {"s3": {"bucket": "bkt"}}
    api = FakeApi(es)
    created = []

    def create_backup(namespace, body):
        created.append(body)
        return body

    def get_backup(namespace, name):
        status = {
            "phase": "Completed",
            "replica": "demo-1",
            "bucket": "bkt",
            "objectKey": f"ns/demo/{name}.sqlite",
            "digest": {"events": 75, "size": 4096, "sha256": "ab" * 32},
        }
        return {**created[-1], "status": status}

    api.create_backup, api.get_backup = create_backup, get_backup
    out = run(api, "backup", "demo", "--wait", "--backup-name", "b1", "--timeout", "5")
    (obj,) = created
    assert obj["kind"] == "EventServerBackup" and obj["spec"] == {"eventServer": "demo"}
    assert obj["metadata"]["labels"]["eventfleet.io/scheduled"] == "false"
    assert "b1 completed from demo-1: 75 events" in out and "s3://bkt/ns/demo/b1.sqlite" in out
    assert api.patches == []  # the EventServer itself is not touched


def test_backup_of_a_fleet_without_spec_backup_is_refused():
    with pytest.raises(plugin.PluginError, match=r"no spec\.backup"):
        run(FakeApi(ES), "backup", "demo")


# ---------------------------------------------------------------- first contact


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "prod", "status", "demo"],
        ["status", "demo", "-n", "prod"],
        ["status", "-n", "prod", "demo"],
        ["--namespace", "prod", "status", "demo", "-o", "json"],
        ["status", "demo", "--namespace=prod"],
    ],
)
def test_namespace_is_accepted_in_any_position(argv):
    args = plugin.parser().parse_args(argv)
    assert (args.namespace, args.name) == ("prod", "demo")


def test_options_after_the_command_win_and_absent_ones_keep_the_earlier_value():
    args = plugin.parser().parse_args(["--context", "c1", "-n", "a", "flush", "demo", "-n", "b"])
    assert (args.context, args.namespace, args.kubeconfig) == ("c1", "b", None)
    assert plugin.parser().parse_args(["status", "demo"]).namespace is None


def test_backup_wait_prints_each_phase_as_it_changes(capsys):
    es = json.loads(json.dumps(ES))
    es["spec"]["backup"] = {"s3": {"bucket": "bkt"}}
    api = FakeApi(es)
    answers = iter(
        [
            {},
            {"phase": "Pending", "attempts": 1, "error": "1: not ready"},
            {"phase": "Pending", "attempts": 1, "error": "1: not ready"},
            {"phase": "Running", "replica": "demo-1", "attempts": 2},
            {"phase": "Completed", "replica": "demo-1", "bucket": "bkt", "objectKey": "k",
             "digest": {"events": 1, "size": 1, "sha256": "00"}},
        ]
    )  # fmt: skip
    api.create_backup = lambda namespace, body: body
    api.get_backup = lambda namespace, name: {"status": next(answers)}
    out = run(api, "backup", "demo", "--wait", "--backup-name", "b1", "--timeout", "30")
    assert "b1 completed from demo-1" in out
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "eventserverbackup/b1 created; waiting up to 30 s"
    # One line per change (the repeated Pending answer adds none), as it happens.
    assert [line.split(": ", 1)[1] for line in err[1:]] == [
        "not picked up by the operator yet",
        "Pending attempt 1 (1: not ready)",
        "Running from demo-1 attempt 2",
        "Completed from demo-1",
    ]


def test_flush_says_at_once_what_it_waits_for(capsys):
    api = FakeApi(ES)

    def patch(namespace, name, body):
        token = body["metadata"]["annotations"]["eventfleet.io/flush"]
        api.es["status"]["lastFlush"] = {"requested": token, "result": "Verified", "message": "ok"}

    api.patch = patch
    run(api, "flush", "demo", "--timeout", "7")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("flush requested (eventfleet.io/flush=")
    assert line.endswith("waiting up to 7 s")


def _plugin(env_extra: dict, *argv: str, prelude: str = "") -> subprocess.CompletedProcess:
    """The real ``kubectl-eventfleet`` entry point in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "EVENTFLEET_"))}
    env.update(env_extra)
    code = f"{prelude}import sys; from eventfleet_operator import plugin; sys.exit(plugin.main())"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def test_no_kubeconfig_is_one_line_with_what_to_do(tmp_path):
    line = _one_line_error(
        _plugin({"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}, "status", "demo")
    )
    assert "no Kubernetes credentials" in line and "KUBECONFIG" in line


def test_a_kubeconfig_that_does_not_exist_is_named(tmp_path):
    missing = tmp_path / "kc.yaml"
    line = _one_line_error(
        _plugin({"HOME": str(tmp_path)}, "--kubeconfig", str(missing), "status", "demo")
    )
    assert f"--kubeconfig {missing}" in line


def test_an_unreachable_api_server_is_one_line_with_its_cause(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [
                        {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}
                    ],
                    "current-context": "x",
                }
            )
        )
        result = _plugin({"HOME": str(tmp_path), "KUBECONFIG": str(kubeconfig)}, "status", "demo")
    line = _one_line_error(result)
    assert f"cannot reach the Kubernetes API server https://127.0.0.1:{port}" in line
    assert "ConnectionRefusedError" in line or "Connection refused" in line, line
    assert "kubectl cluster-info" in line


def test_without_the_kubernetes_package_it_says_how_to_install_it(tmp_path):
    # A `None` entry in sys.modules is how Python spells "this module cannot be imported".
    prelude = "import sys; sys.modules['kubernetes'] = None; "
    result = _plugin({"HOME": str(tmp_path)}, "status", "demo", prelude=prelude)
    line = _one_line_error(result)
    assert "'kubernetes'" in line and "eventfleet[operator]" in line


def test_api_errors_tell_a_missing_object_from_a_missing_crd():
    from kubernetes.client import ApiException

    def error(status, body):
        e = ApiException(status=status, reason="Not Found")
        e.body = json.dumps(body)
        return e

    missing = error(404, {"message": 'eventservers.eventfleet.io "x" not found',
                          "details": {"name": "x", "kind": "eventservers"}})  # fmt: skip
    assert plugin._api_error(missing, "ns", "x") == 'eventserver "x" not found in namespace "ns"'
    no_crd = error(404, {"message": "the server could not find the requested resource"})
    assert "install the eventfleet CRDs" in plugin._api_error(no_crd, "ns", "x")
    forbidden = error(403, {"message": "eventservers is forbidden: User u cannot get"})
    assert "lacks the right" in plugin._api_error(forbidden, "ns", "x")
