"""Storage: Eventer query semantics against a pure-Python reference, durability rules,
query plans and a scale check that paging stays O(page)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Order,
    OrderBy,
    QueryLatestParams,
    QueryResult,
    QueryServerParams,
    QueryTimeseriesParams,
    Timestamp,
    natural_key,
    now,
    timestamp_to_us,
)
from eventfleet_server.common.subscription import Subscription
from eventfleet_server.storage import (
    CorruptStoreError,
    Retention,
    SbsResult,
    Storage,
    StorageError,
    StorageFaultError,
    StorageStats,
    merge_rows,
    snapshot,
)
from eventfleet_server.storage import backend as storage_backend
from eventfleet_server.storage import (
    events as events_table,
)
from eventfleet_server.storage import (
    indexes as indexes_table,
)
from eventfleet_server.storage import (
    last_ids as last_ids_table,
)
from eventfleet_server.storage import (
    latest as latest_table,
)
from eventfleet_server.storage import (
    queries as storage_queries,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# -- reference -------------------------------------------------------------------------


def _page(max_results, cap):
    return cap if max_results is None else max(0, min(max_results, cap))


def ref_latest(events, params):
    sub = Subscription(params.event_types if params.event_types is not None else [("*",)])
    best = {}
    for e in events:
        if sub.matches(e.type) and (
            e.type not in best or natural_key(e) > natural_key(best[e.type])
        ):
            best[e.type] = e
    return list(best.values())


def ref_timeseries(events, p, cap):
    sub = Subscription(p.event_types if p.event_types is not None else [("*",)])
    us = timestamp_to_us

    def keep(e):
        if not sub.matches(e.type):
            return False
        if p.t_from is not None and us(e.timestamp) < us(p.t_from):
            return False
        if p.t_to is not None and us(e.timestamp) > us(p.t_to):
            return False
        if (
            p.source_t_from is not None
            or p.source_t_to is not None
            or (p.order_by is OrderBy.SOURCE_TIMESTAMP)
        ):
            if e.source_timestamp is None:
                return False
            if p.source_t_from is not None and us(e.source_timestamp) < us(p.source_t_from):
                return False
            if p.source_t_to is not None and us(e.source_timestamp) > us(p.source_t_to):
                return False
        return True

    if p.order_by is OrderBy.SOURCE_TIMESTAMP:

        def key(e):
            return (us(e.source_timestamp), *natural_key(e))
    else:
        key = natural_key
    ordered = sorted(filter(keep, events), key=key, reverse=p.order is Order.DESCENDING)
    if p.last_event_id is not None:
        ids = [e.id for e in ordered]
        if p.last_event_id not in ids:
            return QueryResult([], False)
        ordered = ordered[ids.index(p.last_event_id) + 1 :]
    n = _page(p.max_results, cap)
    return QueryResult(ordered[:n], len(ordered) > n)


def ref_server(events, p, cap):
    mine = sorted(
        (e for e in events if e.id.server == p.server_id),
        key=lambda e: (e.id.session, e.id.instance),
    )
    if p.last_event_id is not None:
        mine = [e for e in mine if e.id.instance > p.last_event_id.instance]
    n = _page(p.max_results, cap)
    return QueryResult(mine[:n], len(mine) > n)


def ref_query(events, params, cap):
    if isinstance(params, QueryTimeseriesParams):
        return ref_timeseries(events, params, cap)
    return ref_server(events, params, cap)


# -- helpers ---------------------------------------------------------------------------


def make_events(n, *, server=1, types=(("a",),), start=1, t0=1_000, payload=None):
    return [
        Event(
            EventId(server, 1 + (start + i - 1) // 10, start + i),
            types[i % len(types)],
            Timestamp(t0 + i, 0),
            Timestamp(t0 - i, 5) if i % 2 else None,
            payload,
        )
        for i in range(n)
    ]


@contextlib.asynccontextmanager
async def opened(path, **kwargs):
    storage = await Storage.open(path, **kwargs)
    try:
        yield storage
    finally:
        await storage.close()


@pytest.fixture
async def storage(tmp_path):
    async with opened(tmp_path / "db" / "events.sqlite") as s:
        yield s


async def count_rows(path):
    def count():
        with contextlib.closing(sqlite3.connect(path)) as conn:
            return conn.execute("SELECT count(*) FROM events").fetchone()[0]

    return await asyncio.to_thread(count)


# -- property-based: queries match the reference ---------------------------------------

SEGMENTS = ["a", "b", "c"]
event_types = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3).map(tuple)
patterns = st.tuples(st.lists(st.sampled_from([*SEGMENTS, "?"]), max_size=3), st.booleans()).map(
    lambda x: (*x[0], "*") if x[1] else tuple(x[0])
)
# Few distinct values so that timestamps collide and bounds hit them exactly.
timestamps = st.builds(Timestamp, st.integers(0, 3), st.sampled_from([0, 1, 999_999]))
payloads = st.one_of(
    st.none(),
    st.builds(EventPayloadJson, st.sampled_from(["{}", "[1, 2]", '"x"', "null"])),
    st.builds(EventPayloadBinary, st.sampled_from(["", "t"]), st.binary(max_size=4)),
)
event_specs = st.lists(
    st.tuples(
        st.integers(1, 3),  # server
        st.integers(0, 1),  # session step
        st.integers(1, 3),  # instance step
        event_types,
        timestamps,
        st.none() | timestamps,
        payloads,
    ),
    max_size=40,
)


def build_events(specs):
    counters = {}
    events = []
    for server, session_step, instance_step, type_, ts, sts, payload in specs:
        session, instance = counters.get(server, (1, 0))
        session, instance = session + session_step, instance + instance_step
        counters[server] = (session, instance)
        events.append(Event(EventId(server, session, instance), type_, ts, sts, payload))
    return events


timeseries_params = st.builds(
    QueryTimeseriesParams,
    event_types=st.none() | st.lists(patterns, max_size=3),
    t_from=st.none() | timestamps,
    t_to=st.none() | timestamps,
    source_t_from=st.none() | timestamps,
    source_t_to=st.none() | timestamps,
    order=st.sampled_from(Order),
    order_by=st.sampled_from(OrderBy),
    max_results=st.none() | st.integers(-1, 6),
)
server_params = st.builds(
    QueryServerParams,
    server_id=st.integers(1, 4),
    persisted=st.booleans(),
    max_results=st.none() | st.integers(-1, 6),
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(specs=event_specs, data=st.data())
def test_queries_match_reference(specs, data):
    events = build_events(specs)
    # Arrival order differs from id order sometimes (replication), and some events
    # arrive twice; neither may change what is held.
    order = data.draw(st.permutations(range(len(events))) | st.just(list(range(len(events)))))
    arrivals = [events[i] for i in order]
    arrivals += data.draw(st.lists(st.sampled_from(events), max_size=5)) if events else []
    cuts = sorted(data.draw(st.lists(st.integers(0, len(arrivals)), max_size=4)))
    batches = [arrivals[a:b] for a, b in itertools.pairwise([0, *cuts, len(arrivals)])]
    merge_max = data.draw(st.sampled_from([0, 1, 32]), label="merge_max")
    queries = data.draw(st.lists(st.one_of(timeseries_params, server_params), max_size=5))
    latest_queries = data.draw(
        st.lists(
            st.builds(QueryLatestParams, st.none() | st.lists(patterns, max_size=3)), max_size=3
        )
    )
    keep = data.draw(st.integers(0, len(events) + 1), label="max_events")
    caps = data.draw(st.lists(st.integers(1, 8), min_size=len(queries), max_size=len(queries)))
    sentinels = [
        data.draw(
            st.one_of(
                st.none(),
                st.sampled_from([e.id for e in events]) if events else st.none(),
                st.builds(EventId, st.integers(1, 3), st.integers(0, 3), st.integers(0, 9)),
            ),
            label="last_event_id",
        )
        for _ in queries
    ]

    async def main():
        with tempfile.TemporaryDirectory() as tmp:
            async with opened(Path(tmp) / "events.sqlite") as s:
                written = []
                for batch in batches:
                    written += await s.write(batch)
                # Each event held once, seqs 1..n in arrival order.
                assert sorted(e.id for _, e in written) == sorted(e.id for e in events)
                assert [seq for seq, _ in written] == list(range(1, len(events) + 1))
                assert await s.read_since_seq(0, 1000) == written
                assert s.last_seq == len(events)
                expected_last = {}
                for e in events:
                    if e.id.instance > expected_last.get(e.id.server, EventId(0, 0, -1)).instance:
                        expected_last[e.id.server] = e.id
                assert s.last_ids == expected_last

                for params in latest_queries:
                    got = await s.query(params)
                    assert not got.more_follows
                    assert sorted(got.events, key=natural_key) == sorted(
                        ref_latest(events, params), key=natural_key
                    )
                    # The stored bytes answer the same events, in the same order.
                    assert await s.query_sbs(params) == SbsResult(
                        [codec.encode_event(e) for e in got.events], False
                    )

                old = storage_queries.MERGE_MAX_TYPES
                storage_queries.MERGE_MAX_TYPES = merge_max
                try:
                    for params, cap, sentinel in zip(queries, caps, sentinels, strict=True):
                        params = params._replace(last_event_id=sentinel)
                        # Follow the pages a client would request, each against the reference.
                        for _ in range(len(events) + 2):
                            got = await s.query(params, max_results_cap=cap)
                            assert got == ref_query(events, params, cap), params
                            assert await s.query_sbs(params, max_results_cap=cap) == SbsResult(
                                [codec.encode_event(e) for e in got.events], got.more_follows
                            ), params
                            if not got.more_follows or not got.events:
                                break
                            params = params._replace(last_event_id=got.events[-1].id)
                finally:
                    storage_queries.MERGE_MAX_TYPES = old

            # Count retention keeps the newest arrivals; latest must follow what is left.
            path = Path(tmp) / "events.sqlite"
            async with opened(path, retention=Retention(max_events=keep)) as s:
                deleted = await s.enforce_retention()
                assert deleted == max(0, len(events) - keep)
                left = [e for _, e in written[deleted:]]
                got = await s.query(QueryLatestParams())
                assert sorted(got.events, key=natural_key) == sorted(
                    ref_latest(left, QueryLatestParams()), key=natural_key
                )
                assert s.last_ids == expected_last
                assert s.last_seq == len(events)
                assert (await s.stats()).events == len(left)

    asyncio.run(main())


# -- paging ----------------------------------------------------------------------------


@pytest.mark.parametrize("order", list(Order))
@pytest.mark.parametrize("order_by", list(OrderBy))
@pytest.mark.parametrize("event_types", [None, [("b",)], [("a",), ("c",)]])
async def test_timeseries_paging_yields_full_result(storage, order, order_by, event_types):
    types = [("a",), ("b",), ("c",)]
    events = make_events(200, types=types) + make_events(150, server=2, types=types, t0=1_050)
    await storage.write(events)
    base = QueryTimeseriesParams(event_types=event_types, order=order, order_by=order_by)
    full = ref_timeseries(events, base, 10_000).events
    assert len(full) > 30

    pages, params = [], base._replace(max_results=7)
    while True:
        result = await storage.query(params)
        pages.append(result.events)
        if not result.more_follows:
            break
        params = params._replace(last_event_id=result.events[-1].id)
    assert [e for page in pages for e in page] == full
    assert all(len(page) == 7 for page in pages[:-1])


async def test_server_paging_yields_full_result(storage):
    events = make_events(100) + make_events(60, server=2)
    await storage.write(events)
    pages, params = [], QueryServerParams(server_id=1, max_results=9)
    while True:
        result = await storage.query(params, max_results_cap=5)
        pages.append(result.events)
        if not result.more_follows:
            break
        params = params._replace(last_event_id=result.events[-1].id)
    assert [e for page in pages for e in page] == events[:100]
    assert {len(page) for page in pages[:-1]} == {5}


async def test_read_server_and_since_seq(storage):
    events = make_events(10) + make_events(5, server=2)
    written = await storage.write(events)
    assert await storage.read_server(1, None, 100) == events[:10]
    assert await storage.read_server(1, events[3].id, 2) == events[4:6]
    assert await storage.read_server(2, EventId(2, 9, 99), 10) == []
    assert await storage.read_since_seq(12, 2) == written[12:14]
    assert await storage.read_since_seq(15, 2) == []


# -- writes ----------------------------------------------------------------------------


async def test_idempotent_write(storage):
    events = make_events(20, types=[("a",), ("b", "c")])
    first = await storage.write(events)
    assert [seq for seq, _ in first] == list(range(1, 21))
    assert await storage.write(events) == []
    assert await storage.write(events[5:10] + events[5:10]) == []
    assert storage.last_seq == 20
    assert (await storage.stats()).events == 20


async def test_duplicates_within_and_across_concurrent_writes(storage):
    events = make_events(30)
    # An older id after a newer one in the same batch, and the same event twice.
    batch = [events[5], events[2], events[5], events[2], events[7]]
    assert [e for _, e in await storage.write(batch)] == [events[5], events[2], events[7]]
    # Two peers delivering overlapping history at the same time.
    results = await asyncio.gather(storage.write(events[:20]), storage.write(events[10:]))
    inserted = [e for result in results for _, e in result]
    assert sorted(inserted, key=natural_key) == [
        e for e in events if e not in (events[5], events[2], events[7])
    ]
    assert [e for _, e in await storage.read_since_seq(0, 100)] == [
        events[5],
        events[2],
        events[7],
        *inserted,
    ]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda e: e._replace(type=("a", 7)), "segment 1 7"),
        (lambda e: e._replace(type="abc"), "not a tuple"),
        (lambda e: e._replace(source_timestamp=Timestamp(1, 1_000_000)), "us must be"),
        (lambda e: e._replace(timestamp=Timestamp(1 << 62, 0)), "storable range"),
        (lambda e: e._replace(payload=EventPayloadJson(b"{}")), "is not a str"),
        (lambda e: e._replace(payload=EventPayloadBinary("t", "text")), "binary payload"),
        (lambda e: e._replace(payload=("json", "{}")), "not a model payload"),
        (lambda e: e._replace(id=EventId(1, 1 << 64, e.id.instance)), "64-bit"),
        (lambda e: e._replace(id=EventId(1, 1.5, e.id.instance)), "64-bit"),
        (lambda e: e._replace(payload=EventPayloadJson("\ud800")), "UTF-8"),
    ],
)
async def test_bad_event_stores_nothing(storage, bad, message):
    await storage.write(make_events(3, types=[("x",)]), meta={"k": 1})
    before = (await storage.stats(), storage.last_ids, storage.last_seq)
    events = make_events(6, start=10, types=[("new",), ("x",), ("other",)])
    events[4] = bad(events[4])
    with pytest.raises(StorageError, match="event 4 ") as info:
        await storage.write(events, meta={"k": 2})
    assert message in str(info.value)
    assert (await storage.stats(), storage.last_ids, storage.last_seq) == before
    assert await storage.get_meta("k") == 1
    assert await count_rows(storage.path) == 3
    # The type cache was rolled back with the write: new types are not queryable.
    latest = await storage.query(QueryLatestParams())
    assert {e.type for e in latest.events} == {("x",)}
    # And the same events, fixed, go in with the next seqs.
    good = make_events(6, start=10, types=[("new",), ("x",), ("other",)])
    assert [seq for seq, _ in await storage.write(good)] == list(range(4, 10))
    latest = await storage.query(QueryLatestParams([("new",), ("other",)]))
    assert sorted(e.type for e in latest.events) == [("new",), ("other",)]


async def test_bad_meta_is_refused(storage):
    with pytest.raises(StorageError, match="meta key 'k'"):
        await storage.write(make_events(2), meta={"k": object()})
    assert storage.last_seq == 0


async def test_meta_round_trip(tmp_path):
    path = tmp_path / "events.sqlite"
    async with opened(path) as s:
        assert await s.get_meta("own") is None
        assert await s.write([], meta={"own": {"session": 3, "ids": [1, 2]}, "x": None}) == []
        await s.write(make_events(1), meta={"n": 1.5})
        assert await s.get_meta("own") == {"session": 3, "ids": [1, 2]}
    async with opened(path) as s:
        assert await s.get_meta("own") == {"session": 3, "ids": [1, 2]}
        assert await s.get_meta("n") == 1.5
        assert await s.get_meta("x") is None
        await s.write([], meta={"n": "two"})
        assert await s.get_meta("n") == "two"


async def test_open_rejects_bad_synchronous(tmp_path):
    with pytest.raises(ValueError, match="'SOMETIMES'"):
        await Storage.open(tmp_path / "x.sqlite", synchronous="SOMETIMES")
    for mode in ("OFF", "normal", "FULL", "EXTRA"):
        async with opened(tmp_path / f"{mode}.sqlite", synchronous=mode) as s:
            assert await s.write(make_events(1))


async def test_open_refuses_foreign_files(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(CorruptStoreError, match=r"junk\.sqlite is damaged .*restore"):
        await Storage.open(junk)
    newer = tmp_path / "newer.sqlite"
    with contextlib.closing(sqlite3.connect(newer)) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StorageError, match="schema version 99"):
        await Storage.open(newer)


def test_retention_rejects_bad_values():
    with pytest.raises(ValueError, match="-1"):
        Retention(max_events=-1)
    with pytest.raises(ValueError, match="0"):
        Retention(max_age_seconds=0)


async def test_closed_storage_refuses(tmp_path):
    s = await Storage.open(tmp_path / "x.sqlite")
    await s.close()
    await s.close()
    with pytest.raises(StorageError, match="closed"):
        await s.write(make_events(1))


# -- durability and retention ----------------------------------------------------------


async def test_seq_and_last_ids_persist_and_survive_retention(tmp_path):
    path = tmp_path / "events.sqlite"
    async with opened(path) as s:
        await s.write(make_events(10, t0=now().s))
        assert s.last_seq == 10
    async with opened(path, retention=Retention(max_events=4)) as s:
        assert s.last_seq == 10
        assert await s.enforce_retention() == 6
        assert [seq for seq, _ in await s.read_since_seq(0, 100)] == [7, 8, 9, 10]
        # Events from long ago arrive last (replication); age retention then deletes
        # the highest seqs, which must still not be handed out again.
        await s.write(make_events(3, server=2, t0=1_000))
    async with opened(path, retention=Retention(max_age_seconds=3600)) as s:
        assert s.last_seq == 13
        assert await s.enforce_retention() == 3
        assert s.last_ids == {1: EventId(1, 1, 10), 2: EventId(2, 1, 3)}
    async with opened(path) as s:
        assert s.last_seq == 13
        assert s.last_ids == {1: EventId(1, 1, 10), 2: EventId(2, 1, 3)}
        assert [seq for seq, _ in await s.write(make_events(1, start=11))] == [14]
        assert await s.stats() == StorageStats(
            events=5, db_bytes=(await s.stats()).db_bytes, last_seq=14
        )
        # Held no more, but last_ids remembers them: a Syncer asks after them.
        assert (await s.read_server(2, None, 10)) == []


def _state_row(path):
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return (
            conn.execute("SELECT last_seq, event_count FROM state").fetchone(),
            conn.execute("SELECT server, session, instance FROM last_ids").fetchall(),
        )


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])  # inline, writer thread
@pytest.mark.parametrize("clean_close", [True, False])
async def test_counters_and_last_ids_without_a_state_write_per_commit(
    tmp_path, monkeypatch, clean_close, synchronous
):
    """Commits do not rewrite the state row and last_ids (the mark); a store stopped
    without a clean close (the mark left behind) still opens with every counter and id
    of its committed events, also around retention, and a snapshot reads the same."""
    path = tmp_path / "events.sqlite"
    if not clean_close:
        # A crash after the commits: nothing writes the mark at close.
        monkeypatch.setattr(Storage, "_mark_now", lambda self: None)
    async with opened(path, synchronous=synchronous) as s:
        for i in range(10):
            await s.write(make_events(1, start=1 + i, t0=now().s))
        await s.write(make_events(2, server=2, t0=now().s))
        # Nothing but a commit ran: the mark has not moved.
        assert _state_row(path) == ((0, 0), [])
    marked = ((12, 12), [(1, 1, 10), (2, 1, 2)])
    assert _state_row(path) == (marked if clean_close else ((0, 0), []))
    info = snapshot.inspect(path)
    assert (info.events, info.last_ids) == (12, {1: (1, 10), 2: (1, 2)})
    async with opened(path, synchronous=synchronous, retention=Retention(max_events=4)) as s:
        assert (s.last_seq, s.last_ids) == (12, {1: EventId(1, 1, 10), 2: EventId(2, 1, 2)})
        assert (await s.stats()).events == 12
        await s.write(make_events(1, server=3, t0=now().s))
        # Retention writes the mark with its delete: nothing above it is deleted.
        assert await s.enforce_retention() == 9
        assert _state_row(path) == ((13, 4), [(1, 1, 10), (2, 1, 2), (3, 1, 1)])
        await s.write(make_events(1, start=11, t0=now().s))
    async with opened(path, synchronous=synchronous) as s:
        assert s.last_seq == 14
        assert s.last_ids == {1: EventId(1, 2, 11), 2: EventId(2, 1, 2), 3: EventId(3, 1, 1)}
        assert (await s.stats()).events == 5
        assert [seq for seq, _ in await s.write(make_events(1, start=12, t0=now().s))] == [15]
    info = snapshot.inspect(path)
    assert (info.events, info.last_ids[1]) == (6, (2, 12))


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_the_mark_moves_every_few_commits_and_with_meta(tmp_path, monkeypatch, synchronous):
    monkeypatch.setattr(storage_backend, "MARK_EVERY_COMMITS", 3)
    path = tmp_path / "events.sqlite"
    async with opened(path, synchronous=synchronous) as s:
        for i in range(4):
            await s.write(make_events(1, start=1 + i))
        assert _state_row(path) == ((3, 3), [(1, 1, 3)])
        await s.write([], {"k": 1})
        assert _state_row(path) == ((4, 4), [(1, 1, 4)])


async def test_latest_falls_back_after_retention(tmp_path):
    t = now().s
    events = [
        # type a: newest (by timestamp) is old; falls back to nothing after age retention
        Event(EventId(1, 1, 1), ("a",), Timestamp(t - 7200, 0), None, None),
        # type b: newest by timestamp arrived first (lowest seq), older one after it
        Event(EventId(1, 1, 2), ("b",), Timestamp(t, 0), None, EventPayloadJson("1")),
        Event(EventId(1, 1, 3), ("b",), Timestamp(t - 10, 0), None, EventPayloadJson("2")),
        Event(EventId(1, 1, 4), ("b",), Timestamp(t - 20, 0), None, EventPayloadJson("3")),
        Event(EventId(1, 1, 5), ("c",), Timestamp(t, 0), None, None),
    ]
    path = tmp_path / "events.sqlite"
    async with opened(path) as s:
        await s.write(events)
        latest = await s.query(QueryLatestParams())
        assert sorted(e.id.instance for e in latest.events) == [1, 2, 5]
    async with opened(path, retention=Retention(max_age_seconds=3600, max_events=3)) as s:
        assert await s.enforce_retention() == 2  # a by age, then b's newest by count
        latest = await s.query(QueryLatestParams())
        assert sorted(e.id.instance for e in latest.events) == [3, 5]
        assert await s.query(QueryLatestParams([("a",)])) == QueryResult([], False)


# -- the folds (indexes, latest) -----------------------------------------------------


def _unfolded(path) -> int:
    """Events missing from a folded index table (the three agree, or this fails)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        counts = {
            conn.execute(
                f"SELECT count(*) FROM events WHERE seq NOT IN (SELECT seq FROM {table})"
                + (" AND source_ts IS NOT NULL" if table == "events_by_source_ts" else "")
            ).fetchone()[0]
            for table in ("events_by_ts", "events_by_type")
        }
        assert len(counts) == 1, counts
        return counts.pop()


