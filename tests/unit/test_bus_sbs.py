"""The Event BUS's hand-built SBS ``Event`` bytes are the codec's, byte for byte."""

from __future__ import annotations

from eventfleet_server.bus import sbs
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Timestamp,
)
from hypothesis import given
from hypothesis import strategies as st

I64 = st.integers(-(2**63), 2**63 - 1)
NON_NEGATIVE = st.integers(0, 2**63 - 1)
timestamps = st.builds(Timestamp, st.one_of(NON_NEGATIVE, I64), st.integers(0, 999_999))
payloads = st.one_of(
    st.none(),
    st.builds(EventPayloadJson, st.text()),
    st.builds(EventPayloadBinary, st.text(), st.binary()),
)
types = st.lists(st.text(), max_size=5).map(tuple)


@st.composite
def sessions(draw):
    """One engine session: one server, session and timestamp, consecutive instances
    (sometimes a stray event that breaks those rules: the encoder must fall back)."""
    server = draw(st.one_of(st.integers(0, 300), I64))
    session = draw(st.one_of(st.integers(0, 300), I64))
    ts = draw(timestamps)
    first = draw(st.one_of(st.sampled_from([0, 100, 8_180, 2**62 - 20]), NON_NEGATIVE, I64))
    count = draw(st.integers(0, 40))
    events = []
    for i in range(count):
        instance = first + i
        if not -(2**63) <= instance < 2**63:
            break
        events.append(
            Event(
                EventId(server, session, instance),
                draw(st.sampled_from([("a",), ("bus", "t", "1"), ("é", "", "%2F")]) | types),
                ts,
                draw(st.none() | st.sampled_from([ts, Timestamp(1, 2)]) | timestamps),
                draw(payloads),
            )
        )
    if events and draw(st.booleans()):
        stray = draw(st.builds(EventId, I64, I64, I64))
        at = draw(st.integers(0, len(events) - 1))
        events[at] = events[at]._replace(id=stray)
    return events


@given(sessions())
def test_encode_is_the_codecs_encoding(events):
    assert sbs.encode(events) == [codec.encode_event(e) for e in events]


def test_instances_across_seven_bit_groups():
    # The instance's bytes are reused but for the last 7-bit group: check the wraps
    # (127 -> 128, 8191 -> 8192, ...) and the sign-bit padding byte of encode_int.
    ts = Timestamp(1_790_000_000, 5)
    for first in (0, 120, 8_180, 16_380, 1_048_570, 2**62 - 10):
        events = [
            Event(EventId(1, 2, first + i), ("a", "b"), ts, None, EventPayloadJson("1"))
            for i in range(300)
        ]
        assert sbs.encode(events) == [codec.encode_event(e) for e in events]
