"""SQLite schema and the SQL text of every query the storage runs.

Kept apart from `Storage` so that tests can run ``EXPLAIN QUERY PLAN`` over exactly
the statements the storage executes.

Tables (all STRICT, so a value of the wrong type is an error instead of being stored
with a surprising affinity):

``events``
    one row per event; ``seq`` (the rowid) is the local arrival sequence number,
    timestamps are integer microseconds, ``type_id`` points into ``types``,
    ``kind`` is 0 (no payload), 1 (binary: ``ptype`` + BLOB ``payload``) or
    2 (JSON: TEXT ``payload``).
``types``
    ``type_id`` <-> event type (a JSON array of strings); cached in memory.
``latest``
    the greatest event (by natural key) of each type, with its key, so the
    ``latest`` query and the write-time comparison never scan ``events``.
``last_ids``
    highest event id ever held per server id; retention never touches it.
``state``
    one row: ``last_seq`` (never reused, so not derivable from ``events`` after
    deletes) and ``event_count``.
``meta``
    JSON values by key for the engine.
``event_keys``
    protocol keys of events (the Event BUS UUID) -> local sequence number; an index a
    protocol maintains after commit and can rebuild from ``events`` (``event_keys_seq``
    in ``meta`` is how far it got). Created on open when missing (additive, no version
    change).
"""

from __future__ import annotations

SCHEMA_VERSION = 1

DDL = """
CREATE TABLE state (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    last_seq INTEGER NOT NULL,
    event_count INTEGER NOT NULL
) STRICT;
INSERT INTO state (id, last_seq, event_count) VALUES (0, 0, 0);

CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TABLE types (
    type_id INTEGER PRIMARY KEY,
    type TEXT NOT NULL UNIQUE
) STRICT;

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
    payload ANY
) STRICT;

-- identity: idempotent writes, sentinel lookup, server queries (instance order)
CREATE UNIQUE INDEX events_id ON events (server, instance);
-- timeseries by timestamp; type_id rides along so type filters need no row lookup
CREATE INDEX events_ts ON events (ts, server, session, instance, type_id);
-- timeseries by source timestamp; events without one never appear in such queries
CREATE INDEX events_source_ts ON events (source_ts, ts, server, session, instance, type_id)
    WHERE source_ts IS NOT NULL;
-- timeseries of a few types (merged per type) and the latest fallback after deletes
CREATE INDEX events_type_ts ON events (type_id, ts, server, session, instance);

CREATE TABLE latest (
    type_id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    server INTEGER NOT NULL,
    session INTEGER NOT NULL,
    instance INTEGER NOT NULL
) STRICT;

CREATE TABLE last_ids (
    server INTEGER PRIMARY KEY,
    session INTEGER NOT NULL,
    instance INTEGER NOT NULL
) STRICT;
"""

EVENT_KEYS_DDL = """
CREATE TABLE IF NOT EXISTS event_keys (
    key TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
) STRICT, WITHOUT ROWID
"""
INSERT_EVENT_KEY = "INSERT OR IGNORE INTO event_keys (key, seq) VALUES (?, ?)"
FIND_EVENT_KEYS = "SELECT key, seq FROM event_keys WHERE key IN (SELECT value FROM json_each(?))"
EVENT_KEYS_META = "event_keys_seq"

# Columns read for every event, in the order `Storage` decodes them.
COLS = "server, session, instance, type_id, ts, source_ts, kind, ptype, payload"

INSERT_EVENT = (
    "INSERT INTO events (seq, server, session, instance, type_id, ts, source_ts, kind, ptype,"
    " payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_TYPE = "INSERT INTO types (type_id, type) VALUES (?, ?)"
IS_HELD = "SELECT 1 FROM events WHERE server = ? AND instance = ?"

# Rows are processed one after another, so several events of one type in a batch end
# with the greatest of them. (`WHERE seq >= ?` also ends the SELECT so that SQLite does
# not read ON CONFLICT as a join constraint.)
UPSERT_LATEST = """
INSERT INTO latest (type_id, seq, ts, server, session, instance)
SELECT type_id, seq, ts, server, session, instance FROM events WHERE seq >= ?
ON CONFLICT (type_id) DO UPDATE SET
    seq = excluded.seq, ts = excluded.ts, server = excluded.server,
    session = excluded.session, instance = excluded.instance
WHERE (excluded.ts, excluded.server, excluded.session, excluded.instance)
    > (latest.ts, latest.server, latest.session, latest.instance)
"""

# SQLite takes bare columns from the row holding max(), so `session` belongs to it.
# NOT INDEXED: left alone, the planner serves GROUP BY from events_id, scanning the
# whole index on every write; the rowid range of the batch is what we want.
UPSERT_LAST_IDS = """
INSERT INTO last_ids (server, session, instance)
SELECT server, session, max(instance) FROM events NOT INDEXED WHERE seq >= ? GROUP BY server
ON CONFLICT (server) DO UPDATE SET session = excluded.session, instance = excluded.instance
WHERE excluded.instance > last_ids.instance
RETURNING server, session, instance
"""

UPDATE_STATE = "UPDATE state SET last_seq = ?, event_count = event_count + ? WHERE id = 0"
UPSERT_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)

