"""The chatter frame's C parse and head (`chatter/_frame.c`) against connection.py's
Python code on the same bytes: the C parse gives exactly the Python parse's `Msg` (of
the same namedtuple classes) or None, never a message the Python parse refuses; the C
head gives exactly the Python head's bytes or None (the Python code then takes it)."""

from __future__ import annotations

import random

import pytest
from eventfleet_server.chatter import connection
from eventfleet_server.chatter.connection import Conversation, Msg
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import parts
from tests.leaks import assert_no_leak
from tests.unit.test_chatter import codec_msg as encode

_c = connection._c


def _missing() -> None:
    parts.skip_missing(
        "cc",
        "chatter frames are parsed and built in Python only (chatter/_frame.c was not built)",
        "install a C compiler and reinstall: ./scripts/bootstrap",
    )


@pytest.fixture(autouse=True)
def c_frame(request):
    """The C code; without it each test fails through part `cc` (as
    `test_the_c_frame_is_built`)."""
    if _c is None and request.function is not test_the_c_frame_is_built:
        _missing()
    return _c


def test_the_c_frame_is_built():
    if _c is None:
        _missing()
    body = encode(5, 5, True, True, False, "T.A", b"xy")
    msg = connection.parse_msg(body)
    assert msg == Msg("T.A", b"xy", Conversation(False, 5), True, False, True)
    assert _c.parse(body, 0, len(body)) == msg


def python_parse(body: bytes):
    """The Python parse's message, or the type of the error it raises."""
    try:
        return connection._parse_msg_python(body)
    except Exception as e:
        return type(e)


def check(body: bytes) -> Msg | None:
    """The C parse of `body` (alone and inside a larger buffer) is the Python parse's
    message, or None; None whenever the Python parse raises."""
    expected = python_parse(body)
    got = _c.parse(body, 0, len(body))
    if isinstance(expected, type):
        assert got is None, (body, expected)
        return None
    if got is not None:
        assert got == expected
        assert type(got) is Msg and type(got.conv) is Conversation
        assert [type(v) for v in got] == [type(v) for v in expected]
        assert [type(v) for v in got.conv] == [type(v) for v in expected.conv]
    framed = b"\x07\xff" + body + b"\x81\x00"
    assert _c.parse(framed, 2, 2 + len(body)) == got
    return got


def python_head(*args) -> bytes:
    saved, connection._c = connection._c, None
    try:
        return connection._frame_head(*args)
    finally:
        connection._c = saved


# -- the parse -----------------------------------------------------------------------------

_IDS = (0, 1, 63, 64, 127, 128, 8191, 8192, 2**40 + 3, 2**63 - 1, -1, -64, -65, -(2**63))


def test_messages_parse_as_the_python_parse():
    for msg_id in _IDS:
        for first in (1, 64, msg_id):
            for flags in ((True, True, True), (False, True, False), (True, False, False)):
                for msg_type in ("HatEventer.MsgRegisterReq", "", "é" * 70, "\U0001f600"):
                    for data in (b"", b"\x00x", bytes(range(256)) * 3):
                        body = encode(msg_id, first, *flags, msg_type, data)
                        assert check(body) is not None, (msg_id, first, flags, msg_type)


def test_generated_messages():
    rng = random.Random(11)
    for _ in range(2000):
        msg_id = rng.choice([rng.randrange(1 << 14), rng.randrange(1 << 62), rng.choice(_IDS)])
        first = rng.choice([msg_id, rng.randrange(1 << 20)])
        flags = [rng.random() < 0.5 for _ in range(3)]
        msg_type = "".join(rng.choice("aZ.é\u4e2d") for _ in range(rng.randrange(40)))
        data = rng.randbytes(rng.choice([0, 1, 60, 300, 70_000]))
        assert check(encode(msg_id, first, *flags, msg_type, data)) is not None


def big_body(msg_id: int, first: int) -> bytes:
    """A message with ids beyond int64 (hat's codec refuses them; the hand-built head
    writes them as the Integer layout has them)."""
    frame = python_head(msg_id, first, True, True, True, "T", 1) + b"x"
    return frame[1 + frame[0] :]


def test_integers_beyond_int64_are_left_to_python():
    for msg_id, first in [(2**63, 1), (1, 2**63), (2**64 + 5, 2**64 + 5), (2**68, 1)]:
        body = big_body(msg_id, first)
        assert _c.parse(body, 0, len(body)) is None
        assert connection.parse_msg(body).conv == Conversation(False, first)


def test_flag_bytes_other_than_one_are_true():
    body = bytearray(encode(3, 3, True, True, True, "T", b"x"))
    flags_at = 2  # after the one-byte id and first
    for value in (0x02, 0x80, 0xFF):
        for i in range(3):
            bad = bytearray(body)
            bad[flags_at + i] = value
            assert check(bytes(bad)) is not None


