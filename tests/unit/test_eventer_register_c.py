"""The Eventer's C decode of a one-slice MsgRegisterReq (`eventer/_register.c`) against
the Python path (`wire.slices`, the hat-sbs decoder, `codec.register_event_from_sbs`) on
the same requests: the C decode gives exactly the Python path's events (of the model's
own namedtuple classes) and spans, or None, and `decode_register_now` answers the same
with it on and off, errors included (the C decode leaves every error to the Python
path)."""

from __future__ import annotations

import pathlib
import random

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    RegisterEvent,
    Timestamp,
)
from eventfleet_server.eventer import wire
from eventfleet_server.eventer.wire import (
    CHUNK_BYTES,
    CHUNK_EVENTS,
    InvalidRegistration,
    RegisterLimits,
    decode_register_now,
    slices,
    splice_elements,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import parts
from tests.fuzz.test_decoders import mutated, register_events
from tests.leaks import assert_no_leak
from tests.sample_events import sbs_int

_c = wire._c
LIMITS = RegisterLimits()
_CLASSES = (RegisterEvent, Timestamp, EventPayloadJson, EventPayloadBinary)


@pytest.fixture(autouse=True)
def c_decode(request):
    """The C decode; without it each test fails through part `cc` (as
    `test_the_c_decode_is_built`)."""
    if _c is None and request.function is not test_the_c_decode_is_built:
        parts.skip_missing(
            "cc",
            "the Eventer decodes register requests in Python only (eventer/_register.c "
            "was not built)",
            "install a C compiler and reinstall: ./scripts/bootstrap",
        )
    return _c


def test_the_c_decode_is_built():
    if _c is None:
        parts.skip_missing(
            "cc",
            "the Eventer decodes register requests in Python only (eventer/_register.c "
            "was not built)",
            "install a C compiler and reinstall: ./scripts/bootstrap",
        )
    data = encode([RegisterEvent(("a",), None, None)])
    assert decode_register_now(data, LIMITS) == [RegisterEvent(("a",), None, None)]


def c(data: bytes, limits: RegisterLimits = LIMITS):
    return _c.decode(
        data,
        limits.max_events,
        limits.max_type_segments,
        limits.max_segment_length * 4,
        limits.max_payload_bytes,
        CHUNK_EVENTS,
        CHUNK_BYTES,
        *_CLASSES,
    )


def python(data: bytes, limits: RegisterLimits = LIMITS):
    """The Python path's ``(events, spans)`` before `check_client_event`, for a request
    that decodes into one slice; None otherwise."""
    spans: list = []
    try:
        chunks = list(slices(data, limits, spans))
    except InvalidRegistration:
        return None
    if not chunks:
        return [], spans
    if len(chunks) > 1:
        return None
    try:
        raw = codec.repo.decode("HatEventer.MsgRegisterReq", chunks[0][1])
    except Exception:
        return None
    return [codec.register_event_from_sbs(item) for item in raw], spans


def answer(data: bytes, limits: RegisterLimits, use_c: bool):
    spans: list = []
    try:
        events = decode_register_now(data, limits, spans, use_c=use_c)
    except Exception as e:  # InvalidRegistration, and anything else the same either way
        return type(e), str(e)
    return None if events is None else (events, spans)


def check(data: bytes, limits: RegisterLimits = LIMITS):
    """The C decode's answer, checked against the Python path's."""
    got = c(data, limits)
    if got is not None:
        events, spans = got
        assert type(events) is list and type(spans) is list
        assert got == python(data, limits)
        for e in events:
            assert type(e) is RegisterEvent and type(e.type) is tuple
            assert all(type(s) is str for s in e.type)
            st_ = e.source_timestamp
            assert st_ is None or (
                type(st_) is Timestamp and type(st_.s) is int and type(st_.us) is int
            )
            p = e.payload
            assert p is None or type(p) in (EventPayloadJson, EventPayloadBinary)
            if type(p) is EventPayloadJson:
                assert type(p.data) is str
            elif p is not None:
                assert type(p.type) is str and type(p.data) is bytes
        assert all(type(s) is tuple and len(s) == 3 for s in spans)
    assert answer(data, limits, use_c=True) == answer(data, limits, use_c=False)
    return got


def encode(events) -> bytes:
    return codec.repo.encode(
        "HatEventer.MsgRegisterReq", [codec.register_event_to_sbs(e) for e in events]
    )


def check_valid(events, limits: RegisterLimits = LIMITS):
    """A valid request: the C decode takes it when it fits one slice."""
    data = encode(events)
    got = check(data, limits)
    if python(data, limits) is None:  # more than one slice
        assert len(data) > CHUNK_BYTES or len(events) > CHUNK_EVENTS
        assert got is None
    else:
        assert got is not None and got[0] == events
    return got


# -- requests -----------------------------------------------------------------------------

_ALPHABET = "abcxyz/é€😀 "
_I64 = (1 << 63) - 1


def generated(rng: random.Random, n: int) -> list[RegisterEvent]:
    """Types of up to 32 segments, some longer than 63 bytes (two-byte lengths) and
    non-ASCII, repeated or not; no/JSON/binary payloads up to 300 bytes; source
    timestamps or not, negative and near the int64 bounds too."""

    def text(size: int) -> str:
        return "".join(rng.choice(_ALPHABET) for _ in range(size))

    types = [
        tuple(
            text(rng.choice([0, 1, 3, 40, 70, 130])) for _ in range(rng.choice([0, 1, 4, 12, 32]))
        )
        for _ in range(rng.randint(1, 5))
    ]
    out = []
    sts = None
    for _ in range(n):
        if rng.random() < 0.4:
            sts = rng.choice(
                [
                    None,
                    Timestamp(rng.randint(-5, 5), rng.randrange(1_000_000)),
                    Timestamp(rng.randint(-(10**12), 10**12), rng.randrange(1_000_000)),
                    Timestamp(_I64, 0),
                    Timestamp(-_I64 - 1, 999_999),
                    Timestamp(1, -1),
                ]
            )
        size = rng.choice([0, 1, 50, 63, 64, 65, 300])
        payload = [
            None,
            EventPayloadJson('"' + text(size) + '"'),
            EventPayloadBinary(text(rng.choice([0, 5, 80])), rng.randbytes(size)),
        ][rng.randrange(3)]
        out.append(RegisterEvent(rng.choice(types), sts, payload))
    return out


def test_generated_requests():
    rng = random.Random(2026)
    for _ in range(200):
        check_valid(generated(rng, rng.choice([0, 1, 2, 5, 40, CHUNK_EVENTS])))


def test_counts_around_one_slice():
    events = [
        RegisterEvent(("t", str(i)), Timestamp(i, i), EventPayloadJson(str(i)))
        for i in range(CHUNK_EVENTS + 2)
    ]
    for n in [0, 1, 2, 63, 64, 127, CHUNK_EVENTS]:
        check_valid(events[:n])
    for n in [CHUNK_EVENTS + 1, CHUNK_EVENTS + 2]:
        assert check(encode(events[:n])) is None
        assert decode_register_now(encode(events[:n]), LIMITS) is None  # two slices
    rng = random.Random(5)
    for n in [CHUNK_EVENTS, CHUNK_EVENTS + 1]:
        check(encode(generated(rng, n)))


def _sized(target: int) -> RegisterEvent:
    """An event of `target` bytes (a binary payload)."""
    size = target
    while True:
        event = RegisterEvent(("b",), None, EventPayloadBinary("", bytes(size)))
        n = len(encode([event])) - 1  # less the count
        if n == target:
            return event
        size += target - n


def test_the_one_slice_byte_bound():
    """`slices` ends a slice before an event when it already holds more than
    CHUNK_BYTES bytes: the C decode takes exactly the requests that stay one slice."""
    small = RegisterEvent(("s",), None, None)
    assert len(encode([small])) - 1 == 5
    for extra in range(-6, 3):
        big = _sized(CHUNK_BYTES + extra)
        for tail in [[], [small], [small, small]]:
            events = [big, *tail]
            got = check(encode(events))
            one_slice = not tail or CHUNK_BYTES + extra + 5 * (len(tail) - 1) <= CHUNK_BYTES
            assert (got is not None) == one_slice
            assert (python(encode(events)) is not None) == one_slice
            assert got is None or got[0] == events
    # many events near the bound
    rng = random.Random(3)
    for _ in range(5):
        payload = EventPayloadBinary("x", rng.randbytes(1020 + rng.randrange(10)))
        events = [RegisterEvent(("t", str(i)), None, payload) for i in range(CHUNK_EVENTS)]
        check(encode(events))


def test_texts_and_timestamps():
    check_valid(
        [
            RegisterEvent(("é" * 64, "😀" * 256, "", "a" * 256), Timestamp(-1, 0), None),
            RegisterEvent((), Timestamp(0, 999_999), EventPayloadJson("😀" * 100)),
            RegisterEvent(("x",), Timestamp(_I64, _I64), EventPayloadBinary("é", b"\x00" * 70)),
            RegisterEvent(("x",), Timestamp(-_I64 - 1, -_I64 - 1), EventPayloadJson("")),
            RegisterEvent(("x",), Timestamp(1 << 40, 5), EventPayloadBinary("", b"")),
        ]
    )


def test_repeated_types_and_timestamps_are_equal_objects_of_their_values():
    ts = Timestamp(1_700_000_000, 5)
    events = [
        RegisterEvent(t, s, None)
        for t in [("a", "b"), ("a", "b"), ("a", "c"), ("a", "b")]
        for s in [ts, ts, None, Timestamp(ts.s, 6), ts]
    ]
    check_valid(events)


@pytest.mark.parametrize(
    "s",
    [
        _I64,
        -_I64 - 1,
        _I64 + 1,
        -_I64 - 2,
        1 << 64,
        (1 << 69) - 1,
        -(1 << 69),
        1 << 70,
    ],
)
def test_integers_at_and_beyond_int64(s):
    for tail in [sbs_int(s) + b"\x80", b"\x80" + sbs_int(s)]:
        data = b"\x81\x81\x81a\x81" + tail + b"\x80"
        got = check(data)
        assert (got is not None) == (-_I64 - 1 <= s <= _I64)


@pytest.mark.parametrize(
    "event",
    [
        b"\x81\x00\x81a\x80\x80",  # a two-byte segment count
        b"\x81\x81\x00\x81a\x80\x80",  # a two-byte segment length
        b"\x81\x81\x00\x00\x00\x00\x00\x00\x00\x00\x00\x81a\x80\x80",  # ten bytes
        b"\x81\x81\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x81a\x80\x80",  # eleven
        b"\x81\x81a\x00\x81\x81\x81\x80",  # a two-byte option
        b"\x81\x81a\x00\x80\x80",  # a two-byte none
        b"\x81\x81a\x80\x00\x81\x81\x82{}",  # a two-byte payload option
        b"\x81\x81a\x80\x81\x00\x81\x82{}",  # a two-byte kind
        b"\x81\x81a\x80\x81\x00\x80\x81t\x81x",  # binary, a two-byte kind
        b"\x81\x81a\x80\x81\x81\x00\x82{}",  # a two-byte payload length
        b"\x81\x81a\x82\x80",  # no such option
        b"\x81\x81a\x80\x82",
        b"\x81\x81a\x80\x81\x82\x82{}",  # no such kind
        b"\x81\x81a\x80\x81\x81\x82\xff}",  # JSON, not UTF-8
        b"\x81\x81a\x80\x81\x81\x83\xed\xa0\x80",  # a surrogate
        b"\x81\x81\xc3\x80\x80",  # a segment not UTF-8
        b"\x81\x81a\x80\x81\x80\x81\xc3\x82\x00\x01",  # binary type not UTF-8
        b"\x81\x81a\x80\x81\x80\x81t\xc2",  # negative data length
        b"\x81\x81a\x80\x81\x81\x7f\xff",  # negative length
        b"\x81\xff\x80\x80",  # negative segment count
        b"\xff",  # negative count
        b"\x80",  # no events
        b"\x80\x80",  # trailing
        b"\x81\x80\x80\x80\x80",  # trailing
        b"\x00\x81\x80\x80\x80",  # a two-byte count
        b"",
    ],
)
def test_encodings_off_the_fast_path(event):
    check(event)


# -- limits -------------------------------------------------------------------------------


def test_limits_at_and_over_each_bound():
    limits = RegisterLimits(
        max_events=5, max_payload_bytes=100, max_type_segments=4, max_segment_length=10
    )
    ok = RegisterEvent(("a",), None, None)
    check_valid([ok] * 5, limits)
    assert check(encode([ok] * 6), limits) is None
    check_valid([RegisterEvent(("a",) * 4, None, None)], limits)
    assert check(encode([RegisterEvent(("a",) * 5, None, None)]), limits) is None
    check_valid([RegisterEvent(("a" * 10,), None, None)], limits)
    # 40 bytes pass the walk (4 a character); the characters are then counted
    for segment in ["a" * 11, "é" * 20, "😀" * 10, "😀" * 11, "a" * 40, "a" * 41]:
        got = check(encode([RegisterEvent((segment,), None, None)]), limits)
        assert (got is not None) == (len(segment.encode()) <= 40)
    for payload in [
        EventPayloadJson("1" * 100),
        EventPayloadJson("1" * 101),
        EventPayloadBinary("t" * 200, b"x" * 100),
        EventPayloadBinary("t", b"x" * 101),
    ]:
        got = check(encode([RegisterEvent(("a",), None, payload)]), limits)
        assert (got is not None) == (len(payload[-1]) <= 100)
    for zero in [
        RegisterLimits(max_events=0),
        RegisterLimits(max_type_segments=0),
        RegisterLimits(max_segment_length=0),
        RegisterLimits(max_payload_bytes=0),
    ]:
        check(encode([RegisterEvent(("a",), None, EventPayloadJson("1"))]), zero)
        check(encode([]), zero)


def test_events_the_checks_refuse_raise_the_same_error():
    for event in [
        RegisterEvent(("*",), None, None),
        RegisterEvent(("a", "?"), None, None),
        RegisterEvent(("event", "x"), None, None),
        RegisterEvent(("a",), Timestamp(1, 1_000_000), None),
        RegisterEvent(("a",), None, EventPayloadJson("{nope")),
        RegisterEvent(("a",), None, EventPayloadJson("NaN")),
    ]:
        data = encode([RegisterEvent(("ok",), None, None), event])
        assert c(data) is not None
        result = answer(data, LIMITS, use_c=True)
        assert isinstance(result[0], type) and issubclass(result[0], InvalidRegistration)
        spans_c: list = []
        spans_py: list = []
        for spans, use_c in [(spans_c, True), (spans_py, False)]:
            with pytest.raises(InvalidRegistration):
                decode_register_now(data, LIMITS, spans, use_c=use_c)
        assert spans_c == spans_py


# -- bad input ----------------------------------------------------------------------------


def test_every_truncation():
    rng = random.Random(7)
    for data in [encode(generated(rng, 6)), encode(generated(rng, 3))]:
        for cut in range(len(data)):
            check(data[:cut])


def test_every_byte_changed():
    rng = random.Random(8)
    events = [
        RegisterEvent(("a", "é" * 40), Timestamp(-3, 7), EventPayloadJson('{"x": 1}')),
        RegisterEvent(("b",), None, EventPayloadBinary("t", b"\x00\xff" * 40)),
        *generated(rng, 2),
    ]
    data = encode(events)
    for index in range(len(data)):
        for value in {0x00, 0x7F, 0x80, 0x81, 0xFF, data[index] ^ 0x40, data[index] ^ 0x80}:
            bad = bytearray(data)
            bad[index] = value
            check(bytes(bad))


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_garbage(data):
    check(data)
    check(b"\x81" + data)


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated(st.lists(register_events, max_size=20).map(encode)))
def test_mutated_fuzz_requests(data):
    check(data)


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(register_events, max_size=20))
def test_fuzz_requests(events):
    check_valid(events)


