"""Interoperability with the real hat-event 0.9.44 Eventer client, every message type."""

from __future__ import annotations

import asyncio

import pytest
from hat.drivers import net
from hat.event import common as hat
from hat.event.eventer import client as hat_client

from tests.conftest import running_replica


def addr(replica):
    return net.TcpAddress("127.0.0.1", replica.eventer.port)


def reg(type_, payload=None, source=None):
    return hat.RegisterEvent(type=tuple(type_), source_timestamp=source, payload=payload)


async def collect(queue, count, timeout=5.0):
    out = []
    async with asyncio.timeout(timeout):
        while len(out) < count:
            out.extend(await queue.get())
    return out


async def test_init_reports_operational_status(replica):
    client = await hat_client.connect(addr(replica), "test/status")
    try:
        assert client.status == hat.Status.OPERATIONAL
    finally:
        await client.async_close()


async def test_register_with_response_returns_ids_in_order(replica):
    client = await hat_client.connect(addr(replica), "test/register")
    try:
        payload = hat.EventPayloadJson({"value": 1})
        first = await client.register([reg(("a", "b")), reg(("a", "c"), payload)], True)
        second = await client.register([reg(("a", "d"))], True)
        assert [e.type for e in first] == [("a", "b"), ("a", "c")]
        assert first[1].payload == payload
        assert {e.id.server for e in first + second} == {1}
        assert first[0].id.session == first[1].id.session < second[0].id.session
        instances = [e.id.instance for e in first + second]
        assert instances == sorted(instances) and len(set(instances)) == 3
    finally:
        await client.async_close()


async def test_an_empty_register_is_answered_with_no_events(replica):
    client = await hat_client.connect(addr(replica), "test/empty")
    try:
        async with asyncio.timeout(5):
            assert await client.register([], True) == []
        # The connection goes on.
        assert [e.type for e in await client.register([reg(("e", "1"))], True)] == [("e", "1")]
    finally:
        await client.async_close()


async def test_register_without_response_is_stored(replica):
    client = await hat_client.connect(addr(replica), "test/noresp")
    try:
        assert await client.register([reg(("x", "1"))]) is None
        for _ in range(100):
            res = await client.query(hat.QueryLatestParams([("x", "*")]))
            if res.events:
                break
            await asyncio.sleep(0.02)
        assert [e.type for e in res.events] == [("x", "1")]
    finally:
        await client.async_close()


@pytest.mark.parametrize("persisted", [False, True])
async def test_notifications_honour_subscriptions(replica, persisted):
    queue = asyncio.Queue()
    sub = await hat_client.connect(
        addr(replica),
        "test/sub",
        subscriptions=[("a", "?"), ("b", "*")],
        persisted=persisted,
        events_cb=lambda _, events: queue.put_nowait(events),
    )
    pub = await hat_client.connect(addr(replica), "test/pub")
    try:
        await pub.register([reg(("a", "1")), reg(("c",)), reg(("a", "1", "2"))], True)
        await pub.register([reg(("b",)), reg(("b", "x", "y"))], True)
        got = await collect(queue, 3)
        assert [e.type for e in got] == [("a", "1"), ("b",), ("b", "x", "y")]
        await asyncio.sleep(0.1)
        assert queue.empty()
    finally:
        await sub.async_close()
        await pub.async_close()


async def test_persisted_subscribers_hear_only_of_committed_events(tmp_path):
    # A store too small for the event: its commit fails. persisted=false subscribers see
    # it before the commit; persisted=true ones must never see it.
    async with running_replica(tmp_path / "p", storage={"max_db_bytes": 128 * 1024}) as replica:
        early, late = asyncio.Queue(), asyncio.Queue()
        subs = [
            await hat_client.connect(
                addr(replica),
                f"test/{name}",
                subscriptions=[("*",)],
                persisted=persisted,
                events_cb=lambda _, e, q=q: q.put_nowait(e),
            )
            for name, persisted, q in (("early", False, early), ("late", True, late))
        ]
        pub = await hat_client.connect(addr(replica), "test/pub")
        try:
            big = hat.EventPayloadJson("x" * 600_000)
            assert await pub.register([hat.RegisterEvent(("big",), None, big)], True) is None
            assert [e.type for e in await collect(early, 1)] == [("big",)]
            await asyncio.sleep(0.3)
            assert late.empty()
        finally:
            for c in (*subs, pub):
                await c.async_close()


