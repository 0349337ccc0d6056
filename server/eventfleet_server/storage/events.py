"""The ``events`` table: one row per event, its indexes, and every read of it.

Columns: ``seq`` (the rowid) is the local arrival sequence number; timestamps are
integer microseconds; ``type_id`` points into ``types``; ``kind`` is 0 (no payload),
1 (binary: ``ptype`` + BLOB ``payload``) or 2 (JSON: TEXT ``payload``). The columns
are what indexes, retention, the Arrow export and the backup digest read.

``sbs`` is the event's HatEventer ``Event`` encoding, made once when the event is
committed (schema version 2). Eventer answers and notifications and Syncer messages
are SBS arrays of ``Event``; an SBS array is its element count followed by the
concatenated elements, so a reply is a header plus stored ``sbs`` values joined — no
row is turned back into model objects on those paths (`common.codec.events_array`).

``bus`` is the Event BUS's record of the event, or NULL: the msgpack array ``[producer,
timestamp, uuid, data]`` of bin values, the frames its SYNC and BROADCAST carry after the
topic (the topic comes from the type, the sequence is ``seq``). It is made when the event
is committed, by the protocol that has it at hand (`Storage.set_bus_recorder`: a PUB's
own frames, an envelope merged from a peer), and written in the event's own `INSERT`.
NULL means "none stored" — events that did not come in as BUS envelopes, a peer's
envelopes merged while nobody subscribed, and every event of a store written before
records were stored (schema 2 already had the column, always NULL then): readers build
the record from the columns (`BUS_COLUMNS`, read only for such rows). The storage never
builds or parses a record.

Since schema version 5 the table has one index, its identity (``events_id``): what
queries order and filter by (timestamp, source timestamp, type) lives in tables of its
own, folded in after the commit (`indexes`), so a commit writes the row and its identity
only. A store migrated from version 4 keeps that version's ``typed`` column, no longer
read or written (its DEFAULT fills new rows).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    EventType,
    Timestamp,
    timestamp_to_us,
)

_US = 1_000_000
MIN_I64 = -(1 << 63)
MAX_I64 = (1 << 63) - 1
KIND_NONE, KIND_BINARY, KIND_JSON = 0, 1, 2

DDL = """
CREATE TABLE events (
    seq INTEGER PRIMARY KEY,
    server INTEGER NOT NULL,
    session INTEGER NOT NULL,
    instance INTEGER NOT NULL,
    type_id INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    source_ts INTEGER,
    kind INTEGER NOT NULL,
    ptype TEXT,
    payload ANY,
    sbs BLOB NOT NULL,
    bus BLOB
) STRICT;

