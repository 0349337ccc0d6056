"""The Syncer's receiving path without model objects: a MsgEvents decoded straight to
merge rows (`syncer.rows`), stored by `Storage.write_rows` and read back as the same
events the object path (`decode_events_sbs` + `Storage.write`) gives."""

from __future__ import annotations

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    QueryLatestParams,
    QueryServerParams,
    Timestamp,
    split_sessions,
)
from eventfleet_server.common.sbsint import encode_int
from eventfleet_server.storage import Storage, StorageError, merge_rows, multirow
from eventfleet_server.storage import events as events_table
from eventfleet_server.storage.merge_rows import sessions
from eventfleet_server.syncer import wire
from eventfleet_server.syncer.rows import TYPE_CACHE_MAX, decode_rows
from eventfleet_server.syncer.wire import ProtocolError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sample_events import ev, varied


def expected_rows(events: list[Event]) -> list[list]:
    """What `decode_rows` must give: the object path's `events.row`, no sequence number
    yet, the type in place of its id."""
    rows = []
    for e in events:
        # A merge row has no `bus` slot yet (`Storage.write_rows` appends it).
        row = list(events_table.row(0, e, 0, codec.encode_event(e)))[: merge_rows.BUS]
        row[0], row[4] = None, e.type
        rows.append(row)
    return rows


def test_rows_are_the_object_paths_rows():
    events = varied(300)
    data = wire.encode_events(events)
    types: dict[bytes, tuple] = {}
    assert decode_rows(data, 1, types) == expected_rows(events)
    assert types  # the distinct types, kept for the next message
    # The second message of a stream meets its types in the cache: the same rows.
    assert decode_rows(data, 1, types) == expected_rows(events)


@pytest.mark.parametrize(
    "instance", [0, 1, 63, 64, 127, 128, 8191, 8192, (1 << 62) - 1, 1 << 62, (1 << 63) - 1]
)
def test_instances_up_to_the_largest_id(instance):
    events = [ev(instance=instance)]
    assert decode_rows(wire.encode_events(events), 1, {}) == expected_rows(events)


def test_an_instance_too_large_or_too_long_is_refused():
    element = codec.encode_event(ev(instance=5))
    assert element[2] == 0x85  # server, session, then the instance's one byte
    too_large = element[:2] + encode_int(1 << 63) + element[3:]
    with pytest.raises(ProtocolError, match=r"outside 0\.\.2"):
        decode_rows(codec.events_array([too_large]), 1, {})
    too_long = element[:2] + b"\x00" * 10 + element[2:]
    with pytest.raises(ProtocolError, match="longer than 64 bits"):
        decode_rows(codec.events_array([too_long]), 1, {})


def test_a_full_type_cache_starts_over():
    events = [ev(instance=i + 1, type_=("t", str(i))) for i in range(TYPE_CACHE_MAX + 10)]
    types: dict[bytes, tuple] = {}
    assert decode_rows(wire.encode_events(events), 1, types) == expected_rows(events)
    assert 0 < len(types) <= TYPE_CACHE_MAX


@pytest.mark.parametrize(
    ("events", "server_id", "error"),
    [
        ([ev(instance=1), ev(instance=2)], 2, "is of server 1, this stream is for server 2"),
        ([ev(session=1), ev(session=2, instance=2)], 1, "mixes sessions 1 and 2"),
        ([ev(session=1), ev(server=3, instance=2)], 1, "event 1 .* is of server 3"),
        ([ev(type_=("a", "*"))], 1, "wildcard"),
        ([ev(instance=1), ev(instance=2, type_=("?",))], 1, "event 1 .*wildcard"),
        ([ev(session=-1)], 1, "outside 0..2"),
        ([ev(instance=1), ev(instance=-2)], 1, "event 1: id .* outside 0..2"),
        ([ev(ts=Timestamp(1 << 62, 0))], 1, "storable range"),
        ([ev(instance=1), ev(instance=2, ts=Timestamp(1 << 62, 0))], 1, "event 1 .*storable"),
        ([ev()._replace(source_timestamp=Timestamp(-(1 << 62), 0))], 1, "storable range"),
        ([], 1, "empty"),
    ],
)
def test_checks_like_decode_events_sbs(events, server_id, error):
    data = wire.encode_events(events)
    with pytest.raises(ProtocolError, match=error):
        decode_rows(data, server_id, {})
    with pytest.raises(ProtocolError):
        wire.decode_events_sbs(data, server_id)