async def test_one_session_per_notify_message(replica):
    batches = asyncio.Queue()
    sub = await hat_client.connect(
        addr(replica),
        "test/s",
        subscriptions=[("*",)],
        events_cb=lambda _, e: batches.put_nowait(e),
    )
    pub = await hat_client.connect(addr(replica), "test/p")
    try:
        await asyncio.gather(*(pub.register([reg(("t", str(i)))] * 3, True) for i in range(10)))
        for _ in range(10):
            async with asyncio.timeout(5):
                events = await batches.get()
            assert len(events) == 3
            assert len({e.id.session for e in events}) == 1
    finally:
        await sub.async_close()
        await pub.async_close()


async def test_server_id_filter(replica):
    mine, other = asyncio.Queue(), asyncio.Queue()
    sub1 = await hat_client.connect(
        addr(replica),
        "s1",
        subscriptions=[("*",)],
        server_id=1,
        events_cb=lambda _, e: mine.put_nowait(e),
    )
    sub2 = await hat_client.connect(
        addr(replica),
        "s2",
        subscriptions=[("*",)],
        server_id=2,
        events_cb=lambda _, e: other.put_nowait(e),
    )
    pub = await hat_client.connect(addr(replica), "p")
    try:
        await pub.register([reg(("z",))], True)
        assert len(await collect(mine, 1)) == 1
        await asyncio.sleep(0.1)
        assert other.empty()
    finally:
        for c in (sub1, sub2, pub):
            await c.async_close()


async def test_token_is_required_when_configured(tmp_path):
    async with running_replica(tmp_path / "t", token="s3cret") as replica:
        ok = await hat_client.connect(addr(replica), "good", client_token="s3cret")
        await ok.async_close()
        with pytest.raises(hat_client.EventerInitError, match="client token required"):
            await hat_client.connect(addr(replica), "anonymous")
        with pytest.raises(hat_client.EventerInitError, match="invalid client token"):
            await hat_client.connect(addr(replica), "bad", client_token="wrong")
        assert replica.eventer.rejected.get("bad_token") == 2


async def test_hat_compatible_mode_admits_tokenless_clients(tmp_path):
    async with running_replica(
        tmp_path / "t", token="s3cret", eventer={"allow_tokenless_clients": True}
    ) as replica:
        anonymous = await hat_client.connect(addr(replica), "anonymous")
        await anonymous.async_close()
        # The mode exempts a missing token only: a wrong one is still refused.
        with pytest.raises(hat_client.EventerInitError, match="invalid client token"):
            await hat_client.connect(addr(replica), "bad", client_token="wrong")


async def test_hat_compatible_mode_limited_to_networks(tmp_path):
    overrides = {"allow_tokenless_clients": True, "tokenless_client_networks": ["10.0.0.0/8"]}
    async with running_replica(tmp_path / "t", token="s3cret", eventer=overrides) as replica:
        with pytest.raises(hat_client.EventerInitError, match="client token required"):
            await hat_client.connect(addr(replica), "loopback")
    overrides["tokenless_client_networks"] = ["127.0.0.0/8", "::1"]
    async with running_replica(tmp_path / "t", token="s3cret", eventer=overrides) as replica:
        local = await hat_client.connect(addr(replica), "loopback")
        await local.async_close()


async def test_token_given_to_tokenless_server_is_rejected(replica):
    with pytest.raises(hat_client.EventerInitError):
        await hat_client.connect(addr(replica), "bad", client_token="anything")


async def test_invalid_subscription_is_an_init_error(replica):
    with pytest.raises(hat_client.EventerInitError, match=r"'\*' is only valid as the last"):
        await hat_client.connect(addr(replica), "bad", subscriptions=[("a", "*", "b")])


async def test_status_notify_on_stop(tmp_path):
    statuses = []
    async with running_replica(tmp_path / "s") as replica:
        client = await hat_client.connect(
            addr(replica), "watcher", status_cb=lambda _, s: statuses.append(s)
        )
    await asyncio.wait_for(client.wait_closed(), 5)
    assert statuses == [hat.Status.STOPPING]


