"""The BUS's frame loops (`bus/zmqio.py`): the C extension and the pyzmq fallback read
the same messages, whole and in order, stop at the limit or an empty queue, and send the
same BROADCASTs."""

from __future__ import annotations

import contextlib
import itertools
import time

import pytest
import zmq
from eventfleet_server.bus import zmqio

from tests import parts

MESSAGES = [
    [b"/a/b", b"", b"bench", b"2026-11-29T14:10:35.123Z", b"u" * 36, b"\x92\x01\xcb"],
    [b"only one frame"],
    [b""],
    [b"", b"/with/delimiter", b"1", b"p", b"", b"u" * 36, b"\x00\xff" * 10],
    [bytes(range(256)) * 4096],  # 1 MiB, every byte value
    [b"%d" % i for i in range(100)],  # many frames
    [b"", b"", b""],
]


@contextlib.contextmanager
def _inproc(bound_kind: int, connected_kind: int, before_connect=lambda sock: None):
    """Two sockets over inproc, without high-water marks; `before_connect` sets up the
    connecting one (an identity, a subscription) before it connects."""
    ctx = zmq.Context()
    bound, connected = ctx.socket(bound_kind), ctx.socket(connected_kind)
    try:
        for sock in (bound, connected):
            sock.sndhwm = sock.rcvhwm = 0
        bound.bind("inproc://zmqio-test")
        before_connect(connected)
        connected.connect("inproc://zmqio-test")
        yield bound, connected
    finally:
        bound.close(linger=0)
        connected.close(linger=0)
        ctx.term()


@pytest.fixture
def pair():
    def identify(dealer: zmq.Socket) -> None:
        dealer.identity = b"dealer-1"

    with _inproc(zmq.ROUTER, zmq.DEALER, identify) as sockets:
        yield sockets


def _send_all(dealer: zmq.Socket, messages: list[list[bytes]]) -> None:
    for message in messages:
        dealer.send_multipart(message)


def _read_until(reader: zmqio.Reader, count: int, limit: int) -> list[list[bytes]]:
    """Read `count` messages in calls of at most `limit` (inproc delivers at once, but
    stay bounded in time anyway)."""
    out: list[list[bytes]] = []
    deadline = time.monotonic() + 5
    while len(out) < count and time.monotonic() < deadline:
        got = reader(limit)
        assert len(got) <= limit
        out += got
    return out


def _readers(router: zmq.Socket) -> list[zmqio.Reader]:
    return [zmqio.Reader(router), zmqio.Reader(router, use_c=False)]


def test_the_c_reader_is_built_and_bound(pair):
    router, _ = pair
    reader = zmqio.Reader(router)
    if reader.kind != "c":
        parts.skip_missing(
            "cc",
            f"the Event BUS reads and sends with {reader.describe}",
            "install a C compiler and reinstall: ./scripts/bootstrap",
        )
    assert "libzmq" in reader.describe


@pytest.mark.parametrize("use_c", [True, False], ids=["c", "pyzmq"])
@pytest.mark.parametrize("limit", [1, 3, 1000])
def test_reads_every_message_whole_and_in_order(pair, use_c, limit):
    router, dealer = pair
    reader = zmqio.Reader(router, use_c=use_c)
    expected = [[b"dealer-1", *m] for m in MESSAGES] * 3
    _send_all(dealer, MESSAGES * 3)
    assert _read_until(reader, len(expected), limit) == expected
    assert reader(limit) == []  # and nothing more


def test_both_readers_agree_when_interleaved(pair):
    """Alternating readers on one queue: neither leaves a message half-read."""
    router, dealer = pair
    readers = itertools.cycle(_readers(router))
    expected = [[b"dealer-1", *m] for m in MESSAGES] * 5
    _send_all(dealer, MESSAGES * 5)
    got: list[list[bytes]] = []
    deadline = time.monotonic() + 5
    while len(got) < len(expected) and time.monotonic() < deadline:
        got += next(readers)(2)
    assert got == expected


