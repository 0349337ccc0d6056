"""The event model (HatEventer 0.9 records as Python values).

Timestamps travel as ``{s, us}`` and are stored as one integer of microseconds;
`timestamp_to_us` rejects values that would not round-trip (``us`` outside
0..999999 or beyond the signed 64-bit range), so ordering by the stored integer is
the same as ordering by ``(s, us)``.
"""

from __future__ import annotations

import enum
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

EventType = tuple[str, ...]

_US = 1_000_000
_MAX_US = (1 << 63) - 1


class Timestamp(NamedTuple):
    s: int
    us: int


class EventId(NamedTuple):
    server: int
    session: int
    instance: int


class EventPayloadBinary(NamedTuple):
    type: str
    data: bytes


class EventPayloadJson(NamedTuple):
    """A JSON payload, kept as the text the client sent (it is not re-parsed)."""

    data: str


Payload = EventPayloadBinary | EventPayloadJson | None


class Event(NamedTuple):
    id: EventId
    type: EventType
    timestamp: Timestamp
    source_timestamp: Timestamp | None
    payload: Payload


class RegisterEvent(NamedTuple):
    type: EventType
    source_timestamp: Timestamp | None
    payload: Payload


class Status(enum.Enum):
    STANDBY = "standby"
    STARTING = "starting"
    OPERATIONAL = "operational"
    STOPPING = "stopping"


class Order(enum.Enum):
    DESCENDING = "descending"
    ASCENDING = "ascending"


class OrderBy(enum.Enum):
    TIMESTAMP = "timestamp"
    SOURCE_TIMESTAMP = "sourceTimestamp"


class QueryLatestParams(NamedTuple):
    event_types: list[EventType] | None = None


class QueryTimeseriesParams(NamedTuple):
    event_types: list[EventType] | None = None
    t_from: Timestamp | None = None
    t_to: Timestamp | None = None
    source_t_from: Timestamp | None = None
    source_t_to: Timestamp | None = None
    order: Order = Order.DESCENDING
    order_by: OrderBy = OrderBy.TIMESTAMP
    max_results: int | None = None
    last_event_id: EventId | None = None


class QueryServerParams(NamedTuple):
    server_id: int
    persisted: bool = False
    max_results: int | None = None
    last_event_id: EventId | None = None


QueryParams = QueryLatestParams | QueryTimeseriesParams | QueryServerParams


class QueryResult(NamedTuple):
    events: list[Event]
    more_follows: bool


def timestamp_to_us(t: Timestamp) -> int:
    """Microseconds since the epoch; `ValueError` naming the value if it cannot be stored."""
    if not 0 <= t.us < _US:
        raise ValueError(f"timestamp {t.s}.{t.us}: us must be in 0..999999")
    value = t.s * _US + t.us
    if not -_MAX_US <= value <= _MAX_US:
        raise ValueError(f"timestamp {t.s}.{t.us}: outside the storable range")
    return value


def timestamp_from_us(value: int) -> Timestamp:
    s, us = divmod(value, _US)
    return Timestamp(s, us)


