"""Event BUS wire format: frames <-> values, engine-free and ZeroMQ-free.

The RFC (micro-toolkit Event BUS, a ZeroMQ clone pattern) and its only public
implementation disagree on two points; every decoder here accepts both forms and every
encoder writes the one chosen by configuration:

- integers (sequence frames): the RFC says 8 bytes big-endian, the reference writes ASCII
  decimal text. A frame of ASCII digits is decimal; any other frame of exactly 8 bytes is
  big-endian. (A big-endian value made only of digit bytes would be at least
  0x3030303030303030, about 3.5e18: no real sequence.) An empty frame is 0 (the
  reference client sends an empty sequence frame with PUB).
- subtree lists (SYNCSTART frame 1): the RFC separates subtrees with ``;``, the reference
  with ``,``; both split. SYNCEND echoes the client's frame unchanged.

Errors are `WireError` with a `reason` (a rejection reason value) and a message naming
the bad value.
"""

from __future__ import annotations

import datetime
import enum
import functools
import re
import time
import uuid as uuidlib
from dataclasses import dataclass
from typing import NamedTuple

from eventfleet_server.common.model import (
    SOURCE_TS_MAX_S,
    SOURCE_TS_MIN_S,
    EventType,
    Timestamp,
)

MAX_SEQUENCE = (1 << 63) - 1
SYNCSTART = b"SYNCSTART"
SYNC = b"SYNC"
SYNCEND = b"SYNCEND"

_DIGITS = re.compile(rb"[0-9]+")
_CANONICAL_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_GMTIME_MAX = 253402300800  # 10000-01-01: beyond it strftime's %Y is not 4 digits
# '%' in a topic must start one of these escapes (see topic_to_type).
_ESCAPE = re.compile(r"%(?!25|2F)")


class IntegerEncoding(enum.StrEnum):
    """How this server writes integer frames."""

    REFERENCE = "reference"  # ASCII decimal text (what existing clients speak)
    RFC = "rfc"  # 8 bytes, big-endian


class WireError(ValueError):
    """A frame or message that cannot be decoded; `reason` is the rejection reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _show(frame: bytes, limit: int = 40) -> str:
    text = repr(frame[:limit])
    return text + ("..." if len(frame) > limit else "")


# -- integers ------------------------------------------------------------------------------


def decode_int(frame: bytes, what: str = "sequence") -> int:
    """A sequence frame in either encoding; `WireError` names the bad frame."""
    if not frame:
        return 0
    if _DIGITS.fullmatch(frame):
        if len(frame) > 19:
            raise WireError("bad_message", f"{what} {_show(frame)} is out of range")
        value = int(frame)
    elif len(frame) == 8:
        value = int.from_bytes(frame, "big")
    else:
        raise WireError(
            "bad_message",
            f"{what} {_show(frame)} is neither ASCII decimal nor 8 bytes big-endian",
        )
    if value > MAX_SEQUENCE:
        raise WireError("bad_message", f"{what} {value} is out of range (max {MAX_SEQUENCE})")
    return value


def encode_int(value: int, encoding: IntegerEncoding) -> bytes:
    if encoding is IntegerEncoding.RFC:
        return value.to_bytes(8, "big")
    return str(value).encode()


# -- subtrees ------------------------------------------------------------------------------


def parse_subtrees(frame: bytes) -> tuple[str, ...]:
    """SYNCSTART frame 1 -> subtree prefixes; ``()`` means every topic.

    Both ``;`` (RFC) and ``,`` (reference) separate subtrees. Empty items are dropped;
    an empty frame (or only separators) selects everything, as the RFC's empty
    specification does. A subtree must start with ``/`` (it is a topic path).
    """
    try:
        text = frame.decode()
    except UnicodeDecodeError as e:
        raise WireError("bad_subscription", f"subtrees {_show(frame)} are not UTF-8") from e
    items = [s for s in re.split("[;,]", text) if s]
    for item in items:
        if not item.startswith("/"):
            raise WireError(
                "bad_subscription", f"subtree {item!r} does not start with '/' (not a topic path)"
            )
    return tuple(items)


def matches(topic: str, subtrees: tuple[str, ...]) -> bool:
    """Raw string prefix, as the RFC's path prefix (``/a/b/`` matches ``/a/b/c``) and as
    ZeroMQ's own SUB filter; ``()`` matches every topic."""
    if not subtrees:
        return True
    return topic.startswith(subtrees)


