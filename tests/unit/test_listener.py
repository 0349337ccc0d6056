"""The shared listener layer: rejection logging, admission caps, token policy, tasks."""

from __future__ import annotations

import asyncio
import logging

import pytest
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.listener import (
    Admission,
    AdmissionLimits,
    Rejections,
    RejectReason,
    TokenPolicy,
    receive_text_frames,
)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_rejections_are_counted_and_a_flood_is_logged_in_a_few_lines(caplog):
    clock = Clock()
    rejections = Rejections("eventer", log_interval=10.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        for i in range(1000):
            clock.now = i * 0.005  # 1,000 refusals within 5 s
            rejections.reject(RejectReason.BAD_TOKEN, f"attempt {i}", "10.0.0.1:1")
        rejections.reject(RejectReason.BAD_FRAME, "garbage", "10.0.0.2:1")
        clock.now = 20.0
        rejections.reject(RejectReason.BAD_TOKEN, "one more", "10.0.0.1:1")
    assert rejections.counts == {"bad_token": 1001, "bad_frame": 1}
    lines = [r.getMessage() for r in caplog.records]
    # first bad_token, first bad_frame, the summary of the 999 suppressed, the new window
    assert len(lines) == 4, lines
    assert "attempt 0" in lines[0]
    assert "999 more (bad_token)" in lines[2] and "total 1001" in lines[2]
    assert "one more" in lines[3]


def test_rejection_flush_logs_the_pending_summary(caplog):
    rejections = Rejections("syncer", clock=Clock())
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            rejections.reject(RejectReason.INIT_TIMEOUT, "slow")
        rejections.flush()
    assert "2 more (init_timeout)" in caplog.records[-1].getMessage()


def _session(admission: Admission, address: str):
    """A connection from `address` that initialises at once (or None if refused)."""
    ticket = admission.admit(address, evict=lambda: None)
    if ticket is not None and not ticket.promote():
        ticket.release()
        return None
    return ticket


def test_admission_caps_sessions_total_and_per_address():
    rejections = Rejections("x")
    admission = Admission(
        AdmissionLimits(max_connections=3, max_connections_per_address=2), rejections
    )
    a1 = _session(admission, "10.0.0.1")
    a2 = _session(admission, "10.0.0.1")
    assert a1 and a2
    assert _session(admission, "10.0.0.1") is None  # third session from one address
    b1 = _session(admission, "10.0.0.2")
    assert b1 is not None
    assert _session(admission, "10.0.0.3") is None  # fourth session in total
    assert rejections.counts == {"too_many_connections": 2}
    a1.release()
    a1.release()  # idempotent: frees one place only
    assert admission.open_connections == 2
    assert _session(admission, "10.0.0.1") is not None
    assert _session(admission, "10.0.0.3") is None


def test_a_session_place_taken_between_accept_and_init_refuses_the_init():
    rejections = Rejections("x")
    admission = Admission(AdmissionLimits(max_connections=1), rejections)
    early = admission.admit("10.0.0.1", evict=lambda: None)
    late = admission.admit("10.0.0.2", evict=lambda: None)
    assert early.promote()
    assert not late.promote()  # the budget filled up after it was accepted
    assert rejections.counts == {"too_many_connections": 1}
    assert admission.session_connections == 1


def test_pending_connections_have_their_own_budget_and_the_oldest_is_evicted():
    rejections = Rejections("x")
    limits = AdmissionLimits(
        max_connections=2, max_connections_per_address=2, max_pending=4, max_pending_per_address=3
    )
    admission = Admission(limits, rejections)
    evicted: list[str] = []

    def pending(name: str, address: str):
        return admission.admit(address, evict=lambda: evicted.append(name))

    # Idle connections from one address: the 4th evicts that address's oldest.
    idle = [pending(f"idle{i}", "10.6.6.6") for i in range(4)]
    assert all(idle)
    assert evicted == ["idle0"]
    assert admission.pending_connections == 3
    # A client from elsewhere takes the place of the biggest holder's oldest.
    other = pending("other", "10.0.0.1")
    assert admission.pending_connections == 4
    assert pending("client", "10.0.0.2") is not None
    assert evicted == ["idle0", "idle1"]
    # Evicted tickets are gone for good: promote fails, release frees nothing twice.
    assert not idle[1].promote()
    idle[1].release()
    assert admission.pending_connections == 4
    # Pending connections never took a session place: both sessions are available.
    assert other.promote()
    assert idle[3].promote()
    assert admission.session_connections == 2 and admission.pending_connections == 2
    assert rejections.counts == {"evicted_before_init": 2}
    # A refused init gives its place back and is first in line for eviction.
    idle[3].demote()
    assert admission.session_connections == 1
    for i in range(2):
        assert pending(f"new{i}", "10.0.0.9") is not None
    assert evicted[-1] == "idle3"


def test_without_an_evict_callback_the_newcomer_is_refused():
    rejections = Rejections("x")
    admission = Admission(AdmissionLimits(max_pending=1, max_pending_per_address=1), rejections)
    assert admission.admit("10.0.0.1") is not None
    assert admission.admit("10.0.0.1") is None
    assert rejections.counts == {"too_many_connections": 1}


@pytest.mark.parametrize(
    ("policy", "presented", "accepted"),
    [
        (TokenPolicy.open(), None, True),
        (TokenPolicy.open(), "x", True),
        (TokenPolicy.of(None, refuse_unexpected=True), "x", False),
        (TokenPolicy.of("s3cret"), None, False),
        (TokenPolicy.of("s3cret", allow_missing=True), None, True),
        (TokenPolicy.of("s3cret", allow_missing=True), "wrong", False),
        (TokenPolicy(("old", "new")), "old", True),
        (TokenPolicy(("old", "new")), "new", True),
        (TokenPolicy(("old", "new")), "older", False),
        # A lone surrogate (JSON "\ud800") is a wrong token, not a UnicodeEncodeError
        # (fuzzing of Jetstream's SessionCreate found it).
        (TokenPolicy.of("s3cret"), "\ud800", False),
        (TokenPolicy.of("s3cret"), "s3cret\udfff", False),
    ],
)
def test_token_policy(policy, presented, accepted):
    error = policy.check(presented)
    assert (error is None) is accepted
    if error is not None and presented:
        assert presented not in error  # never echo what was sent


async def test_a_critical_task_that_exits_is_fatal_with_its_name(caplog):
    reasons: list[str] = []
    tasks = Tasks("replica", reasons.append)
    child = tasks.child("engine")

    async def writer():
        await asyncio.sleep(0)
        raise RuntimeError("disk gone")

    with caplog.at_level(logging.CRITICAL):
        child.spawn("writer", writer())
        await asyncio.sleep(0.05)
    assert len(reasons) == 1 and reasons[0].startswith("replica/engine/writer failed")
    assert "disk gone" in reasons[0]
    assert "replica/engine/writer" in caplog.text
    await tasks.close()


async def test_closing_cancels_without_being_fatal_and_non_critical_tasks_may_end():
    reasons: list[str] = []
    tasks = Tasks("replica", reasons.append)
    forever = tasks.spawn("loop", asyncio.sleep(3600))
    tasks.spawn("one-shot", asyncio.sleep(0), critical=False)
    await asyncio.sleep(0.01)
    assert tasks.names == ["replica/loop"]
    await tasks.close()
    assert forever.cancelled()
    assert reasons == []
    with pytest.raises(Exception, match="stopping"):
        tasks.spawn("late", asyncio.sleep(0))


async def test_a_critical_task_that_returns_is_fatal():
    reasons: list[str] = []
    tasks = Tasks("replica", reasons.append)
    tasks.spawn("merge", asyncio.sleep(0))
    await asyncio.sleep(0.01)
    assert reasons == ["replica/merge exited while its owner is running"]


class _Frames:
    """aiohttp's own frame type (WSMessage, WSMsgType) fed like a WebSocketResponse."""

    def __init__(self, *frames):
        self.frames = list(frames)
        self.read = 0

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.frames:
            raise StopAsyncIteration
        self.read += 1
        return self.frames.pop(0)


def _frame(kind: str, data):
    from aiohttp import WSMessage, WSMsgType

    return WSMessage(WSMsgType[kind], data, None)


class _TooBig(Exception):
    code = 1009


@pytest.mark.parametrize("async_handler", [False, True])
async def test_websocket_receive_loop_hands_over_text_and_refuses_the_rest(async_handler):
    texts: list[str] = []
    binaries: list[int] = []

    def on_text(text):
        texts.append(text)

    async def on_text_async(text):
        texts.append(text)

    rejections = Rejections("ws")
    frames = _Frames(
        _frame("TEXT", "a"),
        _frame("BINARY", b"xyz"),
        _frame("PING", b""),  # not ours to handle: ignored
        _frame("TEXT", "b"),
        _frame("ERROR", _TooBig("too big")),
        _frame("TEXT", "never read"),
    )
    await receive_text_frames(
        frames,
        on_text_async if async_handler else on_text,
        binaries.append,
        rejections=rejections,
        peer="10.0.0.1",
        size_limit="x.max_message_size 10",
    )
    assert texts == ["a", "b"] and binaries == [3]
    assert rejections.counts == {"message_too_large": 1}  # and the loop ended there
    assert frames.frames == [_frame("TEXT", "never read")]


async def test_websocket_receive_loop_counts_a_broken_frame_and_honours_stop():
    rejections = Rejections("ws")
    frames = _Frames(_frame("ERROR", ValueError("invalid UTF-8")), _frame("TEXT", "x"))
    await receive_text_frames(
        frames, pytest.fail, pytest.fail, rejections=rejections, peer="p", size_limit="-"
    )
    assert rejections.counts == {"bad_frame": 1} and frames.read == 1

    texts: list[str] = []
    frames = _Frames(_frame("TEXT", "1"), _frame("TEXT", "2"), _frame("TEXT", "3"))
    await receive_text_frames(
        frames,
        texts.append,
        pytest.fail,
        rejections=rejections,
        peer="p",
        size_limit="-",
        stop=lambda: len(texts) == 2,
    )
    assert texts == ["1", "2"] and frames.read == 3  # the third frame is read, not handled
