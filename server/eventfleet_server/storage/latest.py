"""The ``latest`` table: the greatest event (by natural key) of each type, with its key,
so the ``latest`` query and the write-time comparison never scan ``events``.

A ``latest`` query is one pass over this table joined to ``events`` by ``seq`` (a
rowid lookup), answering with the stored ``sbs`` of each event; an explicit list of
types is one ``IN (json_each)`` pass over the primary key, whatever its length.

The table is brought up to date by the folds (`FOLD`, with the folded indexes:
`indexes`), not by each commit: a commit of one event used to write this table's page
too. Its readers fold first; when a fold cannot be written, `query_sql` with ``tail``
adds the events not folded yet.
"""

from __future__ import annotations

import functools
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

# The rows of a seq range (two parameters), processed one after another, so several
# events of one type end with the greatest of them. (The WHERE also ends the SELECT so
# that SQLite does not read ON CONFLICT as a join constraint.)
FOLD = """
INSERT INTO latest (type_id, seq, ts, server, session, instance)
SELECT type_id, seq, ts, server, session, instance FROM events WHERE seq > ? AND seq <= ?
ON CONFLICT (type_id) DO UPDATE SET
    seq = excluded.seq, ts = excluded.ts, server = excluded.server,
    session = excluded.session, instance = excluded.instance
WHERE (excluded.ts, excluded.server, excluded.session, excluded.instance)
    > (latest.ts, latest.server, latest.session, latest.instance)
"""

EVENTS_COLS = ", ".join(f"events.{c}" for c in events.COLS.split(", "))
"""`events.COLS`, qualified for a join."""

# With the events not folded yet (``seq > :folded``): each type's greatest of its
# `latest` row and those events.
_WITH_TAIL = """
WITH candidates AS (
    SELECT type_id, seq, ts, server, session, instance FROM latest
    UNION ALL
    SELECT type_id, seq, ts, server, session, instance FROM events WHERE seq > :folded
), ranked AS (
    SELECT type_id, seq, row_number() OVER (
        PARTITION BY type_id ORDER BY ts DESC, server DESC, session DESC, instance DESC
    ) AS rank FROM candidates
)
"""


@functools.cache
def query_sql(cols: str, *, types: bool, tail: bool) -> str:
    """A ``latest`` query selecting `cols` (of ``events``, qualified), of the types in
    the JSON array ``:types`` or of all; with `tail`, also of the events above
    ``:folded`` (used when a fold could not be written)."""
    if not tail:
        sql = f"SELECT {cols} FROM latest JOIN events USING (seq)"
        where = " WHERE latest.type_id IN (SELECT value FROM json_each(:types))"
        return sql + (where if types else "")
    sql = f"{_WITH_TAIL}SELECT {cols} FROM ranked JOIN events USING (seq) WHERE rank = 1"
    return sql + (" AND ranked.type_id IN (SELECT value FROM json_each(:types))" if types else "")


# Repair after retention deleted events.
STALE = "SELECT type_id FROM latest WHERE NOT EXISTS (SELECT 1 FROM events WHERE seq = latest.seq)"
# Reads the folded per-type index (`indexes`): the caller folds first.
NEWEST_OF_TYPE = (
    "SELECT seq, ts, server, session, instance FROM events_by_type WHERE type_id = ?"
    " ORDER BY ts DESC, server DESC, session DESC, instance DESC LIMIT 1"
)
REPLACE = (
    "INSERT OR REPLACE INTO latest (type_id, seq, ts, server, session, instance)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
DELETE = "DELETE FROM latest WHERE type_id = ?"


def repair(conn: sqlite3.Connection) -> None:
    """After a delete: a type whose latest event went falls back to its next newest, or
    disappears."""
    for (type_id,) in conn.execute(STALE).fetchall():
        newest = conn.execute(NEWEST_OF_TYPE, (type_id,)).fetchall()
        if newest:
            conn.execute(REPLACE, (type_id, *newest[0]))
        else:
            conn.execute(DELETE, (type_id,))