def test_empty_queue_is_an_empty_list(pair):
    router, _ = pair
    for reader in _readers(router):
        assert reader(100) == []
        assert reader(0) == []


# -- BROADCASTs ------------------------------------------------------------------------

ITEMS = [
    (1, (b"/a/b", b"bench", b"2026-11-29T14:10:35.123000Z", b"u" * 36, b"\x92\x01\xcb")),
    (10, (b"/", b"", b"", b"", b"")),  # empty frames
    (2**63 - 1, (b"/max", b"p", b"t", b"u", bytes(range(256)) * 4096)),  # largest, 1 MiB
    (0, (b"/zero", b"p", b"t", b"u", b"\xc0")),
]


@pytest.fixture
def pubsub():
    def subscribe(sub: zmq.Socket) -> None:
        sub.rcvtimeo = 5000
        sub.subscribe(b"")

    with _inproc(zmq.PUB, zmq.SUB, subscribe) as sockets:
        yield sockets


def _expected(rfc: bool) -> list[list[bytes]]:
    return [
        [topic, seq.to_bytes(8, "big") if rfc else str(seq).encode(), p, t, u, d]
        for seq, (topic, p, t, u, d) in ITEMS
    ]


@pytest.mark.parametrize("use_c", [True, False], ids=["c", "pyzmq"])
@pytest.mark.parametrize("rfc", [True, False], ids=["rfc", "reference"])
def test_broadcasts_are_six_frame_messages_in_order(pubsub, use_c, rfc):
    pub, sub = pubsub
    send = zmqio.Broadcaster(pub, rfc=rfc, use_c=use_c)
    send(ITEMS)
    send([])  # nothing to send is not an error
    send(ITEMS[:1])
    got = [sub.recv_multipart() for _ in range(len(ITEMS) + 1)]
    assert got == _expected(rfc) + _expected(rfc)[:1]


@pytest.mark.parametrize(
    "bad",
    [
        [(1, (b"/a", b"p", b"t", b"u"))],  # four frames
        [(1, (b"/a", b"p", b"t", b"u", "text"))],  # str, not bytes
        [(-1, (b"/a", b"p", b"t", b"u", b"d"))],  # negative sequence
        [[1, (b"/a", b"p", b"t", b"u", b"d")]],  # not a tuple
    ],
    ids=["four-frames", "str-frame", "negative-sequence", "list-item"],
)
def test_a_bad_item_sends_nothing_of_itself(pubsub, bad):
    """The C loop checks an item before its first frame: what went before is sent whole,
    the bad item raises, and no part-message is left on the socket."""
    pub, sub = pubsub
    send = zmqio.Broadcaster(pub, rfc=False)
    if send.kind != "c":
        parts.skip_missing("cc", send.describe, "install a C compiler: ./scripts/bootstrap")
    with pytest.raises((TypeError, OverflowError)):
        send([ITEMS[0], *bad])
    send(ITEMS[3:])
    assert [sub.recv_multipart() for _ in range(2)] == [_expected(False)[0], _expected(False)[3]]


@pytest.mark.parametrize("use_c", [True, False], ids=["c", "pyzmq"])
@pytest.mark.parametrize(
    ("kind", "call"),
    [
        (zmq.PUB, lambda sock, use_c: zmqio.Reader(sock, use_c=use_c)(10)),
        (zmq.SUB, lambda sock, use_c: zmqio.Broadcaster(sock, rfc=False, use_c=use_c)(ITEMS)),
    ],
    ids=["read-from-pub", "broadcast-on-sub"],
)
def test_a_socket_that_cannot_do_it_raises_zmq_error(use_c, kind, call):
    ctx = zmq.Context()
    sock = ctx.socket(kind)
    try:
        with pytest.raises(zmq.ZMQError) as raised:
            call(sock, use_c)
        assert raised.value.errno == zmq.ENOTSUP
    finally:
        sock.close(linger=0)
        ctx.term()
