"""Secure defaults of a replica: separate client and peer tokens read from files,
rotation with two valid tokens through the reload path, HTTP's own bind address, the
admin credential on POST /flush, what anonymous /status shows, a private data dir.

Real replicas in this process on 127.0.0.1 (two of them Syncer-connected), the real
hat-event 0.9.44 client and aiohttp's client."""

from __future__ import annotations

import hashlib
import stat

import aiohttp
import pytest
from eventfleet_server import config
from eventfleet_server.listener import Credentials
from eventfleet_server.listener.tokens import token_fingerprint
from eventfleet_server.main import Replica
from hat.drivers import net
from hat.event.eventer import client as hat_client

from tests.unit.test_syncer_replicas import Node, until


def eventer_addr(replica) -> net.TcpAddress:
    return net.TcpAddress("127.0.0.1", replica.eventer.port)


def http_url(replica, path: str) -> str:
    return f"http://127.0.0.1:{replica.http.port}{path}"


class FileNode(Node):
    """A `Node` whose tokens come from files, as with `eventfleet server`."""

    def __init__(self, tmp_path, name, server_id, client_file, peer_file, **overrides):
        super().__init__(
            tmp_path,
            name,
            server_id,
            token_file=str(client_file),
            peer_token_file=str(peer_file),
            token_reload_interval=0.1,
            **overrides,
        )

    async def start(self, wait: bool = True) -> Replica:
        self.write_config()
        conf = config.load(self.config_path, environ={})
        self.token = Credentials(*config.read_credentials(conf, environ={}))
        return await super().start(wait)


def pair(tmp_path, client_file, peer_file):
    nodes = [FileNode(tmp_path, f"r{i}", i, client_file, peer_file) for i in (1, 2)]
    nodes[0].peers, nodes[1].peers = [nodes[1]], [nodes[0]]
    return nodes


async def start_synced(nodes) -> None:
    """Start both before waiting for either (a start may wait for the peer), then wait
    until both are synced."""
    for node in nodes:
        await node.start(wait=False)
    for node in nodes:
        await until(lambda n=node: n.start_task.done(), f"{node.name} started")
    await synced(nodes)


async def synced(nodes) -> None:
    for node in nodes:
        await until(lambda n=node: n.replica.syncer.initial_sync_done, f"{node.name} synced")
        await until(
            lambda n=node: all(p["state"] == "synced" for p in n.replica.syncer.state()),
            f"{node.name} links synced",
        )


async def test_client_and_peer_tokens_are_separate_and_rotate(tmp_path):
    client_file, peer_file = tmp_path / "client-token", tmp_path / "peer-token"
    client_file.write_text("client-1\n")
    peer_file.write_text("# the peers' secret\npeer-1\n")
    nodes = pair(tmp_path, client_file, peer_file)
    try:
        await start_synced(nodes)
        r1 = nodes[0].replica
        # The peer token is not a client credential, and the other way round.
        with pytest.raises(hat_client.EventerInitError, match="invalid client token"):
            await hat_client.connect(eventer_addr(r1), "c", client_token="peer-1")
        assert r1.syncer.rejected == {}

        # Rotation step 1: the new client token is added; both are valid.
        client_file.write_text("client-1\nclient-2\n")
        await until(lambda: r1.credentials.client == ("client-1", "client-2"), "reload")
        for token in ("client-1", "client-2"):
            c = await hat_client.connect(eventer_addr(r1), "c", client_token=token)
            await c.async_close()
        # Step 3: the old one is dropped and refused from now on.
        client_file.write_text("client-2\n")
        await until(lambda: r1.credentials.client == ("client-2",), "reload")
        with pytest.raises(hat_client.EventerInitError, match="invalid client token"):
            await hat_client.connect(eventer_addr(r1), "c", client_token="client-1")

        # Peer token rotated through the same steps: the mesh keeps (re)connecting.
        peer_file.write_text("peer-1\npeer-2\n")
        await until(
            lambda: all(n.replica.credentials.peer == ("peer-1", "peer-2") for n in nodes),
            "peer reload",
        )
        peer_file.write_text("peer-2\npeer-1\n")
        await until(lambda: all(n.replica.credentials.peer_token == "peer-2" for n in nodes), "")
        peer_file.write_text("peer-2\n")
        await until(lambda: all(n.replica.credentials.peer == ("peer-2",) for n in nodes), "")
        # New connections use the new token: cut the links and watch them come back.
        for node in nodes:
            for session in node.replica.syncer.server.sessions():
                session.conn.close("test: reconnect with the rotated token")
        await synced(nodes)
        c = await hat_client.connect(eventer_addr(r1), "c", client_token="client-2")
        await c.register([hat_client.common.RegisterEvent(("rotated",), None, None)], True)
        await c.async_close()
        r2 = nodes[1].replica
        await until(lambda: r2.storage.last_ids.get(1) is not None, "event synced after rotation")
        assert r1.syncer.rejected == {} and r2.syncer.rejected == {}

        # A broken reload (empty file) keeps the current tokens.
        client_file.write_text("\n")
        assert r1.reload_credentials("test") is False
        assert r1.credentials.client == ("client-2",)
    finally:
        for node in reversed(nodes):
            await node.stop()


