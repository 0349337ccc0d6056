"""Property-based fuzzing of every decoder (Hypothesis), bounded for CI.

Each target (tests/fuzz/targets.py) must end, quickly, with a value or its documented
error: no other exception, no hang (the per-example deadline), no runaway memory. Inputs
are random bytes plus mutations of valid messages (which get past the first byte).
Valid messages must decode to what was encoded. ``EVENTFLEET_FUZZ_EXAMPLES`` raises the
count per target (CI default 200); the long coverage-guided runs use atheris
(scripts/fuzz, docs/security.md).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import pathlib

import pytest
import yaml
from eventfleet_server.bus import wire as bus_wire
from eventfleet_server.chatter.connection import _frame_head, parse_msg
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    RegisterEvent,
    Timestamp,
)
from eventfleet_server.common.sbsint import encode_int
from eventfleet_server.eventer.wire import (
    CHUNK_EVENTS,
    InvalidRegistration,
    RegisterLimits,
    decode_register,
    event_elements,
    register_res,
    register_res_parts,
    splice_elements_sliced,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.fuzz import targets


@pytest.fixture(scope="module", autouse=True)
def _close_fuzz_replica():
    """The logged-in Replication target keeps a real store open between examples; close it
    after the module, or pytest cannot exit (its worker threads are not daemons); the
    Jetstream session targets' replica likewise."""
    yield
    targets.close_replica()
    targets.close_jetstream()


EXAMPLES = int(os.environ.get("EVENTFLEET_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=2000,  # ms per example: a decoder that walks garbage for seconds fails
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

# Up to 80 characters: lengths of 64 bytes and more take two bytes in SBS, which the
# register walker reads on its slow path (shorter ones inline).
segment = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80).filter(
    lambda s: s not in ("?", "*")  # the one type rule (docs/security.md): empty is valid
)
payloads = st.one_of(
    st.none(),
    st.builds(EventPayloadBinary, st.text(max_size=8), st.binary(max_size=64)),
    st.builds(
        EventPayloadJson,
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
            max_leaves=6,
        ).map(lambda v: __import__("json").dumps(v)),
    ),
)
timestamps = st.one_of(
    st.none(),
    st.builds(Timestamp, st.integers(-62_135_596_800, 253_402_300_799), st.integers(0, 999_999)),
)
register_events = st.builds(
    RegisterEvent,
    st.lists(segment, max_size=6).map(tuple).filter(lambda t: t[:1] != ("event",)),
    timestamps,
    payloads,
)


def encode_register(events) -> bytes:
    return codec.repo.encode(
        "HatEventer.MsgRegisterReq", [codec.register_event_to_sbs(e) for e in events]
    )


