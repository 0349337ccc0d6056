"""Operator options: CLI, environment, and the kopf-run module."""

from __future__ import annotations

import argparse

import pytest
from eventfleet_operator import cli
from eventfleet_operator.config import ConfigError, OperatorConfig
from eventfleet_operator.reconcilers.children import is_subset


def parse(argv):
    return cli.add_arguments(argparse.ArgumentParser()).parse_args(argv)


def test_cli_options():
    args = parse(["-n", "a", "--namespace", "b", "--resync-seconds", "5", "--log-format", "json"])
    assert args.namespaces == ["a", "b"]
    assert args.resync_seconds == 5
    assert args.all_namespaces is None
    assert parse(["-A"]).all_namespaces is True
    with pytest.raises(SystemExit):
        parse(["-A", "-n", "x"])


def test_env_and_overrides():
    env = {
        "EVENTFLEET_OPERATOR_NAMESPACES": "a, b",
        "EVENTFLEET_OPERATOR_RESYNC_SECONDS": "7",
        "EVENTFLEET_OPERATOR_REPLICA_URLS_FILE": "/tmp/x.json",
    }
    cfg = OperatorConfig.from_env(env)
    assert cfg.namespaces == ("a", "b")
    assert cfg.resync_seconds == 7
    assert cfg.replica_urls_file == "/tmp/x.json"
    assert OperatorConfig.from_env(env, resync_seconds=2.0).resync_seconds == 2.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EVENTFLEET_OPERATOR_RESYNC_SECONDS": "soon"}, "EVENTFLEET_OPERATOR_RESYNC_SECONDS"),
        ({"EVENTFLEET_OPERATOR_REPLICA_URL_TEMPLATE": "http://x:{port}"}, "replica-url-template"),
        (
            {"EVENTFLEET_OPERATOR_NAMESPACES": "a", "EVENTFLEET_OPERATOR_ALL_NAMESPACES": "1"},
            "exclude",
        ),
    ],
)
def test_bad_settings_name_the_option(env, message):
    with pytest.raises(ConfigError, match=message):
        OperatorConfig.from_env(env)


def test_main_requires_a_scope(capsys, monkeypatch):
    monkeypatch.delenv("EVENTFLEET_OPERATOR_NAMESPACES", raising=False)
    monkeypatch.delenv("EVENTFLEET_OPERATOR_ALL_NAMESPACES", raising=False)
    assert cli.main([]) == 2
    assert "--namespace" in capsys.readouterr().err


def test_is_subset_tolerates_server_defaults():
    desired = {"spec": {"ports": [{"port": 1}], "type": "ClusterIP"}}
    live = {
        "spec": {"ports": [{"port": 1, "protocol": "TCP"}], "type": "ClusterIP", "clusterIP": "1"}
    }
    assert is_subset(desired, live)
    assert not is_subset({"spec": {"ports": [{"port": 1}, {"port": 2}]}}, live)
    assert not is_subset({"spec": {"type": "NodePort"}}, live)


def test_quiet_resync_drops_only_the_timer_success_line():
    import logging

    from eventfleet_operator.handlers import QuietResync

    def record(message, level=logging.INFO):
        return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)

    quiet = QuietResync()
    assert not quiet.filter(record("Timer 'resync' succeeded."))
    assert not quiet.filter(record("Timer 'follow-up' succeeded."))
    assert quiet.filter(
        record("Timer 'resync' failed with an exception. Will retry.", logging.ERROR)
    )
    assert quiet.filter(record("created StatefulSet demo"))