def test_fuzz_regressions():
    folder = pathlib.Path(__file__).parents[1] / "fuzz" / "regressions" / "eventer_register"
    paths = sorted(folder.iterdir())
    assert paths
    for path in paths:
        check(path.read_bytes())
        check(path.read_bytes(), RegisterLimits(max_events=1000, max_payload_bytes=4096))


def test_only_bytes_and_ints():
    data = encode([RegisterEvent(("a",), None, None)])
    for other in (bytearray(data), memoryview(data)):
        with pytest.raises(TypeError):
            c(other)
    args = [data, 1, 1, 1, 1, 1, 1, *_CLASSES]
    for index, bad in [(1, "1"), (6, 1.0), (7, object), (8, tuple), (9, 1)]:
        with pytest.raises(TypeError):
            _c.decode(*args[:index], bad, *args[index + 1 :])
    with pytest.raises(TypeError):
        _c.decode(data)
    # limits beyond an int64 are no limit, below it refuse everything
    huge, tiny = 1 << 80, -(1 << 80)
    assert _c.decode(data, huge, huge, huge, huge, huge, huge, *_CLASSES) is not None
    assert _c.decode(data, tiny, 5, 5, 5, 5, 5, *_CLASSES) is None
    # decode_register_now takes any bytes-like request (the Python path for others)
    assert decode_register_now(bytearray(data), LIMITS) == decode_register_now(data, LIMITS)


