"""HatSyncer message checks, peer-list parsing and small mesh helpers (no sockets)."""

from __future__ import annotations

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadJson,
    Timestamp,
)
from eventfleet_server.config import ConfigError
from eventfleet_server.syncer import wire
from eventfleet_server.syncer.mesh import Backoff, ids_named_by, sync_state_type
from eventfleet_server.syncer.peers import parse_peers
from eventfleet_server.syncer.wire import ProtocolError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sample_events import ev, varied


def test_init_req_round_trip():
    data = wire.encode_init_req(EventId(2, 3, 4), "r1", "tok", [("a", "*")])
    req = wire.decode_init_req(data)
    assert req.last_event_id == EventId(2, 3, 4)
    assert req.client_name == "r1" and req.client_token == "tok"
    assert req.subscription.patterns == (("a", "*"),)


@pytest.mark.parametrize(
    ("last", "subs", "error"),
    [
        (EventId(0, 0, 0), [("*",)], "lastEventId.server 0"),
        (EventId(1, -1, 0), [("*",)], "outside"),
        (EventId(-5, 0, 0), [("*",)], "lastEventId.server -5"),
        (EventId(1, 0, 0), [("*", "a")], "'*' is only valid as the last segment"),
    ],
)
def test_init_req_rejects_bad_values_naming_them(last, subs, error):
    data = wire.encode_init_req(last, "r1", None, subs)
    with pytest.raises(ProtocolError, match=error.replace("*", r"\*")):
        wire.decode_init_req(data)


def test_init_req_garbage():
    with pytest.raises(ProtocolError, match="does not decode"):
        wire.decode_init_req(b"\xff\xff")


def test_events_round_trip_and_checks():
    events = [ev(instance=1), ev(instance=2, payload=EventPayloadJson('{"x": 1}'))]
    assert wire.decode_events(wire.encode_events(events), 1) == events
    with pytest.raises(ProtocolError, match="is of server 1, this stream is for server 2"):
        wire.decode_events(wire.encode_events(events), 2)
    mixed = [ev(session=1), ev(session=2, instance=2)]
    with pytest.raises(ProtocolError, match="mixes sessions 1 and 2"):
        wire.decode_events(wire.encode_events(mixed), 1)
    with pytest.raises(ProtocolError, match="wildcard"):
        wire.decode_events(wire.encode_events([ev(type_=("a", "*"))]), 1)
    with pytest.raises(ProtocolError, match=r"us must be in 0\.\.999999"):
        wire.decode_events(wire.encode_events([ev(ts=Timestamp(1, 2_000_000))]), 1)
    with pytest.raises(ProtocolError, match="empty"):
        wire.decode_events(codec.repo.encode(wire.EVENTS, []), 1)
    with pytest.raises(ProtocolError, match="does not decode"):
        wire.decode_events(b"\x01", 1)


def test_merged_events_follow_the_shared_validation_rule():
    """What a client may register, a peer may send (empty segments, the empty type,
    source timestamps before 1970); what the rule refuses, the merge refuses."""
    ok = [
        Event(EventId(1, 1, i), t, Timestamp(1, 0), st, None)
        for i, (t, st) in enumerate(
            [
                (("a", ""), None),
                (("x", "", "y"), Timestamp(-1, 0)),
                ((), Timestamp(-62_135_596_800, 0)),
                (("",), Timestamp(253_402_300_799, 999_999)),
            ],
            start=1,
        )
    ]
    assert wire.decode_events(wire.encode_events(ok), 1) == ok
    for bad, error in [
        (ok[0]._replace(type=("?",)), "wildcard"),
        (ok[0]._replace(source_timestamp=Timestamp(-62_135_596_801, 0)), "years 1..9999"),
        (ok[0]._replace(source_timestamp=Timestamp(253_402_300_800, 0)), "years 1..9999"),
    ]:
        with pytest.raises(ProtocolError, match=error):
            wire.decode_events(wire.encode_events([bad]), 1)


def test_init_res():
    assert wire.decode_init_res(wire.encode_init_res(None)) is None
    assert wire.decode_init_res(wire.encode_init_res("no")) == "no"