@st.composite
def mutated(draw, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid message with a few bytes flipped, inserted or cut."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "cut"]))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif data:
            del data[pos : pos + draw(st.integers(1, 8))]
    return bytes(data)


valid_register = st.lists(register_events, max_size=20).map(encode_register)
valid_query = st.builds(
    lambda types, n: codec.repo.encode(
        "HatEventer.MsgQueryReq",
        (
            "timeseries",
            {
                "eventTypes": ("value", [list(t) for t in types]),
                "tFrom": ("none", None),
                "tTo": ("none", None),
                "sourceTFrom": ("none", None),
                "sourceTTo": ("none", None),
                "order": ("descending", None),
                "orderBy": ("timestamp", None),
                "maxResults": ("value", n),
                "lastEventId": ("none", None),
            },
        ),
    ),
    st.lists(st.lists(segment, min_size=1, max_size=3), max_size=4),
    st.integers(0, 1000),
)


patterns = st.lists(
    st.lists(st.one_of(segment, st.sampled_from(["?", "*"])), max_size=4), max_size=4
)  # valid and invalid subscriptions ('*' not last)
valid_init = st.builds(
    lambda name, token, subs, server, persisted: codec.repo.encode(
        "HatEventer.MsgInitReq",
        {
            "clientName": name,
            "clientToken": ("none", None) if token is None else ("value", token),
            "subscriptions": subs,
            "serverId": ("none", None) if server is None else ("value", server),
            "persisted": persisted,
        },
    ),
    st.text(max_size=20),
    st.none() | st.text(max_size=20),
    patterns,
    st.none() | st.integers(-(2**40), 2**40),
    st.booleans(),
)
valid_queries = st.one_of(
    valid_query,
    patterns.map(
        lambda p: codec.repo.encode(
            "HatEventer.MsgQueryReq", ("latest", {"eventTypes": ("value", p)})
        )
    ),
    st.builds(
        lambda server, persisted, n: codec.repo.encode(
            "HatEventer.MsgQueryReq",
            (
                "server",
                {
                    "serverId": server,
                    "persisted": persisted,
                    "maxResults": ("value", n),
                    "lastEventId": ("none", None),
                },
            ),
        ),
        st.integers(-(2**40), 2**40),
        st.booleans(),
        st.integers(-5, 1000),
    ),
)


def frame(body: bytes) -> bytes:
    size = len(body).to_bytes(max((len(body).bit_length() + 7) // 8, 1), "big")
    return bytes((len(size),)) + size + body


def chatter_msg(type_: str, data: bytes, msg_id: int) -> bytes:
    return codec.repo.encode(
        "HatChatter.Msg",
        {
            "id": msg_id,
            "first": msg_id,
            "owner": True,
            "token": True,
            "last": True,
            "data": {"type": type_, "data": data},
        },
    )


valid_frames = st.lists(
    st.tuples(
        st.sampled_from(["HatEventer.MsgEventsAck", "HatChatter.Pong", "X.Y"]),
        st.binary(max_size=40),
    ),
    max_size=5,
).map(lambda ms: b"".join(frame(chatter_msg(t, d, i + 1)) for i, (t, d) in enumerate(ms)))


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
@FUZZ
@given(data=st.binary(max_size=512))
def test_random_bytes(name, data):
    targets.TARGETS[name](data)


@FUZZ
@given(data=mutated(valid_register))
def test_mutated_register_requests(data):
    targets.eventer_register(data)


@FUZZ
@given(data=mutated(valid_register))
def test_mutated_register_requests_walked_as_the_codec_reads_them(data):
    """Whenever the sliced decoder accepts a request, the C decoder reads the same
    events from the whole message: the walk never cuts a slice at the wrong place."""
    try:
        decoded = asyncio.run(decode_register(data, RegisterLimits()))
    except InvalidRegistration:  # MalformedRequest and RequestRefused included
        return
    whole = codec.repo.decode("HatEventer.MsgRegisterReq", data)
    assert decoded == [codec.register_event_from_sbs(e) for e in whole]


@FUZZ
@given(data=mutated(valid_queries) | valid_queries)
def test_mutated_queries(data):
    targets.eventer_query(data)


@FUZZ
@given(data=mutated(valid_init) | valid_init)
def test_mutated_init_requests(data):
    targets.eventer_init(data)


@FUZZ
@given(data=mutated(valid_frames))
def test_mutated_frames(data):
    targets.chatter_frames(data)


@FUZZ
@given(events=st.lists(register_events, max_size=40))
def test_valid_register_requests_decode_to_what_was_sent(events):
    decoded = asyncio.run(decode_register(encode_register(events), RegisterLimits()))
    assert decoded == events


@FUZZ
@given(
    events=st.lists(register_events, min_size=1, max_size=40),
    server=st.integers(0, 2**40),
    session=st.integers(0, 2**40),
    first=st.integers(1, 2**40),
    ts=st.builds(Timestamp, st.integers(0, 2**40), st.integers(0, 999_999)),
)
def test_register_response_spliced_from_the_request_equals_the_codecs(
    events, server, session, first, ts
):
    """The MsgRegisterRes built from the request's bytes is byte for byte the one the
    codec encodes from the events (as registered: one session, one timestamp)."""
    request = encode_register(events)
    spans: list = []
    decoded = asyncio.run(decode_register(request, RegisterLimits(), spans))
    created = [
        Event(EventId(server, session, first + i), e.type, ts, e.source_timestamp, e.payload)
        for i, e in enumerate(decoded)
    ]
    expected = codec.repo.encode(
        "HatEventer.MsgRegisterRes", ("events", [codec.event_to_sbs(e) for e in created])
    )
    elements = event_elements(request, spans, created)
    assert register_res(elements) == expected
    assert b"".join(register_res_parts(elements)) == expected
    prepared = asyncio.run(splice_elements_sliced(request, spans, created[0].id, ts))
    assert prepared == elements


def test_a_large_register_response_is_spliced_in_slices_identically():
    """Beyond CHUNK_EVENTS events the stored bytes are prepared a slice at a time
    (yielding to the loop between slices) and the answer written in pieces: the same
    bytes as the codec's."""
    events = [
        RegisterEvent(("big", str(i)), Timestamp(i, i), EventPayloadBinary("b", b"x" * i))
        for i in range(3 * CHUNK_EVENTS + 5)
    ]
    request = encode_register(events)
    spans: list = []
    decoded = asyncio.run(decode_register(request, RegisterLimits(), spans))
    ts = Timestamp(1_700_000_000, 5)
    created = [
        Event(EventId(1, 7, 100 + i), e.type, ts, e.source_timestamp, e.payload)
        for i, e in enumerate(decoded)
    ]
    expected = codec.repo.encode(
        "HatEventer.MsgRegisterRes", ("events", [codec.event_to_sbs(e) for e in created])
    )
    prepared = asyncio.run(splice_elements_sliced(request, spans, EventId(1, 7, 100), ts))
    assert b"".join(register_res_parts(prepared)) == expected
    # Not one registration (another session in the middle): not spliced, no wrong answer.
    mixed = [*created[:200], created[200]._replace(id=EventId(1, 8, 300)), *created[201:]]
    assert event_elements(request, spans, mixed) is None


@FUZZ
@given(
    body=st.binary(min_size=0, max_size=300),
    type_=st.text(max_size=20),
    msg_id=st.integers(1, 2**40),
)
def test_frame_parser_and_builder_agree_with_the_codec(body, type_, msg_id):
    encoded = chatter_msg(type_, body, msg_id)
    parsed = parse_msg(encoded)
    expected = codec.repo.decode("HatChatter.Msg", encoded)
    assert parsed.data == bytes(expected["data"]["data"])
    assert parsed.type == expected["data"]["type"] and parsed.first
    assert parsed.conv == (False, msg_id) and parsed.last and parsed.token
    # The frame the sender builds by hand is the codec's, behind the length prefix.
    head = _frame_head(msg_id, msg_id, True, True, True, type_, len(body))
    assert head.endswith(encoded[: len(encoded) - len(body)])
    assert int.from_bytes(head[1 : 1 + head[0]], "big") == len(encoded)


@FUZZ
@given(n=st.integers(0, 2**62))
def test_integer_encoding_round_trips(n):
    from eventfleet_server.common.sbsint import read_int

    encoded = encode_int(n)
    assert read_int(encoded, 0) == (n, len(encoded))
    # The C decoder reads our encoding as the same Integer.
    assert codec.repo.decode("HatEventer.Timestamp", encoded + encode_int(0)) == {"s": n, "us": 0}


config_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 70000)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "port",
                    "host",
                    "enabled",
                    "storage",
                    "eventer",
                    "syncer",
                    "http",
                    "peers",
                    "max_msg_size",
                    "synchronous",
                    "name",
                    "server_id",
                    "admission",
                    "max_connections",
                    "token_file",
                    "x",
                ]
            ),
            c,
            max_size=4,
        )
    ),
    max_leaves=10,
)