_EVENTS_COLS = ", ".join(f"events.{c}" for c in COLS.split(", "))
LATEST_ALL = f"SELECT {_EVENTS_COLS} FROM latest JOIN events USING (seq)"
LATEST_TYPES = (
    f"SELECT {_EVENTS_COLS} FROM latest JOIN events USING (seq)"
    " WHERE latest.type_id IN (SELECT value FROM json_each(?))"
)
LATEST_TYPES_SEQ = (
    f"SELECT seq, {_EVENTS_COLS} FROM latest JOIN events USING (seq)"
    " WHERE latest.type_id IN (SELECT value FROM json_each(?))"
)

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
SINCE_SEQ = f"SELECT seq, {COLS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"

# Retention.
DELETE_OLDER = (
    "DELETE FROM events WHERE seq IN"
    " (SELECT seq FROM events INDEXED BY events_ts WHERE ts < ? LIMIT ?)"
)
DELETE_FIRST = "DELETE FROM events WHERE seq IN (SELECT seq FROM events ORDER BY seq LIMIT ?)"
STALE_LATEST = (
    "SELECT type_id FROM latest WHERE NOT EXISTS (SELECT 1 FROM events WHERE seq = latest.seq)"
)
NEWEST_OF_TYPE = (
    "SELECT seq, ts, server, session, instance FROM events INDEXED BY events_type_ts"
    " WHERE type_id = ? ORDER BY ts DESC, server DESC, session DESC, instance DESC LIMIT 1"
)
REPLACE_LATEST = (
    "INSERT OR REPLACE INTO latest (type_id, seq, ts, server, session, instance)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
DELETE_LATEST = "DELETE FROM latest WHERE type_id = ?"
DELETED_STATE = "UPDATE state SET event_count = event_count - ? WHERE id = 0"


_TS_KEY = ("ts", "server", "session", "instance")
_SOURCE_KEY = ("source_ts", "ts", "server", "session", "instance")


def timeseries_sql(
    *,
    source: bool,
    descending: bool,
    source_filter: bool,
    types: int | None,
    after: bool,
) -> str:
    """The SQL of one timeseries query shape (named parameters).

    `source`: order by source timestamp (else timestamp). `source_filter`: bound the
    source timestamp while ordering by timestamp. `types`: None for no type filter,
    ``0`` for a ``type_id IN json_each(:types)`` filter on the ordering index, ``n > 0``
    for a merge of n per-type range scans on ``events_type_ts`` (SQLite merges the
    ordered arms lazily, so the cost is O(page·log n + n)). `after`: continue after
    the sentinel key (``:k0``..``:k4``) with a row-value comparison on the index.

    Parameters: ``:lo``/``:hi`` bound the timestamp, ``:slo``/``:shi`` the source
    timestamp, ``:t0``.. are type ids, ``:types`` a JSON array of type ids,
    ``:limit`` the page size plus one.
    """
    if source and types:
        raise ValueError("per-type merge is only built for timestamp order")
    key = _SOURCE_KEY if source else _TS_KEY
    cmp = "<" if descending else ">"
    direction = " DESC" if descending else ""
    order = ", ".join(k + direction for k in key)
    # With a sentinel its key already bounds the start of the range; a second bound on
    # the same side would compete with the row-value range for the index.
    start_bound = "hi" if descending else "lo"

    conds: list[str] = []
    if source:
        conds.append("source_ts IS NOT NULL")
        for name, op in (("slo", ">="), ("shi", "<=")):
            if not (after and name[1:] == start_bound):
                conds.append(f"source_ts {op} :{name}")
        conds.append("ts >= :lo AND ts <= :hi")
    else:
        for name, op in (("lo", ">="), ("hi", "<=")):
            if not (after and name == start_bound):
                conds.append(f"ts {op} :{name}")
        if source_filter:
            conds.append("source_ts >= :slo AND source_ts <= :shi")
    if after:
        params = ", ".join(f":k{i}" for i in range(len(key)))
        conds.append(f"({', '.join(key)}) {cmp} ({params})")

    if types:
        arms = [
            f"SELECT {COLS} FROM events INDEXED BY events_type_ts"
            f" WHERE type_id = :t{i} AND {' AND '.join(conds)}"
            for i in range(types)
        ]
        return f"{' UNION ALL '.join(arms)} ORDER BY {order} LIMIT :limit"

    if types == 0:
        conds.append("type_id IN (SELECT value FROM json_each(:types))")
    index = "events_source_ts" if source else "events_ts"
    return (
        f"SELECT {COLS} FROM events INDEXED BY {index}"
        f" WHERE {' AND '.join(conds)} ORDER BY {order} LIMIT :limit"
    )