def test_parse_peers_skips_self_and_names_duplicates():
    raw = [
        {"name": "a", "host": "h", "port": 1, "server_id": 1},
        {"name": "b", "host": "h", "port": 2, "server_id": 2},
    ]
    peers, own = parse_peers(raw, 2)
    assert [p.name for p in peers] == ["a"] and own == "b"
    with pytest.raises(ConfigError, match="name 'a' appears twice"):
        parse_peers([*raw, {"name": "a", "host": "h", "port": 3, "server_id": 3}], 9)
    with pytest.raises(ConfigError, match="server_id 2 appears twice"):
        parse_peers([*raw, {"name": "c", "host": "h", "port": 3, "server_id": 2}], 9)


def test_sync_state_types_name_server_ids():
    assert sync_state_type(1, 4) == ("event", "1", "synced", "4")
    assert ids_named_by(("event", "1", "synced", "4")) == (1, 4)
    assert ids_named_by(("event", "0", "synced", "x")) == ()
    assert ids_named_by(("event", "1", "eventer", "4")) == ()
    assert ids_named_by(("event", "1", "synced", str(1 << 64))) == (1,)


def test_backoff_doubles_to_the_cap_with_jitter():
    b = Backoff(1.0, 4.0)
    delays = [b.next() for _ in range(5)]
    assert 0.8 <= delays[0] <= 1.2 and 1.6 <= delays[1] <= 2.4
    assert all(3.2 <= d <= 4.8 for d in delays[2:])
    b.reset()
    assert b.next() <= 1.2


def test_configuration_with_duplicate_peers_is_refused_at_load():
    from eventfleet_server import config

    peers = [
        {"name": "a", "host": "h", "port": 1, "server_id": 1},
        {"name": "b", "host": "h", "port": 2, "server_id": 1},
    ]
    with pytest.raises(ConfigError, match=r"peers\[1\] \(b\): server_id 1 appears twice"):
        config.load(None, environ={}, overrides={"peers": peers})


def test_split_events_array_gives_each_events_own_encoding():
    events = varied(300, session=None)
    data = wire.encode_events(events)
    assert codec.split_events_array(data) == [codec.encode_event(e) for e in events]
    assert codec.events_array(codec.split_events_array(data)) == data
    assert codec.split_events_array(codec.events_array([])) == []
    # Every truncation, and trailing bytes, are refused (never a short element).
    for cut in range(1, 400):
        with pytest.raises(ValueError):
            codec.split_events_array(data[:-cut])
    with pytest.raises(ValueError, match="1 bytes after the last event"):
        codec.split_events_array(data + b"\x80")


def test_decode_events_sbs_returns_the_received_bytes():
    events = varied(50)
    data = wire.encode_events(events)
    decoded, elements = wire.decode_events_sbs(data, 1)
    assert decoded == events
    assert elements == [codec.encode_event(e) for e in events]
    with pytest.raises(ProtocolError, match="does not decode"):
        wire.decode_events_sbs(data[:-3], 1)


@pytest.mark.parametrize(
    ("events", "server_id", "error"),
    [
        ([ev(instance=1), ev(instance=2)], 2, "is of server 1, this stream is for server 2"),
        ([ev(session=1), ev(session=2, instance=2)], 1, "mixes sessions 1 and 2"),
        ([ev(type_=("a", "*"))], 1, "wildcard"),
        ([ev(session=-1)], 1, "outside 0..2"),
        ([ev(ts=Timestamp(1 << 62, 0))], 1, "storable range"),
        ([], 1, "empty"),
    ],
)
def test_decode_events_sbs_checks_like_decode_events(events, server_id, error):
    data = wire.encode_events(events)
    with pytest.raises(ProtocolError, match=error):
        wire.decode_events_sbs(data, server_id)


def _c_decoded(element: bytes) -> Event:
    return codec.event_from_sbs(codec.repo.decode("HatEventer.Event", element))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_events_sbs_refuses_garbage_with_a_protocol_error(data):
    try:
        events, elements = wire.decode_events_sbs(data, 1)
    except ProtocolError:
        return
    # What is accepted is stored and served as received: the C decoder (any client)
    # reads each element as the event it was taken for.
    assert [_c_decoded(b) for b in elements] == events


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5000), st.integers(0, 255))
def test_a_corrupted_byte_is_refused_or_read_as_the_c_decoder_reads_it(index, value):
    events = varied(20)
    data = bytearray(wire.encode_events(events))
    data[index % len(data)] = value
    try:
        decoded, elements = wire.decode_events_sbs(bytes(data), 1)
    except ProtocolError:
        return
    assert [_c_decoded(b) for b in elements] == decoded
    assert decoded == wire.decode_events(bytes(data), 1)
