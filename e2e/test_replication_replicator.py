"""The project's replicator (replication.upstreams) against its own publisher in another
fleet, and against a minimal independent publisher written here from the seed.

Checks: the table is mirrored, a restart of either side continues incrementally,
changes flow both ways, and nothing is duplicated (each change is one event on each
side: no echo)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets

import pytest
from aiohttp import WSMsgType, web
from hat.drivers import net
from hat.event import common as hat
from hat.event.eventer import client as hat_client

from e2e.appws_client import AppWsClient
from e2e.fleet_helpers import HOST, ReplicaProc, eventually, free_block

pytestmark = pytest.mark.timeout(240)

PASSWORD = "pw-repl"


def conf(tmp, name, upstreams=()) -> dict:
    pw = tmp / f"{name}-password"
    pw.write_text(PASSWORD)
    return {
        "replication": {
            "enabled": True,
            "tables": [{"name": "users"}],
            "password_file": str(pw),
            "upstreams": [
                {
                    "password_file": str(pw),
                    "reconnect_min_delay": 0.2,
                    "reconnect_max_delay": 1.0,
                    **u,
                }
                for u in upstreams
            ],
        }
    }


def ws_url(replica) -> str:
    return replica.http.replace("http://", "ws://") + "/replication"


async def table(replica, name="users") -> dict[str, dict]:
    """The table as the replica's Eventer shows it (hat-event client, latest query)."""
    client = await hat_client.connect(net.TcpAddress(HOST, replica.ports["eventer"]), "t/read")
    try:
        result = await client.query(hat.QueryLatestParams([("replication", name, "?")]))
    finally:
        await client.async_close()
    return {e.type[-1]: e.payload.data for e in result.events if e.payload is not None}


async def history(replica, key: str, name="users") -> list:
    client = await hat_client.connect(net.TcpAddress(HOST, replica.ports["eventer"]), "t/hist")
    try:
        result = await client.query(
            hat.QueryTimeseriesParams(event_types=[("replication", name, key)], max_results=100)
        )
    finally:
        await client.async_close()
    return result.events


async def register(replica, key: str, row: dict | None, name="users") -> None:
    client = await hat_client.connect(net.TcpAddress(HOST, replica.ports["eventer"]), "t/w")
    try:
        payload = None if row is None else hat.EventPayloadJson(row)
        await client.register([hat.RegisterEvent(("replication", name, key), None, payload)], True)
    finally:
        await client.async_close()


async def converged(a, b, what: str, timeout: float = 30.0) -> dict:
    async def same():
        ta, tb = await table(a), await table(b)
        return ta if ta == tb else None

    return await eventually(same, what, timeout)


async def seed_rows(replica, n: int) -> None:
    async with AppWsClient(ws_url(replica)) as c:
        assert (await c.login(PASSWORD))["ok"] is True
        await c.start("users")
        await c.initial_pass("users")
        for i in range(n):
            await c.send({"api": "users", "mt": "ReplicateAdd", "columns": {"id": f"r{i}", "v": i}})
        await c.request({"api": "users", "mt": "ReplicateNext"})  # a round trip: all read


async def test_replicator_against_own_publisher_across_two_fleets(tmp_path):
    pub = ReplicaProc(tmp_path, "fleetA-1", 1, free_block(1), extra=conf(tmp_path, "a"))
    pub.start()
    sub = None
    try:
        await pub.wait_ready()
        await seed_rows(pub, 200)
        upstream = {"name": "a", "url": ws_url(pub), "table": "users"}
        sub = ReplicaProc(
            tmp_path, "fleetB-1", 1, free_block(1), extra=conf(tmp_path, "b", [upstream])
        )
        sub.start()
        await sub.wait_ready()
        rows = await converged(pub, sub, "initial pass mirrored")
        assert len(rows) == 200 and rows["r7"] == {"id": "r7", "v": 7}
        assert "full pass done (200 rows)" in sub.log()

        # Publisher -> replicator, live.
        await register(pub, "r1", {"id": "r1", "v": "changed on A"})
        await register(pub, "r2", None)
        # Replicator -> publisher, live (written over Eventer on B).
        await register(sub, "fromB", {"id": "fromB", "v": "written on B"})
        await register(sub, "r3", {"id": "r3", "v": "changed on B"})
        await register(sub, "r4", None)
        rows = await converged(pub, sub, "changes both ways")
        assert rows["fromB"]["v"] == "written on B" and rows["r1"]["v"] == "changed on A"
        assert "r2" not in rows and "r4" not in rows
        # Nothing duplicated: one event per change on each side (no echo).
        await asyncio.sleep(0.5)
        for replica in (pub, sub):
            assert len(await history(replica, "fromB")) == 1
            assert len(await history(replica, "r3")) == 2  # the add, then B's change
            assert len(await history(replica, "r1")) == 2

        # Restart the replicator: it continues incrementally from its stored usn.
        sub.stop()
        await register(pub, "late1", {"id": "late1", "v": "while B was down"})
        sub.start()
        await sub.wait_ready()
        await converged(pub, sub, "after the replicator's restart")
        # Incremental: r5 plus B's own earlier writes (the publisher does not echo them, so
        # B's stored usn is below them); those arrive identical and are not written again.
        assert "incremental pass done" in sub.log() and sub.log().count("full pass") == 1
        assert len(await history(sub, "fromB")) == 1 and len(await history(sub, "late1")) == 1

        # Restart the publisher: same store, same guid: incremental again, and a change
        # made on B while A was down goes up after the reconnect.
        pub.stop()
        await register(sub, "late2", {"id": "late2", "v": "while A was down"})
        pub.start()
        await pub.wait_ready()
        rows = await converged(pub, sub, "after the publisher's restart")
        assert rows["late2"]["v"] == "while A was down"
        assert sub.log().count("incremental pass done") == 2
        for replica in (pub, sub):
            for key in ("late1", "late2", "fromB"):
                assert len(await history(replica, key)) == 1, (replica.name, key)
    finally:
        if sub is not None:
            sub.stop()
        pub.stop()