@FUZZ
@given(
    doc=st.dictionaries(
        st.sampled_from(
            [
                "server_id",
                "host",
                "data_dir",
                "eventer",
                "syncer",
                "http",
                "storage",
                "peers",
                "log",
                "bus",
                "token_file",
                "peer_token_file",
                "nope",
            ]
        ),
        config_values,
        max_size=5,
    )
)
def test_structured_config_documents(doc):
    targets.config_yaml(yaml.safe_dump(doc).encode())


# -- Event BUS -------------------------------------------------------------------------------

bus_encodings = st.sampled_from(list(bus_wire.IntegerEncoding))


def _unambiguous(value: int, encoding) -> bool:
    # An RFC (8-byte) value made only of ASCII digit bytes reads as decimal: ~3.5e18 and
    # above only, never a real sequence (bus/wire.py's docstring).
    return not bus_wire.encode_int(value, encoding).isdigit()


@FUZZ
@given(value=st.integers(0, bus_wire.MAX_SEQUENCE), encoding=bus_encodings)
def test_bus_integers_round_trip_in_both_encodings(value, encoding):
    if _unambiguous(value, encoding):
        assert bus_wire.decode_int(bus_wire.encode_int(value, encoding)) == value


topic_segment = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8).filter(
    lambda s: s not in ("?", "*")
)
event_types = st.lists(topic_segment, min_size=1, max_size=5).map(tuple)
# What a PUB may carry: no event a timestamp outside years 1..9999 (refused as
# bad_message; an offset can move a datetime of year 1 or 9999 beyond).
iso_times = st.datetimes(
    min_value=datetime.datetime(1, 1, 2),
    max_value=datetime.datetime(9999, 12, 30),
    timezones=st.just(datetime.UTC) | st.none() | st.timezones(),
).map(lambda d: d.isoformat())