def now() -> Timestamp:
    return timestamp_from_us(time.time_ns() // 1000)


def registered_events(
    events: Sequence[RegisterEvent], first: EventId, ts: Timestamp
) -> list[Event]:
    """The `Event` each of `events` becomes when registered as one session from id
    `first` on, all at time `ts` (consecutive instances)."""
    server, session, instance = first
    # tuple.__new__: a NamedTuple's generated __new__ is a Python call per object, two
    # per event here (~0.4 µs each at batch 100).
    new = tuple.__new__
    return [
        new(
            Event,
            (
                new(EventId, (server, session, instance + i)),
                e.type,
                ts,
                e.source_timestamp,
                e.payload,
            ),
        )
        for i, e in enumerate(events)
    ]


def natural_key(event: Event) -> tuple[int, int, int, int]:
    """Total order used as the secondary order of every query.

    hat-event orders events of one server by id and events of different servers by
    timestamp. The engine keeps timestamps non-decreasing per server id, so
    ``(timestamp, server, session, instance)`` agrees with both rules and is total.
    """
    t = event.timestamp
    return (t.s * _US + t.us, event.id.server, event.id.session, event.id.instance)


def split_sessions(events: Iterable[Event]) -> list[list[Event]]:
    """Consecutive runs of one ``(server, session)``, in order.

    A session is one engine batch: the unit the engine fans out and the unit of one
    Syncer ``MsgEvents``. Runs are consecutive, not grouped: the same session split by
    another one stays two runs, so the order of ``events`` is never changed.
    """
    groups: list[list[Event]] = []
    for e in events:
        if groups and groups[-1][0].id[:2] == e.id[:2]:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


# The one validation rule of registered events, shared by every protocol (Eventer,
# Syncer merge, Event BUS, Replication, Jetstream; docs/security.md "Validation"). It is
# hat-event 0.9.44's reference server's, which stores whatever a client sends, narrowed
# only to what we could not store and query faithfully:
#
# - a type is a list of strings, any of them empty, the list too (('a', ''),
#   ('x', '', 'y'), ('',), ()); a whole segment '*' or '?' is refused: a query for that
#   type would be a wildcard and match others (segments merely containing them are fine);
# - a source timestamp is any calendar time from 0001-01-01 to 9999-12-31 UTC (before
#   1970 too), `us` 0..999999: what every protocol can render (ISO 8601 text, the BUS's
#   producer timestamps, Arrow) and order (integer microseconds). The reference keeps
#   any int64 `s` and uint32 `us`, which it cannot render either;
# - a JSON payload is JSON text whose every number a reader can hold as a finite double:
#   NaN and ±Infinity (Python's json reads and writes them, JSON has no such literals)
#   and number literals beyond ±1.8e308 (1e400, an integer of 309 digits: Python reads
#   1e400 as inf, JavaScript's JSON.parse reads either as Infinity) are refused, so that
#   no protocol (Jetstream's frames, a client's JSON.parse) is handed text it cannot read.
WILDCARD_SEGMENTS = ("*", "?")
SOURCE_TS_MIN_S = -62_135_596_800  # 0001-01-01T00:00:00Z
SOURCE_TS_MAX_S = 253_402_300_799  # 9999-12-31T23:59:59Z

# The first type segment reserved for events the servers register themselves
# (`('event', N, 'synced', M)` sync states): clients may not register under it.
RESERVED_TYPE_PREFIX = "event"


def event_type_error(t: Any) -> str | None:
    """Why `t` cannot be a registered event's type (the shared rule above), or None."""
    if type(t) is not tuple and not isinstance(t, tuple):
        return f"type {t!r} must be a list of strings"
    # Written for the register hot path (every event of every request passes here):
    # tuple membership tests run in C, a generator per check cost more than the checks.
    for s in t:
        if type(s) is not str and not isinstance(s, str):
            return f"type {t!r} must be a list of strings"
    if "*" in t or "?" in t:
        return f"type {list(t)!r} has a wildcard segment ('*' or '?' alone)"
    return None


def source_timestamp_error(t: Any) -> str | None:
    """Why `t` cannot be a source timestamp (the shared rule above), or None."""
    if not isinstance(t, Timestamp):
        return f"sourceTimestamp {t!r} is invalid"
    if not (0 <= t.us < _US and SOURCE_TS_MIN_S <= t.s <= SOURCE_TS_MAX_S):
        return (
            f"sourceTimestamp s={t.s} us={t.us} is out of range (years 1..9999: "
            f"s {SOURCE_TS_MIN_S}..{SOURCE_TS_MAX_S}, us 0..999999)"
        )
    return None


class InvalidEvent(ValueError):
    """An event that no protocol may register (the shared rule above); the message
    names the event and the bad value."""


class _BadNumber(ValueError):
    def __init__(self, literal: str) -> None:
        super().__init__(bad_number_message(literal))


def bad_number_message(literal: str) -> str:
    """The shared rule's words for a number no JSON reader can hold, naming it."""
    shown = literal if len(literal) <= 24 else f"{literal[:12]}... ({len(literal)} characters)"
    return (
        f"the number {shown} is not a finite double (NaN, Infinity and numbers beyond "
        "±1.8e308 are refused: JSON readers cannot hold them)"
    )


def json_value_error(value: Any) -> str | None:
    """`json_payload_error` for a value already decoded (Python's json reads NaN,
    Infinity and 1e400 as floats, an integer of any length as an int): why it breaks
    the number rule, or None. Walks the value; for text prefer `json_payload_error`."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is float:
            if not math.isfinite(v):  # written as the JSON text that carried it would be
                return bad_number_message("NaN" if v != v else "Infinity" if v > 0 else "-Infinity")
        elif t is int:
            if v > _MAX_EXACT or v < -_MAX_EXACT:
                try:
                    float(v)
                except OverflowError:
                    return bad_number_message(str(v) if v.bit_length() < 4000 else "an integer")
        elif t is dict:
            stack.extend(v.values())
        elif t is list or t is tuple:
            stack.extend(v)
    return None


_MAX_EXACT = 1 << 1000  # below this every int converts to a double: no float() needed


def _refuse_constant(literal: str) -> float:
    raise _BadNumber(literal)  # NaN, Infinity, -Infinity


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # float() never gives NaN from a JSON number literal
        raise _BadNumber(literal)
    return value


def _finite_int(literal: str) -> int:
    value = int(literal)
    try:
        float(value)
    except OverflowError:
        raise _BadNumber(literal) from None
    return value


# The decoders of the check. Hooks are Python calls per literal: NaN/Infinity cost
# nothing until they appear, the float hook one call per float literal; the integer
# hook only where an integer beyond a double (309 digits at least) could be, since it
# would double the parse of an integer-heavy payload.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
_DECODER_INTS = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_finite_int
)
_MIN_BAD_INT_DIGITS = 309  # 10**308 < 1.8e308 < 10**309
# Any 309 consecutive characters hold two adjacent ones of every 154th character: a
# 309-digit run shows as two digits side by side in `text[::154]`. Scanning the sample
# costs a fraction of scanning the text (which would add a third to a parse).
_STRIDE = _MIN_BAD_INT_DIGITS // 2
_TWO_DIGITS = re.compile("[0-9]{2}")


def _may_hold_big_int(text: str) -> bool:
    return len(text) >= _MIN_BAD_INT_DIGITS and _TWO_DIGITS.search(text[::_STRIDE]) is not None


def encoded_json_error(text: str) -> str | None:
    """`json_payload_error` for JSON text this server encoded with ``allow_nan=False``
    (no NaN, Infinity or 1e400 can be in it): only an integer beyond a double can
    break the rule, so the text is parsed only where it has 309 digits or more."""
    return json_payload_error(text) if _may_hold_big_int(text) else None


def json_payload_error(text: Any) -> str | None:
    """Why `text` cannot be a JSON payload (the shared rule above), or None."""
    if not isinstance(text, str):
        return "JSON payload must be text"
    decoder = _DECODER_INTS if _may_hold_big_int(text) else _DECODER
    # The C scanner straight away (what `decode` runs, without its two Python frames:
    # ~0.65 of 1.4 µs for a small payload, on every JSON event registered): a text that
    # is one JSON value from its first to its last character is valid. Anything else
    # (leading or trailing whitespace, errors) goes through `decode`, for its answer and
    # its exact error message.
    try:
        if decoder.scan_once(text, 0)[1] == len(text):
            return None
    except (_BadNumber, ValueError, RecursionError, StopIteration):
        pass
    try:
        decoder.decode(text)
    except _BadNumber as err:
        return f"JSON payload: {err}"
    except (ValueError, RecursionError) as err:
        return f"JSON payload is not valid JSON: {str(err)[:200]}"
    return None


def check_register_event(i: int, e: RegisterEvent) -> None:
    """Refuse what no event may be, naming event `i` and the bad value (`InvalidEvent`).

    The shared rule (above): types are lists of strings without a whole-segment
    wildcard; source timestamps within years 1..9999, us 0..999999; a JSON payload must
    parse, its numbers finite doubles. Deployment limits (sizes, counts) are the
    protocol's (see eventer.limits).
    """
    error = event_type_error(e.type)
    if error is not None:
        raise InvalidEvent(f"event {i}: {error}")
    st = e.source_timestamp
    if st is not None and (error := source_timestamp_error(st)) is not None:
        raise InvalidEvent(f"event {i}: {error}")
    p = e.payload
    if isinstance(p, EventPayloadJson):
        if (error := json_payload_error(p.data)) is not None:
            raise InvalidEvent(f"event {i}: {error}")
    elif p is not None and not isinstance(p, EventPayloadBinary):
        raise InvalidEvent(f"event {i}: payload {p!r} is invalid")