def test_every_truncation():
    body = encode(2**40, 9, True, False, True, "HatEventer.MsgQueryReq", bytes(range(200)))
    for cut in range(len(body)):
        check(body[:cut])
    for extra in (b"\x00", b"\x81", b"xyz"):
        assert check(body + extra) is None


def test_every_byte_changed():
    body = encode(70_000, 12, False, True, False, "é.Msg", b"\x00\xff" * 40)
    for index in range(len(body)):
        for value in {0x00, 0x3F, 0x40, 0x7F, 0x80, 0x81, 0xC0, 0xFF, body[index] ^ 0x40}:
            bad = bytearray(body)
            bad[index] = value
            check(bytes(bad))


def test_bad_utf8_types_are_left_to_python():
    for raw in (b"\xff", b"\xed\xa0\x80", b"a\xc3"):  # not UTF-8, a surrogate, cut short
        body = bytes([0x81, 0x81, 1, 1, 1, 0x80 | len(raw)]) + raw + b"\x80"
        assert _c.parse(body, 0, len(body)) is None
        with pytest.raises(UnicodeDecodeError):
            connection.parse_msg(body)


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=120))
def test_garbage(body):
    check(body)
    check(b"\x81\x81\x01\x00\x01" + body)


def test_regions_outside_the_buffer_are_none():
    body = encode(1, 1, True, True, True, "T", b"x")
    for start, end in [(-1, len(body)), (0, len(body) + 1), (3, 2), (len(body) + 1, len(body))]:
        assert _c.parse(body, start, end) is None
    assert _c.parse(body, 0, 0) is None


def test_only_bytes_and_ints():
    body = encode(1, 1, True, True, True, "T", b"x")
    for args in [(bytearray(body), 0, len(body)), (body, "0", 1), (body, 0), (body, 0, 1.0)]:
        with pytest.raises(TypeError):
            _c.parse(*args)
    with pytest.raises(TypeError):
        _c.setup(Msg, object)
    with pytest.raises(TypeError):
        _c.head(1, 1, True, True, True, "T", 1)
    with pytest.raises(TypeError):
        _c.head(1, 1, True, True, True, b"T")


# -- the head ------------------------------------------------------------------------------


def test_heads_are_the_python_heads():
    for msg_id in (0, 1, 63, 64, 127, 128, 8191, 8192, 2**40 + 3, 2**63 - 1):
        for first in (1, 64, msg_id):
            for flags in ((True, True, True), (False, True, False), (0, 1, 0), ([], "x", None)):
                for msg_type in ("HatEventer.MsgRegisterRes", "", "é" * 70):
                    for size in (0, 1, 60, 250, 70_000, 2**24, 2**40, 2**63 - 1):
                        args = (msg_id, first, *flags, msg_type, size)
                        assert connection._frame_head(*args) == python_head(*args), args


def test_heads_and_parse_agree_with_the_codec():
    for msg_id, size in [(5, 0), (300, 70), (2**33, 4096)]:
        data = bytes(size)
        body = encode(msg_id, msg_id, True, True, False, "HatEventer.MsgEventsNotify", data)
        head = connection._frame_head(
            msg_id, msg_id, True, True, False, "HatEventer.MsgEventsNotify", size
        )
        length = len(body).to_bytes((len(body).bit_length() + 7) // 8, "big")
        assert head + data == bytes((len(length),)) + length + body
        assert connection.parse_msg(body).data == data


def test_heads_off_the_fast_path_are_left_to_python():
    typ = b"\x81T"
    for args in [(-1, 1, 5), (1, -1, 5), (1, 1, -1), (2**64, 1, 5), (1, 2**64, 5), (True, 1, 5)]:
        msg_id, first, size = args
        assert _c.head(msg_id, first, True, True, True, typ, size) is None
    assert _c.head(1, 1, True, True, True, b"x" * 5000, 5) is None
    # ... which the Python code still encodes
    assert connection._frame_head(2**64, 1, True, True, True, "T", 5) == python_head(
        2**64, 1, True, True, True, "T", 5
    )


def test_a_flag_that_cannot_be_judged_raises():
    class Bad:
        def __bool__(self):
            raise RuntimeError("no truth")

    with pytest.raises(RuntimeError):
        _c.head(1, 1, Bad(), True, True, b"\x81T", 5)


# -- references ----------------------------------------------------------------------------


def test_no_reference_or_memory_is_leaked():
    rng = random.Random(9)
    good = encode(2**40, 3, True, True, False, "HatEventer.MsgRegisterReq", rng.randbytes(300))
    bodies = [good, good[:-3], good + b"\x00", big_body(2**63, 1)]
    bodies.append(bytes([0x81, 0x81, 1, 1, 1, 0x81, 0xFF, 0x80]))

    def run(times: int) -> None:
        for _ in range(times):
            for body in bodies:
                _c.parse(body, 0, len(body))
            _c.head(7, 7, True, True, True, b"\x81T", 100)
            _c.head(-1, 7, True, True, True, b"\x81T", 100)

    assert_no_leak(run, (Msg, Conversation), "parses and heads")