def pub_frames(event_type, seq, encoding, producer, ts, uuid, data):
    return [
        bus_wire.type_to_topic(event_type).encode(),
        bus_wire.encode_int(seq, encoding),
        producer.encode(),
        ts.encode(),
        uuid.encode(),
        data,
    ]


valid_pub = st.builds(
    pub_frames,
    event_types,
    st.integers(0, 10**12),
    bus_encodings,
    st.text(max_size=10),
    st.just("") | iso_times,
    st.uuids().map(str),
    st.binary(max_size=40),
)
valid_syncstart = st.builds(
    lambda subtrees, sep, seq, encoding: [
        bus_wire.SYNCSTART,
        sep.join(subtrees).encode(),
        bus_wire.encode_int(seq, encoding),
    ],
    st.lists(event_types.map(bus_wire.type_to_topic), max_size=3),
    st.sampled_from([";", ","]),
    st.integers(0, 10**12),
    bus_encodings,
)


def _fits(frames) -> bool:
    return all(len(f) < 256 for f in frames)  # what one length byte can frame


@FUZZ
@given(frames=valid_pub.filter(_fits))
def test_valid_pub_decodes_to_what_was_sent(frames):
    pub = bus_wire.parse_pub(frames)
    assert pub.topic.encode() == frames[0] and pub.data == frames[5]
    assert pub.uuid == frames[4].decode() and pub.producer.encode() == frames[2]
    assert targets.split_frames(targets.join_frames(frames)) == frames


@FUZZ
@given(data=mutated(valid_pub.filter(_fits).map(targets.join_frames)))
def test_mutated_bus_pubs(data):
    targets.bus_pub(data)


@FUZZ
@given(data=mutated(valid_syncstart.filter(_fits).map(lambda f: targets.join_frames(f[1:]))))
def test_mutated_bus_syncstarts(data):
    targets.bus_syncstart(data)


# -- websocket protocols ---------------------------------------------------------------------

# Any JSON value, strings with lone surrogates included (JSON can carry "\ud800").
json_text = st.text(st.characters(), max_size=8) | st.text(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]), max_size=3
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | json_text,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(json_text, c, max_size=3),
    max_leaves=8,
)


def _fields(keys):
    return st.dictionaries(st.sampled_from(keys), json_values | json_text, max_size=len(keys))