# -- topics <-> event types ----------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def type_to_topic(event_type: EventType) -> str:
    """``('a', 'b', 'c')`` -> ``/a/b/c``; ``%`` and ``/`` inside a segment are escaped
    as ``%25`` and ``%2F`` so that the mapping is one-to-one. (Cached: every snapshot
    and broadcast maps the same few types over and over.)"""
    return "/" + "/".join(s.replace("%", "%25").replace("/", "%2F") for s in event_type)


@functools.lru_cache(maxsize=65536)
def topic_to_type(topic: str) -> EventType:
    """``/a/b/c`` -> ``('a', 'b', 'c')``, the inverse of `type_to_topic`.

    Every segment is kept, empty ones too (``/a//b/`` is ``('a', '', 'b', '')``). A topic
    must start with ``/``; ``%`` may only start ``%25`` or ``%2F``; the segments ``?`` and
    ``*`` are subscription wildcards of the event model and cannot name an event.
    """
    if not topic.startswith("/"):
        raise WireError("bad_topic", f"topic {topic[:200]!r} does not start with '/'")
    if _ESCAPE.search(topic):
        raise WireError("bad_topic", f"topic {topic[:200]!r}: '%' must start the escape %25 or %2F")
    segments = topic[1:].split("/")
    out = []
    for segment in segments:
        if segment in ("?", "*"):
            raise WireError(
                "bad_topic", f"topic {topic[:200]!r}: segment {segment!r} is a wildcard"
            )
        out.append(segment.replace("%2F", "/").replace("%25", "%"))
    return tuple(out)


_TOPICS: dict[bytes, tuple[str, EventType]] = {}
_TOPICS_MAX = 65536


def parse_topic(frame: bytes) -> tuple[str, EventType]:
    """A PUB's topic frame -> ``(topic, event type)``; `WireError` (``bad_topic``).

    Accepted frames are cached: a PUB stream carries the same few topics over and
    over, and the hit costs one dict lookup.
    """
    hit = _TOPICS.get(frame)
    if hit is not None:
        return hit
    try:
        topic = frame.decode()
    except UnicodeDecodeError as e:
        raise WireError("bad_topic", f"topic {_show(frame)} is not UTF-8") from e
    event_type = topic_to_type(topic)
    if len(_TOPICS) >= _TOPICS_MAX:
        _TOPICS.clear()  # a flood of distinct topics: start over rather than grow
    hit = _TOPICS[frame] = (topic, event_type)
    return hit


# -- timestamps ----------------------------------------------------------------------------


_ISO_SECONDS: dict[int, str] = {}
_ISO_SECONDS_MAX = 4096


def timestamp_to_iso(t: Timestamp) -> str:
    """``2024-05-01T12:00:00.123456Z`` (UTC, microseconds)."""
    s = t.s
    text = _ISO_SECONDS.get(s)
    if text is None:
        if 0 <= s < _GMTIME_MAX:
            # time.gmtime is several times cheaper than datetime arithmetic + strftime.
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))
        else:
            dt = _EPOCH + datetime.timedelta(seconds=s)
            text = dt.strftime("%Y-%m-%dT%H:%M:%S")
        if len(_ISO_SECONDS) >= _ISO_SECONDS_MAX:
            _ISO_SECONDS.clear()
        # Events come in time order: the second is nearly always one seen just before.
        _ISO_SECONDS[s] = text
    return f"{text}.{t.us:06d}Z"


def timestamp_us_to_iso(us: int) -> str:
    """`timestamp_to_iso` of a timestamp in microseconds since the epoch."""
    s, micro = divmod(us, 1_000_000)
    text = _ISO_SECONDS.get(s)
    if text is None:
        return timestamp_to_iso(Timestamp(s, micro))
    return f"{text}.{micro:06d}Z"