def _typed_upto(path):
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'folded_upto'").fetchone()
        return None if row is None else int(row[0])


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_a_type_query_right_after_a_write_sees_every_event(
    tmp_path, monkeypatch, synchronous
):
    # No background pass: only the query's own fold can put the rows into the index.
    monkeypatch.setattr(storage_backend, "_FOLD_INTERVAL", 3600)
    monkeypatch.setattr(storage_backend, "FOLD_CHUNK", 7)  # several fold transactions
    path = tmp_path / "events.sqlite"
    types = [("a",), ("b",), ("c",)]
    written = make_events(30, types=types)
    async with opened(path, synchronous=synchronous) as s:
        await s.write(written)
        assert _unfolded(path) == 30  # inserted outside the folded indexes
        got = await s.query(
            QueryTimeseriesParams(event_types=[("b",)], order=Order.ASCENDING, max_results=100)
        )
        assert got.events == [e for e in written if e.type == ("b",)]
        assert _unfolded(path) == 0 and _typed_upto(path) == 30
        # A server query does not fold (it reads the identity index, written at commit).
        more = make_events(5, types=types, start=31, t0=2_000)
        await s.write(more)
        got = await s.query(QueryServerParams(1))
        assert [e.id.instance for e in got.events] == list(range(1, 36))
        assert _unfolded(path) == 5
    # The fold's progress survives a restart; the next type query folds the rest.
    async with opened(path, synchronous=synchronous) as s:
        got = await s.query(
            QueryTimeseriesParams(event_types=[("a",), ("c",)], order=Order.ASCENDING)
        )
        assert got.events == [e for e in written + more if e.type != ("b",)]
        assert _typed_upto(path) == 35


