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
import os

import pytest
import yaml
from eventfleet_server.chatter.connection import _parse_large
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    EventPayloadBinary,
    EventPayloadJson,
    RegisterEvent,
    Timestamp,
)
from eventfleet_server.common.sbsint import encode_int
from eventfleet_server.eventer.decode import RegisterLimits, decode_register
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import targets

EXAMPLES = int(os.environ.get("EVENTFLEET_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=2000,  # ms per example: a decoder that walks garbage for seconds fails
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

segment = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="?*"), min_size=1, max_size=12
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
    st.builds(Timestamp, st.integers(0, 253_402_300_799), st.integers(0, 999_999)),
)
register_events = st.builds(
    RegisterEvent,
    st.lists(segment, min_size=1, max_size=6).map(tuple).filter(lambda t: t[0] != "event"),
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
@given(data=mutated(valid_query))
def test_mutated_queries(data):
    targets.eventer_query(data)


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
    body=st.binary(min_size=0, max_size=300),
    type_=st.text(max_size=20),
    msg_id=st.integers(1, 2**40),
)
def test_large_frame_parser_agrees_with_the_codec(body, type_, msg_id):
    encoded = chatter_msg(type_, body, msg_id)
    parsed = _parse_large(encoded)
    expected = codec.repo.decode("HatChatter.Msg", encoded)
    assert parsed["data"]["data"] == bytes(expected["data"]["data"])
    assert parsed["data"]["type"] == expected["data"]["type"] and parsed["id"] == msg_id


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
