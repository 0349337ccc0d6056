"""The Syncer's C walk of a MsgEvents (`syncer/_rows.c`) against the Python walk
(`rows._walk`) on the same messages: the C walk gives exactly the Python walk's rows (the
very type tuples of the stream's cache) or None, never adds to the cache, and
`decode_rows` answers the same with it on and off, errors included (the C walk leaves
every error to the Python walk)."""

from __future__ import annotations

import functools
import random

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Timestamp,
)
from eventfleet_server.common.sbsint import encode_int
from eventfleet_server.syncer import rows as rows_module
from eventfleet_server.syncer import wire
from eventfleet_server.syncer.rows import TYPE_CACHE_MAX, decode_rows
from eventfleet_server.syncer.wire import MAX_ID, ProtocolError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import parts
from tests.leaks import assert_no_leak
from tests.sample_events import ev, sbs_int, varied
from tests.unit.test_syncer_rows import expected_rows

_c = rows_module._c


@pytest.fixture(autouse=True)
def c_walk(request):
    """The C walk; without it each test fails through part `cc` (as `test_the_c_walk_is_built`)."""
    if _c is None and request.function is not test_the_c_walk_is_built:
        parts.skip_missing(
            "cc",
            "the Syncer walks MsgEvents in Python only (syncer/_rows.c was not built)",
            "install a C compiler and reinstall: ./scripts/bootstrap",
        )
    return _c


def test_the_c_walk_is_built():
    if _c is None:
        parts.skip_missing(
            "cc",
            "the Syncer walks MsgEvents in Python only (syncer/_rows.c was not built)",
            "install a C compiler and reinstall: ./scripts/bootstrap",
        )
    assert _c.MIN_S == rows_module._MIN_S and _c.MAX_S == rows_module._MAX_S


def _answer(data: bytes, server_id: int, types: dict, use_c: bool):
    try:
        return decode_rows(data, server_id, types, use_c=use_c)
    except ProtocolError as e:
        return f"ProtocolError: {e}"


def check(data: bytes, server_id: int = 1, types: dict | None = None) -> list | None:
    """The C walk's answer, checked against the Python walk's on copies of `types`."""
    types = {} if types is None else types
    before = dict(types)
    got = _c.walk(data, server_id, types)
    assert types == before  # the C walk never adds a type
    py_types, c_types = dict(types), dict(types)
    expected = _answer(data, server_id, py_types, use_c=False)
    if got is not None:
        assert got == expected
        for row, want in zip(got, expected, strict=True):
            assert row[4] is want[4]  # the cache's own tuple
            assert type(row[10]) is bytes
    assert _answer(data, server_id, c_types, use_c=True) == expected
    assert c_types == py_types
    return got


def warm(data: bytes, server_id: int = 1) -> dict:
    """The stream's cache after the Python walk read `data` (as far as it got)."""
    types: dict = {}
    try:
        decode_rows(data, server_id, types, use_c=False)
    except ProtocolError:
        pass
    return types


def check_warm(data: bytes, server_id: int = 1) -> list | None:
    """`check` on a cold cache (the C walk knows no type: the Python walk's), then on a
    warm one."""
    assert check(data, server_id) is None
    return check(data, server_id, warm(data, server_id))


# -- messages -----------------------------------------------------------------------------


def _encoded(events: list[Event]) -> bytes:
    return wire.encode_events(events)