async def test_queries_answer_in_full_when_the_fold_fails(tmp_path, monkeypatch, caplog):
    # A store that takes no writes (a full disk) still answers reads, and completely:
    # every query shape that reads the folded tables adds the events not folded yet.
    monkeypatch.setattr(storage_backend, "_FOLD_INTERVAL", 3600)
    path = tmp_path / "events.sqlite"
    types = [("a",), ("b",)]
    folded = make_events(8, types=types)
    rest = [
        Event(EventId(1, 1, 9), ("a",), Timestamp(3, 0), Timestamp(50, 0), None),
        Event(EventId(1, 1, 10), ("c",), Timestamp(500, 0), Timestamp(1, 0), None),
        Event(EventId(1, 1, 11), ("b",), Timestamp(400, 0), None, None),
    ]
    every = folded + rest
    by_ts = sorted(every, key=lambda e: (e.timestamp, e.id.server, e.id.session, e.id.instance))
    async with opened(path) as s:
        await s.write(folded)
        await s.fold()  # the tables hold these ...
        await s.write(rest)  # ... and not these

        def full() -> None:
            raise StorageFaultError(f"{path}: the file system is full (injected)")

        monkeypatch.setattr(s, "_fold_chunk", full)
        for _ in range(2):
            got = await s.query(QueryTimeseriesParams(event_types=[("a",)], order=Order.ASCENDING))
            assert got.events == [e for e in by_ts if e.type == ("a",)]
            got = await s.query(QueryTimeseriesParams(order=Order.DESCENDING))
            assert got.events == by_ts[::-1]
            page = await s.query(QueryTimeseriesParams(order=Order.ASCENDING, max_results=3))
            assert page.events == by_ts[:3] and page.more_follows
            after = await s.query(
                QueryTimeseriesParams(order=Order.ASCENDING, last_event_id=by_ts[2].id)
            )
            assert after.events == by_ts[3:]
            got = await s.query(
                QueryTimeseriesParams(
                    event_types=[("a",), ("c",)],
                    order_by=OrderBy.SOURCE_TIMESTAMP,
                    order=Order.ASCENDING,
                )
            )
            assert [e.id.instance for e in got.events] == [10, 9]  # by source timestamp
            latest = await s.query(QueryLatestParams())
            assert {e.type: e.id.instance for e in latest.events} == {
                ("a",): max(
                    (e for e in every if e.type == ("a",)),
                    key=lambda e: (e.timestamp, e.id.instance),
                ).id.instance,
                ("b",): 8,  # instance 11 is older
                ("c",): 10,
            }
            assert (await s.query(QueryLatestParams([("c",)]))).events == [rest[1]]
            assert [e.id.instance for _, e in await s.read_latest([("c",)])] == [10]
        assert _unfolded(path) == 3
        warnings = [r for r in caplog.records if "fold failed" in r.message]
        assert len(warnings) == 1 and "full (injected)" in warnings[0].message