async def test_queries(replica):
    client = await hat_client.connect(addr(replica), "q")
    try:
        created = []
        for i in range(25):
            source = hat.Timestamp(1000 - i, 0)
            payload = hat.EventPayloadBinary("raw", bytes([i]))
            created += await client.register([reg(("q", str(i % 5)), payload, source)], True)
        latest = await client.query(hat.QueryLatestParams([("q", "?")]))
        assert sorted(e.id for e in latest.events) == sorted(e.id for e in created[-5:])

        ts = await client.query(
            hat.QueryTimeseriesParams(
                event_types=[("q", "1")],
                order=hat.Order.ASCENDING,
                order_by=hat.OrderBy.TIMESTAMP,
                max_results=3,
            )
        )
        assert [e.id for e in ts.events] == [e.id for e in created if e.type == ("q", "1")][:3]
        assert ts.more_follows

        page2 = await client.query(
            hat.QueryTimeseriesParams(
                event_types=[("q", "1")],
                order=hat.Order.ASCENDING,
                order_by=hat.OrderBy.TIMESTAMP,
                max_results=3,
                last_event_id=ts.events[-1].id,
            )
        )
        assert [e.id for e in page2.events] == [e.id for e in created if e.type == ("q", "1")][3:]
        assert not page2.more_follows

        by_source = await client.query(
            hat.QueryTimeseriesParams(
                order=hat.Order.ASCENDING,
                order_by=hat.OrderBy.SOURCE_TIMESTAMP,
                source_t_from=hat.Timestamp(980, 0),
                source_t_to=hat.Timestamp(990, 0),
            )
        )
        assert [e.source_timestamp.s for e in by_source.events] == list(range(980, 991))

        desc = await client.query(hat.QueryTimeseriesParams(max_results=2))
        assert [e.id for e in desc.events] == [e.id for e in reversed(created)][:2]

        server = await client.query(
            hat.QueryServerParams(server_id=1, persisted=True, max_results=10)
        )
        assert [e.id for e in server.events] == [e.id for e in created[:10]]
        assert server.more_follows
        rest = await client.query(
            hat.QueryServerParams(server_id=1, persisted=False, last_event_id=server.events[-1].id)
        )
        assert [e.id for e in rest.events] == [e.id for e in created[10:]]
        assert not rest.more_follows
        assert (await client.query(hat.QueryServerParams(server_id=7))).events == []
    finally:
        await client.async_close()


async def test_restart_continues_ids(tmp_path):
    async with running_replica(tmp_path / "d") as replica:
        client = await hat_client.connect(addr(replica), "c")
        before = await client.register([reg(("r",))] * 3, True)
        await client.async_close()
    async with running_replica(tmp_path / "d") as replica:
        client = await hat_client.connect(addr(replica), "c")
        after = await client.register([reg(("r",))], True)
        res = await client.query(hat.QueryServerParams(server_id=1))
        await client.async_close()
    assert after[0].id.instance > before[-1].id.instance
    assert after[0].id.session > before[-1].id.session
    assert [e.id for e in res.events] == [e.id for e in before + after]


async def test_pipelined_registers_answered_after_their_commit_in_one_write(replica, monkeypatch):
    """Requests pipelined by one client (the real one, many in flight) that share a
    commit get their MsgRegisterRes together, in one write, after that commit: each
    answer names its own request's events (by conversation) and every event answered is
    stored."""
    from eventfleet_server.chatter import Connection

    batches: list[int] = []
    send_many = Connection.send_many

    def counting_send_many(self, msgs):
        batches.append(len(msgs))
        return send_many(self, msgs)

    monkeypatch.setattr(Connection, "send_many", counting_send_many)
    commits: list[int] = []
    replica.engine.add_commit_listener(lambda count, seconds: commits.append(count))
    client = await hat_client.connect(addr(replica), "test/pipelined")
    try:
        results = await asyncio.gather(
            *(client.register([reg(("pipe", str(i)))], True) for i in range(16))
        )
        assert [[e.type for e in r] for r in results] == [[("pipe", str(i))] for i in range(16)]
        stored = await client.query(hat.QueryLatestParams([("pipe", "*")]))
        assert sorted(e.id for e in stored.events) == sorted(r[0].id for r in results)
    finally:
        await client.async_close()
    # 16 requests in fewer commits than requests; each commit's answers in one write.
    assert sum(commits) == 16 and len(commits) < 16, commits
    assert batches and sum(batches) == 16 - commits.count(1), (batches, commits)


async def test_an_answer_committed_while_the_eventer_stops_still_leaves(replica):
    """The Eventer's engine hooks go first when it stops, its connections after: a
    request committed in between is still answered (its answer is not left queued for
    a commit listener that is gone)."""
    client = await hat_client.connect(addr(replica), "test/stopping")
    try:
        for unsubscribe in replica.eventer._unsubscribe:  # the first step of `stop`
            unsubscribe()
        replica.eventer._unsubscribe = []
        async with asyncio.timeout(5):
            created = await client.register([reg(("stopping", "1"))], True)
        assert [e.type for e in created] == [("stopping", "1")]
    finally:
        await client.async_close()


