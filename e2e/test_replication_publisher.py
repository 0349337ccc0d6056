"""Replication publisher against a real replica process, driven by a replicator client
written in the test from the seed (e2e/appws_client.py, not the project's replicator).

Covers login (good, bad, replayed, expired, rate-limited, before login), full and
incremental starts, column selection, live changes both ways (also through the real
hat-event Eventer client), refusals and every bad input of the issue."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest
from hat.drivers import net
from hat.event import common as hat
from hat.event.eventer import client as hat_client

from e2e.appws_client import AppWsClient
from e2e.fleet_helpers import HOST, ReplicaProc, free_block

pytestmark = pytest.mark.timeout(180)

USERS = {"alice": "pw-alice", "bob": "pw-bob"}
TABLES = [
    {"name": "users"},
    {
        "name": "phones",
        "key": "id",
        "columns": {"id": {}, "number": {"update": True}, "owner": {}, "note": {"update": True}},
        "add": False,
    },
]


def replication_conf(tmp, **extra) -> dict:
    users = tmp / "users.json"
    users.write_text(json.dumps(USERS))
    return {
        "replication": {
            "enabled": True,
            "tables": TABLES,
            "users_file": str(users),
            "challenge_ttl": 2.5,  # short for the expiry test; long enough for a loaded CI
            "max_message_size": 100_000,
            "max_send_queue": 50,
            "failed_login_limit": 1000,
            **extra,
        }
    }


@pytest.fixture(scope="module")
def publisher(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("repl-pub")
    replica = ReplicaProc(tmp, "r1", 1, free_block(1), extra=replication_conf(tmp))
    replica.start()
    try:
        asyncio.run(replica.wait_ready())
        yield replica
    finally:
        replica.stop()


def ws_url(replica) -> str:
    return replica.http.replace("http://", "ws://") + "/replication"


async def rejected(replica) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(replica.http + "/metrics") as resp:
        text = await resp.text()
    out = {}
    for m in re.finditer(
        r'eventfleet_rejected_total\{protocol="replication",reason="(\w+)"\} (\S+)', text
    ):
        out[m.group(1)] = float(m.group(2))
    return out


async def logged_in(replica, user="alice") -> AppWsClient:
    client = await AppWsClient(ws_url(replica)).__aenter__()
    result = await client.login(USERS[user], sip=user)
    assert result == {"mt": "AppLoginResult", "src": result["src"], "ok": True}
    return client


async def hat_latest(replica, types):
    client = await hat_client.connect(net.TcpAddress(HOST, replica.ports["eventer"]), "t/read")
    try:
        result = await client.query(hat.QueryLatestParams(types))
        return {e.type: e for e in result.events}
    finally:
        await client.async_close()


# -- login ------------------------------------------------------------------------------


async def test_login_good_bad_and_nothing_before_login(publisher):
    before = await rejected(publisher)
    async with AppWsClient(ws_url(publisher)) as c:
        # Before login only AppChallenge/AppLogin are served.
        answer = await c.request({"api": "users", "mt": "ReplicateStart", "columns": {}})
        assert answer["mt"] == "ReplicateStartResult" and "log in first" in answer["error"]
        bad = await c.login("not-the-password")
        assert bad["ok"] is False and "wrong digest" in bad["error"]
        unknown = await c.login("pw-alice", sip="mallory")
        assert unknown["error"] == bad["error"]  # does not reveal which users exist
        good = await c.login("pw-bob", sip="bob")
        assert good["ok"] is True
        again = await c.login("pw-bob", sip="bob")
        assert "already logged in" in again["error"]
        start = await c.start("users")
        assert start["mt"] == "ReplicateStartResult" and "error" not in start
    after = await rejected(publisher)
    assert after.get("not_initialized", 0) == before.get("not_initialized", 0) + 1
    assert after.get("login_failed", 0) == before.get("login_failed", 0) + 2


async def test_login_with_info_is_part_of_the_digest(publisher):
    async with AppWsClient(ws_url(publisher)) as c:
        challenge = await c.challenge()
        msg = c.login_message(challenge, "pw-alice", info="some-info")
        assert (await c.request(msg))["ok"] is True
    async with AppWsClient(ws_url(publisher)) as c:
        challenge = await c.challenge()
        msg = c.login_message(challenge, "pw-alice", info="some-info")
        msg["info"] = "other-info"  # the digest covered "some-info"
        assert "wrong digest" in (await c.request(msg))["error"]


async def test_replayed_and_expired_challenges_are_refused(publisher):
    async with AppWsClient(ws_url(publisher)) as first:
        challenge = await first.challenge()
        captured = first.login_message(challenge, "pw-alice")
        assert (await first.request(captured))["ok"] is True
    async with AppWsClient(ws_url(publisher)) as c:
        # The captured AppLogin on a new connection: no challenge outstanding.
        answer = await c.request(captured)
        assert answer["ok"] is False and "no outstanding challenge" in answer["error"]
        # With a fresh challenge, the old digest does not fit it.
        await c.challenge()
        assert "wrong digest" in (await c.request(captured))["error"]
        # A challenge is single-use: the failed attempt consumed it.
        again = c.login_message(challenge, "pw-alice")
        assert "no outstanding challenge" in (await c.request(again))["error"]
        # Expired (challenge_ttl is 2.5 s here).
        fresh = await c.challenge()
        await asyncio.sleep(2.8)
        late = await c.request(c.login_message(fresh, "pw-alice"))
        assert late["ok"] is False and "expired" in late["error"]
        # ...and the connection still logs in with a new one.
        assert (await c.login("pw-alice"))["ok"] is True


async def test_failed_logins_are_rate_limited_per_address(tmp_path):
    replica = ReplicaProc(
        tmp_path,
        "rl",
        1,
        free_block(1),
        extra=replication_conf(tmp_path, failed_login_limit=3, failed_login_window=5.0),
    )
    replica.start()
    try:
        await replica.wait_ready()
        async with AppWsClient(ws_url(replica)) as c:
            for _ in range(3):
                assert "wrong digest" in (await c.login("wrong"))["error"]
            blocked = await c.login("pw-alice")  # even the right password is not checked
            assert blocked["ok"] is not True and "too many failed logins" in blocked["error"]
        await asyncio.sleep(5.2)
        async with AppWsClient(ws_url(replica)) as c:
            assert (await c.login("pw-alice"))["ok"] is True
        counts = await rejected(replica)
        assert counts["login_failed"] == 3 and counts["login_rate_limited"] == 1
    finally:
        replica.stop()


async def test_connections_not_logged_in_never_take_a_session_place(tmp_path):
    """The pre-login budget (docs/security.md, "Connections"): websockets that never log
    in fill only `max_pending` and are evicted oldest first; a login still gets a
    session place, and a login past `max_connections` sessions is refused."""
    admission = {"max_connections": 1, "max_pending": 3, "max_pending_per_address": 3}
    extra = replication_conf(tmp_path, admission=admission)
    replica = ReplicaProc(tmp_path, "adm", 1, free_block(1), extra=extra)
    replica.start()
    idle: list[AppWsClient] = []
    try:
        await replica.wait_ready()
        for _ in range(5):
            idle.append(await AppWsClient(ws_url(replica)).__aenter__())
        async with AppWsClient(ws_url(replica)) as bob:  # evicts one more idle one
            alice = await logged_in(replica)  # and one more: 4 evicted
            try:
                # The one session place went to alice while bob had not logged in yet.
                refused = await bob.login(USERS["bob"], sip="bob")
                assert refused["ok"] is not True
                assert "too many replication sessions" in refused["error"]
                # With the session budget full, a new connection is refused before the
                # upgrade.
                async with aiohttp.ClientSession() as http:
                    with pytest.raises(aiohttp.WSServerHandshakeError, match="503"):
                        await http.ws_connect(ws_url(replica))
            finally:
                await alice.__aexit__(None, None, None)
        counts = await rejected(replica)
        assert counts["evicted_before_init"] == 4, counts
        assert counts["too_many_connections"] == 2, counts
    finally:
        for c in idle:
            await c.__aexit__(None, None, None)
        replica.stop()


# -- starts, passes, columns -------------------------------------------------------------


async def test_full_then_incremental_start_and_guid_mismatch(publisher):
    writer = await logged_in(publisher)
    try:
        assert "error" not in await writer.start("users")
        await writer.initial_pass("users")
        for i in range(5):
            await writer.send(
                {"api": "users", "mt": "ReplicateAdd", "columns": {"id": f"inc{i}", "n": i}}
            )
        async with AppWsClient(ws_url(publisher)) as reader:
            await reader.login("pw-alice")
            start = await reader.start("users")
            assert start["full"] is True and re.fullmatch(r"[0-9a-f]{32}", start["guid"])
            # Wait until the writer's rows are all visible.
            for _ in range(50):
                rows, usn, _ = await reader.initial_pass("users")
                if all(f"inc{i}" in rows for i in range(5)):
                    break
                await asyncio.sleep(0.1)
                start = await reader.start("users")
            assert rows["inc3"] == {"id": "inc3", "n": 3}
            guid = start["guid"]
            assert usn == start["usn"]
        # Changes after usn: one update, one delete, one add.
        await writer.send(
            {"api": "users", "mt": "ReplicateUpdate", "columns": {"id": "inc1", "n": 10}}
        )
        await writer.send({"api": "users", "mt": "ReplicateDel", "columns": {"id": "inc2"}})
        await writer.send({"api": "users", "mt": "ReplicateAdd", "columns": {"id": "inc9", "n": 9}})
        await asyncio.sleep(0.3)
        async with AppWsClient(ws_url(publisher)) as reader:
            await reader.login("pw-alice")
            start = await reader.start("users", guid=guid, usn=usn)
            assert start["full"] is False and start["guid"] == guid and start["usn"] > usn
            rows, end, extra = await reader.initial_pass("users")
            assert rows == {"inc1": {"id": "inc1", "n": 10}, "inc9": {"id": "inc9", "n": 9}}
            dels = [m for m in extra if m["mt"] == "ReplicateDel"]
            assert [m["columns"] for m in dels] == [{"id": "inc2"}]
            assert end == start["usn"]
            # Nothing left to send: an incremental start at the end usn is empty.
            start2 = await reader.start("users", guid=guid, usn=end)
            assert start2["full"] is False
            assert (await reader.initial_pass("users"))[0] == {}
            # Another guid (e.g. another replica's store) or a usn from the future: full.
            wrong = await reader.start("users", guid="0" * 32, usn=end)
            assert wrong["full"] is True
            future = await reader.start("users", guid=guid, usn=end + 10**6)
            assert future["full"] is True
            full_rows = (await reader.initial_pass("users"))[0]
            assert "inc2" not in full_rows and full_rows["inc1"]["n"] == 10
    finally:
        await writer.__aexit__()


async def test_column_selection_update_flags_and_refusals(publisher):
    # phones: offered columns id, number (updatable), owner, note (updatable); no adds.
    loader = await hat_client.connect(net.TcpAddress(HOST, publisher.ports["eventer"]), "t/w")
    try:
        row = {"id": "p1", "number": "100", "owner": "ann", "note": "desk"}
        await loader.register(
            [hat.RegisterEvent(("replication", "phones", "p1"), None, hat.EventPayloadJson(row))],
            True,
        )
    finally:
        await loader.async_close()
    c = await logged_in(publisher)
    try:
        bad = await c.start("phones", columns={"id": {}, "colour": {}})
        assert "unknown columns ['colour']" in bad["error"]
        start = await c.start(
            "phones", columns={"number": {"update": True}, "owner": {"update": True}}
        )
        # owner is not updatable on this publisher; the key always travels.
        assert start["columns"] == {"number": {"update": True}, "owner": {}, "id": {}}
        assert start["add"] is False
        rows, _, _ = await c.initial_pass("phones")
        assert rows == {"p1": {"number": "100", "owner": "ann", "id": "p1"}}
        # More ReplicateNext than rows (a pipelining replicator): the end marker again.
        again = await c.request({"api": "phones", "mt": "ReplicateNext"})
        assert "columns" not in again and "error" not in again
        # Updating a column that is not update:true: refused, with the row as it stands.
        refused = await c.request(
            {"api": "phones", "mt": "ReplicateUpdate", "columns": {"id": "p1", "owner": "eve"}}
        )
        assert refused["mt"] == "ReplicateUpdateResult"
        assert "not updatable" in refused["error"]
        assert refused["columns"] == {"number": "100", "owner": "ann", "id": "p1"}
        # Adding is not granted on this table.
        refused = await c.request(
            {"api": "phones", "mt": "ReplicateAdd", "columns": {"id": "p2", "number": "1"}}
        )
        assert "adding rows was not granted" in refused["error"]
        # Deleting was not asked for in ReplicateStart... it was (del defaults True in the
        # client); start again without it.
        await c.start("phones", columns={"number": {"update": True}}, delete=False)
        await c.initial_pass("phones")
        refused = await c.request({"api": "phones", "mt": "ReplicateDel", "columns": {"id": "p1"}})
        assert "deleting rows was not granted" in refused["error"]
        # An allowed update goes through and keeps the columns not sent (note).
        await c.send(
            {"api": "phones", "mt": "ReplicateUpdate", "columns": {"id": "p1", "number": "200"}}
        )
        for _ in range(50):
            latest = await hat_latest(publisher, [("replication", "phones", "*")])
            stored = latest[("replication", "phones", "p1")].payload.data
            if stored["number"] == "200":
                break
            await asyncio.sleep(0.1)
        assert stored == {"id": "p1", "number": "200", "owner": "ann", "note": "desk"}
        assert len(latest) == 1  # nothing refused was stored
    finally:
        await c.__aexit__()


# -- live changes ------------------------------------------------------------------------


async def test_live_changes_both_ways_and_through_eventer(publisher):
    a = await logged_in(publisher)
    b = await logged_in(publisher, "bob")
    try:
        for c in (a, b):
            await c.start("users", columns={"id": {}, "name": {"update": True}})
            await c.initial_pass("users")
        await a.send(
            {"api": "users", "mt": "ReplicateAdd", "columns": {"id": "lv1", "name": "Ann"}}
        )
        [add] = await b.live(1)
        assert add["mt"] == "ReplicateAdd" and add["columns"] == {"id": "lv1", "name": "Ann"}
        assert isinstance(add["usn"], int)
        await b.send(
            {"api": "users", "mt": "ReplicateUpdate", "columns": {"id": "lv1", "name": "Bo"}}
        )
        [upd] = await a.live(1)
        assert upd["mt"] == "ReplicateUpdate" and upd["columns"]["name"] == "Bo"
        assert upd["usn"] > add["usn"]
        # The writer does not get its own change echoed.
        assert await b.quiet(0.3) == []
        # A row written over Eventer (hat-event client) reaches both sessions.
        client = await hat_client.connect(net.TcpAddress(HOST, publisher.ports["eventer"]), "t/w")
        try:
            await client.register(
                [
                    hat.RegisterEvent(
                        ("replication", "users", "lv2"),
                        None,
                        hat.EventPayloadJson({"id": "lv2", "name": "Cy", "extra": 1}),
                    )
                ],
                True,
            )
            # Only the selected columns travel.
            for c in (a, b):
                [m] = await c.live(1)
                assert m["mt"] == "ReplicateAdd" and m["columns"] == {"id": "lv2", "name": "Cy"}
            # A tombstone (no payload) deletes the row.
            await client.register(
                [hat.RegisterEvent(("replication", "users", "lv2"), None, None)], True
            )
            for c in (a, b):
                [m] = await c.live(1)
                assert m["mt"] == "ReplicateDel" and m["columns"] == {"id": "lv2"}
        finally:
            await client.async_close()
        # The replicator's delete becomes a tombstone event visible over Eventer.
        await a.send({"api": "users", "mt": "ReplicateDel", "columns": {"id": "lv1"}})
        [d] = await b.live(1)
        assert d["mt"] == "ReplicateDel"
        latest = await hat_latest(publisher, [("replication", "users", "lv1")])
        assert latest[("replication", "users", "lv1")].payload is None
    finally:
        await a.__aexit__()
        await b.__aexit__()


# -- bad input ---------------------------------------------------------------------------


async def test_bad_frames_and_messages_are_answered_counted_and_harmless(publisher):
    before = await rejected(publisher)
    rows_before = set(await hat_latest(publisher, [("replication", "users", "*")]))
    c = await logged_in(publisher)
    try:
        await c.send("this is not json")
        assert (await c.recv())["mt"] == "Error"
        await c.send("[1, 2]")
        assert "must be a JSON object" in (await c.recv())["error"]
        await c.send('{"api": "users"}')
        assert "'mt'" in (await c.recv())["error"]
        await c.ws.send_bytes(b"\x00\x01")
        assert "binary frame" in (await c.recv())["error"]
        answer = await c.request({"api": "users", "mt": "ReplicateFrobnicate"})
        assert (
            answer["mt"] == "ReplicateFrobnicateResult"
            and "unknown message type" in answer["error"]
        )
        answer = await c.request({"api": "nosuchtable", "mt": "ReplicateStart", "columns": {}})
        assert "unknown table" in answer["error"]
        answer = await c.request({"api": "users", "mt": "ReplicateNext"})
        assert "no ReplicateStart" in answer["error"]
        answer = await c.request({"api": "users", "mt": "ReplicateStart", "columns": ["id"]})
        assert "'columns' must be an object" in answer["error"]
        answer = await c.request({"api": "users", "mt": "ReplicateStart", "columns": {"id": True}})
        assert "must be an object" in answer["error"]
        answer = await c.request({"api": "users", "mt": "ReplicateStart", "usn": -1})
        assert "usn" in answer["error"]
        assert "error" not in await c.start("users")
        await c.initial_pass("users")
        for bad_columns, text in (
            ("row", "must be an object"),
            ({"name": "no key"}, "no key column"),
            ({"id": ["x"]}, "row key"),
            ({"id": "*"}, "row key"),
            # The shared payload rule: numbers no JSON reader holds (json.dumps writes
            # NaN and Infinity; 10**400 is JSON text beyond a double).
            ({"id": "n1", "name": float("nan")}, "the number NaN is not a finite double"),
            ({"id": "n2", "name": float("-inf")}, "the number -Infinity is not a finite"),
            ({"id": "n3", "name": [10**400]}, "the number 100000000000... (401 characters)"),
        ):
            answer = await c.request({"api": "users", "mt": "ReplicateAdd", "columns": bad_columns})
            assert answer["mt"] == "ReplicateAddResult" and text in answer["error"], answer
        # The connection still works.
        await c.send({"api": "users", "mt": "ReplicateAdd", "columns": {"id": "ok1"}})
        async with AppWsClient(ws_url(publisher)) as other:
            assert (await other.login("pw-alice"))["ok"] is True
    finally:
        await c.__aexit__()
    after = await rejected(publisher)
    assert after["bad_frame"] - before.get("bad_frame", 0) == 4
    assert after["bad_message"] - before.get("bad_message", 0) >= 8
    assert after["unexpected_message"] - before.get("unexpected_message", 0) >= 2
    # Nothing half-stored: of all the writes above only the good one made an event.
    for _ in range(50):
        rows_after = set(await hat_latest(publisher, [("replication", "users", "*")]))
        if ("replication", "users", "ok1") in rows_after:
            break
        await asyncio.sleep(0.1)
    assert rows_after - rows_before == {("replication", "users", "ok1")}


async def test_huge_frame_closes_only_that_connection(publisher):
    before = await rejected(publisher)
    c = await logged_in(publisher)
    try:
        await c.send(json.dumps({"mt": "ReplicateStart", "api": "users", "pad": "x" * 200_000}))
        frame = await c.ws.receive(timeout=10)
        assert frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert c.ws.close_code == 1009
    finally:
        await c.__aexit__()
    # Before login the limit is 64 KiB.
    async with AppWsClient(ws_url(publisher)) as pre:
        await pre.send(json.dumps({"mt": "AppChallenge", "pad": "x" * 70_000}))
        assert "before login" in (await pre.recv())["error"]
    async with AppWsClient(ws_url(publisher)) as other:
        assert (await other.login("pw-alice"))["ok"] is True
    after = await rejected(publisher)
    assert after["message_too_large"] - before.get("message_too_large", 0) == 2


async def test_session_that_never_reads_is_closed(publisher):
    before = await rejected(publisher)
    slow = await logged_in(publisher)
    writer = await logged_in(publisher, "bob")
    try:
        await slow.start("users")
        await slow.initial_pass("users")
        await writer.start("users")
        await writer.initial_pass("users")
        # ~20 MB of changes: more than socket buffers hold, so the outbox (50) overflows.
        big = "y" * 90_000
        for i in range(250):
            await writer.send(
                {"api": "users", "mt": "ReplicateAdd", "columns": {"id": f"big{i}", "v": big}}
            )
        closed = False
        for _ in range(600):
            frame = await slow.ws.receive(timeout=30)
            if frame.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.CLOSING,
            ):
                closed = True
                break
        assert closed and slow.ws.close_code == 1008
        # The writer's session and the replica keep working.
        await writer.send(
            {"api": "users", "mt": "ReplicateUpdate", "columns": {"id": "big0", "v": "small"}}
        )
        async with AppWsClient(ws_url(publisher)) as other:
            assert (await other.login("pw-alice"))["ok"] is True
    finally:
        await slow.__aexit__()
        await writer.__aexit__()
    after = await rejected(publisher)
    assert after["slow_subscriber"] - before.get("slow_subscriber", 0) == 1


async def test_login_timeout_closes_the_connection(tmp_path):
    replica = ReplicaProc(
        tmp_path,
        "lt",
        1,
        free_block(1),
        extra=replication_conf(tmp_path, admission={"init_timeout": 0.5}),
    )
    replica.start()
    try:
        await replica.wait_ready()
        async with AppWsClient(ws_url(replica)) as c:
            frame = await c.ws.receive(timeout=5)
            assert frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert (await rejected(replica))["init_timeout"] == 1
    finally:
        replica.stop()


async def test_status_and_metrics_show_replication(publisher):
    async with AppWsClient(ws_url(publisher)) as c:
        await c.login("pw-alice")
        start = await c.start("users")
        async with aiohttp.ClientSession() as s:
            async with s.get(publisher.http + "/status") as resp:
                doc = (await resp.json())["protocols"]["replication"]
            async with s.get(publisher.http + "/metrics") as resp:
                metrics = await resp.text()
    assert doc["guid"] == start["guid"] and doc["path"] == "/replication"
    assert set(doc["tables"]) == {"users", "phones"}
    assert {"peer": "127.0.0.1", "user": "alice", "tables": {"users": "pass"}} in doc["sessions"]
    assert re.search(r'eventfleet_connections\{protocol="replication"\} [1-9]', metrics)


async def test_passwords_never_reach_the_log(publisher):
    async with AppWsClient(ws_url(publisher)) as c:
        await c.login("pw-wrong-guess")
        await c.login("pw-alice")
    text = publisher.log()
    assert "replication login from" in text
    for secret in (*USERS.values(), "pw-wrong-guess"):
        assert secret not in text
