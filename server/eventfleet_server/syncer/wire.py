"""HatSyncer messages: names, encoding and validation shared by the server and client.

Message table (seed): the client opens with ``MsgInitReq`` (first, not last) and the
server answers ``MsgInitRes`` in that conversation. The server then sends history as
``MsgEvents`` (one session per message), ``MsgSynced``, and live ``MsgEvents``, each in a
conversation of its own. ``MsgFlushReq`` opens a conversation (not last) that the
client closes with ``MsgFlushRes`` once everything it received before is committed.
"""

from __future__ import annotations

from typing import NamedTuple

from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Timestamp,
    event_type_error,
    source_timestamp_error,
    timestamp_to_us,
)
from eventfleet_server.common.sbsguard import check_bounds
from eventfleet_server.common.subscription import Subscription

P = "HatSyncer."
INIT_REQ = P + "MsgInitReq"
INIT_RES = P + "MsgInitRes"
SYNCED = P + "MsgSynced"
EVENTS = P + "MsgEvents"
FLUSH_REQ = P + "MsgFlushReq"
FLUSH_RES = P + "MsgFlushRes"

MAX_ID = (1 << 63) - 1  # ids are stored as SQLite 64-bit integers

_NONE_DATA = codec.repo.encode(SYNCED, None)


class ProtocolError(Exception):
    """The peer broke the protocol; the message says how (names the bad value)."""


class InitReq(NamedTuple):
    last_event_id: EventId
    client_name: str
    client_token: str | None
    subscription: Subscription


def encode_init_req(
    last_event_id: EventId, client_name: str, token: str | None, subscriptions
) -> bytes:
    return codec.repo.encode(
        INIT_REQ,
        {
            "lastEventId": codec.event_id_to_sbs(last_event_id),
            "clientName": client_name,
            "clientToken": codec.opt(token),
            "subscriptions": [list(s) for s in subscriptions],
        },
    )


def decode_init_req(data: bytes) -> InitReq:
    """Decode and validate; `ProtocolError` names the bad field."""
    try:
        # Before the token is checked: bounds first, the C decoder only after.
        check_bounds(codec.repo, INIT_REQ, data)
        raw = codec.repo.decode(INIT_REQ, data)
    except Exception as e:
        raise ProtocolError(f"MsgInitReq does not decode: {e}") from e
    last = codec.event_id_from_sbs(raw["lastEventId"])
    if not 1 <= last.server <= MAX_ID:
        raise ProtocolError(f"lastEventId.server {last.server} is not a valid server id")
    if not (0 <= last.session <= MAX_ID and 0 <= last.instance <= MAX_ID):
        raise ProtocolError(f"lastEventId {tuple(last)} is outside 0..2^63-1")
    try:
        subscription = Subscription(raw["subscriptions"])
    except ValueError as e:
        raise ProtocolError(str(e)) from e
    token = raw["clientToken"][1] if raw["clientToken"][0] == "value" else None
    return InitReq(last, raw["clientName"], token, subscription)


def encode_init_res(error: str | None) -> bytes:
    return codec.repo.encode(INIT_RES, ("success", None) if error is None else ("error", error))


def decode_init_res(data: bytes) -> str | None:
    """None on success, else the server's error text."""
    try:
        kind, value = codec.repo.decode(INIT_RES, data)
    except Exception as e:
        raise ProtocolError(f"MsgInitRes does not decode: {e}") from e
    return None if kind == "success" else str(value)


def encode_none() -> bytes:
    """The body of MsgSynced, MsgFlushReq and MsgFlushRes (SBS None: empty)."""
    return _NONE_DATA


def encode_events(events: list[Event]) -> bytes:
    """MsgEvents of model events (the server sends stored bytes: `codec.events_array`)."""
    return codec.repo.encode(EVENTS, [codec.event_to_sbs(e) for e in events])


