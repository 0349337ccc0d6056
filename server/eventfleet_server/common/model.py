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
#   any int64 `s` and uint32 `us`, which it cannot render either.
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


def check_register_event(i: int, e: RegisterEvent) -> None:
    """Refuse what no event may be, naming event `i` and the bad value (`ValueError`).

    The shared rule (above): types are lists of strings without a whole-segment
    wildcard; source timestamps within years 1..9999, us 0..999999; a JSON payload must
    parse. Deployment limits (sizes, counts) are the protocol's (see eventer.limits).
    """
    error = event_type_error(e.type)
    if error is not None:
        raise ValueError(f"event {i}: {error}")
    st = e.source_timestamp
    if st is not None and (error := source_timestamp_error(st)) is not None:
        raise ValueError(f"event {i}: {error}")
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