def generated(rng: random.Random, n: int) -> list[Event]:
    """One session's events: many types (up to 12 segments, multi-byte lengths, non-ASCII),
    none/JSON/binary payloads up to 300 bytes, source timestamps or not, timestamps
    repeated or not (negative seconds too), instances up to 2^63-1."""
    alphabet = "abcxyz/é€😀 "
    types = [
        tuple(
            "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 3, 40, 70, 130])))
            for _ in range(rng.randint(0, 12))
        )
        for _ in range(rng.randint(1, 6))
    ]
    session = rng.choice([0, 1, 63, 64, 8191, 8192, MAX_ID - 1, MAX_ID])
    instance = rng.choice([0, 1, 1 << 40, MAX_ID - 2 * n])
    ts = Timestamp(rng.randint(-(10**12), 10**12), rng.randrange(1_000_000))
    sts = None
    out = []
    for _ in range(n):
        instance += rng.randint(1, 2)
        if rng.random() < 0.2:
            ts = Timestamp(rng.randint(-(10**12), 10**12), rng.randrange(1_000_000))
        if rng.random() < 0.3:
            sts = rng.choice([None, Timestamp(rng.randint(-5, 5), rng.randrange(1_000_000))])
        kind = rng.randrange(3)
        size = rng.choice([0, 1, 50, 63, 64, 65, 300])
        payload = [
            None,
            EventPayloadJson('"' + "".join(rng.choice(alphabet) for _ in range(size)) + '"'),
            EventPayloadBinary(
                "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 5, 80]))),
                rng.randbytes(size),
            ),
        ][kind]
        out.append(Event(EventId(1, session, instance), rng.choice(types), ts, sts, payload))
    return out


@functools.cache
def _test_rows_messages() -> list[tuple[bytes, int]]:
    """The messages of tests/unit/test_syncer_rows.py (and its error cases)."""
    out = [(_encoded(varied(300)), 1)]
    out += [(_encoded([ev(instance=i)]), 1) for i in [0, 127, 128, (1 << 62) - 1, MAX_ID]]
    element = codec.encode_event(ev(instance=5))
    out.append((codec.events_array([element[:2] + encode_int(1 << 63) + element[3:]]), 1))
    out.append((codec.events_array([element[:2] + b"\x00" * 10 + element[2:]]), 1))
    out.append((codec.events_array([element[:2] + b"\x00" * 9 + element[2:]]), 1))  # 10 bytes
    cases = [
        ([ev(instance=1), ev(instance=2)], 2),
        ([ev(session=1), ev(session=2, instance=2)], 1),
        ([ev(session=1), ev(server=3, instance=2)], 1),
        ([ev(type_=("a", "*"))], 1),
        ([ev(instance=1), ev(instance=2, type_=("?",))], 1),
        ([ev(session=-1)], 1),
        ([ev(instance=1), ev(instance=-2)], 1),
        ([ev(ts=Timestamp(1 << 62, 0))], 1),
        ([ev(instance=1), ev(instance=2, ts=Timestamp(1 << 62, 0))], 1),
        ([ev()._replace(source_timestamp=Timestamp(-(1 << 62), 0))], 1),
        ([], 1),
    ]
    out += [(_encoded(events), server_id) for events, server_id in cases]
    first, second = codec.encode_event(ev(instance=1)), codec.encode_event(ev(instance=2))
    out.append((codec.events_array([first, b"\x00\x81" + second[1:]]), 1))
    ts = Timestamp(1_700_000_000, 5)
    tricky = (f"a{(encode_int(ts.s) + encode_int(ts.us))[:-2].decode()}", "", "zzzzz")
    for order in ([("a",), tricky, ("a",), tricky], [tricky, tricky, ("a",), tricky]):
        events = [
            ev(instance=i + 1, type_=t, ts=Timestamp(ts.s, ts.us if i else 6))
            for i, t in enumerate(order)
        ]
        out.append((_encoded(events), 1))
    a, b = Timestamp(1_700_000_000, 5), Timestamp(1_700_000_000, 6)
    order = [a, a, None, a, b, b, a, Timestamp(1_700_000_001, 5), None, b]
    events = [ev(instance=i + 1)._replace(source_timestamp=s) for i, s in enumerate(order)]
    out.append((_encoded(events), 1))
    return out


@pytest.mark.parametrize("index", range(len(_test_rows_messages())))
def test_the_rows_tests_messages(index):
    data, server_id = _test_rows_messages()[index]
    check_warm(data, server_id)


def test_valid_messages_take_the_c_walk_once_their_types_are_known():
    for data in [_encoded(varied(300)), _encoded([ev(instance=MAX_ID)])]:
        rows = check_warm(data)
        assert rows is not None and rows == expected_rows(wire.decode_events_sbs(data, 1)[0])


def test_generated_messages():
    rng = random.Random(20260)
    for _ in range(150):
        events = generated(rng, rng.choice([1, 2, 5, 40]))
        data = _encoded(events)
        rows = check_warm(data)
        assert rows == expected_rows(events)