replication_messages = st.builds(
    lambda mt, fields: {**fields, "mt": mt},
    st.sampled_from(
        ["AppChallenge", "AppLogin", "ReplicateStart", "ReplicateNext", "ReplicateAdd", "X"]
    )
    | json_text,
    _fields(["api", "src", "sip", "digest", "app", "domain", "guid", "dn", "info", "usn"]),
) | st.fixed_dictionaries(
    # AppLogin with string fields, so that it gets past the type checks to the digest.
    {
        "mt": st.just("AppLogin"),
        "sip": st.sampled_from(["user", "nobody"]) | json_text,
        "digest": json_text | st.text("0123456789abcdef", min_size=64, max_size=64),
    },
    optional={k: json_text for k in ("app", "domain", "guid", "dn")} | {"info": json_values},
)


@FUZZ
@given(msg=replication_messages)
def test_structured_replication_messages(msg):
    targets.replication_frame(json.dumps(msg).encode())


@FUZZ
@given(data=mutated(replication_messages.map(lambda m: json.dumps(m).encode())))
def test_mutated_replication_frames(data):
    targets.replication_frame(data)


# After login: the replication messages, on the replica's tables (and others), with rows
# whose keys and columns are the tables' own often enough to reach the write checks.
replication_rows = st.dictionaries(
    st.sampled_from(["id", "k", "name", "price", "v"]) | json_text,
    st.integers(0, 5) | st.sampled_from(["1", "2", "3", "a", "b", "c"]) | json_values,
    max_size=4,
)
replication_columns = st.dictionaries(
    st.sampled_from(["id", "k", "name", "price", "v"]) | json_text,
    st.fixed_dictionaries({}, optional={"update": st.booleans() | json_values}) | json_values,
    max_size=3,
)
replication_after_login = st.builds(
    lambda mt, api, fields: {**fields, "mt": mt, "api": api},
    st.sampled_from(
        ["ReplicateStart", "ReplicateNext", "ReplicateAdd", "ReplicateUpdate", "ReplicateDel"]
    )
    | st.sampled_from(["AppChallenge", "AppLogin", "X"])
    | json_text,
    st.sampled_from(["items", "free", "nope"]) | json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "columns": replication_rows | replication_columns | json_values,
            "usn": st.integers(-1, 2**64) | json_values,
            "guid": json_text | json_values,
            "add": st.booleans() | json_values,
            "del": st.booleans() | json_values,
            "src": json_values,
        },
    ),
) | st.builds(
    # A write with the table's key column present, so it reaches the row checks.
    lambda mt, api, key, row: {
        "mt": mt,
        "api": api,
        "columns": {**row, targets.REPLICATION_TABLES[api]["key"]: key},
    },
    st.sampled_from(["ReplicateAdd", "ReplicateUpdate", "ReplicateDel"]),
    st.sampled_from(sorted(targets.REPLICATION_TABLES)),
    st.integers(-1, 9)
    | st.sampled_from(["1", "2", "3", "a", "b", "c", "", "?", "*"])
    | json_values,
    replication_rows,
)


@FUZZ
@given(msg=replication_after_login)
# Found by CI: a lone surrogate in a row failed the event's encoding for storage with an
# uncaught UnicodeEncodeError (the engine now refuses it as a RegisterError).
@example(msg={"mt": "ReplicateAdd", "api": "items", "columns": {"name": {"\ud800": None}, "id": 0}})
def test_structured_replication_messages_after_login(msg):
    targets.replication_logged_in(json.dumps(msg).encode())


@FUZZ
@given(data=mutated(replication_after_login.map(lambda m: json.dumps(m).encode())))
def test_mutated_replication_frames_after_login(data):
    targets.replication_logged_in(data)


jetstream_messages = st.builds(
    lambda type_, fields: {**fields, "type": type_},
    st.sampled_from(["SessionCreate", "ScopeFetch", "ScopeSync", "Ping"]) | json_text,
    _fields(["version", "params", "index", "ack", "token", "name"]),
) | st.builds(
    lambda token, version: {
        "type": "SessionCreate",
        "version": version,
        "params": {"token": token},
    },
    json_values | st.just("secret"),
    json_values | st.just("0.0.1"),
)