# -- a minimal independent publisher ---------------------------------------------------


class MiniPublisher:
    """A publisher written from the seed: one table in a dict, usn counter, guid."""

    def __init__(self, password: str):
        self.password = password
        self.guid = secrets.token_hex(16)
        self.usn = 0
        self.rows: dict[str, tuple[int, dict | None]] = {}
        self.sessions: list[web.WebSocketResponse] = []
        self.starts: list[dict] = []
        self.received: list[dict] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    def set(self, key: str, columns: dict | None) -> tuple[int, dict | None]:
        self.usn += 1
        self.rows[key] = (self.usn, columns)
        return self.rows[key]

    async def push(self, mt: str, columns: dict) -> None:
        for ws in list(self.sessions):
            await ws.send_json({"api": "users", "mt": mt, "columns": columns})

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/repl", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, HOST, port)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        for ws in list(self.sessions):
            await ws.close()
        await self.runner.cleanup()

    async def handle(self, request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        challenge = None
        logged_in = False
        pending: list[str] = []
        async for frame in ws:
            if frame.type != WSMsgType.TEXT:
                break
            msg = json.loads(frame.data)
            mt, src = msg.get("mt"), msg.get("src")
            if mt == "AppChallenge":
                challenge = secrets.token_hex(8)
                await ws.send_json({"mt": "AppChallengeResult", "src": src, "challenge": challenge})
            elif mt == "AppLogin":
                text = ":".join(
                    [msg[k] for k in ("app", "domain", "sip", "guid", "dn")]
                    + ([msg["info"]] if "info" in msg else [])
                    + [challenge, self.password]
                )
                ok = (
                    challenge is not None
                    and msg["digest"] == hashlib.sha256(text.encode()).hexdigest()
                )
                challenge = None
                logged_in = ok
                await ws.send_json(
                    {"mt": "AppLoginResult", "src": src, **({} if ok else {"error": "bad"})}
                )
            elif not logged_in:
                await ws.close()
            elif mt == "ReplicateStart":
                self.starts.append(msg)
                incremental = msg.get("guid") == self.guid
                since = msg.get("usn", 0) if incremental else 0
                pending = [
                    k
                    for k, (usn, cols) in sorted(self.rows.items(), key=lambda kv: kv[1][0])
                    if usn > since and (cols is not None or incremental)
                ]
                await ws.send_json(
                    {
                        "api": "users",
                        "mt": "ReplicateStartResult",
                        "src": src,
                        "guid": self.guid,
                        "usn": self.usn,
                        "columns": {},
                    }
                )
            elif mt == "ReplicateNext":
                while pending:
                    key = pending.pop(0)
                    usn, cols = self.rows[key]
                    if cols is None:
                        await ws.send_json(
                            {"api": "users", "mt": "ReplicateDel", "columns": {"id": key}}
                        )
                        continue
                    await ws.send_json(
                        {
                            "api": "users",
                            "mt": "ReplicateNextResult",
                            "src": src,
                            "usn": usn,
                            "columns": cols,
                        }
                    )
                    break
                else:
                    await ws.send_json(
                        {"api": "users", "mt": "ReplicateNextResult", "src": src, "usn": self.usn}
                    )
                    self.sessions.append(ws)
            elif mt in ("ReplicateAdd", "ReplicateUpdate", "ReplicateDel"):
                self.received.append(msg)
                cols = msg["columns"]
                key = str(cols["id"])
                if mt == "ReplicateDel":
                    self.set(key, None)
                else:
                    old = self.rows.get(key, (0, None))[1] or {}
                    self.set(key, {**old, **cols})
        with contextlib.suppress(ValueError):
            self.sessions.remove(ws)
        return ws


async def test_replicator_against_an_independent_publisher(tmp_path):
    mini = MiniPublisher(PASSWORD)
    for i in range(50):
        mini.set(f"m{i}", {"id": f"m{i}", "n": i})
    await mini.start()
    url = f"ws://{HOST}:{mini.port}/repl"
    sub = ReplicaProc(
        tmp_path,
        "sub",
        1,
        free_block(1),
        extra=conf(tmp_path, "s", [{"name": "mini", "url": url, "table": "users"}]),
    )
    sub.start()
    try:
        await sub.wait_ready()

        async def mirrored():
            rows = await table(sub)
            want = {k: c for k, (_, c) in mini.rows.items() if c is not None}
            return rows if rows == want else None

        await eventually(mirrored, "table mirrored from the independent publisher")
        assert mini.starts[0]["guid"] == "" and mini.starts[0]["usn"] == 0
        # Publisher -> replica, live.
        await mini.push("ReplicateUpdate", mini.set("m1", {"id": "m1", "n": 100})[1])
        await mini.push("ReplicateDel", {"id": "m2"})
        mini.set("m2", None)
        await eventually(mirrored, "live changes from the publisher")
        # Replica -> publisher.
        await register(sub, "local1", {"id": "local1", "n": -1})
        await register(sub, "m3", None)
        await eventually(mirrored, "local changes reach the publisher")
        assert [m["mt"] for m in mini.received] == ["ReplicateAdd", "ReplicateDel"]
        # Restart the publisher on the same port, same table and guid: incremental.
        port = mini.port
        await mini.stop()
        mini.set("m4", {"id": "m4", "n": "while down"})
        await mini.start(port)
        await eventually(mirrored, "after the publisher restarted")
        last = mini.starts[-1]
        assert last["guid"] == mini.guid and last["usn"] > 0
        # Restart the replica: incremental from its stored guid/usn, nothing re-sent.
        sub.stop()
        mini.set("m5", {"id": "m5"})
        sub.start()
        await sub.wait_ready()
        await eventually(mirrored, "after the replica restarted")
        assert mini.starts[-1]["guid"] == mini.guid and mini.starts[-1]["usn"] >= last["usn"]
        assert len(mini.received) == 2  # no echo of rows that came from the publisher
        assert len(await history(sub, "m0")) == 1
    finally:
        sub.stop()
        await mini.stop()


async def test_replicator_puts_back_a_row_the_publisher_refused(tmp_path):
    """A local change the publisher refuses (a column it does not let replicators
    update) is answered with the publisher's row, and the replicator restores it: both
    sides end identical."""
    pub_conf = conf(tmp_path, "a")
    pub_conf["replication"]["tables"] = [
        {"name": "users", "columns": {"id": {}, "name": {"update": True}, "owner": {}}}
    ]
    pub = ReplicaProc(tmp_path, "pub", 1, free_block(1), extra=pub_conf)
    pub.start()
    sub = None
    try:
        await pub.wait_ready()
        await register(pub, "u1", {"id": "u1", "name": "Ann", "owner": "ops"})
        upstream = {
            "name": "a",
            "url": ws_url(pub),
            "table": "users",
            "columns": {"id": {}, "name": {"update": True}, "owner": {"update": True}},
        }
        sub = ReplicaProc(tmp_path, "sub", 1, free_block(1), extra=conf(tmp_path, "b", [upstream]))
        sub.start()
        await sub.wait_ready()
        await converged(pub, sub, "initial pass")
        # An allowed change goes up...
        await register(sub, "u1", {"id": "u1", "name": "Bea", "owner": "ops"})
        rows = await converged(pub, sub, "allowed update")
        assert rows["u1"]["name"] == "Bea"
        # ...a refused one is put back on the replicator's side.
        await register(sub, "u1", {"id": "u1", "name": "Bea", "owner": "mallory"})
        rows = await converged(pub, sub, "refused update reverted")
        assert rows["u1"]["owner"] == "ops"
        assert "not updatable" in sub.log()
    finally:
        if sub is not None:
            sub.stop()
        pub.stop()