async def test_the_arrow_export_is_complete_when_the_fold_fails(tmp_path, monkeypatch):
    # The export pages the folded timestamp table: events not folded yet come from
    # `events` itself, in the same order, across pages.
    import pyarrow as pa
    from eventfleet_server.storage import bulk

    monkeypatch.setattr(storage_backend, "_FOLD_INTERVAL", 3600)
    path = tmp_path / "events.sqlite"
    folded = make_events(6)
    rest = [
        Event(EventId(1, 1, 7 + i), ("a",), Timestamp(t, 0), None, None)
        for i, t in enumerate([500, 1_003, 9_000])
    ]
    async with opened(path) as s:
        await s.write(folded)
        await s.fold()
        await s.write(rest)

        def full() -> None:
            raise StorageFaultError(f"{path}: the file system is full (injected)")

        monkeypatch.setattr(s, "_fold_chunk", full)
        chunks = [c async for c in bulk.export_stream(s, 0, 10_000_000_000, page_rows=2)]
        table = pa.ipc.open_stream(b"".join(chunks)).read_all()
    expected = sorted(folded + rest, key=lambda e: (e.timestamp, e.id.instance))
    assert table.column("instance").to_pylist() == [e.id.instance for e in expected]
    assert _unfolded(path) == 3


async def test_a_fold_stops_at_what_was_committed_when_it_was_asked(tmp_path, monkeypatch):
    # Commits keep arriving between its chunks: a query's fold must not chase them.
    monkeypatch.setattr(storage_backend, "_FOLD_INTERVAL", 3600)
    monkeypatch.setattr(storage_backend, "FOLD_CHUNK", 5)
    path = tmp_path / "events.sqlite"
    async with opened(path) as s:
        await s.write(make_events(20))
        chunks = 0
        fold_chunk = s._fold_chunk

        def counted() -> None:
            nonlocal chunks
            chunks += 1
            fold_chunk()

        monkeypatch.setattr(s, "_fold_chunk", counted)
        stop = False

        async def keep_writing() -> None:
            start = 21
            while not stop and start < 200:  # bounded
                await s.write(make_events(1, start=start, t0=5_000 + start))
                start += 1

        writer = asyncio.create_task(keep_writing())
        try:
            await s.fold()
        finally:
            stop = True
            await writer
        assert chunks == 4  # 20 events in chunks of 5, whatever came after