# -- the splice of the stored bytes (`_register.splice`) ---------------------------------


def python_splice(data: bytes, spans: list, first: EventId, ts: Timestamp):
    saved, wire._c = wire._c, None
    try:
        return splice_elements(data, spans, first, ts)
    finally:
        wire._c = saved


_INSTANCES = (0, 1, 63, 64, 126, 127, 128, 8190, 8191, 8192, 16383, 2**40, 2**63 - 5000)


def test_splices_are_the_python_splices_and_the_codecs_events():
    rng = random.Random(21)
    for n in (1, 2, 3, 60, 120):
        events = [
            RegisterEvent(
                tuple(rng.choice(["a", "é" * 30, "x" * 200, ""]) for _ in range(rng.randrange(4))),
                rng.choice([None, Timestamp(rng.randrange(1 << 34), rng.randrange(10**6))]),
                rng.choice(
                    [None, EventPayloadJson(f'{{"v": {i}}}'), EventPayloadBinary("t", b"\x00" * i)]
                ),
            )
            for i in range(n)
        ]
        data = encode(events)
        decoded, spans = c(data)
        assert decoded == events
        for instance in _INSTANCES:
            for server, session in [(1, 1), (64, 2**33), (2**63 - 1, 0)]:
                for ts in (Timestamp(0, 0), Timestamp(1_796_000_000, 999_999)):
                    first = EventId(server, session, instance)
                    got = splice_elements(data, spans, first, ts)
                    assert type(got) is list and all(type(b) is bytes for b in got)
                    assert got == python_splice(data, spans, first, ts)
        # ... and each is the codec's encoding of the event registered with that id
        first, ts = EventId(7, 9, 126), Timestamp(5, 6)
        for i, (element, e) in enumerate(
            zip(splice_elements(data, spans, first, ts), events, strict=True)
        ):
            made = Event(EventId(7, 9, 126 + i), e.type, ts, e.source_timestamp, e.payload)
            assert element == codec.encode_event(made)


