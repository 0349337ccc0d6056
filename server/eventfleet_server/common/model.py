"""The event model (HatEventer 0.9 records as Python values).

Timestamps travel as ``{s, us}`` and are stored as one integer of microseconds;
`timestamp_to_us` rejects values that would not round-trip (``us`` outside
0..999999 or beyond the signed 64-bit range), so ordering by the stored integer is
the same as ordering by ``(s, us)``.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Iterable
from typing import NamedTuple

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


# Source timestamps a client may give: the Unix epoch up to the end of year 9999.
# Anything else is a client bug (uninitialised clocks, ms taken for s) that would sort
# oddly forever; refusing it says so at once.
SOURCE_TS_MIN_S = 0
SOURCE_TS_MAX_S = 253_402_300_799

# The first type segment reserved for events the servers register themselves
# (`('event', N, 'synced', M)` sync states): clients may not register under it.
RESERVED_TYPE_PREFIX = "event"


def check_register_event(i: int, e: RegisterEvent) -> None:
    """Refuse what no event may be, naming event `i` and the bad value (`ValueError`).

    Types: a non-empty list of non-empty strings without wildcards. Payloads: JSON text
    must parse. Source timestamps: within the epoch .. year 9999, us 0..999999.
    Deployment limits (sizes, counts) are the protocol's (see eventer.limits).
    """
    # Written for the register hot path (every event of every request passes here):
    # tuple membership tests run in C, a generator per check cost more than the checks.
    t = e.type
    if type(t) is not tuple and not isinstance(t, tuple):
        raise ValueError(f"event {i}: type {t!r} must be a list of strings")
    for s in t:
        if type(s) is not str and not isinstance(s, str):
            raise ValueError(f"event {i}: type {t!r} must be a list of strings")
    if not t:
        raise ValueError(f"event {i}: type is empty")
    if "" in t:
        raise ValueError(f"event {i}: type {list(t)!r} has an empty segment")
    if "*" in t or "?" in t:
        raise ValueError(f"event {i}: type {list(t)!r} contains a wildcard segment")
    st = e.source_timestamp
    if st is not None:
        if not isinstance(st, Timestamp):
            raise ValueError(f"event {i}: sourceTimestamp {st!r} is invalid")
        if not (0 <= st.us < _US and SOURCE_TS_MIN_S <= st.s <= SOURCE_TS_MAX_S):
            raise ValueError(
                f"event {i}: sourceTimestamp {st.s}.{st.us:06d} is out of range "
                f"(s {SOURCE_TS_MIN_S}..{SOURCE_TS_MAX_S}, us 0..999999)"
            )
    p = e.payload
    if isinstance(p, EventPayloadJson):
        if not isinstance(p.data, str):
            raise ValueError(f"event {i}: JSON payload must be text")
        try:
            json.loads(p.data)
        except ValueError as err:
            raise ValueError(f"event {i}: JSON payload is not valid JSON: {err}") from None
    elif p is not None and not isinstance(p, EventPayloadBinary):
        raise ValueError(f"event {i}: payload {p!r} is invalid")
