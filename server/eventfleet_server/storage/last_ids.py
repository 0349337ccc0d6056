"""The ``last_ids`` table: highest event id ever held per server id (retention never
touches it); cached in memory by the backend."""

from __future__ import annotations

import sqlite3

from eventfleet_server.common.model import EventId

DDL = """
CREATE TABLE last_ids (
    server INTEGER PRIMARY KEY,
    session INTEGER NOT NULL,
    instance INTEGER NOT NULL
) STRICT;
"""

# SQLite takes bare columns from the row holding max(), so `session` belongs to it.
# NOT INDEXED: left alone, the planner serves GROUP BY from events_id, scanning the
# whole index on every write; the rowid range of the batch is what we want.
UPSERT = """
INSERT INTO last_ids (server, session, instance)
SELECT server, session, max(instance) FROM events NOT INDEXED WHERE seq >= ? GROUP BY server
ON CONFLICT (server) DO UPDATE SET session = excluded.session, instance = excluded.instance
WHERE excluded.instance > last_ids.instance
RETURNING server, session, instance
"""

SELECT = "SELECT server, session, instance FROM last_ids"


def load(conn: sqlite3.Connection) -> dict[int, EventId]:
    return {
        server: EventId(server, session, instance)
        for server, session, instance in conn.execute(SELECT)
    }


def update(conn: sqlite3.Connection, first_seq: int) -> list[tuple[int, int, int]]:
    """Fold the batch from `first_seq` on in; returns the ids that went up."""
    return conn.execute(UPSERT, (first_seq,)).fetchall()