def test_splices_off_the_fast_path_are_left_to_python():
    data = encode([RegisterEvent(("a",), None, None), RegisterEvent(("b", "c"), None, None)])
    spans: list = []
    decode_register_now(data, LIMITS, spans)
    ts = Timestamp(5, 6)
    for first, stamp in [
        (EventId(-1, 1, 1), ts),
        (EventId(1, 1, -1), ts),
        (EventId(1, 1, 1), Timestamp(-1, 0)),
        (EventId(2**64, 1, 1), ts),
        (EventId(1, 1, 2**63 - 1), ts),  # the second event's instance is beyond int64
        (EventId(1, 1, 1), Timestamp(2**63, 0)),
    ]:
        args = (data, spans, *first, stamp.s, stamp.us)
        assert _c.splice(*args) is None
        # ... which the Python code splices (non-negative) or refuses (negative) alone
        assert splice_elements(data, spans, first, stamp) == python_splice(
            data, spans, first, stamp
        )
    for bad_spans in [
        [(0, 1, len(data) + 1)],
        [(2, 1, 3)],
        [(-1, 0, 1)],
        [(0, 1)],
        [[0, 1, 2]],
        [(0, 1, 2.0)],
        [(0, 1, 2**70)],
    ]:
        assert _c.splice(data, bad_spans, 1, 1, 1, 5, 6) is None
    assert _c.splice(data, [], 1, 1, 1, 5, 6) == []
    for args in [(bytearray(data), spans, 1, 1, 1, 5, 6), (data, tuple(spans), 1, 1, 1, 5, 6)]:
        with pytest.raises(TypeError):
            _c.splice(*args)
    with pytest.raises(TypeError):
        _c.splice(data, spans, 1, 1, 1, 5)


# -- references ---------------------------------------------------------------------------


def test_no_reference_or_memory_is_leaked():
    rng = random.Random(9)
    good = encode(generated(rng, 50))
    inputs = [
        good,
        encode(generated(rng, 50)),
        good[:-3],  # truncated after events were made
        encode([RegisterEvent(("a",), None, None)]) + b"\x80",
        encode([RegisterEvent(("a",), None, None)])[:-1] + b"\x81\x81\x82\xff}",
        encode([RegisterEvent(("a",), Timestamp(1, 2), EventPayloadBinary("t", b"x"))] * 3),
        encode([RegisterEvent(("a",), None, None)] * (CHUNK_EVENTS + 1)),
    ]

    _, spans = c(good)

    def run(times: int) -> None:
        for _ in range(times):
            for data in inputs:
                c(data)
            _c.splice(good, spans, 1, 2, 3, 4, 5)
            _c.splice(good, [*spans, (0, 1)], 1, 2, 3, 4, 5)  # off the path after 50

    assert_no_leak(run, _CLASSES, "decodes of 7 requests and 2 splices")