def decode_events_sbs(data: bytes, server_id: int) -> tuple[list[Event], list[bytes]]:
    """`decode_events`, and each event's SBS bytes as received (stored as they are, so
    a merged event is never encoded again).

    The catch-up hot path: one walk of the encoding gives both the events and their
    bytes (`codec.decode_events_array`; the C decoder's dicts plus a second walk for the
    bytes cost half as much again), then the same checks as `decode_events`."""
    try:
        events, elements = codec.decode_events_array(data)
    except ValueError as e:
        raise ProtocolError(f"MsgEvents does not decode: {e}") from e
    if not events:
        raise ProtocolError("MsgEvents is empty")
    session = events[0].id.session
    check_timestamp = _check_timestamp
    for i, event in enumerate(events):
        eid = event.id
        if eid.server != server_id:
            raise ProtocolError(
                f"event {i} {tuple(eid)} is of server {eid.server}, "
                f"this stream is for server {server_id}"
            )
        if eid.session != session:
            raise ProtocolError(f"MsgEvents mixes sessions {session} and {eid.session} (event {i})")
        if not (0 <= eid.session <= MAX_ID and 0 <= eid.instance <= MAX_ID):
            raise ProtocolError(f"event {i}: id {tuple(eid)} is outside 0..2^63-1")
        event_type = event.type
        if "*" in event_type or "?" in event_type:
            raise ProtocolError(f"event {i}: type {list(event_type)!r} contains a wildcard segment")
        check_timestamp(i, eid, event.timestamp)
        if event.source_timestamp is not None:
            check_timestamp(i, eid, event.source_timestamp)
    return events, elements


def decode_events(data: bytes, server_id: int) -> list[Event]:
    """Decode one MsgEvents for a stream of `server_id` and check it as a whole.

    Nothing of a message that fails here is stored: the stream is closed instead.
    This is the catch-up hot path (every event of a replica that was away passes
    here), hence one flat loop instead of the generic codec's per-field helpers.
    """
    try:
        raw = codec.repo.decode(EVENTS, data)
    except Exception as e:
        raise ProtocolError(f"MsgEvents does not decode: {e}") from e
    if not raw:
        raise ProtocolError("MsgEvents is empty")
    events: list[Event] = []
    append = events.append
    session = raw[0]["id"]["session"]
    # The model's NamedTuples built with tuple.__new__: their generated __new__ is a
    # Python-level call per object, five objects an event (a fifth of catch-up CPU).
    new = tuple.__new__
    check_timestamp = _check_timestamp
    try:
        for i, d in enumerate(raw):
            rid = d["id"]
            eid = new(EventId, (rid["server"], rid["session"], rid["instance"]))
            if eid[0] != server_id:
                raise ProtocolError(
                    f"event {i} {tuple(eid)} is of server {eid[0]}, "
                    f"this stream is for server {server_id}"
                )
            if eid[1] != session:
                raise ProtocolError(f"MsgEvents mixes sessions {session} and {eid[1]} (event {i})")
            if not (0 <= eid[1] <= MAX_ID and 0 <= eid[2] <= MAX_ID):
                raise ProtocolError(f"event {i}: id {tuple(eid)} is outside 0..2^63-1")
            event_type = tuple(d["type"])
            if (error := event_type_error(event_type)) is not None:  # the shared rule
                raise ProtocolError(f"event {i}: {error}")
            t = d["timestamp"]
            ts = new(Timestamp, (t["s"], t["us"]))
            check_timestamp(i, eid, ts)
            st = d["sourceTimestamp"]
            if st[0] == "value":
                source = new(Timestamp, (st[1]["s"], st[1]["us"]))
                if (error := source_timestamp_error(source)) is not None:  # the shared rule
                    raise ProtocolError(f"event {i} {tuple(eid)}: {error}")
            else:
                source = None
            p = d["payload"]
            if p[0] != "value":
                payload = None
            elif p[1][0] == "json":
                payload = new(EventPayloadJson, (p[1][1],))
            else:
                payload = new(EventPayloadBinary, (p[1][1]["type"], bytes(p[1][1]["data"])))
            append(new(Event, (eid, event_type, ts, source, payload)))
    except (KeyError, TypeError, IndexError) as e:
        raise ProtocolError(f"MsgEvents holds a malformed event: {e!r}") from e
    return events


_MIN_S = -(MAX_ID // 1_000_000) + 1
_MAX_S = MAX_ID // 1_000_000 - 1


def _check_timestamp(i: int, eid: EventId, t: Timestamp) -> None:
    # Cheap bounds first; the exact rule (timestamp_to_us) only near the edges.
    if not (0 <= t.us < 1_000_000 and _MIN_S < t.s < _MAX_S):
        try:
            timestamp_to_us(t)
        except ValueError as err:
            raise ProtocolError(f"event {i} {tuple(eid)}: {err}") from err