def test_type_cache_states():
    events = [ev(instance=i + 1, type_=("t", str(i % 3))) for i in range(9)]
    data = _encoded(events)
    types: dict = {}
    assert _c.walk(data, 1, types) is None and types == {}  # cold: the Python walk's
    first = decode_rows(data, 1, types)  # which fills the cache
    assert len(types) == 3
    rows = _c.walk(data, 1, types)
    assert rows == first == expected_rows(events)
    assert all(r[4] is types[k] for r, k in zip(rows, _type_keys(data), strict=True))
    # One type missing (the cache started over, say): the Python walk again.
    del types[_type_keys(data)[1]]
    assert check(data, 1, types) is None
    assert decode_rows(data, 1, types) == first and len(types) == 3
    # A cache of another class is not read (its lookups may differ): the Python walk.
    assert _c.walk(data, 1, type("Types", (dict,), {})(types)) is None


def _type_keys(data: bytes) -> list[bytes]:
    """Each event's encoded type, read by the Python walk."""
    types: dict = {}
    rows = decode_rows(data, 1, types, use_c=False)
    by_value = {v: k for k, v in types.items()}
    return [by_value[r[4]] for r in rows]


def test_a_full_type_cache_starts_over_in_python():
    events = [ev(instance=i + 1, type_=("t", str(i))) for i in range(TYPE_CACHE_MAX + 10)]
    data = _encoded(events)
    assert check(data, 1, warm(data)) is None  # its first types were dropped
    assert check(_encoded(events[-10:]), 1, warm(data)) == expected_rows(events[-10:])


# -- bad input ----------------------------------------------------------------------------


def test_every_truncation():
    rng = random.Random(7)
    for data in [_encoded(varied(20)), _encoded(generated(rng, 6))]:
        types = warm(data)
        for cut in range(len(data)):
            assert check(data[:cut], 1, types) is None


def test_every_byte_changed():
    rng = random.Random(8)
    for data in [_encoded(varied(6)), _encoded(generated(rng, 3))]:
        types = warm(data)
        for index in range(len(data)):
            for value in {0x00, 0x7F, 0x80, 0xFF, data[index] ^ 0x40, data[index] ^ 0x80}:
                bad = bytearray(data)
                bad[index] = value
                check(bytes(bad), 1, types)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage(data):
    check(data, 1, {})
    check(data, 1, warm(_encoded(varied(20))))


def test_trailing_bytes_server_and_sessions():
    data = _encoded(varied(20))
    types = warm(data)
    assert check(data + b"\x80", 1, types) is None
    assert check(data, 2, types) is None
    assert check(data, 1 << 70, types) is None  # a server id no int64 holds
    mixed = _encoded([ev(session=1, instance=1), ev(session=2, instance=2)])
    assert check(mixed, 1, warm(mixed)) is None
    other_server = _encoded([ev(instance=1), ev(server=2, instance=2)])
    assert check(other_server, 1, warm(other_server)) is None
    # A negative server equal to the stream's: the Python walk does not refuse it either.
    negative = _encoded([ev(server=-3, instance=1), ev(server=-3, instance=2)])
    assert check(negative, -3, warm(negative, -3)) is not None


@pytest.mark.parametrize(
    "events",
    [
        [ev(session=-1)],
        [ev(instance=-1)],
        [ev(instance=1), ev(instance=-(1 << 62))],
        [ev(ts=Timestamp(rows_module._MAX_S, 0))],
        [ev(ts=Timestamp(rows_module._MAX_S - 1, 999_999))],
        [ev(ts=Timestamp(rows_module._MIN_S, 0))],
        [ev(ts=Timestamp(rows_module._MIN_S + 1, 0))],
        [ev(ts=Timestamp(5, 1_000_000))],
        [ev(ts=Timestamp(5, -1))],
        [ev()._replace(source_timestamp=Timestamp(rows_module._MAX_S, 1))],
    ],
)
def test_ids_and_timestamps_at_the_bounds(events):
    data = _encoded(events)
    check(data, 1, warm(data))