async def test_peer_with_a_wrong_peer_token_is_refused(tmp_path):
    (tmp_path / "c").write_text("client\n")
    (tmp_path / "p1").write_text("peer-a\n")
    (tmp_path / "p2").write_text("peer-b\n")
    n1 = FileNode(tmp_path, "r1", 1, tmp_path / "c", tmp_path / "p1")
    n2 = FileNode(tmp_path, "r2", 2, tmp_path / "c", tmp_path / "p2")
    n1.peers, n2.peers = [n2], [n1]
    try:
        await n1.start(wait=False)
        await n2.start(wait=False)
        await until(lambda: n1.replica.syncer and n1.replica.syncer.rejected.get("bad_token"), "")
        assert all(p["state"] != "synced" for p in n1.replica.syncer.state())
    finally:
        await n2.stop()
        await n1.stop()


async def test_http_admin_routes_need_the_peer_token(tmp_path):
    (tmp_path / "c").write_text("client\n")
    (tmp_path / "p").write_text("peer\n")
    nodes = pair(tmp_path, tmp_path / "c", tmp_path / "p")
    try:
        await start_synced(nodes)
        r1 = nodes[0].replica
        flush = http_url(r1, "/flush?peer=r2&timeout=5")
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer client"}, {"Authorization": "x"}):
                async with http.post(flush, headers=headers) as res:
                    assert res.status == 401, headers
            async with http.post(flush, headers={"Authorization": "Bearer peer"}) as res:
                assert res.status == 200 and (await res.json())["flushed"] is True
            # Probes and metrics stay open.
            for path in ("/healthz", "/readyz", "/metrics"):
                async with http.get(http_url(r1, path)) as res:
                    assert res.status == 200, path
            async with http.get(http_url(r1, "/status")) as res:
                anonymous = await res.json()
            async with http.get(
                http_url(r1, "/status"), headers={"Authorization": "Bearer peer"}
            ) as res:
                full = await res.json()
        assert set(anonymous) == set(full)
        assert anonymous["protocols"] is None
        # Which tokens are loaded (the operator follows a rotation by it), never the
        # tokens: fingerprints, for the peer-token holder only.
        assert anonymous["credentials"] is None
        assert full["credentials"] == {
            "client": [token_fingerprint("client")],
            "peer": [token_fingerprint("peer")],
        }
        assert token_fingerprint("peer") == hashlib.sha256(b"peer").hexdigest()[:16]
        assert "peer" not in full["credentials"]["peer"] + full["credentials"]["client"]
        assert anonymous["storage"]["db_bytes"] is None and anonymous["storage"]["last_seq"] is None
        assert anonymous["peers"] == full["peers"]  # the sync-state events say as much
        assert anonymous["last_ids"] == full["last_ids"] and anonymous["ready"] is True
        assert [p["name"] for p in full["peers"]] == ["r2"] and "eventer" in full["protocols"]
    finally:
        for node in reversed(nodes):
            await node.stop()


async def test_http_binds_its_own_host_and_the_data_dir_is_private(tmp_path):
    from tests.conftest import running_replica

    data = tmp_path / "d"
    async with running_replica(data, http={"host": "127.0.0.2"}) as replica:
        # Listeners on `host` (127.0.0.1), HTTP on http.host only.
        assert replica.http.address[0] == "127.0.0.2"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.2:{replica.http.port}/healthz") as res:
                assert res.status == 200
            with pytest.raises(aiohttp.ClientConnectionError):
                await http.get(f"http://127.0.0.1:{replica.http.port}/healthz")
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    # An existing world-readable directory is tightened.
    data.chmod(0o755)
    async with running_replica(data):
        pass
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