def test_truncated_and_trailing_bytes_are_refused():
    data = wire.encode_events(varied(20))
    for cut in range(1, len(data)):
        with pytest.raises(ProtocolError, match="does not decode"):
            decode_rows(data[:-cut], 1, {})
    with pytest.raises(ProtocolError, match="1 bytes after the last event"):
        decode_rows(data + b"\x80", 1, {})


def test_equal_values_encoded_differently_are_read_as_such():
    # An SBS Integer may carry redundant leading groups: 0x00 0x81 is 1, like 0x81.
    first, second = codec.encode_event(ev(instance=1)), codec.encode_event(ev(instance=2))
    assert second.startswith(b"\x81\x81")  # server 1, session 1
    long_server = b"\x00\x81" + second[1:]
    data = codec.events_array([first, long_server])
    rows = decode_rows(data, 1, {})
    assert [r[1:4] for r in rows] == [[1, 1, 1], [1, 1, 2]]
    assert rows[1][10] == long_server  # stored as received


def test_a_type_holding_the_timestamp_bytes_is_read_whole():
    """`decode_rows` looks a known type up by the bytes before the next occurrence of the
    previous event's timestamp. Here that timestamp's encoding also occurs inside the
    types (the end of a segment and the next one's length byte), and a shorter type is
    known too: every event still gets its whole type and its own timestamp."""
    ts = Timestamp(1_700_000_000, 5)
    ts_bytes = encode_int(ts.s) + encode_int(ts.us)
    assert ts_bytes in codec.encode_event(ev(ts=ts))
    assert ts_bytes[-2:] == b"\x80\x85"  # ... the lengths of an empty and a 5-byte segment
    tricky = (f"a{ts_bytes[:-2].decode()}", "", "zzzzz")
    assert ts_bytes in codec.encode_event(ev(type_=tricky, ts=Timestamp(9, 9)))
    types: dict[bytes, tuple] = {}
    for order in ([("a",), tricky, ("a",), tricky], [tricky, tricky, ("a",), tricky]):
        events = [
            ev(instance=i + 1, type_=t, ts=Timestamp(ts.s, ts.us if i else 6))
            for i, t in enumerate(order)
        ]
        for cache in (types, {}):  # warm (every type known) and cold
            rows = decode_rows(wire.encode_events(events), 1, cache)
            assert rows == expected_rows(events)


def test_repeated_source_timestamps_are_read_as_each_event_carries_them():
    """`decode_rows` reuses the previous source timestamp when the next one's bytes start
    with it: runs, a missing one between, a return to an older one, and one whose
    encoding is a prefix of nothing else all read as the object path reads them."""
    a, b = Timestamp(1_700_000_000, 5), Timestamp(1_700_000_000, 6)
    c = Timestamp(1_700_000_001, 5)  # the same microseconds, another second
    order = [a, a, None, a, b, b, a, c, c, None, None, b]
    events = [ev(instance=i + 1)._replace(source_timestamp=sts) for i, sts in enumerate(order)]
    rows = decode_rows(wire.encode_events(events), 1, {})
    assert rows == expected_rows(events)
    assert [r[6] for r in rows][:3] == [rows[0][6], rows[0][6], None]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_refused_or_read_as_the_c_decoder_reads_it(data):
    try:
        rows = decode_rows(data, 1, {})
    except ProtocolError:
        return
    events = [codec.event_from_sbs(codec.repo.decode("HatEventer.Event", r[10])) for r in rows]
    assert rows == expected_rows_of(events, rows)


def expected_rows_of(events: list[Event], got: list[list]) -> list[list]:
    # As `expected_rows`, with the element bytes as received (the C decoder reads a
    # differently encoded equal value as that value).
    rows = expected_rows(events)
    for row, r in zip(rows, got, strict=True):
        row[10] = r[10]
    return rows


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5000), st.integers(0, 255))
def test_a_corrupted_byte_is_refused_or_read_as_the_object_path_reads_it(index, value):
    data = bytearray(wire.encode_events(varied(20)))
    data[index % len(data)] = value
    try:
        rows = decode_rows(bytes(data), 1, {})
    except ProtocolError:
        with pytest.raises(ProtocolError):
            wire.decode_events_sbs(bytes(data), 1)
        return
    events, elements = wire.decode_events_sbs(bytes(data), 1)
    assert [r[10] for r in rows] == elements
    assert rows == expected_rows_of(events, rows)


# -- storing ------------------------------------------------------------------------------


@pytest.fixture
async def storage(tmp_path):
    s = await Storage.open(tmp_path / "events.sqlite", synchronous="NORMAL")
    try:
        yield s
    finally:
        await s.close()