@pytest.mark.parametrize(
    ("session", "instance", "sts_s"),
    [
        (1 << 63, 1, 7),
        (-(1 << 63) - 1, 1, 7),
        (1, 1 << 63, 7),
        (1, 1 << 64, 7),
        (1, 1, 1 << 64),
        (1, MAX_ID, -(1 << 63)),
        (1, MAX_ID, -(1 << 63) - 1),
        (MAX_ID, MAX_ID, 7),
    ],
)
def test_integers_beyond_int64(session, instance, sts_s):
    element = codec.encode_event(ev()._replace(source_timestamp=Timestamp(7, 1)))
    assert element[:3] == b"\x81\x81\x81" and element.endswith(b"\x81\x87\x81\x80")
    assert sbs_int(1) == b"\x81" and sbs_int(MAX_ID) == encode_int(MAX_ID)
    element = (
        b"\x81"
        + sbs_int(session)
        + sbs_int(instance)
        + element[3:-4]
        + b"\x81"
        + sbs_int(sts_s)
        + b"\x81\x80"
    )
    data = codec.events_array([element])
    rows = check(data, 1, warm(data))
    assert (rows is not None) == (sts_s == 7 and 0 <= session <= MAX_ID and instance <= MAX_ID)


def _with_payload(tail: bytes) -> bytes:
    """A one-event message whose payload part is `tail` (and nothing after it)."""
    element = codec.encode_event(ev())
    assert element.endswith(b"\x80\x80")  # no source timestamp, no payload
    return codec.events_array([element[:-1] + tail])


@pytest.mark.parametrize(
    "tail",
    [
        b"\x81\x81\x82{}",  # JSON
        b"\x81\x81\x82\xff}",  # JSON, not UTF-8
        b"\x81\x81\x83\xed\xa0\x80",  # JSON, a surrogate: not UTF-8 either
        b"\x81\x80\x81t\x82\x00\x01",  # binary
        b"\x81\x80\x81\xc3\x82\x00\x01",  # binary, its type not UTF-8
        b"\x81\x80\x81t\xc2",  # binary, a negative data length
        b"\x81\x82\x82{}",  # no such choice
        b"\x82",  # no such option
        b"\x81\x81\x00\x00\x00\x00\x00\x00\x00\x00\x00\x82{}",  # a 10-byte length
        b"\x81\x81\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x82{}",  # 11 bytes
        b"\x81\x81\x7f\xff",  # a negative length
        b"\x81\x81\x01\x7f\x7f\x7f\x7f\x7f\x7f\x7f\xff",  # a length beyond any message
    ],
)
def test_payloads(tail):
    data = _with_payload(tail)
    check(data, 1, warm(data))


def test_bad_source_timestamp_option_and_bad_type_text():
    element = codec.encode_event(ev(type_=("ab",)))
    for bad in [element[:-2] + b"\x82\x80", element.replace(b"\x82ab", b"\x82\xffb")]:
        data = codec.events_array([element, bad])
        check(data, 1, warm(data))


def test_only_bytes():
    data = _encoded(varied(3))
    for other in (bytearray(data), memoryview(data)):
        with pytest.raises(TypeError):
            _c.walk(other, 1, {})
    with pytest.raises(TypeError):
        _c.walk(data, "1", {})
    # decode_rows takes any bytes-like message (as bytes), with the same rows.
    types = warm(data)
    assert decode_rows(bytearray(data), 1, types) == decode_rows(data, 1, types, use_c=False)


# -- references ---------------------------------------------------------------------------


def test_no_reference_or_memory_is_leaked():
    rng = random.Random(9)
    data = _encoded(varied(50))
    generated_data = _encoded(generated(rng, 50))
    types = warm(data) | warm(generated_data)
    inputs = [
        data,
        generated_data,
        data[:-3],  # truncated after the types were looked up
        _with_payload(b"\x81\x81\x82\xff}"),  # bad UTF-8, after the rows before it
        data + b"\x80",
        _encoded([ev(type_=("never", "seen"))]),
    ]

    def run(times: int) -> None:
        for _ in range(times):
            for message in inputs:
                _c.walk(message, 1, types)

    # The cached types' keys and values: each row refers to them, none may stay.
    assert_no_leak(run, [*types, *types.values()], "walks of 6 messages")
