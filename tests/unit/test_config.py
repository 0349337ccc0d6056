"""Configuration: schema validation with errors naming the key, precedence."""

from __future__ import annotations

import pytest
from eventfleet_server import config


def test_defaults_are_valid():
    conf = config.load(None, environ={})
    assert conf["eventer"]["port"] == 23012
    assert conf["server_id"] == 1


def test_file_env_and_flags_precedence(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server_id: 4\neventer:\n  port: 1234\n")
    conf = config.load(
        path, environ={"EVENTFLEET_POD_NAME": "fleet-2"}, overrides={"eventer": {"port": 999}}
    )
    assert conf["server_id"] == 3  # pod ordinal 2 -> server id 3
    assert conf["eventer"]["port"] == 999
    assert conf["eventer"]["max_results_cap"] == 10_000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server_id: 0\n", "server_id"),
        ("eventer:\n  port: 70000\n", "eventer.port"),
        ("storage:\n  synchronous: SOMETIMES\n", "storage.synchronous"),
        ("unknown_key: 1\n", "unknown_key"),
        ("peers:\n  - name: a\n    host: h\n    port: 1\n", "server_id"),
        ("- a list\n", "mapping"),
        ("a: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match=message.replace(".", r"\.")):
        config.load(path, environ={})


def test_bad_pod_name():
    with pytest.raises(config.ConfigError, match="EVENTFLEET_POD_NAME"):
        config.load(None, environ={"EVENTFLEET_POD_NAME": "nope"})


def test_token_sources(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("abc\n")
    conf = config.load(None, environ={}, overrides={"token_file": str(token_file)})
    assert config.read_token(conf, environ={}) == "abc"
    assert config.read_token(conf, environ={"EVENTFLEET_TOKEN": "env"}) == "env"
    token_file.write_text("")
    with pytest.raises(config.ConfigError, match="empty"):
        config.read_token(conf, environ={})


def test_bus_section_comes_from_its_fragment_with_defaults(tmp_path):
    bus = config.load(None, environ={})["bus"]
    assert bus["enabled"] is True and bus["port"] == 23030
    assert bus["integer_encoding"] == "reference"
    path = tmp_path / "bus.yaml"
    path.write_text("bus:\n  port: 24030\n  integer_encoding: rfc\n")
    loaded = config.load(path, environ={})["bus"]
    assert (loaded["port"], loaded["integer_encoding"], loaded["pub_hwm"]) == (24030, "rfc", 100000)
    path.write_text("bus:\n  integer_encoding: decimal\n")
    with pytest.raises(config.ConfigError, match=r"bus.integer_encoding"):
        config.load(path, environ={})
    path.write_text("bus:\n  port: 65535\n")  # P+2 must be a port too
    with pytest.raises(config.ConfigError, match=r"bus.port"):
        config.load(path, environ={})
