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
    timestamp_to_us,
)
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
    return codec.repo.encode(EVENTS, [codec.event_to_sbs(e) for e in events])


def decode_events(data: bytes, server_id: int) -> list[Event]:
    """Decode one MsgEvents for a stream of `server_id` and check it as a whole.

    Nothing of a message that fails here is stored: the stream is closed instead.
    """
    try:
        events = [codec.event_from_sbs(e) for e in codec.repo.decode(EVENTS, data)]
    except Exception as e:
        raise ProtocolError(f"MsgEvents does not decode: {e}") from e
    if not events:
        raise ProtocolError("MsgEvents is empty")
    session = events[0].id.session
    for i, e in enumerate(events):
        check_event(i, e)
        if e.id.server != server_id:
            raise ProtocolError(
                f"event {i} {tuple(e.id)} is of server {e.id.server}, "
                f"this stream is for server {server_id}"
            )
        if e.id.session != session:
            raise ProtocolError(
                f"MsgEvents mixes sessions {session} and {e.id.session} (event {i})"
            )
    return events


def check_event(i: int, e: Event) -> None:
    """Reject values storage would refuse, so a bad event never fails a shared commit."""
    if not (0 <= e.id.session <= MAX_ID and 0 <= e.id.instance <= MAX_ID):
        raise ProtocolError(f"event {i}: id {tuple(e.id)} is outside 0..2^63-1")
    if any(s in ("?", "*") for s in e.type):
        raise ProtocolError(f"event {i}: type {list(e.type)!r} contains a wildcard segment")
    try:
        timestamp_to_us(e.timestamp)
        if e.source_timestamp is not None:
            timestamp_to_us(e.source_timestamp)
    except ValueError as err:
        raise ProtocolError(f"event {i} {tuple(e.id)}: {err}") from err
    p = e.payload
    if isinstance(p, EventPayloadJson | EventPayloadBinary):
        for value in (p.data,) if isinstance(p, EventPayloadJson) else (p.type,):
            try:
                value.encode()
            except UnicodeError as err:
                raise ProtocolError(f"event {i} {tuple(e.id)}: payload text: {err}") from err


def split_sessions(events: list[Event]) -> list[list[Event]]:
    """Consecutive runs of one (server, session): the unit of one MsgEvents."""
    groups: list[list[Event]] = []
    for e in events:
        if groups and groups[-1][0].id[:2] == e.id[:2]:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups
