"""The ``state`` row (``last_seq``, never reused so not derivable from ``events`` after
deletes, and ``event_count``) and the ``meta`` table (JSON values by key for the
engine and protocols)."""

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
UPDATE = "UPDATE state SET last_seq = ?, event_count = event_count + ? WHERE id = 0"
DELETED = "UPDATE state SET event_count = event_count - ? WHERE id = 0"
UPSERT_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
SELECT_META = "SELECT key, value FROM meta"


def load(conn: sqlite3.Connection) -> tuple[int, int, dict[str, str]]:
    """``(last_seq, event_count, meta)``."""
    last_seq, count = conn.execute(SELECT).fetchone()
    return last_seq, count, dict(conn.execute(SELECT_META).fetchall())


def set_meta(conn: sqlite3.Connection, items: list[tuple[str, str]]) -> None:
    conn.executemany(UPSERT_META, items)