-- identity: idempotent writes, sentinel lookup, server queries (instance order)
CREATE UNIQUE INDEX events_id ON events (server, instance);
"""

# Columns read to rebuild an event, in the order `decode` takes them.
COLS = "server, session, instance, type_id, ts, source_ts, kind, ptype, payload"

# New rows wait outside the folded indexes (`indexes`) until the next fold.
INSERT = (
    "INSERT INTO events (seq, server, session, instance, type_id, ts, source_ts, kind, ptype,"
    " payload, sbs, bus) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# `INSERT` of rows without the ``bus`` value (NULL): merge rows nobody made records for.
INSERT_NO_BUS = (
    "INSERT INTO events (seq, server, session, instance, type_id, ts, source_ts, kind, ptype,"
    " payload, sbs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
IS_HELD = "SELECT 1 FROM events WHERE server = ? AND instance = ?"

# The sentinel of a timeseries query, found by its id through the unique index.
SENTINEL = (
    "SELECT ts, source_ts, type_id FROM events INDEXED BY events_id"
    " WHERE server = ? AND instance = ? AND session = ?"
)

# Server queries: for one server id `session` never decreases while `instance` grows
# (DESIGN §4), so instance order is the (session, instance) order.
SERVER = (
    f"SELECT {COLS} FROM events INDEXED BY events_id"
    " WHERE server = ? AND instance > ? ORDER BY instance LIMIT ?"
)
SERVER_SBS = (
    "SELECT sbs FROM events INDEXED BY events_id"
    " WHERE server = ? AND instance > ? ORDER BY instance LIMIT ?"
)
# The Syncer's history: what it groups by (session), filters by (type) and sends (sbs).
SERVER_STREAM = (
    "SELECT session, instance, type_id, sbs FROM events INDEXED BY events_id"
    " WHERE server = ? AND instance > ? ORDER BY instance LIMIT ?"
)
SINCE_SEQ = f"SELECT seq, {COLS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
# The Event BUS's snapshot: the stored records, and the columns a record is built from
# for the rows stored without one (converting those columns for every row cost the
# snapshot half again its SQL time).
BUS_SINCE_SEQ = "SELECT seq, type_id, bus FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
BUS_COLUMNS = (
    "SELECT seq, server, session, instance, ts, source_ts, ptype, payload FROM events"
    " WHERE seq IN (SELECT value FROM json_each(?))"
)

# Retention.
# Reads the folded timestamp index: the caller folds first (`indexes`).
DELETE_OLDER = "DELETE FROM events WHERE seq IN (SELECT seq FROM events_by_ts WHERE ts < ? LIMIT ?)"
DELETE_FIRST = "DELETE FROM events WHERE seq IN (SELECT seq FROM events ORDER BY seq LIMIT ?)"


def encode(event: Event) -> bytes:
    """The stored ``sbs`` value of `event`."""
    return codec.encode_event(event)


def row(seq: int, event: Event, type_id: int, sbs: bytes | None, bus: bytes | None = None) -> tuple:
    """The `INSERT` parameters of `event` (raises TypeError/ValueError naming the bad
    field); `sbs` is encoded here when None, `bus` is stored as given."""
    event_id = event.id
    source = event.source_timestamp
    payload = event.payload
    if payload is None:
        kind, ptype, data = KIND_NONE, None, None
    elif type(payload) is EventPayloadJson:
        kind, ptype, data = KIND_JSON, None, payload.data
        if type(data) is not str:
            raise TypeError(f"JSON payload data {data!r} is not a str")
    elif type(payload) is EventPayloadBinary:
        kind, ptype, data = KIND_BINARY, payload.type, payload.data
        if type(ptype) is not str or not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"binary payload {payload!r} needs str type, bytes")
    else:
        raise TypeError(f"payload {payload!r} is not a model payload")
    return (
        seq,
        event_id.server,
        event_id.session,
        event_id.instance,
        type_id,
        timestamp_to_us(event.timestamp),
        None if source is None else timestamp_to_us(source),
        kind,
        ptype,
        data,
        _encode_checked(event) if sbs is None else sbs,
        bus,
    )


def _encode_checked(event: Event) -> bytes:
    for value in event.id:
        if type(value) is not int or not MIN_I64 <= value <= MAX_I64:
            raise ValueError(f"id {value!r} is not a 64-bit integer")
    try:
        return encode(event)
    except UnicodeError as e:
        raise ValueError(f"text is not valid UTF-8: {e}") from None
    except OverflowError as e:
        raise ValueError(f"a value is out of range: {e}") from None


def decode(rows: list[tuple], types: list[EventType | None]) -> list[Event]:
    """Model events of `COLS` rows (the paths that need objects: BUS, Replication,
    in-process callers)."""
    out = []
    append = out.append
    # NamedTuples built with tuple.__new__: their generated __new__ is a Python-level
    # call per object.
    new = tuple.__new__
    for server, session, instance, type_id, ts, sts, kind, ptype, data in rows:
        source = None if sts is None else new(Timestamp, divmod(sts, _US))
        if kind == KIND_JSON:
            payload = new(EventPayloadJson, (data,))
        elif kind == KIND_BINARY:
            payload = new(EventPayloadBinary, (ptype, data))
        else:
            payload = None
        append(
            new(
                Event,
                (
                    new(EventId, (server, session, instance)),
                    types[type_id],
                    new(Timestamp, divmod(ts, _US)),
                    source,
                    payload,
                ),
            )
        )
    return out


def diagnose(
    events: Sequence[Event], rows: list[tuple], inserted: list[tuple[int, Event]], error: Exception
) -> str:
    """Name the event whose row SQLite refused (only runs after a failed insert)."""
    for r, (_, event) in zip(rows, inserted, strict=True):
        problem = None
        for value in r[1:4]:
            if type(value) is not int or not MIN_I64 <= value <= MAX_I64:
                problem = f"id {value!r} is not a 64-bit integer"
        for value in r[8:10]:
            if isinstance(value, str):
                try:
                    value.encode()
                except UnicodeError:
                    problem = "text is not valid UTF-8"
        if problem is not None:
            index = next(i for i, e in enumerate(events) if e is event)
            return f"{describe(index, event)}: {problem}: {error}"
    return f"write of {len(rows)} events failed: {error}"


def describe(index: int, event: Any) -> str:
    text = repr(event)
    if len(text) > 300:
        text = text[:300] + "..."
    return f"event {index} {text}"


def is_held(conn: sqlite3.Connection, server: int, instance: int) -> bool:
    return bool(conn.execute(IS_HELD, (server, instance)).fetchall())


def top_instance(last_ids: dict, server: int) -> float:
    last = last_ids.get(server)
    return last.instance if last is not None else -math.inf
