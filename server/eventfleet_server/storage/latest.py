"""The ``latest`` table: the greatest event (by natural key) of each type, with its key,
so the ``latest`` query and the write-time comparison never scan ``events``.

A ``latest`` query is one pass over this table joined to ``events`` by ``seq`` (a
rowid lookup), answering with the stored ``sbs`` of each event; an explicit list of
types is one ``IN (json_each)`` pass over the primary key, whatever its length.
"""

from __future__ import annotations

import sqlite3

from eventfleet_server.storage import events

DDL = """
CREATE TABLE latest (
    type_id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    server INTEGER NOT NULL,
    session INTEGER NOT NULL,
    instance INTEGER NOT NULL
) STRICT;
"""

# Rows are processed one after another, so several events of one type in a batch end
# with the greatest of them. (`WHERE seq >= ?` also ends the SELECT so that SQLite does
# not read ON CONFLICT as a join constraint.)
UPSERT = """
INSERT INTO latest (type_id, seq, ts, server, session, instance)
SELECT type_id, seq, ts, server, session, instance FROM events WHERE seq >= ?
ON CONFLICT (type_id) DO UPDATE SET
    seq = excluded.seq, ts = excluded.ts, server = excluded.server,
    session = excluded.session, instance = excluded.instance
WHERE (excluded.ts, excluded.server, excluded.session, excluded.instance)
    > (latest.ts, latest.server, latest.session, latest.instance)
"""

_EVENTS_COLS = ", ".join(f"events.{c}" for c in events.COLS.split(", "))
ALL = f"SELECT {_EVENTS_COLS} FROM latest JOIN events USING (seq)"
TYPES = (
    f"SELECT {_EVENTS_COLS} FROM latest JOIN events USING (seq)"
    " WHERE latest.type_id IN (SELECT value FROM json_each(?))"
)
TYPES_SEQ = (
    f"SELECT seq, {_EVENTS_COLS} FROM latest JOIN events USING (seq)"
    " WHERE latest.type_id IN (SELECT value FROM json_each(?))"
)
ALL_SBS = "SELECT events.sbs FROM latest JOIN events USING (seq)"
TYPES_SBS = (
    "SELECT events.sbs FROM latest JOIN events USING (seq)"
    " WHERE latest.type_id IN (SELECT value FROM json_each(?))"
)

# Repair after retention deleted events.
STALE = "SELECT type_id FROM latest WHERE NOT EXISTS (SELECT 1 FROM events WHERE seq = latest.seq)"
# Reads the per-type index (`type_index`): the caller folds every event into it first.
NEWEST_OF_TYPE = (
    "SELECT seq, ts, server, session, instance FROM events_by_type WHERE type_id = ?"
    " ORDER BY ts DESC, server DESC, session DESC, instance DESC LIMIT 1"
)
REPLACE = (
    "INSERT OR REPLACE INTO latest (type_id, seq, ts, server, session, instance)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
DELETE = "DELETE FROM latest WHERE type_id = ?"


def update(conn: sqlite3.Connection, first_seq: int) -> None:
    """Fold the rows from `first_seq` on (the batch just inserted) into the table."""
    conn.execute(UPSERT, (first_seq,))


def repair(conn: sqlite3.Connection) -> None:
    """After a delete: a type whose latest event went falls back to its next newest, or
    disappears."""
    for (type_id,) in conn.execute(STALE).fetchall():
        newest = conn.execute(NEWEST_OF_TYPE, (type_id,)).fetchall()
        if newest:
            conn.execute(REPLACE, (type_id, *newest[0]))
        else:
            conn.execute(DELETE, (type_id,))
