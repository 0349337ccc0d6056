"""The ``last_ids`` table: highest event id ever held per server id (retention never
touches it); cached in memory by the backend.

Written with the ``state`` mark (see `state`), not on every commit: the ids of the
events above the mark are read back from them at start (`load`).
"""

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

# Rows are the raised ids only (the writer knows them from its walk of the batch); the
# WHERE keeps the table monotonic whatever it is given.
UPSERT = """
INSERT INTO last_ids (server, session, instance) VALUES (?, ?, ?)
ON CONFLICT (server) DO UPDATE SET session = excluded.session, instance = excluded.instance
WHERE excluded.instance > last_ids.instance
"""

SELECT = "SELECT server, session, instance FROM last_ids"
# The highest id per server among the events above the state mark (a rowid range;
# SQLite takes the bare `session` from the row holding the max).
ABOVE = "SELECT server, session, max(instance) FROM events WHERE seq > ? GROUP BY server"

# The newest stored event of one server id (the unique `events_id` index, one seek): the
# engine's own last id and timestamp at start, which commits no longer write to `meta`.
NEWEST_OF_SERVER = (
    "SELECT session, instance, ts FROM events WHERE server = ? ORDER BY instance DESC LIMIT 1"
)


def load(conn: sqlite3.Connection, mark: int) -> dict[int, EventId]:
    """The table, raised by the events stored above the state mark `mark`."""
    held = {
        server: EventId(server, session, instance)
        for server, session, instance in conn.execute(SELECT)
    }
    for server, session, instance in conn.execute(ABOVE, (mark,)):
        known = held.get(server)
        if known is None or instance > known.instance:
            held[server] = EventId(server, session, instance)
    return held


def update(conn: sqlite3.Connection, raised: list[tuple[int, int, int]]) -> None:
    """Store ``(server, session, instance)`` of each server whose highest id went up."""
    conn.executemany(UPSERT, raised)
