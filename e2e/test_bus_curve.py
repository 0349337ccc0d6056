"""CURVE on the Event BUS against a real replica process, with real pyzmq clients:
an allowed client key and a token-derived key are served (encrypted); an unknown client
key, a client expecting another server key and a PLAIN client are refused and counted;
PLAIN listeners for reference clients only where configured; the server key and the
allowed keys rotated without a restart (SIGHUP and the file watch), established
sessions kept."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import aiohttp
import zmq
import zmq.asyncio
from eventfleet_server.bus.curve import token_keypair

from e2e.bus_client import BusClient, wait_live
from e2e.fleet_helpers import ReplicaProc, free_block, serving, stop_group
from e2e.test_bus import rejected, wait_rejected


class CurveBusClient(BusClient):
    """The RFC client of e2e/bus_client.py over CURVE: it knows the server's public key
    and presents its own key pair (Z85)."""

    def __init__(self, port: int, server_key: bytes, keypair: tuple[bytes, bytes], **kw):
        super().__init__(port, **kw)
        self.server_key = server_key
        self.keypair = keypair

    def _socket(self, kind: int, offset: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.linger = 0
        sock.curve_serverkey = self.server_key
        sock.curve_publickey, sock.curve_secretkey = self.keypair
        sock.connect(f"tcp://{self.host}:{self.port + offset}")
        return sock


def write_keys(tmp_path, name: str = "server") -> bytes:
    """A fresh server key pair: the secret in <name>.key (Z85), the public key returned."""
    public, secret = zmq.curve_keypair()
    path = tmp_path / f"{name}.key"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(secret + b"\n")
    tmp.replace(path)  # atomically, as a kubelet swaps a Secret volume
    return public


def allow(tmp_path, *keys: bytes) -> None:
    path = tmp_path / "clients" / "allowed"
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# client public keys\n" + "".join(k.decode() + "\n" for k in keys))
    tmp.replace(path)


def curve_bus(tmp_path, **curve) -> dict:
    """The replica's ``bus`` section: CURVE with the key written by `write_keys` and the
    clients `allow`ed, plus `curve`'s settings."""
    return {
        "enabled": True,
        "curve": {
            "enabled": True,
            "secret_key_file": str(tmp_path / "server.key"),
            "allowed_keys": str(tmp_path / "clients"),
            **curve,
        },
    }


@contextlib.asynccontextmanager
async def curve_replica(
    tmp_path, *, token: str | None = "s3cret", curve=None, base: int | None = None, **extra
):
    token_file = None
    if token:
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
    replica = ReplicaProc(
        tmp_path,
        "r1",
        1,
        base or free_block(1),
        token_file=token_file,
        extra={"token_reload_interval": 0.5, "bus": curve_bus(tmp_path, **(curve or {})), **extra},
    )
    async with serving(replica):
        yield replica


async def bus_status(replica: ReplicaProc) -> dict:
    """The BUS part of /status (the full view: the client token when there is one)."""
    token = replica.token_file.read_text().strip() if replica.token_file else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(replica.http + "/status", headers=headers) as resp,
    ):
        body = await resp.json()
    return body["protocols"]["bus"]