@FUZZ
@given(msgs=st.lists(jetstream_messages, min_size=1, max_size=3), single=st.booleans())
def test_structured_jetstream_frames(msgs, single):
    targets.jetstream_frame(json.dumps(msgs[0] if single else msgs).encode())


@FUZZ
@given(
    data=mutated(
        st.lists(jetstream_messages, min_size=1, max_size=3).map(lambda m: json.dumps(m).encode())
    )
)
def test_mutated_jetstream_frames(data):
    targets.jetstream_frame(data)


# -- Jetstream past the handshake ---------------------------------------------------------------

ROOT_S = targets.jetstream_root(targets.JETSTREAM_SCOPE)
# Model uuids: the scope's own (the root, the two items), new valid ones, and anything.
model_uuids = st.sampled_from([ROOT_S, "i1", "i2", "i3", "I1", "x-1_Y"]) | json_text
property_values = (
    st.sampled_from(
        [ROOT_S, "i1", "i2", "i3", ["i1"], ["i1", "i3"], "2026-11-27T04:00:00Z", 1.5, True, 10**400]
    )
    | json_values
)
fragments = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["add", "change", "remove"]) | json_values,
        "clsName": st.sampled_from(["List", "Item"]) | json_values,
        "uuid": model_uuids,
    },
    optional={
        "properties": st.dictionaries(
            st.sampled_from(
                ["title", "items", "pinned", "text", "done", "created", "n", "extra", "tags"]
            )
            | json_text,
            property_values,
            max_size=4,
        )
        | json_values
    },
)
jetstream_after_session = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["ScopeSync", "ScopeFetch", "Ping", "SessionCreate"]) | json_text,
        "index": st.integers(-1, 5) | json_values,
    },
    optional={
        "scopeIndex": st.integers(-1, 2) | json_values,
        "fragments": st.lists(fragments, max_size=4) | json_values,
        "atomic": st.booleans() | json_values,
        "name": st.sampled_from(["s", "t", "", "*", "a" * 101]) | json_text,
        "ack": st.integers(-1, 10) | json_values,
        "resendMissing": st.booleans() | json_values,
    },
)


@FUZZ
@given(msgs=st.lists(jetstream_after_session, min_size=1, max_size=3))
def test_structured_jetstream_messages_in_a_session(msgs):
    targets.jetstream_session(json.dumps(msgs).encode())


@FUZZ
@given(frags=st.lists(fragments, max_size=5), atomic=st.booleans())
def test_structured_jetstream_syncs(frags, atomic):
    targets.jetstream_scope_sync(json.dumps({"fragments": frags, "atomic": atomic}).encode())


@FUZZ
@given(
    data=mutated(
        st.lists(jetstream_after_session, min_size=1, max_size=3).map(
            lambda m: json.dumps(m).encode()
        )
    )
)
def test_mutated_jetstream_messages_in_a_session(data):
    targets.jetstream_session(data)


# -- kept inputs -------------------------------------------------------------------------------

FUZZ_DIR = pathlib.Path(__file__).parent
KEPT = sorted(
    (kind, path)
    for kind in ("corpus", "regressions")
    for path in (FUZZ_DIR / kind).glob("*/*")
    if path.is_file()
)


@pytest.mark.parametrize(
    "path", [p for _, p in KEPT], ids=[f"{k}/{p.parent.name}/{p.name}" for k, p in KEPT]
)
def test_kept_inputs(path):
    """The seeds (tests/fuzz/corpus/TARGET/) and every input of a past finding
    (tests/fuzz/regressions/TARGET/) pass their target: a finding stays fixed."""
    targets.TARGETS[path.parent.name](path.read_bytes())


def test_kept_inputs_are_found():
    assert {p.parent.name for k, p in KEPT if k == "corpus"} >= {
        "jetstream_session",
        "jetstream_scope_sync",
        "jetstream_scope_fetch",
    }