async def test_pipelined_requests_around_a_sliced_one_keep_their_order(replica):
    """Messages are handled as they are read; a request too large for one slice is
    decoded by a task with the reading of the others held: the registers pipelined
    behind it still get their ids in the order the client sent them, and a query
    behind them is answered."""
    from eventfleet_server.eventer.wire import CHUNK_EVENTS

    client = await hat_client.connect(addr(replica), "test/order")
    try:
        big = [reg(("order", "big", str(i))) for i in range(CHUNK_EVENTS * 2 + 1)]
        requests = [[reg(("order", "small", "0"))], big] + [
            [reg(("order", "small", str(i)))] for i in range(1, 6)
        ]
        async with asyncio.timeout(20):
            results = await asyncio.gather(
                *(client.register(r, True) for r in requests),
                client.query(hat.QueryLatestParams([("order", "small", "5")])),
            )
        answers, latest = results[:-1], results[-1]
        assert [len(a) for a in answers] == [len(r) for r in requests]
        sessions = [a[0].id.session for a in answers]
        assert sessions == sorted(sessions) and len(set(sessions)) == len(sessions)
        instances = [e.id.instance for a in answers for e in a]
        assert instances == sorted(instances)
        # The query behind them is answered too (from what was committed by then).
        assert {e.id for e in latest.events} <= {answers[-1][0].id}
    finally:
        await client.async_close()


@pytest.mark.parametrize("interleaved", [False, True], ids=["alone", "interleaved"])
async def test_a_sliced_requests_answer_is_what_was_stored(replica, monkeypatch, interleaved):
    """A request too large for one slice has its stored bytes prepared a slice at a
    time, for the ids and time `next_registration` gives, and its answer written in
    pieces. The answer and what a query then reads are the same events, byte for byte
    through the real client. When another registration takes those ids meanwhile
    (`interleaved`), the bytes are spliced again for the ids the request did get."""
    from eventfleet_server.engine import engine as engine_module
    from eventfleet_server.eventer import session as session_module
    from eventfleet_server.eventer import wire

    calls = {"prepared": 0, "spliced_at_once": 0}
    made_by_engine: list[int] = []  # sizes of the registrations the engine made anew
    make = engine_module.registered_events

    def making(events, *args):
        made_by_engine.append(len(events))
        return make(events, *args)

    monkeypatch.setattr(engine_module, "registered_events", making)
    sliced = session_module.splice_elements_sliced
    at_once = session_module.event_elements

    async def preparing(*args):
        calls["prepared"] += 1
        out = await sliced(*args)
        if interleaved:  # another connection's request, registered meanwhile
            replica.engine.register([hat.RegisterEvent(("sliced", "other"), None, None)])
        return out

    def counting(*args):
        calls["spliced_at_once"] += 1
        return at_once(*args)

    monkeypatch.setattr(session_module, "splice_elements_sliced", preparing)
    monkeypatch.setattr(session_module, "event_elements", counting)
    count = wire.CHUNK_EVENTS * 3 + 7
    payload = hat.EventPayloadBinary("blob", bytes(range(256)) * 8)
    client = await hat_client.connect(addr(replica), "test/sliced")
    try:
        before = await client.register([reg(("sliced", "before"))], True)
        big = [
            hat.RegisterEvent(("sliced", "big", str(i)), hat.Timestamp(i, 7), payload)
            for i in range(count)
        ]
        answer = await client.register(big, True)
        stored = await client.query(
            hat.QueryTimeseriesParams(event_types=[("sliced", "big", "*")], max_results=count)
        )
    finally:
        await client.async_close()
    assert calls["prepared"] == 1
    # Spliced at once: the small request before it, and the big one only when the
    # prepared ids were taken.
    assert calls["spliced_at_once"] == (2 if interleaved else 1)
    # Its events were made a slice at a time too, and made anew only when the ids were
    # taken (`Engine.register`'s `prepared`).
    assert (count in made_by_engine) == interleaved
    assert len(answer) == count
    assert sorted(stored.events, key=lambda e: e.id) == answer
    assert [e.type for e in answer] == [e.type for e in big]
    assert all(
        e.payload == payload and e.source_timestamp == r.source_timestamp
        for e, r in zip(answer, big, strict=True)
    )
    first = answer[0].id
    assert [e.id.instance for e in answer] == list(range(first.instance, first.instance + count))
    assert {e.id.session for e in answer} == {first.session} and first > before[0].id
    assert {e.timestamp for e in answer} == {answer[0].timestamp}
    assert answer[0].timestamp >= before[0].timestamp