async def test_the_background_pass_folds_what_was_written(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_backend, "_FOLD_INTERVAL", 0.05)
    path = tmp_path / "events.sqlite"
    async with opened(path) as s:
        await s.write(make_events(20, types=[("a",), ("b",)]))
        for _ in range(100):  # bounded: 5 s
            if not _unfolded(path):
                break
            await asyncio.sleep(0.05)
        assert _unfolded(path) == 0 and _typed_upto(path) == 20


async def test_the_latest_repair_finds_an_event_not_yet_folded(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_backend, "_FOLD_INTERVAL", 3600)
    path = tmp_path / "events.sqlite"
    newest = Event(EventId(1, 1, 1), ("t",), Timestamp(2_000, 0), None, None)
    older = Event(EventId(1, 1, 2), ("t",), Timestamp(1_000, 0), None, None)
    async with opened(path, retention=Retention(max_events=1)) as s:
        await s.write([newest])
        await s.write([older])  # after the newest (seq 2), unfolded
        assert await s.enforce_retention() == 1  # deletes seq 1: the type's latest
        assert (await s.query(QueryLatestParams([("t",)]))).events == [older]


# -- concurrency -----------------------------------------------------------------------


async def test_query_not_blocked_by_open_write_transaction(storage):
    await storage.write(make_events(5))
    release = threading.Event()
    holding = threading.Event()

    def hold():
        conn = storage._writer._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM events")
        holding.set()
        release.wait(10)
        conn.execute("ROLLBACK")

    held = asyncio.ensure_future(storage_backend._run(storage._writer, hold))
    assert await asyncio.to_thread(holding.wait, 10)
    try:
        result = await asyncio.wait_for(storage.query(QueryServerParams(1)), 2)
        assert len(result.events) == 5  # the last committed state
    finally:
        release.set()
        await held


