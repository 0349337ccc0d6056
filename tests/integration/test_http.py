"""The replica's HTTP endpoint: probes, /status contract, /metrics content, /flush, mounts.

Peer-dependent behaviour is driven here through a stand-in object with the Syncer's
documented interface (`state()`, `initial_sync_done`, `flush_peer`), so the HTTP side is
pinned independently of the Syncer; test_http_syncer.py runs the same against real peers.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import typing

import aiohttp
import pytest
from aiohttp import web
from eventfleet_server.client.eventer import EventerInitError, connect
from eventfleet_server.common.model import (
    Event,
    EventId,
    QueryServerParams,
    RegisterEvent,
    Status,
    Timestamp,
)
from eventfleet_server.http.health import readiness
from eventfleet_server.syncer.routes import FLUSH_PATH, FlushRoute, peer_metrics
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import running_replica

STATUS_KEYS = {
    "version",
    "server_id",
    "status",
    "ready",
    "session",
    "last_ids",
    "peers",
    "storage",
    "protocols",
    "credentials",
}


class FakeSyncer:
    """The Syncer's contract as the HTTP layer reads it: the protocol plug-in interface
    (with `initial_sync_done` and `peer_states()`) plus `state()` and `flush_peer`."""

    name = "syncer"
    connection_count = 0
    rejected: typing.ClassVar[dict] = {}

    def __init__(self, peers=(), *, initial_sync_done=True, flush_result=True):
        self.peers = list(peers)
        self.initial_sync_done = initial_sync_done
        self.flush_result = flush_result
        self.flushed: list[tuple[str, float]] = []

    def health(self):
        return None if self.initial_sync_done else "initial sync with the peers is not done"

    def describe(self):
        return {"port": None}

    def state(self):
        return [dict(p) for p in self.peers]

    def peer_states(self):
        return self.state()

    async def flush_peer(self, name, timeout):
        self.flushed.append((name, timeout))
        return self.flush_result


@pytest.fixture
def use_syncer(replica, monkeypatch):
    """Put a stand-in syncer (or None) on `replica` for one test.

    Through monkeypatch, which is undone before the replica fixture stops the replica, so
    the replica's own Syncer (if it runs one) is the one that gets stopped.
    """

    return lambda syncer: install_syncer(replica, monkeypatch, syncer)


def install_syncer(replica, monkeypatch, syncer):
    """Replace the replica's Syncer protocol by `syncer` (None: no Syncer) for one test:
    the real Syncer's ``/flush`` route and metrics are withdrawn and the stand-in's
    mounted the way the Syncer mounts its own (`eventfleet_server.syncer.routes`)."""
    for proto, _ in replica.protocol_states:
        if proto.name == "syncer" and hasattr(proto, "withdraw"):
            proto.withdraw()
    others = [p for p, _ in replica.protocol_states if p.name != "syncer"]
    created = [*others, syncer] if syncer is not None else others
    monkeypatch.setattr(replica, "_created", created)
    monkeypatch.setattr(replica, "protocols", {p.name: p for p in created})
    if syncer is not None:
        route = FlushRoute(syncer, lambda: replica.storage.last_ids)
        replica.http.mount_json(FLUSH_PATH, route, method="POST")
        replica.http.add_metrics(lambda: peer_metrics(syncer))
    return syncer


def peer(name, server_id, state="synced", **extra):
    return {
        "name": name,
        "server_id": server_id,
        "state": state,
        "last_event_id": {"server": server_id, "session": 3, "instance": 7},
        "lag_events": 0,
        "lag_seconds": 0.0,
        **extra,
    }


def url(replica, path):
    return f"http://127.0.0.1:{replica.http.port}{path}"


async def get(replica, path, **kwargs):
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(url(replica, path), **kwargs) as resp,
    ):
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def get_json(replica, path):
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(url(replica, path)) as resp,
    ):
        return resp.status, await resp.json()


async def post_json(replica, path):
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.post(url(replica, path)) as resp,
    ):
        return resp.status, await resp.json()


async def scrape(replica) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    status, _, text = await get(replica, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def register(replica, *batches):
    client = await connect("127.0.0.1", replica.eventer.port, "test/http")
    try:
        for size in batches:
            events = [RegisterEvent(("http", str(i)), None, None) for i in range(size)]
            assert await client.register(events, with_response=True)
    finally:
        await client.close()


# -- probes and /status ---------------------------------------------------------------------


async def test_probes_and_status_of_a_standalone_replica(replica):
    status, body = await get_json(replica, "/healthz")
    assert status == 200 and body["alive"] is True
    assert await get_json(replica, "/readyz") == (200, {"ready": True})

    await register(replica, 2, 3)
    status, doc = await get_json(replica, "/status")
    assert status == 200
    assert set(doc) == STATUS_KEYS
    assert doc["version"] == 1
    assert doc["server_id"] == 1
    assert doc["status"] == "operational" and doc["ready"] is True
    assert doc["session"] == replica.engine.last_id.session
    last = replica.engine.last_id
    assert doc["last_ids"] == {
        "1": {"server": 1, "session": last.session, "instance": last.instance}
    }
    assert doc["peers"] == []
    assert doc["storage"]["events"] == 5
    assert doc["storage"]["db_bytes"] > 0
    assert doc["storage"]["last_seq"] >= 5


async def test_readyz_waits_for_the_initial_sync_and_status_shows_peers(replica, use_syncer):
    syncer = FakeSyncer(
        [peer("r2", 2, "syncing", lag_events=40, lag_seconds=1.5), peer("r3", 3, "disconnected")],
        initial_sync_done=False,
    )
    use_syncer(syncer)
    status, body = await get_json(replica, "/readyz")
    assert status == 503
    assert body["ready"] is False and "initial sync" in body["reason"]
    _, doc = await get_json(replica, "/status")
    assert doc["ready"] is False and doc["status"] == "operational"
    assert doc["peers"][0] == {
        "name": "r2",
        "server_id": 2,
        "state": "syncing",
        "last_event_id": {"server": 2, "session": 3, "instance": 7},
        "lag_events": 40,
        "lag_seconds": 1.5,
    }
    assert doc["peers"][1]["state"] == "disconnected"

    syncer.initial_sync_done = True
    syncer.peers[0]["state"] = "synced"
    assert await get_json(replica, "/readyz") == (200, {"ready": True})
    _, doc = await get_json(replica, "/status")
    assert doc["ready"] is True and doc["peers"][0]["state"] == "synced"


async def test_status_keeps_its_shape_whatever_the_syncer_adds(replica, use_syncer):
    # The contract is versioned: syncer-internal fields must not leak into it.
    use_syncer(FakeSyncer([peer("r2", 2, extra_field="x", last_event_id=None)]))
    _, doc = await get_json(replica, "/status")
    assert set(doc) == STATUS_KEYS
    assert doc["peers"] == [
        {
            "name": "r2",
            "server_id": 2,
            "state": "synced",
            "last_event_id": None,
            "lag_events": 0,
            "lag_seconds": 0.0,
        }
    ]


def test_readiness_rules():
    class Stub:
        def __init__(self, status, syncer=None):
            self.engine = type("E", (), {"status": status})() if status else None
            self.protocol_states = [(syncer, True)] if syncer else []

    assert readiness(Stub(None)) == (False, "starting: the store is being opened")
    assert readiness(Stub(Status.STARTING))[0] is False
    assert readiness(Stub(Status.STOPPING)) == (False, "engine status is stopping")
    assert readiness(Stub(Status.OPERATIONAL)) == (True, None)
    assert readiness(Stub(Status.OPERATIONAL, FakeSyncer(initial_sync_done=False)))[0] is False
    # Lost peers after the initial sync do not make a replica unready: it still serves.
    lost = FakeSyncer([peer("r2", 2, "disconnected")], initial_sync_done=True)
    assert readiness(Stub(Status.OPERATIONAL, lost)) == (True, None)
    # A created protocol that has not started yet holds readiness back.
    starting = Stub(Status.OPERATIONAL, FakeSyncer())
    starting.protocol_states = [(starting.protocol_states[0][0], False)]
    assert readiness(starting) == (False, "protocol syncer is starting")


async def test_healthz_does_not_touch_the_disk(replica, monkeypatch):
    stalled = asyncio.Event()

    async def slow_stats():
        await stalled.wait()  # a disk that never answers

    monkeypatch.setattr(replica.storage, "stats", slow_stats)
    async with asyncio.timeout(2):
        status, body = await get_json(replica, "/healthz")
    assert status == 200 and body["alive"] is True
    stalled.set()


# -- /metrics -------------------------------------------------------------------------------


async def test_metrics_count_registrations_commits_and_queries(replica):
    await register(replica, 1, 4, 10)
    client = await connect("127.0.0.1", replica.eventer.port, "test/query")
    try:
        await client.query(QueryServerParams(server_id=1, persisted=True))
        m = await scrape(replica)
        assert m[("eventfleet_connections", (("protocol", "eventer"),))] == 1
    finally:
        await client.close()
    with pytest.raises(EventerInitError):
        await connect("127.0.0.1", replica.eventer.port, "intruder", client_token="nope")

    m = await scrape(replica)
    assert m[("eventfleet_events_registered_total", (("origin", "client"),))] == 15
    assert m[("eventfleet_events_registered_total", (("origin", "peer"),))] == 0
    assert m[("eventfleet_events_persisted_total", ())] == 15
    assert m[("eventfleet_register_batch_size_count", ())] == 3
    assert m[("eventfleet_register_batch_size_sum", ())] == 15
    assert m[("eventfleet_register_batch_size_bucket", (("le", "2.0"),))] == 1
    assert m[("eventfleet_commit_duration_seconds_count", ())] >= 1
    assert m[("eventfleet_commit_events_sum", ())] == 15
    assert m[("eventfleet_notify_latency_seconds_count", (("persisted", "false"),))] == 3
    assert m[("eventfleet_notify_latency_seconds_count", (("persisted", "true"),))] == 3
    assert m[("eventfleet_query_duration_seconds_count", (("query", "server"),))] == 1
    assert m[("eventfleet_query_duration_seconds_count", (("query", "latest"),))] == 0
    assert m[("eventfleet_connections", (("protocol", "eventer"),))] == 0
    assert m[("eventfleet_rejected_total", (("protocol", "eventer"), ("reason", "bad_token")))] == 1
    assert m[("eventfleet_storage_events", ())] == 15
    assert m[("eventfleet_storage_db_bytes", ())] > 0
    assert m[("eventfleet_last_event_instance", (("server", "1"),))] == (
        replica.engine.last_id.instance
    )
    assert m[("eventfleet_status", (("status", "operational"),))] == 1
    assert m[("eventfleet_status", (("status", "starting"),))] == 0
    assert m[("eventfleet_initial_sync_done", ())] == 1
    assert m[("process_resident_memory_bytes", ())] > 0


async def test_metrics_report_syncer_peers(replica, use_syncer):
    use_syncer(
        FakeSyncer(
            [
                peer("r2", 2, "synced", events_received=12),
                peer("r3", 3, "syncing", lag_events=5, lag_seconds=0.25),
                peer("r4", 4, "disconnected", lag_events=None, lag_seconds=None),
            ],
            initial_sync_done=False,
        )
    )
    m = await scrape(replica)
    assert m[("eventfleet_syncer_peer_connected", (("peer", "r2"),))] == 1
    assert m[("eventfleet_syncer_peer_connected", (("peer", "r3"),))] == 1
    assert m[("eventfleet_syncer_peer_connected", (("peer", "r4"),))] == 0
    assert m[("eventfleet_syncer_peer_synced", (("peer", "r2"),))] == 1
    assert m[("eventfleet_syncer_peer_synced", (("peer", "r3"),))] == 0
    assert m[("eventfleet_syncer_peer_lag_events", (("peer", "r3"),))] == 5
    assert m[("eventfleet_syncer_peer_lag_seconds", (("peer", "r3"),))] == 0.25
    assert ("eventfleet_syncer_peer_lag_events", (("peer", "r4"),)) not in m
    assert m[("eventfleet_syncer_events_received_total", (("peer", "r2"),))] == 12
    assert m[("eventfleet_initial_sync_done", ())] == 0


async def test_each_replica_has_its_own_registry(tmp_path):
    async with (
        running_replica(tmp_path / "a", server_id=1) as a,
        running_replica(tmp_path / "b", server_id=2) as b,
    ):
        await register(a, 3)
        ma, mb = await scrape(a), await scrape(b)
        client = (("origin", "client"),)
        assert ma[("eventfleet_events_registered_total", client)] == 3
        assert mb[("eventfleet_events_registered_total", client)] == 0
        assert ("eventfleet_last_event_instance", (("server", "1"),)) not in mb


async def test_metrics_negotiate_openmetrics(replica):
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, content_type, text = await get(replica, "/metrics", headers={"Accept": accept})
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")
    _, content_type, _ = await get(replica, "/metrics")
    assert content_type.startswith("text/plain")


# -- /flush ---------------------------------------------------------------------------------


async def test_flush_without_a_syncer_is_not_implemented(replica, use_syncer):
    use_syncer(None)
    status, body = await post_json(replica, "/flush?peer=r2")
    assert status == 501 and body["flushed"] is False
    status, _, _ = await get(replica, "/flush?peer=r2")
    assert status == 405  # as with a Syncer: a GET never flushes


async def test_flush_contract(replica, use_syncer):
    syncer = use_syncer(FakeSyncer([peer("r2", 2)]))
    await register(replica, 2)

    status, body = await post_json(replica, "/flush?peer=r2&timeout=7")
    assert status == 200
    last = replica.engine.last_id
    assert body == {
        "flushed": True,
        "last_ids": {"1": {"server": 1, "session": last.session, "instance": last.instance}},
    }
    assert syncer.flushed == [("r2", 7.0)]

    assert (await post_json(replica, "/flush?peer=r9"))[0] == 404
    assert (await post_json(replica, "/flush"))[0] == 400
    assert (await post_json(replica, "/flush?peer=r2&timeout=0"))[0] == 400
    assert (await post_json(replica, "/flush?peer=r2&timeout=x"))[0] == 400
    syncer.flush_result = False
    status, body = await post_json(replica, "/flush?peer=r2&timeout=1")
    assert status == 504 and body["flushed"] is False
    status, _, _ = await get(replica, "/flush?peer=r2")
    assert status == 405  # a GET must never trigger a flush


# -- mount points ---------------------------------------------------------------------------


async def test_protocols_mount_their_own_routes_after_start(replica):
    http = replica.http

    async def echo_ws(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            await ws.send_str("echo:" + msg.data)
        return ws

    async def hello(request):
        return web.json_response({"example": True})

    unmount_ws = http.mount("/replication", echo_ws)
    unmount_ex = http.add_routes([web.get("/example", hello)])
    with pytest.raises(ValueError, match="already mounted"):
        http.mount("/replication", echo_ws)
    with pytest.raises(ValueError, match="reserved"):
        http.mount("/metrics", hello)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        async with s.ws_connect(url(replica, "/replication")) as ws:
            await ws.send_str("hi")
            assert (await ws.receive()).data == "echo:hi"
        async with s.get(url(replica, "/example")) as resp:
            assert await resp.json() == {"example": True}
        async with s.post(url(replica, "/example")) as resp:
            assert resp.status == 405
        unmount_ws()
        unmount_ex()
        async with s.get(url(replica, "/replication")) as resp:
            assert resp.status == 404
        async with s.get(url(replica, "/example")) as resp:
            assert resp.status == 404
    # Unmounted paths can be claimed again (a protocol restarting).
    http.mount("/replication", echo_ws)()


async def test_status_is_served_while_last_ids_exist_for_peers(replica):
    # Events of another server id held here (merged from a peer) show up per server id.
    foreign = Event(EventId(7, 2, 9), ("peer", "x"), Timestamp(1_700_000_000, 0), None, None)
    assert await replica.engine.merge([foreign])
    _, doc = await get_json(replica, "/status")
    assert doc["last_ids"]["7"] == {"server": 7, "session": 2, "instance": 9}
    m = await scrape(replica)
    assert m[("eventfleet_events_registered_total", (("origin", "peer"),))] == 1
    assert m[("eventfleet_last_event_instance", (("server", "7"),))] == 9
    assert m[("eventfleet_notify_latency_seconds_count", (("persisted", "false"),))] == 0


# -- documentation and dashboard stay in step with /metrics ---------------------------------

REPO = pathlib.Path(__file__).resolve().parents[2]


async def exported_families(replica, use_syncer) -> set[str]:
    use_syncer(FakeSyncer([peer("r2", 2, events_received=1)]))
    _, _, text = await get(replica, "/metrics")
    return {f.name for f in text_string_to_metric_families(text)}


async def test_every_metric_is_documented(replica, use_syncer):
    doc = (REPO / "docs" / "observability.md").read_text()
    documented = set(re.findall(r"`(eventfleet_[a-z_]+)`", doc))
    exported = set()
    for family in await exported_families(replica, use_syncer):
        if family.startswith("eventfleet_"):
            # The parser names counters without `_total`; the docs use the full name.
            exported.add(family + "_total" if family + "_total" in documented else family)
    assert exported - documented == set(), "document these metrics in docs/observability.md"
    assert documented - exported == set(), "docs/observability.md names metrics not exported"


async def test_dashboard_uses_only_exported_metrics(replica, use_syncer):
    dash = json.loads((REPO / "docs" / "grafana" / "eventfleet.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    used = {re.sub(r"_(bucket|sum|count|total)$", "", m) for m in re.findall(r"[a-z_]+", exprs)}
    families = await exported_families(replica, use_syncer)
    missing = {m for m in used if m.startswith(("eventfleet_", "process_")) and m not in families}
    assert not missing