# ``YYYY-MM-DDTHH:MM`` -> seconds since the epoch, for the fast path below.
_MINUTES: dict[bytes, int] = {}
_MINUTES_MAX = 4096


def _minute(prefix: bytes) -> int | None:
    """Seconds of a ``YYYY-MM-DDTHH:MM`` prefix (cached), None if it is not one."""
    seconds = _MINUTES.get(prefix)
    if seconds is not None:
        return seconds
    if not (prefix[4] == 45 and prefix[7] == 45 and prefix[10] == 84 and prefix[13] == 58):
        return None  # not '-', '-', 'T', ':' where they belong: the general parser decides
    try:
        dt = datetime.datetime.fromisoformat(prefix.decode("ascii") + ":00+00:00")
    except (UnicodeDecodeError, ValueError):
        return None
    delta = dt - _EPOCH
    seconds = delta.days * 86400 + delta.seconds
    if len(_MINUTES) >= _MINUTES_MAX:
        _MINUTES.clear()
    _MINUTES[prefix] = seconds
    return seconds


def timestamp_from_iso(frame: bytes) -> Timestamp | None:
    """An ISO-8601 producer timestamp; an empty frame is None. Naive means UTC."""
    if not frame:
        return None
    # Fast path for what clients send nearly always, UTC with a 'Z':
    # YYYY-MM-DDTHH:MM:SSZ, ...SS.fffZ (JavaScript's toISOString) or ...SS.ffffffZ (ours).
    # The minute is cached; the result is the general parser's, which decides the rest.
    n = len(frame)
    if (n == 20 or n == 24 or n == 27) and frame[n - 1] == 90 and frame[16] == 58:
        base = _minute(frame[:16])
        second = frame[17:19]
        if base is not None and second.isdigit() and (sec := int(second)) < 60:
            if n == 20:
                return Timestamp(base + sec, 0)
            fraction = frame[20 : n - 1]
            if frame[19] == 46 and fraction.isdigit():
                return Timestamp(base + sec, int(fraction) * (1000 if n == 24 else 1))
    return _timestamp_general(frame)


def _timestamp_general(frame: bytes) -> Timestamp:
    try:
        text = frame.decode()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        dt = datetime.datetime.fromisoformat(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise WireError("bad_message", f"timestamp {_show(frame)} is not ISO-8601") from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.UTC)
    delta = dt - _EPOCH
    total = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return Timestamp(*divmod(total, 1_000_000))


def timestamp_frame(frame: bytes, t: Timestamp) -> bytes:
    """The producer timestamp frame we write for `t`, parsed from `frame`: the frame
    itself when it already is our form (``...SS.ffffffZ``), else re-formatted."""
    if (
        len(frame) == 27
        and frame[26] == 90  # Z
        and frame[19] == 46  # .
        and frame[16] == 58  # :
        and frame[:16] in _MINUTES  # a checked YYYY-MM-DDTHH:MM (the fast path took it)
    ):
        return frame
    return timestamp_to_iso(t).encode()


# -- commands ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncStart:
    """A SYNCSTART: the client's raw subtree frame (echoed in SYNCEND), the parsed
    subtrees and the sequence to start above."""

    subtrees_frame: bytes
    subtrees: tuple[str, ...]
    sequence: int


class Publish(NamedTuple):
    """A PUB from a client, decoded except for its data (kept as the msgpack bytes).

    The ``*_frame`` fields are what a BROADCAST of it carries (the client's own frames
    where they already are in our form): a PUB is encoded for the wire once, here.
    """

    topic: str
    event_type: EventType
    producer: str
    source_timestamp: Timestamp | None
    uuid: str
    data: bytes
    topic_frame: bytes
    producer_frame: bytes
    timestamp_frame: bytes  # b"" without a producer timestamp (the server's is used)
    uuid_frame: bytes  # canonical (lowercase)