async def until_curve(replica: ReplicaProc, key: str, value, timeout: float = 30.0) -> None:
    """Wait until the replica's /status shows curve[`key`] == `value` (a reload done)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (await bus_status(replica))["curve"][key] != value:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"curve {key} never became {value!r}:\n{replica.log()}")
        await asyncio.sleep(0.1)


async def refused(client: BusClient, topic: str) -> None:
    """A refused client: its SYNCSTART is never answered (libzmq drops the connection
    at the handshake and the DEALER waits for a pipe)."""
    with contextlib.suppress(TimeoutError):
        await client.publish(topic, 1, timeout=2.0)
    try:
        await asyncio.wait_for(client.syncstart("/c/", timeout=1.0), 3.0)
    except TimeoutError:
        return
    raise AssertionError(f"{topic}: a refused client was served")


async def served(client: BusClient, topic: str) -> None:
    """Subscribe, publish `topic` and see it broadcast and in a snapshot."""
    client.subscribe("/c/")
    await wait_live(client, client, topic)
    events, _ = await client.syncstart("/c/")
    assert topic in {e.topic for e in events}


async def test_curve_serves_allowed_and_token_keys_refuses_the_rest(tmp_path):
    server_key = write_keys(tmp_path)
    client_pair = zmq.curve_keypair()
    allow(tmp_path, client_pair[0])
    async with curve_replica(tmp_path) as replica:
        port = replica.ports["bus"]
        status = await bus_status(replica)
        assert status["auth"] == "curve"
        assert status["curve"]["public_key"] == server_key.decode()
        allowed = CurveBusClient(port, server_key, client_pair)
        by_token = CurveBusClient(port, server_key, token_keypair("s3cret"))
        unknown = CurveBusClient(port, server_key, zmq.curve_keypair())
        old_token = CurveBusClient(port, server_key, token_keypair("not-the-token"))
        other_server = CurveBusClient(port, zmq.curve_keypair()[0], client_pair)
        plain = BusClient(port, plain=("anyone", "s3cret"))
        clients = (allowed, by_token, unknown, old_token, other_server, plain)
        try:
            await served(allowed, "/c/allowed")
            await served(by_token, "/c/token")
            before = await rejected(replica)
            for client, topic in (
                (unknown, "/c/unknown"),
                (old_token, "/c/old-token"),
                (other_server, "/c/other-server"),
                (plain, "/c/plain"),
            ):
                await refused(client, topic)
            # Two ZAP refusals (unknown keys) and two failed handshakes (another server
            # key; PLAIN against CURVE), each at least once per socket tried.
            await wait_rejected(replica, "bad_key", before.get("bad_key", 0) + 4)
            events, _ = await allowed.syncstart("/c/")
            assert {e.topic for e in events} == {"/c/allowed", "/c/token"}
        finally:
            for c in clients:
                c.close()


async def test_server_key_rotation_without_restart_keeps_established_sessions(tmp_path):
    old_key = write_keys(tmp_path)
    client_pair = zmq.curve_keypair()
    allow(tmp_path, client_pair[0])
    async with curve_replica(tmp_path) as replica:
        port = replica.ports["bus"]
        established = CurveBusClient(port, old_key, client_pair)
        clients = [established]
        try:
            await served(established, "/c/before")
            new_key = write_keys(tmp_path)
            os.kill(replica.proc.pid, signal.SIGHUP)
            await until_curve(replica, "public_key", new_key.decode())
            fresh = CurveBusClient(port, new_key, client_pair)
            stale = CurveBusClient(port, old_key, client_pair)
            clients += [fresh, stale]
            await served(fresh, "/c/after")
            # The session made before the rotation still publishes, subscribes, snapshots.
            await wait_live(established, established, "/c/established")
            events, _ = await established.syncstart("/c/")
            assert {e.topic for e in events} >= {"/c/before", "/c/after", "/c/established"}
            # A new connection with the old key meets the new one and fails.
            await refused(stale, "/c/stale")
            assert (await bus_status(replica))["curve"]["rotations"] == 1
            # A second rotation, through the file watch this time (no signal).
            third_key = write_keys(tmp_path)
            await until_curve(replica, "public_key", third_key.decode())
            third = CurveBusClient(port, third_key, client_pair)
            clients.append(third)
            await served(third, "/c/third")
            await wait_live(fresh, fresh, "/c/fresh-still")
        finally:
            for c in clients:
                c.close()


async def test_allowed_keys_and_a_broken_key_file_reload_without_restart(tmp_path):
    server_key = write_keys(tmp_path)
    first, second = zmq.curve_keypair(), zmq.curve_keypair()
    allow(tmp_path, first[0])
    async with curve_replica(tmp_path, token=None) as replica:
        port = replica.ports["bus"]
        a = CurveBusClient(port, server_key, first)
        b_refused = CurveBusClient(port, server_key, second)
        clients = [a, b_refused]
        try:
            await served(a, "/c/a")
            await refused(b_refused, "/c/b-early")
            allow(tmp_path, first[0], second[0])  # picked up by the file watch
            b = CurveBusClient(port, server_key, second)
            clients.append(b)
            await until_curve(replica, "allowed_keys", 2)
            await served(b, "/c/b")
            # A half-written key file is refused (logged) and the current key serves on.
            (tmp_path / "server.key").write_text("not a key\n")
            os.kill(replica.proc.pid, signal.SIGHUP)
            c = CurveBusClient(port, server_key, first)
            clients.append(c)
            await served(c, "/c/c")
            assert (await bus_status(replica))["curve"]["rotations"] == 0
        finally:
            for client in clients:
                client.close()
        assert "secret key is not a Z85 CURVE key" in replica.log()


async def test_plain_only_where_configured_and_only_from_allowed_networks(tmp_path):
    server_key = write_keys(tmp_path)
    allow(tmp_path, zmq.curve_keypair()[0])
    base = free_block(1)
    plain_port = base + 6  # the block's free ports after HTTP (e2e/fleet_helpers.ports_of)
    async with curve_replica(tmp_path, base=base, curve={"plain_port": plain_port}) as replica:
        status = await bus_status(replica)
        assert status["auth"] == "curve+plain"
        assert status["ports"]["plain-collector"] == plain_port + 2
        reference = BusClient(plain_port, plain=("anyone", "s3cret"))
        wrong = BusClient(plain_port, plain=("anyone", "nope"))
        curve_client = CurveBusClient(replica.ports["bus"], server_key, token_keypair("s3cret"))
        try:
            reference.subscribe("/c/")
            # Published over CURVE, broadcast to the PLAIN subscriber: one BUS, two doors.
            await wait_live(reference, curve_client, "/c/from-curve")
            await refused(wrong, "/c/wrong")
            await wait_rejected(replica, "bad_token", 1)
        finally:
            for c in (reference, wrong, curve_client):
                c.close()
    # PLAIN restricted to a network the clients are not on: refused and counted.
    curve = {"plain_port": plain_port, "plain_networks": ["192.0.2.0/24"]}
    async with curve_replica(tmp_path, base=base, curve=curve) as replica:
        outsider = BusClient(plain_port, plain=("anyone", "s3cret"))
        try:
            await refused(outsider, "/c/outsider")
            counts = await wait_rejected(replica, "bad_token", 1)
            assert counts["bad_token"] >= 1
        finally:
            outsider.close()
    assert "not in bus.curve.plain_networks" in replica.log()


async def test_a_bad_key_file_stops_the_start_with_one_line_naming_it(tmp_path):
    write_keys(tmp_path)
    allow(tmp_path, zmq.curve_keypair()[0])
    bad = tmp_path / "clients" / "more"
    bad.write_text("K!:kb?o5bN:kKmACJ%RQW@@?f={os4o+{o$x@E\n")  # 38 characters
    replica = ReplicaProc(
        tmp_path,
        "r1",
        1,
        free_block(1),
        extra={"bus": curve_bus(tmp_path)},
    )
    replica.write_config()
    replica.start()
    try:
        code = replica.proc.wait(timeout=60)
    finally:
        stop_group(replica.proc)
    log = replica.log()
    assert code == 1, log
    assert (
        f"cannot start: bus.curve.allowed_keys {bad}:1: public key "
        "'K!:kb?o5bN:kKmACJ%RQW@@?f={os4o+{o$x@E' is not a Z85 CURVE key (40 characters, "
        "got 38)" in log
    ), log
    assert "Traceback" not in log
