"""Per-request bounds and validation of Eventer registrations, the latest-results cap,
max_uncommitted against the whole batch, and sync-state events: the reserved prefix
refused from clients, forged ones from peers ignored, known server ids capped.

Every refusal fails the whole request (nothing stored), is counted, and the client
stays connected. The real hat-event 0.9.44 client against an in-process replica."""

from __future__ import annotations

import pytest
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadJson,
    RegisterEvent,
    Timestamp,
)
from eventfleet_server.engine import RegisterError
from hat.event import common as hat
from hat.event.eventer import client as hat_client

from tests.conftest import running_replica
from tests.integration.test_eventer_bad_input import addr, stored_count

LIMITS = {
    "max_events_per_request": 50,
    "max_payload_bytes": 1000,
    "max_type_segments": 4,
    "max_segment_length": 10,
    "max_latest_results": 5,
}


def ev(*type_, payload=None, ts=None):
    return hat.RegisterEvent(type_, ts, payload)


BAD_REQUESTS = {
    "too many events": [ev("a", str(i)) for i in range(51)],
    "payload too large": [ev("a"), ev("b", payload=hat.EventPayloadBinary("t", b"x" * 1001))],
    "json payload too large": [ev("a", payload=hat.EventPayloadJson("x" * 999))],
    "too many segments": [ev("a", "b", "c", "d", "e")],
    "segment too long": [ev("a" * 11)],
    # The shared validation rule (docs/security.md): empty types and segments, and
    # source timestamps before 1970, are valid (hat-event's reference stores them).
    "wildcard segment": [ev("a"), ev("a", "*")],
    "one-segment wildcard": [ev("?", "b")],
    "reserved prefix": [ev("event", "1", "synced", "2")],
    "before year 1": [ev("a", ts=hat.Timestamp(-62_135_596_801, 0))],
    "year 10000": [ev("a", ts=hat.Timestamp(253_402_300_800, 0))],
    "us out of range": [ev("a", ts=hat.Timestamp(0, 1_000_000))],
}


@pytest.fixture
async def limited(tmp_path):
    async with running_replica(tmp_path / "r", eventer=LIMITS) as replica:
        yield replica


async def test_bad_requests_fail_as_a_whole_and_are_counted(limited):
    client = await hat_client.connect(addr(limited), "c")
    try:
        for name, events in BAD_REQUESTS.items():
            assert await client.register(events, True) is None, name
        assert await stored_count(limited) == 0
        assert limited.eventer.rejected["register_failed"] == len(BAD_REQUESTS)
        # At the limits exactly, and still connected after all of that.
        ok = [ev("a" * 10, "b", "c", str(i)) for i in range(50)]
        ok[0] = ev("big", payload=hat.EventPayloadBinary("t", b"x" * 1000))
        assert len(await client.register(ok, True)) == 50
    finally:
        await client.async_close()


async def test_invalid_json_text_is_refused(limited):
    # hat-event's client always encodes valid JSON: send the text with our own client.
    from eventfleet_server.client.eventer import connect

    client = await connect("127.0.0.1", limited.eventer.port, "raw")
    try:
        bad = RegisterEvent(("a",), None, EventPayloadJson("{not json"))
        assert await client.register([RegisterEvent(("ok",), None, None), bad], True) is None
        assert await stored_count(limited) == 0
    finally:
        await client.close()


async def test_latest_results_are_capped_with_more_follows(limited):
    client = await hat_client.connect(addr(limited), "c")
    try:
        await client.register([ev("t", str(i)) for i in range(8)], True)
        result = await client.query(hat.QueryLatestParams([("t", "*")]))
        assert len(result.events) == 5 and result.more_follows is True
        result = await client.query(hat.QueryLatestParams([("t", "1")]))
        assert len(result.events) == 1 and result.more_follows is False
    finally:
        await client.async_close()


async def test_max_uncommitted_is_checked_against_the_whole_batch(tmp_path):
    async with running_replica(tmp_path / "r", storage={"max_uncommitted": 10}) as replica:
        engine = replica.engine
        with pytest.raises(RegisterError, match="11 events in one request exceed"):
            engine.register([RegisterEvent(("a",), None, None)] * 11)
        _, first = engine.register([RegisterEvent(("a",), None, None)] * 6)
        # 6 uncommitted + 5 would pass 10: refused before any id is handed out.
        last = engine.last_id
        with pytest.raises(RegisterError, match=r"6 \+ 5 > max_uncommitted 10"):
            engine.register([RegisterEvent(("a",), None, None)] * 5)
        assert engine.last_id == last
        await first
        created, fut = engine.register([RegisterEvent(("a",), None, None)] * 10)
        await fut
        assert len(created) == 10


def sync_event(server: int, named_own: int, named_peer: int) -> Event:
    type_ = ("event", str(named_own), "synced", str(named_peer))
    return Event(EventId(server, 1, 1), type_, Timestamp(1, 0), None, EventPayloadJson("{}"))


async def test_forged_sync_state_events_start_no_relays(tmp_path):
    peers = [{"name": "r2", "host": "127.0.0.1", "port": 1, "server_id": 2}]
    async with running_replica(
        tmp_path / "r", peers=peers, syncer={"max_known_server_ids": 5, "bootstrap_timeout": 0.5}
    ) as replica:
        mesh = replica.syncer.mesh
        before = mesh.known_server_ids()
        # Server 2 "registered" a sync state of server 7: forged, names nothing.
        mesh.on_committed([sync_event(2, 7, 99)])
        assert mesh.known_server_ids() == before
        # Server 2's own sync state with server 3: genuine, 3 becomes known.
        mesh.on_committed([sync_event(2, 2, 3)])
        assert 3 in mesh.known_server_ids()
        # Capped: at most max_known_server_ids, whatever peers name.
        mesh.on_committed([sync_event(2, 2, n) for n in range(10, 40)])
        assert len(mesh._seen) == 5 and 39 not in mesh.known_server_ids()


async def test_restart_skips_max_uncommitted_plus_one_ids(tmp_path):
    # Ids shown to persisted=false subscribers but never committed must never be reused:
    # after a restart the engine continues max_uncommitted + 1 above the stored id.
    data = tmp_path / "r"
    async with running_replica(data, storage={"max_uncommitted": 10}) as replica:
        created = await replica.engine.register_wait([RegisterEvent(("a",), None, None)] * 3)
        last = created[-1].id
    async with running_replica(data, storage={"max_uncommitted": 10}) as replica:
        (after,) = await replica.engine.register_wait([RegisterEvent(("b",), None, None)])
    assert after.id.instance == last.instance + 10 + 1 + 1
    assert after.id.session == last.session + 10 + 1 + 1


async def test_retention_settings_reach_the_store(tmp_path):
    import asyncio

    # max_events only (max_age_seconds would keep these fresh events): 5 of 12 remain.
    retention = {"max_events": 5, "check_interval_seconds": 0.05}
    async with running_replica(tmp_path / "r", storage={"retention": retention}) as replica:
        await replica.engine.register_wait(
            [RegisterEvent(("a", str(i)), None, None) for i in range(12)]
        )
        deadline = asyncio.get_running_loop().time() + 10
        while (events := (await replica.storage.stats()).events) > 5:
            assert asyncio.get_running_loop().time() < deadline, events
            await asyncio.sleep(0.05)
        assert events == 5