# -- query plans -----------------------------------------------------------------------


def _plan(conn, sql, params):
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


async def test_query_plans_use_indexes(storage):
    await storage.write(make_events(50, types=[("a",), ("b",)]))
    params = {"lo": 0, "hi": 1, "slo": 0, "shi": 1, "types": "[1]", "limit": 5}
    params |= {f"k{i}": 0 for i in range(5)} | {f"t{i}": i for i in range(3)}
    with contextlib.closing(sqlite3.connect(storage.path)) as conn:
        for source, descending, source_filter, types, after in itertools.product(
            [False, True], [False, True], [False, True], [None, 0, 1, 3], [False, True]
        ):
            if source and (source_filter or types):
                continue  # shapes the storage never builds
            sql = storage_queries.timeseries_sql(
                source=source,
                descending=descending,
                source_filter=source_filter,
                types=types,
                after=after,
            )
            plan = _plan(conn, sql, params)
            # Each arm: a range of the folded table in its key order, then the row.
            arms = [line for line in plan if line.startswith("SEARCH t ")]
            assert len(arms) == (types or 1), (sql, plan)
            assert all(line.startswith("SEARCH t USING PRIMARY KEY (") for line in arms), plan
            if types:
                assert all("(type_id=? AND " in line for line in arms), plan
            else:
                first = "source_ts" if source else "ts"
                assert all(f"({first}" in line for line in arms), plan  # a range of the key
            rows = [line for line in plan if line.startswith("SEARCH events")]
            assert rows and all(
                line == "SEARCH events USING INTEGER PRIMARY KEY (rowid=?)" for line in rows
            ), plan
            if after:
                assert all(">(" in line or "<(" in line for line in arms), plan
            assert not any("TEMP B-TREE" in line for line in plan), plan
            assert not any(line.startswith(("SCAN t", "SCAN events")) for line in plan), plan
            # With the events not folded yet (a fold failed): one arm more, a rowid range.
            tail = storage_queries.timeseries_sql(
                source=source,
                descending=descending,
                source_filter=source_filter,
                types=types,
                after=after,
                tail=True,
            )
            plan = _plan(conn, tail, params | {"folded": 10})
            assert "SEARCH events USING INTEGER PRIMARY KEY (rowid>?)" in plan, plan
            assert len([line for line in plan if line.startswith("SEARCH t ")]) == (types or 1)
        assert _plan(conn, events_table.SERVER, (1, 0, 5)) == [
            "SEARCH events USING INDEX events_id (server=? AND instance>?)"
        ]
        assert _plan(conn, events_table.SENTINEL, (1, 0, 5)) == [
            "SEARCH events USING INDEX events_id (server=? AND instance=?)"
        ]
        assert _plan(conn, events_table.SINCE_SEQ, (1, 5)) == [
            "SEARCH events USING INTEGER PRIMARY KEY (rowid>?)"
        ]
        assert _plan(conn, latest_table.NEWEST_OF_TYPE, (1,)) == [
            "SEARCH events_by_type USING PRIMARY KEY (type_id=?)"
        ]
        # Folds read only their range of rows (`last_ids` is given the raised ids by the
        # writer and reads no events at all).
        for statement in [*indexes_table.FOLD, latest_table.FOLD]:
            assert (
                _plan(conn, statement, (1, 2))[0]
                == "SEARCH events USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"
            ), statement
        assert not any("events" in line for line in _plan(conn, last_ids_table.UPSERT, (1, 2, 3)))
        # O(types): walk `latest`, fetch each event by its seq.
        cols = latest_table.EVENTS_COLS
        latest_args = {"types": "[1]", "folded": 10}
        assert _plan(conn, latest_table.query_sql(cols, types=False, tail=False), latest_args) == [
            "SCAN latest",
            "SEARCH events USING INTEGER PRIMARY KEY (rowid=?)",
        ]
        plan = _plan(conn, latest_table.query_sql(cols, types=True, tail=False), latest_args)
        assert "SEARCH events USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
        assert not any("SCAN events" in line for line in plan), plan
        # After a failed fold: `latest` and the rows above the folded ones, no scan.
        plan = _plan(conn, latest_table.query_sql(cols, types=True, tail=True), latest_args)
        assert "SEARCH events USING INTEGER PRIMARY KEY (rowid>?)" in plan, plan
        assert not any("SCAN events" in line for line in plan), plan
        assert any(
            "events_by_ts USING PRIMARY KEY (ts<?)" in line
            for line in _plan(conn, events_table.DELETE_OLDER, (0, 5))
        )


