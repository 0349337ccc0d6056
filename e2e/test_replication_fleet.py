"""Replication across a three-replica fleet (Syncer mesh): a row written over
Replication on one replica is read over Eventer (the real hat-event client) and over
Replication on the others; a replicator that fails over from one replica to another
ends with the identical table (per-replica guid: the failover is a full pass)."""

from __future__ import annotations

import asyncio

import pytest

from e2e.appws_client import AppWsClient
from e2e.fleet_helpers import ReplicaProc, eventually, free_block, mesh_peers
from e2e.test_replication_replicator import PASSWORD, conf, register, table, ws_url

pytestmark = pytest.mark.timeout(300)


async def session(replica, **start) -> AppWsClient:
    c = await AppWsClient(ws_url(replica)).__aenter__()
    assert (await c.login(PASSWORD))["ok"] is True
    result = await c.start("users", **start)
    assert "error" not in result
    return c


async def test_three_replicas_replication_eventer_and_failover(tmp_path):
    base = free_block(4)
    procs = [
        ReplicaProc(tmp_path, f"r{i}", i, base + 10 * (i - 1), extra=conf(tmp_path, f"r{i}"))
        for i in (1, 2, 3)
    ]
    ext = None
    clients: list[AppWsClient] = []
    try:
        for p in procs:
            p.write_config(mesh_peers(procs))
            p.start()
        await asyncio.gather(*(p.wait_ready() for p in procs))
        r1, r2, r3 = procs

        # Sessions on r2 and r3 are live before the write on r1.
        watchers = [await session(r) for r in (r2, r3)]
        clients += watchers
        for w in watchers:
            assert (await w.initial_pass("users"))[0] == {}
        writer = await session(r1)
        clients.append(writer)
        await writer.initial_pass("users")
        await writer.send(
            {"api": "users", "mt": "ReplicateAdd", "columns": {"id": "u1", "name": "Ann"}}
        )
        for w in watchers:
            [m] = await w.live(1, timeout=20)
            assert m["mt"] == "ReplicateAdd" and m["columns"] == {"id": "u1", "name": "Ann"}
        # Over Eventer (hat-event client) on every other replica.
        for r in (r2, r3):
            assert (await table(r))["u1"] == {"id": "u1", "name": "Ann"}
        # A new session's initial pass on r3 holds it too.
        fresh = await session(r3)
        clients.append(fresh)
        rows, _, _ = await fresh.initial_pass("users")
        assert rows == {"u1": {"id": "u1", "name": "Ann"}}
        # The reverse: written over Eventer on r3, seen by the Replication session on r1.
        await register(r3, "u2", {"id": "u2", "name": "Bo"})
        [m] = await writer.live(1, timeout=20)
        assert m["mt"] == "ReplicateAdd" and m["columns"]["id"] == "u2"

        # The seed client's failover: r1's guid/usn mean nothing on r2 -> full pass.
        s1 = await session(r1)
        clients.append(s1)
        rows1, usn1, _ = await s1.initial_pass("users")
        guid1 = (await s1.start("users"))["guid"]
        s2 = await AppWsClient(ws_url(r2)).__aenter__()
        clients.append(s2)
        await s2.login(PASSWORD)
        start2 = await s2.start("users", guid=guid1, usn=usn1)
        assert start2["guid"] != guid1 and start2["full"] is True
        assert (await s2.initial_pass("users"))[0] == rows1

        # The project's replicator in another fleet: upstream r1, failing over to r2.
        for i in range(20):
            await register(r1, f"f{i}", {"id": f"f{i}", "n": i})
        upstream = {
            "name": "fleet",
            "url": ws_url(r1),
            "failover_urls": [ws_url(r2), ws_url(r3)],
            "table": "users",
        }
        ext = ReplicaProc(tmp_path, "ext", 1, base + 30, extra=conf(tmp_path, "ext", [upstream]))
        ext.start()
        await ext.wait_ready()

        async def same_as(r):
            a, b = await table(r), await table(ext)
            return a if a == b and a else None

        await eventually(lambda: same_as(r1), "ext mirrors the fleet")
        r1.kill9()
        # While the replicator fails over: changes on the survivors and on ext.
        await register(r2, "f0", None)
        await register(r3, "f1", {"id": "f1", "n": "changed on r3"})
        await register(ext, "fromExt", {"id": "fromExt"})
        rows = await eventually(lambda: same_as(r2), "ext identical to r2 after failover", 60)
        assert "f0" not in rows and rows["f1"]["n"] == "changed on r3" and "fromExt" in rows
        assert (await table(r3)) == rows
        assert ext.log().count("full pass done") == 2  # the first pass, then on r2 or r3
    finally:
        for c in clients:
            await c.__aexit__()
        if ext is not None:
            ext.stop()
        for p in procs:
            p.stop()


async def test_local_fleet_command_enables_replication(tmp_path):
    """`eventfleet fleet --replication users`: every replica publishes the table, the
    login password is the fleet token, a row written on one replica reaches the other."""
    from e2e.fleet_helpers import FleetProc

    fleet = FleetProc(tmp_path / "fleet", 2, free_block(2), extra_args=["--replication", "users"])
    fleet.start()
    try:
        up = await fleet.wait_up()
        token = (tmp_path / "fleet" / "token").read_text().strip()
        urls = [f"ws://{up[n]['http']}/replication" for n in ("replica-1", "replica-2")]
        clients = []
        for url in urls:
            c = await AppWsClient(url).__aenter__()
            clients.append(c)
            assert (await c.login(token))["ok"] is True
            assert "error" not in await c.start("users")
            await c.initial_pass("users")
        await clients[0].send({"api": "users", "mt": "ReplicateAdd", "columns": {"id": "x"}})
        [m] = await clients[1].live(1, timeout=20)
        assert m["mt"] == "ReplicateAdd" and m["columns"] == {"id": "x"}
        for c in clients:
            await c.__aexit__()
    finally:
        fleet.stop()


async def test_operator_rendered_replication_section_runs_a_replica(tmp_path):
    """The operator path: `spec.protocols.replication` -> the replication section the
    operator renders (builders.replica_config) -> a real replica serving it, with the user
    list where the operator mounts the Secret (here: a file with the Secret's content)."""
    from eventfleet_operator import builders, model, naming

    spec = model.parse(
        "demo",
        "events",
        {
            "protocols": {
                "replication": {
                    "enabled": True,
                    "tables": [{"name": "users", "columns": {"id": {}, "name": {"update": True}}}],
                    "usersSecretRef": {"name": "replication-users"},
                }
            }
        },
    )
    section = builders.replica_config(spec, peer_count=1, allow_empty_start=True)["replication"]
    assert section["users_file"] == naming.REPLICATION_USERS_PATH
    users = tmp_path / "users.yaml"  # what kubelet would mount from the Secret
    users.write_text("ops: s3cret\n")
    section["users_file"] = str(users)
    replica = ReplicaProc(tmp_path, "op", 1, free_block(1), extra={"replication": section})
    replica.start()
    try:
        await replica.wait_ready()
        async with AppWsClient(ws_url(replica)) as c:
            assert (await c.login("s3cret", sip="ops"))["ok"] is True
            start = await c.start("users", columns={"id": {}, "name": {"update": True}})
            assert start["columns"] == {"id": {}, "name": {"update": True}}
            await c.initial_pass("users")
            await c.send(
                {"api": "users", "mt": "ReplicateAdd", "columns": {"id": "a", "name": "A"}}
            )

        async def stored():
            return (await table(replica)).get("a") == {"id": "a", "name": "A"}

        await eventually(stored, "the row stored on the replica")
    finally:
        replica.stop()
