"""The local fleet's files: private directories, separate client and peer tokens, and
the hat-compatible Eventer setting limited to loopback (or off)."""

from __future__ import annotations

import shutil
import stat

import pytest
from eventfleet_server import config
from eventfleet_server.fleet import layout


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_prepare_makes_private_dirs_and_two_tokens(tmp_path):
    data = tmp_path / "fleet"
    data.mkdir(mode=0o755)
    fleet = layout.plan(2, data, base_port=40000)
    layout.prepare(fleet)
    assert mode(data) == 0o700
    assert all(mode(r.data_dir) == 0o700 for r in fleet.replicas)
    client, peer = fleet.token_file.read_text(), fleet.peer_token_file.read_text()
    assert client.strip() and peer.strip() and client != peer
    assert mode(fleet.token_file) == mode(fleet.peer_token_file) == 0o600
    conf = config.load(fleet.replicas[0].config_path, environ={})
    assert config.read_credentials(conf, environ={}) == ((client.strip(),), (peer.strip(),))
    assert conf["eventer"]["allow_tokenless_clients"] is True
    assert conf["eventer"]["tokenless_client_networks"] == ["127.0.0.0/8", "::1"]
    # A second run keeps the tokens (a resumed fleet).
    layout.prepare(layout.plan(2, data))
    assert fleet.token_file.read_text() == client


def test_require_client_token(tmp_path):
    fleet = layout.plan(1, tmp_path / "f", base_port=40000, tokenless_loopback=False)
    layout.prepare(fleet)
    conf = config.load(fleet.replicas[0].config_path, environ={})
    assert conf["eventer"]["allow_tokenless_clients"] is False


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_tls_fleet_gets_a_ca_and_a_certificate_per_replica(tmp_path):
    fleet = layout.plan(2, tmp_path / "f", base_port=40000, tls=True)
    layout.prepare(fleet)
    conf = config.load(fleet.replicas[1].config_path, environ={})
    settings = config.build(config.ReplicaConfig, conf).tls.settings()
    assert settings.cert_file.endswith("replica-2.pem")
    # The files work: server and mutual-TLS client contexts load them.
    settings.server_context(client_certificates=True)
    settings.peer_client_context()
    assert mode(fleet.tls_dir / "ca.key") == 0o600 and mode(fleet.tls_dir) == 0o700
    ca = (fleet.tls_dir / "ca.pem").read_bytes()
    layout.prepare(layout.plan(2, tmp_path / "f", tls=True))  # resumed: same CA
    assert (fleet.tls_dir / "ca.pem").read_bytes() == ca


@pytest.mark.parametrize("tls", [False, True])
def test_printed_websocket_and_page_urls_follow_the_fleets_tls(tmp_path, tls):
    """`eventfleet fleet --tls` serves HTTP (and so Jetstream and Replication) over TLS:
    the addresses it prints say wss:// and https:// then, ws:// and http:// otherwise."""
    fleet = layout.plan(1, tmp_path / "f", base_port=40000, tls=tls)
    replica = fleet.replicas[0]
    if tls and shutil.which("openssl"):
        layout.prepare(fleet)
        conf = config.build(config.ReplicaConfig, config.load(replica.config_path, environ={}))
        assert conf.tls.http and conf.tls.settings() is not None
    urls = replica.jetstream(tls)
    ws, page = ("wss://", "https://") if tls else ("ws://", "http://")
    assert urls["jetstream"].startswith(ws) and urls["jetstream_demo"].startswith(page)
    assert replica.replication(tls) == f"{ws}127.0.0.1:{replica.http_port}/replication"


@pytest.mark.parametrize(("replicas", "resumed_empty_start"), [(1, True), (3, False)])
def test_only_a_new_fleet_or_a_lone_replica_may_start_without_asking_peers(
    tmp_path, replicas, resumed_empty_start
):
    data = tmp_path / "f"
    first = layout.plan(replicas, data, base_port=40000)
    layout.prepare(first)
    assert config.load(first.replicas[0].config_path, environ={})["allow_empty_start"] is True
    # Run again (fleet.json now exists): replicas of a fleet must learn their ids from
    # peers, but a lone replica has none, and waiting for one would never end.
    resumed = layout.plan(replicas, data)
    assert not resumed.new_fleet
    layout.prepare(resumed)
    conf = config.load(resumed.replicas[0].config_path, environ={})
    assert conf["allow_empty_start"] is resumed_empty_start
