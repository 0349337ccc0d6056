"""The ``event_keys`` table: protocol keys of events (the Event BUS UUID) -> local
sequence number; an index a protocol maintains after commit and can rebuild from
``events`` (``event_keys_seq`` in ``meta`` is how far it got). Created on open when
missing (additive, no version change)."""

from __future__ import annotations

DDL = """
CREATE TABLE IF NOT EXISTS event_keys (
    key TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
) STRICT, WITHOUT ROWID
"""
INSERT = "INSERT OR IGNORE INTO event_keys (key, seq) VALUES (?, ?)"
FIND = "SELECT key, seq FROM event_keys WHERE key IN (SELECT value FROM json_each(?))"
META_KEY = "event_keys_seq"