def parse_syncstart(frames: list[bytes]) -> SyncStart:
    """``[SYNCSTART, subtrees, sequence]`` (the identity already removed)."""
    if not frames:
        raise WireError("bad_frame", "empty message on the snapshot socket")
    if frames[0] != SYNCSTART:
        raise WireError("bad_command", f"unknown command {_show(frames[0])} (expected SYNCSTART)")
    if len(frames) != 3:
        raise WireError("bad_frame", f"SYNCSTART has {len(frames)} frames, expected 3")
    return SyncStart(frames[1], parse_subtrees(frames[1]), decode_int(frames[2]))


_TIMESTAMPS: dict[bytes, tuple[Timestamp | None, bytes]] = {}
_TIMESTAMPS_MAX = 4096


def _parse_timestamp(frame: bytes) -> tuple[Timestamp | None, bytes]:
    """A PUB's producer timestamp frame -> ``(timestamp or None, the frame a BROADCAST
    carries)``; `WireError` if it is not ISO-8601 or out of range. Cached: a publisher
    sends many PUBs within one clock tick (JavaScript's clock has milliseconds), and a
    hit is one dict lookup where parsing and formatting cost ~1.5 µs per PUB."""
    source_timestamp = timestamp_from_iso(frame)
    if source_timestamp is None:
        out = b""
    else:
        if not SOURCE_TS_MIN_S <= source_timestamp.s <= SOURCE_TS_MAX_S:
            raise WireError(
                "bad_message", f"timestamp {_show(frame)} is out of range (years 1..9999)"
            )
        out = timestamp_frame(frame, source_timestamp)
    if len(_TIMESTAMPS) >= _TIMESTAMPS_MAX:
        _TIMESTAMPS.clear()  # a new tick every PUB: start over rather than grow
    hit = _TIMESTAMPS[frame] = (source_timestamp, out)
    return hit


def parse_pub(frames: list[bytes]) -> Publish:
    """``[topic, sequence, producer, timestamp, uuid, data]`` (identity removed).

    A leading empty delimiter frame (REQ-style DEALER clients) is skipped. The sequence
    frame must decode but is ignored: the server assigns its own. Written for the PUB
    hot path: cached topics, a fast path for UTC timestamps, no UUID object for a
    canonical UUID.
    """
    if len(frames) == 7 and frames[0] == b"":
        frames = frames[1:]
    if len(frames) != 6:
        raise WireError("bad_frame", f"PUB has {len(frames)} frames, expected 6")
    topic_frame, seq_frame, producer_frame, ts_frame, uuid_frame, data = frames
    topic, event_type = parse_topic(topic_frame)
    if seq_frame:
        decode_int(seq_frame)
    try:
        producer = producer_frame.decode()
    except UnicodeDecodeError as e:
        raise WireError("bad_message", f"producer {_show(producer_frame)} is not UTF-8") from e
    hit = _TIMESTAMPS.get(ts_frame)
    if hit is None:
        hit = _parse_timestamp(ts_frame)
    source_timestamp, out_ts = hit
    if _CANONICAL_UUID.fullmatch(uuid_frame):
        uuid = uuid_frame.decode()  # already canonical: skip the costly uuid.UUID parse
    else:
        try:
            uuid = str(uuidlib.UUID(uuid_frame.decode()))
        except (UnicodeDecodeError, ValueError) as e:
            raise WireError("bad_message", f"uuid {_show(uuid_frame)} is not a UUID") from e
        uuid_frame = uuid.encode()
    return Publish(
        topic,
        event_type,
        producer,
        source_timestamp,
        uuid,
        data,
        topic_frame,
        producer_frame,
        out_ts,
        uuid_frame,
    )


def event_frames(
    topic: str,
    sequence: int,
    producer: str,
    timestamp: str,
    uuid: str,
    data: bytes,
    encoding: IntegerEncoding,
) -> list[bytes]:
    """The six frames of a BROADCAST (SYNC prepends its command frame)."""
    return [
        topic.encode(),
        encode_int(sequence, encoding),
        producer.encode(),
        timestamp.encode(),
        uuid.encode(),
        data,
    ]


def syncend_frames(subtrees_frame: bytes, sequence: int, encoding: IntegerEncoding) -> list[bytes]:
    return [SYNCEND, subtrees_frame, encode_int(sequence, encoding)]