# -- scale -----------------------------------------------------------------------------


async def test_paging_cost_does_not_grow_with_table(tmp_path, capsys):
    """VM steps for one page at 100k events stay close to those at 1k events."""
    types = [(f"t{i}",) for i in range(100)]

    async def measure(size):
        async with opened(tmp_path / f"{size}.sqlite") as s:
            t0 = time.perf_counter()
            for start in range(0, size, 1000):
                await s.write(
                    make_events(1000, start=start + 1, t0=start, types=types, payload=None)
                )
            insert_s = time.perf_counter() - t0
            steps = 0

            def progress():
                nonlocal steps
                steps += 1
                return 0

            await s._reader.set_progress_handler(progress, 100)
            middle = EventId(1, 1 + (size // 2 - 1) // 10, size // 2)
            queries = {
                "desc first page": QueryTimeseriesParams(max_results=100),
                "asc after middle": QueryTimeseriesParams(
                    order=Order.ASCENDING, max_results=100, last_event_id=middle
                ),
                "source asc": QueryTimeseriesParams(
                    order=Order.ASCENDING, order_by=OrderBy.SOURCE_TIMESTAMP, max_results=100
                ),
                "1 type after middle": QueryTimeseriesParams(
                    event_types=[types[(size // 2 - 1) % 100]],
                    order=Order.ASCENDING,
                    max_results=3,
                    last_event_id=middle,
                ),
                "5 types desc": QueryTimeseriesParams(event_types=types[:5], max_results=20),
                "server after middle": QueryServerParams(1, max_results=100, last_event_id=middle),
            }
            result = {}
            for name, params in queries.items():
                steps = 0
                got = await s.query(params)
                assert got.events and got.more_follows, name
                result[name] = steps
            await s._reader.set_progress_handler(None, 100)
            page_ms = []
            for params in (QueryTimeseriesParams(max_results=1000),) * 5:
                t0 = time.perf_counter()
                await s.query(params)
                page_ms.append((time.perf_counter() - t0) * 1000)
            return result, insert_s, min(page_ms)

    small, _, _ = await measure(1_000)
    large, _, _ = await measure(100_000)
    # Insert rates and page times belong to the benchmarks (scripts/bench); this test
    # asserts the plan scales (VM steps), which does not depend on the machine's load.
    for name in small:
        assert large[name] <= 2 * small[name] + 20, (name, small[name], large[name])


async def test_inline_writes_are_checkpointed_in_the_background(tmp_path):
    """NORMAL commits run on the loop; the WAL is checkpointed from the reader's thread."""
    storage = await Storage.open(tmp_path / "inline.sqlite", synchronous="NORMAL")
    try:
        assert storage._inline
        events = [
            Event(EventId(1, i, i), ("w",), Timestamp(i, 0), None, None) for i in range(1, 301)
        ]
        for e in events:
            await storage.write([e])
        assert storage._commits_since_checkpoint > 0
        await asyncio.sleep(1.2)
        assert storage._commits_since_checkpoint == 0
        result = await storage.query(QueryServerParams(1), max_results_cap=1000)
        assert [e.id for e in result.events] == [e.id for e in events]
    finally:
        await storage.close()
    full = await Storage.open(tmp_path / "full.sqlite", synchronous="FULL")
    assert not full._inline
    await full.close()


def _wal_restarts(path: Path) -> int:
    # The WAL header's checkpoint sequence number (bytes 12..16, big-endian) grows by
    # one each time a writer starts the WAL over from its first frame.
    with open(f"{path}-wal", "rb") as f:
        return int.from_bytes(f.read(16)[12:16], "big")


async def _commit_one(storage: Storage, event: Event) -> None:
    # Inline as the engine commits, then one loop turn; through `write` while the
    # checkpoint's last pass holds writes.
    if storage.can_write_now(1):
        storage.write_now([event])
        await asyncio.sleep(0)
    else:
        await storage.write([event])


async def test_the_wal_starts_over_under_a_steady_load(tmp_path):
    """Inline commits that never pause still let the background checkpoint copy the
    whole WAL, so the next commit starts it over: the file is reused, not grown
    without bound (878 MB after 30,000 one-event commits when it was not)."""
    path = tmp_path / "steady.sqlite"
    storage = await Storage.open(path, synchronous="NORMAL")
    try:
        assert storage._inline
        before = _wal_restarts(path)
        deadline = time.monotonic() + 10 * storage_backend._CHECKPOINT_INTERVAL
        i = 0
        # Bounded in count and time; a commit every loop turn, so every checkpoint
        # runs while commits go on.
        while i < 200_000 and time.monotonic() < deadline:
            i += 1
            await _commit_one(storage, Event(EventId(1, i, i), ("s",), Timestamp(i, 0), None, None))
            if i % 100 == 0 and _wal_restarts(path) >= before + 2:
                break
        restarts = _wal_restarts(path) - before
        assert restarts >= 2, f"the WAL started over {restarts} time(s) in {i} commits"
        result = await storage.query(QueryServerParams(1), max_results_cap=10)
        assert len(result.events) == 10
    finally:
        await storage.close()


async def test_a_busy_reader_neither_stops_checkpoints_nor_holds_writes(tmp_path):
    """The checkpoints have their own connection: while the reader's thread is busy
    (a long query; here it sleeps), the WAL still starts over, and no write waits
    behind the reader (the checkpoint's last pass holds writes only for its own work)."""
    path = tmp_path / "busy.sqlite"
    storage = await Storage.open(path, synchronous="NORMAL")
    busy = 6 * storage_backend._CHECKPOINT_INTERVAL
    try:
        before = _wal_restarts(path)
        reader_busy = asyncio.ensure_future(storage_backend._run(storage._reader, time.sleep, busy))
        longest = 0.0
        i = 0
        while not reader_busy.done() and i < 200_000:
            i += 1
            started = time.monotonic()
            await _commit_one(storage, Event(EventId(1, i, i), ("b",), Timestamp(i, 0), None, None))
            longest = max(longest, time.monotonic() - started)
        await reader_busy
        restarts = _wal_restarts(path) - before
        assert restarts >= 1, f"no WAL restart in {i} commits while the reader was busy"
        # Behind the reader a write would have waited up to `busy` (3 s).
        assert longest < busy / 2, f"a write waited {longest:.2f} s while the reader was busy"
    finally:
        await storage.close()


async def test_inline_writes_wait_while_a_large_batch_commits_on_the_thread(tmp_path):
    """In inline mode a batch above INLINE_MAX_EVENTS commits on the writer thread; small
    writes and writer jobs (the BUS's UUID index, retention) issued meanwhile wait for
    it instead of running on the same connection inside its transaction."""
    storage = await Storage.open(tmp_path / "mixed.sqlite", synchronous="NORMAL")
    try:
        assert storage._inline
        big = storage_backend.INLINE_MAX_EVENTS * 20
        instance = 0
        for round_ in range(5):
            batch = [
                Event(
                    EventId(1, round_ + 1, instance + i), ("big",), Timestamp(10 + i, 0), None, None
                )
                for i in range(1, big + 1)
            ]
            instance += big
            large = asyncio.create_task(storage.write(batch))
            await asyncio.sleep(0)  # the large write is on the thread now
            await storage.add_event_keys([(f"key-{round_}", 1)], storage.last_seq)
            small = Event(
                EventId(2, round_ + 1, round_ + 1), ("small",), Timestamp(5, 0), None, None
            )
            await storage.write([small])
            await large
        assert storage.last_ids[1].instance == instance
        assert storage.last_ids[2].instance == 5
        result = await storage.query(QueryServerParams(2), max_results_cap=1000)
        assert len(result.events) == 5
        assert await storage.find_event_keys([f"key-{r}" for r in range(5)]) == {
            f"key-{r}": 1 for r in range(5)
        }
    finally:
        await storage.close()


async def test_bus_records_are_written_in_the_insert_of_their_events(storage):
    """events.bus: the recorder's record of each event is stored by the write that
    inserts the event (events and merge rows), None as NULL; the snapshot read gives the
    record, and the payload only where no record is stored."""
    given = []

    def of_events(batch):
        given.append(list(batch))
        return [b"r%d" % e.id.instance if e.id.instance % 2 else None for e in batch]

    storage.set_bus_recorder(
        of_events, lambda rows: [b"m%d" % r[merge_rows.INSTANCE] for r in rows]
    )
    evs = make_events(3, payload=EventPayloadJson('{"v": 1}'))
    inserted = await storage.write(evs)
    assert given == [evs]
    rows = [
        [None, 2, 1, i, ("m",), 5_000_000, None, 2, None, f'{{"m": {i}}}', b"sbs"] for i in (1, 2)
    ]
    merged = await storage.write_rows(rows)
    assert [r[merge_rows.BUS] for r in merged] == [b"m1", b"m2"]
    assert [e for _, e in await storage.read_since_seq(0, 3)] == [e for _, e in inserted]

    got, columns = await storage.read_bus_since_seq(0, 10)
    assert got == [(1, 0, b"r1"), (2, 0, None), (3, 0, b"r3"), (4, 1, b"m1"), (5, 1, b"m2")]
    assert [storage.type_of(t) for _, t, _ in got] == [("a",)] * 3 + [("m",)] * 2
    # Only the row without a record comes with the columns it is built from.
    assert columns == {2: (1, 1, 2, 1_001_000_000, 999_000_005, None, '{"v": 1}')}
    assert await storage.read_bus_since_seq(3, 1) == ([got[3]], {})

    # No recorder: NULL.
    storage.set_bus_recorder(None, None)
    await storage.write(make_events(1, start=10))
    assert (await storage.read_bus_since_seq(5, 10))[0][0][2] is None


async def test_a_failing_bus_recorder_stores_no_records_and_the_write_succeeds(storage, caplog):
    def broken(items):
        raise RuntimeError("recorder bug")

    storage.set_bus_recorder(broken, lambda rows: [b"short"])  # one record for two rows
    inserted = await storage.write(make_events(2))
    rows = [[None, 2, 1, i, ("m",), 5_000_000, None, 0, None, None, b"s"] for i in (1, 2)]
    merged = await storage.write_rows(rows)
    assert len(inserted) == 2 and len(merged) == 2
    assert [r[2] for r in (await storage.read_bus_since_seq(0, 10))[0]] == [None] * 4
    assert storage.bus_recorder_failures == 2
    assert "BUS recorder failed" in caplog.text and "recorder bug" in caplog.text


async def test_a_failed_write_gives_rows_with_records_back_as_given(storage):
    storage.set_bus_recorder(None, lambda rows: [b"rec"] * len(rows))
    good = [[None, 2, 1, i, ("m",), 5_000_000, None, 0, None, None, b"s"] for i in (1, 2)]
    bad = [[None, 2, 1, 3, ("m", 7), 5_000_000, None, 0, None, None, b"s"]]  # not a type
    given = [list(r) for r in good + bad]
    with pytest.raises(StorageError, match="segment 1 7"):
        await storage.write_rows(good + bad)
    assert good + bad == given  # no sequence number, the type, no BUS slot
    inserted = await storage.write_rows(good)
    assert [r[merge_rows.BUS] for r in inserted] == [b"rec", b"rec"]
    assert [rec for _, _, rec in (await storage.read_bus_since_seq(0, 10))[0]] == [b"rec"] * 2
