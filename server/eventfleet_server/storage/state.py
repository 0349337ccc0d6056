"""The ``state`` row (``last_seq``, never reused so not derivable from ``events`` after
deletes, and ``event_count``) and the ``meta`` table (JSON values by key for the
engine and protocols).

The row is a *mark* (schema version 3): the counters as of ``last_seq``. Commits do
not rewrite it (a page written and a statement run on every commit, ~10 % of a
one-event commit's SQL and WAL writes): every event stored above the mark was inserted
after it, and nothing above it is ever deleted before the mark moves (a delete writes
the mark in its own transaction), so the true counters are the mark plus the events
above it (`load`, one rowid range). The backend moves the mark every 1,000 commits
(`backend.MARK_EVERY_COMMITS`), on every delete, with every ``meta`` write and at a
clean close, so that range stays short. Up to version 2 every commit wrote the row:
such a store is a mark with nothing above it.
"""

from __future__ import annotations

import sqlite3

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
"""

SELECT = "SELECT last_seq, event_count FROM state WHERE id = 0"
MARK = "UPDATE state SET last_seq = ?, event_count = ? WHERE id = 0"
# The events committed since the mark: a range of the rowid.
ABOVE = "SELECT count(*), max(seq) FROM events WHERE seq > ?"
UPSERT_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
SELECT_META = "SELECT key, value FROM meta"


def counters(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """``(last_seq, event_count, mark)``: the counters of the store (the mark plus the
    events committed above it) and the mark's own ``last_seq``."""
    mark, count = conn.execute(SELECT).fetchone()
    above, top = conn.execute(ABOVE, (mark,)).fetchone()
    return (mark if top is None else max(mark, top)), count + above, mark


def load(conn: sqlite3.Connection) -> tuple[int, int, int, dict[str, str]]:
    """``(last_seq, event_count, mark, meta)`` (see `counters`)."""
    last_seq, count, mark = counters(conn)
    return last_seq, count, mark, dict(conn.execute(SELECT_META).fetchall())


def set_mark(conn: sqlite3.Connection, last_seq: int, event_count: int) -> None:
    """Write the counters as they are after the caller's transaction."""
    conn.execute(MARK, (last_seq, event_count))


def set_meta(conn: sqlite3.Connection, items: list[tuple[str, str]]) -> None:
    conn.executemany(UPSERT_META, items)
