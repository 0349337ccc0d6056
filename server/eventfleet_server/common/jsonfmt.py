"""Events as JSON-friendly values (CLI output, HTTP status, docs examples)."""

from __future__ import annotations

import base64
import datetime

from eventfleet_server.common import jsontext
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Timestamp,
)


def timestamp_to_iso(t: Timestamp) -> str:
    dt = datetime.datetime.fromtimestamp(t.s, datetime.UTC).replace(microsecond=t.us)
    return dt.isoformat().replace("+00:00", "Z")


def timestamp_from_iso(text: str) -> Timestamp:
    """ISO 8601 (naive means UTC) or a number of seconds since the epoch."""
    try:
        value = float(text)
    except ValueError:
        try:
            dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as e:
            raise ValueError(f"{text!r} is neither ISO 8601 nor seconds since the epoch") from e
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=datetime.UTC)
        delta = dt - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        total_us = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
        return Timestamp(*divmod(total_us, 1_000_000))
    total_us = round(value * 1_000_000)
    return Timestamp(*divmod(total_us, 1_000_000))


def event_id_to_json(i: EventId) -> dict:
    return {"server": i.server, "session": i.session, "instance": i.instance}


def event_to_json(e: Event) -> dict:
    out: dict = {
        "id": event_id_to_json(e.id),
        "type": list(e.type),
        "timestamp": timestamp_to_iso(e.timestamp),
        "source_timestamp": timestamp_to_iso(e.source_timestamp) if e.source_timestamp else None,
        "payload": None,
    }
    p = e.payload
    if isinstance(p, EventPayloadJson):
        value = jsontext.parse(p.data)
        if value is jsontext.NOT_JSON:
            out["payload"] = {"json_text": p.data}  # stored as sent
        else:
            out["payload"] = {"json": value}
    elif isinstance(p, EventPayloadBinary):
        out["payload"] = {"binary": {"type": p.type, "base64": base64.b64encode(p.data).decode()}}
    return out
