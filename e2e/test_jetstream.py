"""Jetstream against real replica processes, spoken by the reference client.

The client is jetstream-js from the npm package ``jetstream`` 0.13.4, run by Node (one
process per client, driven by e2e/jetstream/driver.js); the reference server comes from
the same package. Both are installed by scripts/tools/jetstream.sh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import aiohttp
import pytest
from hat.drivers import net
from hat.event import common as hat
from hat.event.eventer import client as hat_client

from e2e.fleet_helpers import (
    ReplicaProc,
    eventually,
    free_block,
    mesh_peers,
    status,
)
from e2e.jetstream.refclient import RefClient, ReferenceServer, ensure_tools, ref_clients

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _reference_tools():
    ensure_tools()


def js_url(replica: ReplicaProc) -> str:
    return f"ws://127.0.0.1:{replica.ports['http']}/jetstream"


@contextlib.asynccontextmanager
async def replicas(tmp_path, n: int, *, token: str | None = None, extra: dict | None = None):
    token_file = None
    if token:
        token_file = tmp_path / "token"
        token_file.write_text(token)
    procs = [
        ReplicaProc(tmp_path, f"r{i + 1}", i + 1, free_block(1), token_file=token_file, extra=extra)
        for i in range(n)
    ]
    try:
        for p in procs:
            p.write_config(mesh_peers([q for q in procs if q is not p]))
            p.start()
        for p in procs:
            await p.wait_ready()
        yield procs
    finally:
        for p in procs:
            if p.proc is not None:
                p.stop()


def items(answer: dict) -> list[tuple[str, bool]]:
    return [(it["text"], it["done"]) for it in answer["state"]["items"] if it]


async def test_session_fetch_sync_and_live_changes_between_sessions(tmp_path):
    async with replicas(tmp_path, 1) as (r1,), ref_clients(2) as (a, b):
        first = await a.connect(js_url(r1), "groceries")
        assert first["state"]["items"] == []
        assert (await a.call("add", text="milk"))["state"] == "COMPLETED"
        assert (await a.call("add", text="eggs"))["state"] == "COMPLETED"
        assert (await a.call("toggle", index=0))["state"] == "COMPLETED"
        assert (await a.call("title", text="Saturday"))["state"] == "COMPLETED"

        # A second session gets the same state from the store (ScopeState)...
        second = await b.connect(js_url(r1), "groceries")
        assert second["state"]["rootUUID"] == first["state"]["rootUUID"]
        assert second["state"]["title"] == "Saturday"
        assert items(second) == [("milk", True), ("eggs", False)]
        # ...then each sees the other's edits live (server ScopeSync), removal included.
        assert (await b.call("remove", index=0))["state"] == "COMPLETED"
        seen = await a.call("waitFor", count=1, text="eggs")
        assert seen["ok"], seen
        await a.call("add", text="bread")
        seen = await b.call("waitFor", count=2, text="bread")
        assert seen["ok"] and items(seen) == [("eggs", False), ("bread", False)]

        doc = await status(r1.http)
        js = doc["protocols"]["jetstream"]
        assert js["sessions"] == 2 and js["scopes"] == 1 and js["syncs_applied"] == 6


async def test_atomic_sync_with_one_bad_fragment_stores_nothing(tmp_path):
    async with replicas(tmp_path, 1) as (r1,), ref_clients(2) as (a, b):
        state = (await a.connect(js_url(r1), "atomic"))["state"]
        root = state["rootUUID"]
        good = {
            "type": "add",
            "clsName": "Item",
            "uuid": str(uuid.uuid4()),
            "properties": {"text": "ok"},
        }
        parent = {
            "type": "change",
            "clsName": "List",
            "uuid": root,
            "properties": {"items": [good["uuid"]]},
        }
        bad = {
            "type": "add",
            "clsName": "Item",
            "uuid": str(uuid.uuid4()),
            "properties": {"done": "yes"},
        }
        reply = await a.call("raw", message={"atomic": True, "fragments": [good, parent, bad]})
        kinds = [r["error"]["type"] for r in reply["fragmentReplies"]]
        assert kinds == ["atomic-sync-rejected", "atomic-sync-rejected", "invalid-property"]
        # Nothing half-applied: a fresh session and the store agree the list is empty.
        fresh = await b.connect(js_url(r1), "atomic")
        assert fresh["state"]["items"] == []
        async with hat_events(r1) as conn:
            result = await conn.query(hat.QueryLatestParams([("jetstream", "atomic", "*")]))
            assert result.events == []
        # The same fragments without `atomic`: the good ones are applied.
        reply = await a.call("raw", message={"atomic": False, "fragments": [good, parent, bad]})
        assert reply["fragmentReplies"][:2] == [{"accepted": True}, {"accepted": True}]
        seen = await b.call("waitFor", count=1, text="ok")
        assert seen["ok"], seen


async def test_resume_after_a_dropped_connection_resends_what_was_missed(tmp_path):
    async with replicas(tmp_path, 1) as (r1,), ref_clients(2) as (a, b):
        token = (await a.connect(js_url(r1), "resume"))["token"]
        await b.connect(js_url(r1), "resume")
        await a.call("offline", ms=1500)
        for text in ("one", "two", "three"):
            assert (await b.call("add", text=text))["state"] == "COMPLETED"
        seen = await a.call("waitFor", count=3, timeout=10000)
        assert seen["ok"], seen
        assert [t for t, _ in items(seen)] == ["one", "two", "three"]
        stats = await a.call("stats")
        assert stats["status"] == "CONNECTED" and stats["serverIndex"] >= 5
        # The same session, resumed: the replica never saw a third SessionCreate.
        js = (await status(r1.http))["protocols"]["jetstream"]
        assert js["sessions"] == 2
        # And the resumed session still sends: its edit reaches b.
        await a.call("add", text="four")
        assert (await b.call("waitFor", count=4, text="four"))["ok"]
        assert token


async def test_server_pings_carry_the_ack_the_client_trims_its_resend_buffer_with(tmp_path):
    async with (
        replicas(tmp_path, 1, extra={"jetstream": {"ping_interval": 0.3}}) as (r1,),
        ref_clients(1) as (a,),
    ):
        await a.connect(js_url(r1), "pings")
        for text in ("one", "two", "three"):
            await a.call("add", text=text)
            # Busy or not, the server pings: the client keeps its syncs until acked.
        for _ in range(50):
            stats = await a.call("stats")
            if stats["nonAcked"] == 0:
                break
            await asyncio.sleep(0.1)
        assert stats["nonAcked"] == 0, stats


async def test_bad_input_is_refused_and_the_replica_keeps_serving(tmp_path):
    async with replicas(tmp_path, 1, token="s3cret") as (r1,), ref_clients(1) as (a,):
        url = js_url(r1)
        async with aiohttp.ClientSession() as http:
            # Unknown session token: close 4096, as the reference.
            async with http.ws_connect(url + "?x-jetstream-sessiontoken=bogus") as ws:
                msg = await ws.receive(timeout=5)
                assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4096
                assert json.loads(msg.extra)["type"] == "session-token-unrecognized"
            # Something else than SessionCreate first.
            async with http.ws_connect(url) as ws:
                await ws.send_str(json.dumps({"type": "Ping", "index": 0, "ack": 0}))
                msg = await ws.receive(timeout=5)
                assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4096
            # Wrong credentials: an auth-error reply, then the connection is closed.
            async with http.ws_connect(url) as ws:
                await ws.send_str(
                    json.dumps(
                        {
                            "type": "SessionCreate",
                            "index": 0,
                            "version": "0.1.0",
                            "params": {"token": "x"},
                        }
                    )
                )
                (reply,) = json.loads((await ws.receive(timeout=5)).data)
                assert reply["error"]["type"] == "auth-error" and "sessionToken" not in reply
            # A good session that then sends garbage, a binary frame, an unknown type and
            # an oversized frame: errors are counted, the session survives the first three.
            async with http.ws_connect(url, max_msg_size=0) as ws:
                create = {"type": "SessionCreate", "index": 0, "version": "0.1.0"}
                create["params"] = {"token": "s3cret"}
                await ws.send_str(json.dumps(create))
                (reply,) = json.loads((await ws.receive(timeout=5)).data)
                assert reply["sessionToken"]
                await ws.send_str("{not json")
                await ws.send_bytes(b"\x00\x01")
                await ws.send_str(json.dumps({"type": "Teleport", "index": 1}))
                await ws.send_str(json.dumps({"type": "ScopeFetch", "index": 2, "name": "a/b"}))
                (reply,) = json.loads((await ws.receive(timeout=5)).data)
                assert (
                    reply["type"] == "ScopeFetchReply"
                    and reply["error"]["type"] == "invalid-scope-name"
                )
                await ws.send_str(
                    json.dumps({"type": "ScopeFetch", "index": 3, "name": "x" * 5_000_000})
                )
                msg = await ws.receive(timeout=10)
                assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009
        # The reference client without the token is denied; with it (X-Jetstream-Token in
        # the URL, the only place the reference client can carry it) it works.
        denied = await a.call("connect", url=url, scope="s")
        assert denied == {"id": denied["id"], "ok": False, "error": "sessionDenied"}
        async with ref_clients(1) as (good,):
            assert (await good.connect(url, "s", token="s3cret"))["ok"]
            assert (await good.call("add", text="still serving"))["state"] == "COMPLETED"
        counted = await rejections(r1)
        for reason in (
            "unknown_session",
            "not_initialized",
            "bad_token",
            "bad_frame",
            "unexpected_message",
            "bad_scope",
            "message_too_large",
        ):
            assert counted.get(reason, 0) >= 1, (reason, counted)
        assert counted["bad_frame"] >= 2  # the garbage text and the binary frame


async def rejections(replica: ReplicaProc) -> dict[str, float]:
    """``eventfleet_rejected_total{protocol="jetstream"}`` by reason, from /metrics."""
    async with aiohttp.ClientSession() as http, http.get(replica.http + "/metrics") as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("eventfleet_rejected_total{") and 'protocol="jetstream"' in line:
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


async def test_a_session_that_never_reads_is_closed_and_others_go_on(tmp_path):
    extra = {"jetstream": {"max_queued_messages": 20}}
    async with replicas(tmp_path, 1, extra=extra) as (r1,), ref_clients(2) as (a, b):
        url = js_url(r1)
        await a.connect(url, "flood")
        async with aiohttp.ClientSession() as http, http.ws_connect(url) as stuck:
            create = {"type": "SessionCreate", "index": 0, "version": "0.1.0", "params": {}}
            await stuck.send_str(json.dumps(create))
            await stuck.send_str(json.dumps({"type": "ScopeFetch", "index": 1, "name": "flood"}))
            # From here on `stuck` reads nothing: every change below is fanned out to it
            # until the socket and then its queue are full.
            big = "x" * 200_000
            for i in range(60):
                assert (await a.call("title", text=f"{i} {big}"))["state"] == "COMPLETED"
                if (await rejections(r1)).get("slow_subscriber"):
                    break
            assert (await rejections(r1)).get("slow_subscriber") == 1
        # The replica goes on serving the other sessions.
        await b.connect(url, "flood")
        assert (await a.call("add", text="after the flood"))["state"] == "COMPLETED"
        assert (await b.call("waitFor", count=1, text="after the flood"))["ok"]


@contextlib.asynccontextmanager
async def hat_events(replica: ReplicaProc, **kwargs):
    host, port = replica.eventer
    conn = await hat_client.connect(
        net.TcpAddress(host, port), f"e2e/jetstream/{replica.name}", **kwargs
    )
    try:
        yield conn
    finally:
        await conn.async_close()


async def test_fleet_wide_changes_and_failover_after_kill9(tmp_path):
    async with replicas(tmp_path, 3) as (r1, r2, r3), ref_clients(3) as (a, c, later):
        await a.connect(js_url(r1), "fleet")
        await c.connect(js_url(r3), "fleet")
        for text in ("alpha", "beta"):
            assert (await a.call("add", text=text))["state"] == "COMPLETED"
        # Seen over Jetstream on r3...
        seen = await c.call("waitFor", count=2, text="beta", timeout=15000)
        assert seen["ok"], seen
        # ...and over Eventer (the real hat-event client) on r2.
        async with hat_events(r2) as conn:

            async def two_items():
                result = await conn.query(
                    hat.QueryLatestParams([("jetstream", "fleet", "Item", "*")])
                )
                texts = sorted(e.payload.data["text"] for e in result.events)
                return texts if texts == ["alpha", "beta"] else None

            await eventually(two_items, "r2 holds both items")
            # A change made over Eventer on r2 reaches Jetstream sessions on r1 and r3.
            item_uuid = seen["state"]["items"][0]["uuid"]
            await conn.register(
                [
                    hat.RegisterEvent(
                        ("jetstream", "fleet", "Item", item_uuid),
                        None,
                        hat.EventPayloadJson({"text": "alpha (via eventer)", "done": True}),
                    )
                ],
                with_response=True,
            )
        for client in (a, c):
            got = await client.call("waitFor", count=2, text="alpha (via eventer)", timeout=15000)
            assert got["ok"], got
        # kill -9 the replica a's session is on; a client on r2 ends with the same state.
        expected = items(await c.call("state"))
        r1.kill9()
        resumed = await later.connect(js_url(r2), "fleet")
        assert items(resumed) == expected
        await later.call("add", text="after failover")
        got = await c.call("waitFor", count=3, text="after failover", timeout=15000)
        assert got["ok"], got


async def test_reference_server_and_ours_answer_the_same_script(tmp_path):
    """The same client script against Uber's server and ours: the states must agree; the
    documented difference is `atomic` (the reference applies the good fragments)."""
    ref = ReferenceServer(free_block(1), tmp_path / "reference.log").start()
    try:
        async with replicas(tmp_path, 1) as (r1,):
            transcripts = {}
            for name, url in (("reference", ref.url + "/"), ("eventfleet", js_url(r1))):
                async with ref_clients(2) as (a, b):
                    transcripts[name] = await _script(a, b, url)
    finally:
        ref.stop()
    ours, theirs = transcripts["eventfleet"], transcripts["reference"]
    assert ours["states"] == theirs["states"]
    assert ours["outcomes"] == theirs["outcomes"]
    # atomic: true with one bad fragment: the reference applies the others, we do not.
    assert theirs["atomic_items"] == 2 and ours["atomic_items"] == 1
    assert all("error" in r for r in ours["atomic_reply"])
    assert sum("error" in r for r in theirs["atomic_reply"]) == 1


async def _script(a: RefClient, b: RefClient, url: str) -> dict:
    states, outcomes = [], []
    scope = f"script-{uuid.uuid4().hex[:8]}"
    root = (await a.connect(url, scope))["state"]["rootUUID"]
    await b.connect(url, scope)
    for op, args in [
        ("add", {"text": "milk"}),
        ("add", {"text": "eggs"}),
        ("toggle", {"index": 1}),
        ("title", {"text": "list"}),
        ("remove", {"index": 0}),
    ]:
        outcomes.append((await a.call(op, **args))["state"])
        expected = [list(x) for x in items(await a.call("state"))]
        # b must reach exactly a's state through the server's ScopeSync messages.
        seen = await b.call("waitFor", items=expected, timeout=5000)
        states.append(items(seen) if seen["ok"] else ["b did not converge", items(seen)])
    good = str(uuid.uuid4())
    current = [i["uuid"] for i in (await a.call("state"))["state"]["items"] if i]
    fragments = [
        {"type": "add", "clsName": "Item", "uuid": good, "properties": {"text": "atomic"}},
        {
            "type": "change",
            "clsName": "List",
            "uuid": root,
            "properties": {"items": [*current, good]},
        },
        {"type": "add", "clsName": "Nope", "uuid": str(uuid.uuid4()), "properties": {}},
    ]
    reply = await a.call("raw", message={"atomic": True, "fragments": fragments})
    await asyncio.sleep(0.5)
    late = await RefClient.start("late")
    try:
        after = await late.connect(url, scope)
    finally:
        await late.close()
    return {
        "states": states,
        "outcomes": outcomes,
        "atomic_reply": [
            {k: v for k, v in r.items() if k != "accepted"} for r in reply["fragmentReplies"]
        ],
        "atomic_items": len([i for i in after["state"]["items"] if i]),
    }


async def test_operator_rendered_jetstream_section_runs_a_replica(tmp_path):
    """The operator path: `spec.protocols.jetstream` -> the section the operator renders
    (builders.replica_config) -> a real replica serving it, used by the reference client
    at the configured path, with models under the configured type prefix."""
    from eventfleet_operator import builders, model

    spec = model.parse(
        "demo",
        "events",
        {"protocols": {"jetstream": {"path": "/sync", "typePrefix": ["site", "a"]}}},
    )
    section = builders.replica_config(spec, peer_count=1, allow_empty_start=True)["jetstream"]
    assert section == {"enabled": True, "path": "/sync", "type_prefix": ["site", "a"]}
    async with replicas(tmp_path, 1, extra={"jetstream": section}) as (r1,), ref_clients(1) as (a,):
        url = f"ws://127.0.0.1:{r1.ports['http']}/sync"
        await a.connect(url, "ops")
        assert (await a.call("add", text="from the operator's config"))["state"] == "COMPLETED"
        async with hat_events(r1) as conn:
            result = await conn.query(
                hat.QueryLatestParams([("site", "a", "jetstream", "ops", "Item", "*")])
            )
            assert [e.payload.data["text"] for e in result.events] == ["from the operator's config"]
        async with aiohttp.ClientSession() as http, http.get(js_url(r1)) as resp:
            assert resp.status == 404  # not at the default path


async def test_connections_without_a_session_never_take_a_session_place(tmp_path):
    """The pre-init budget (docs/security.md, "Connections"): upgraded websockets that
    never send SessionCreate fill only `max_pending`, oldest evicted first; a client
    still creates its session, and one past `max_connections` sessions is refused."""
    admission = {"max_connections": 1, "max_pending": 3, "max_pending_per_address": 3}
    extra = {"jetstream": {"admission": admission}}
    create = json.dumps({"type": "SessionCreate", "index": 0, "version": "0.1.0"})
    async with replicas(tmp_path, 1, extra=extra) as (r1,), aiohttp.ClientSession() as http:
        url = js_url(r1)
        idle = [await http.ws_connect(url) for _ in range(5)]
        late = await http.ws_connect(url)  # evicts one more idle connection: 3 so far
        async with http.ws_connect(url) as first:  # and one more: 4
            await first.send_str(create)
            (reply,) = json.loads((await first.receive(timeout=5)).data)
            assert reply["sessionToken"]
            # The one session place is taken: `late`'s SessionCreate is refused...
            await late.send_str(create)
            msg = await late.receive(timeout=5)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4096
            assert json.loads(msg.extra)["type"] == "too-many-connections"
            # ... and a new connection is refused before the upgrade.
            with pytest.raises(aiohttp.WSServerHandshakeError, match="503"):
                await http.ws_connect(url)
        for ws in [*idle, late]:
            await ws.close()
        counted = await rejections(r1)
        assert counted["evicted_before_init"] == 4, counted
        assert counted["too_many_connections"] == 2, counted


async def test_what_fuzzing_found_is_refused_or_served_by_a_real_replica(tmp_path):
    """The Jetstream faults the session fuzz targets found (docs/security.md, "Decoders
    and fuzzing" 5-8), over real websockets: a date of 400 digits and a NaN are refused and
    counted, the session goes on; a lone surrogate in a string and an upper-case reference
    are stored, fanned out to another session and served in a later ScopeState."""

    async def take(ws, wanted: str) -> dict:
        while True:
            for m in json.loads((await ws.receive(timeout=10)).data):
                if m["type"] == wanted:
                    return m

    async def session(http, url: str, index: int = 1):
        ws = await http.ws_connect(url)
        create = {"type": "SessionCreate", "index": 0, "version": "0.1.0"}
        await ws.send_str(json.dumps({**create, "params": {"token": "s3cret"}}))
        assert (await take(ws, "SessionCreateReply"))["sessionToken"]
        await ws.send_str(json.dumps({"type": "ScopeFetch", "index": index, "name": "s"}))
        return ws, await take(ws, "ScopeState")

    async with replicas(tmp_path, 1, token="s3cret") as (r1,), aiohttp.ClientSession() as http:
        url = js_url(r1)
        a, state = await session(http, url)
        b, _ = await session(http, url)
        root = state["rootUUID"]

        def sync(index: int, fragments: list) -> str:
            return json.dumps(
                {"type": "ScopeSync", "index": index, "scopeIndex": 0, "fragments": fragments}
            )

        big = {"type": "add", "clsName": "Item", "uuid": "b1", "properties": {"created": 10**400}}
        await a.send_str(sync(2, [big]))
        reply = await take(a, "ScopeSyncReply")
        assert reply["fragmentReplies"][0]["error"]["type"] == "invalid-property"
        await a.send_str(sync(3, [big]).replace("1" + "0" * 400, "NaN"))  # not JSON
        item = {"type": "add", "clsName": "Item", "uuid": "A2", "properties": {"text": "\ud800"}}
        link = {"type": "change", "clsName": "List", "uuid": root, "properties": {"items": ["A2"]}}
        await a.send_str(sync(4, [item, link]))
        assert (await take(a, "ScopeSyncReply"))["fragmentReplies"] == [{}, {}]
        fanned = await take(b, "ScopeSync")  # the other session gets the change
        assert {f["uuid"]: f["properties"] for f in fanned["fragments"]} == {
            "a2": {"text": "\ud800"},
            root: {"items": ["a2"]},
        }
        c, state = await session(http, url)  # a later fetch serves the model
        assert {f["uuid"]: f["properties"] for f in state["fragments"]} == {
            root: {"items": ["a2"]},
            "a2": {"text": "\ud800"},
        }
        for ws in (a, b, c):
            await ws.close()
        counted = await rejections(r1)
        assert counted.get("bad_fragment") == 1 and counted.get("bad_frame") == 1, counted