def rows_of(events: list[Event]) -> list[list]:
    """Rows as a stream receives them: one MsgEvents per session."""
    return [
        row
        for group in split_sessions(events)
        for row in decode_rows(wire.encode_events(group), group[0].id.server, {})
    ]


# Inline; on the writer thread in whole multi-row INSERTs; and with a remainder.
@pytest.mark.parametrize("count", [10, 2000, multirow.INSERT_ROWS * 2 + 7])
async def test_written_rows_read_back_as_the_events(storage, count):
    events = varied(count, session=3)
    rows = rows_of(events)
    inserted = await storage.write_rows(rows)
    assert [r[0] for r in inserted] == list(range(1, count + 1))
    assert storage.merged_events(inserted) == events
    result = await storage.query(QueryServerParams(1, True, count))
    assert result.events == sorted(events, key=lambda e: e.id.instance)
    stored = await storage.query_sbs(QueryServerParams(1, True, count))
    assert stored.events == [codec.encode_event(e) for e in result.events]
    assert storage.last_ids[1] == max(e.id for e in events)
    latest = await storage.query(QueryLatestParams(event_types=[("x", "y")]))
    assert latest.events == [max((e for e in events if e.type == ("x", "y")), key=_natural)]


def _natural(e: Event) -> tuple:
    return (e.timestamp, e.id)


async def test_rows_already_held_are_skipped(storage):
    events = [ev(session=1 + i // 10, instance=i + 1, type_=("t", str(i % 3))) for i in range(30)]
    first = events[:20]
    assert len(await storage.write_rows(rows_of(first))) == 20
    assert await storage.write_rows(rows_of(first)) == []
    # Older ids after newer ones in one batch, the same event twice, then new ones.
    batch = rows_of([events[5]]) + rows_of([events[25]]) + rows_of([events[25], events[21]])
    inserted = await storage.write_rows(batch + rows_of(events[26:]))
    assert storage.merged_events(inserted) == [events[25], events[21], *events[26:]]
    assert [r[0] for r in inserted] == list(range(21, 21 + len(inserted)))
    assert (await storage.stats()).events == 20 + len(inserted)


async def test_a_failed_write_stores_nothing_and_gives_the_rows_back(storage):
    good = rows_of([ev(instance=1, type_=("new", "1")), ev(instance=2, type_=("new", "2"))])
    bad = rows_of([ev(instance=3)])
    bad[0][4] = ("a", 7)  # not a type: refused when its id is assigned
    given_rows = [list(r) for r in good]
    with pytest.raises(StorageError, match="segment 1 7"):
        await storage.write_rows(good + bad)
    assert good == given_rows  # types back in place, no sequence number kept
    assert (await storage.stats()).events == 0 and 1 not in storage.last_ids
    inserted = await storage.write_rows(good)
    assert storage.merged_events(inserted) == [
        ev(instance=1, type_=("new", "1")),
        ev(instance=2, type_=("new", "2")),
    ]


async def test_a_row_refused_inside_a_multi_row_insert_stores_nothing(storage):
    """A row SQLite refuses in the middle of a multi-row INSERT (`multirow.insert`)
    fails the whole merge: nothing of it is stored, the rows go back as given."""
    rows = rows_of(varied(multirow.INSERT_ROWS * 2 + 3, session=3))
    rows[multirow.INSERT_ROWS + 5][merge_rows.SBS] = "not bytes"  # STRICT BLOB column
    given_rows = [list(r) for r in rows]
    with pytest.raises(StorageError, match="cannot store TEXT value in BLOB column"):
        await storage.write_rows(rows)
    assert rows == given_rows
    assert (await storage.stats()).events == 0 and 1 not in storage.last_ids
    rows[multirow.INSERT_ROWS + 5][merge_rows.SBS] = b"fixed"
    assert len(await storage.write_rows(rows)) == len(rows)


def test_sessions_are_consecutive_runs():
    rows = [[None, s, ss, i] for i, (s, ss) in enumerate([(1, 1), (1, 1), (1, 2), (2, 2), (1, 1)])]
    assert sessions(rows) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert sessions([]) == []


async def test_row_events_are_built_on_first_use(storage):
    events = varied(30, session=3)
    inserted = await storage.write_rows(rows_of(events))
    lazy = storage.merged_events(inserted)
    assert len(lazy) == 30 and lazy[0] == events[0] and lazy[-1] == events[-1]
    assert lazy._events is None  # the first and the last alone build nothing else
    assert lazy.server_ids() == {1}
    assert lazy.of_types(lambda t: t == ("x", "y")) == [e for e in events if e.type == ("x", "y")]
    assert lazy[3:5] == events[3:5] and list(lazy) == events and lazy == events
