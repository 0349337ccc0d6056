"""The folded indexes of ``events``: tables of their own, filled after the commit by
*folds*, many commits at once (schema version 5).

A commit writes an event's row and its identity (``events`` and its unique index
``events_id``, which idempotent writes need at once) and nothing else. What queries
order and filter by is folded in later (`FOLD`, `Storage.fold`), thousands of
events per transaction, with the latest-per-type table (`latest.FOLD`):

* ``events_by_ts`` — timeseries by timestamp (and retention by age, the Arrow export);
* ``events_by_source_ts`` — timeseries by source timestamp (events that have one);
* ``events_by_type`` — timeseries of a few types, one ordered range per type, and the
  ``latest`` repair after retention.

Each is a ``WITHOUT ROWID`` table keyed by the order it serves, ending in the event's
natural key (unique, as ``(server, instance)`` is), and carries ``seq`` to fetch the
row. Why: a commit of one event used to write one b-tree page per index, each a 4 KiB
WAL frame (five frames for a one-event commit, ~18 KB), and an index led by the type
one page per distinct type in the batch; a fold writes each page once for thousands of
events. Measured in performance.md (run X).

Every read of these tables runs after a fold of everything committed before it, so it
never misses an event; when a fold cannot be written (a full disk), queries add the
rows not folded yet from ``events`` itself (`queries`), and stay complete.

A row deleted from ``events`` takes its entries with it (`DELETE_TRIGGER_DDL`),
whichever statement deletes it; rows not folded yet have none, and the trigger finds
none.
"""

from __future__ import annotations

# Each table's columns, its key first, in its own order.
BY_TS = ("ts", "server", "session", "instance", "type_id", "seq")
BY_SOURCE_TS = ("source_ts", "ts", "server", "session", "instance", "type_id", "seq")
BY_TYPE = ("type_id", "ts", "server", "session", "instance", "seq")
# Each table: (its columns, how many of them make its primary key), in one place.
_TABLES = {
    "events_by_ts": (BY_TS, 4),
    "events_by_source_ts": (BY_SOURCE_TS, 5),
    "events_by_type": (BY_TYPE, 5),
}
COLUMNS = {name: columns for name, (columns, _) in _TABLES.items()}


def _table(name: str) -> str:
    columns, key_length = _TABLES[name]
    key = columns[:key_length]
    defs = ",\n".join(f"    {c} INTEGER NOT NULL" for c in columns)
    return (
        f"CREATE TABLE {name} (\n{defs},\n    PRIMARY KEY ({', '.join(key)})\n)"
        " STRICT, WITHOUT ROWID"
    )


TABLES_DDL = [_table(name) for name in COLUMNS]

DELETE_TRIGGER_DDL = """
CREATE TRIGGER events_folded_delete AFTER DELETE ON events BEGIN
    DELETE FROM events_by_ts WHERE ts = old.ts AND server = old.server
        AND session = old.session AND instance = old.instance;
    DELETE FROM events_by_source_ts WHERE source_ts = old.source_ts AND ts = old.ts
        AND server = old.server AND session = old.session AND instance = old.instance;
    DELETE FROM events_by_type WHERE type_id = old.type_id AND ts = old.ts
        AND server = old.server AND session = old.session AND instance = old.instance;
END
"""

# `schema.create` splits its DDL on ";", which the trigger's body holds: the tables and
# the trigger are created statement by statement (`schema.create_folded`).


def _fold(name: str, where: str) -> str:
    columns = ", ".join(COLUMNS[name])
    return f"INSERT INTO {name} ({columns}) SELECT {columns} FROM events WHERE {where}"


_RANGE = "seq > ? AND seq <= ?"
# The entries of a seq range (two parameters each): one pass in seq order over
# ``events`` per table; within the transaction each table's pages are written once.
FOLD = [
    _fold("events_by_ts", _RANGE),
    _fold("events_by_source_ts", _RANGE + " AND source_ts IS NOT NULL"),
    _fold("events_by_type", _RANGE),
]
# Every event's entries (a migration fills the tables at once).
FILL = [
    _fold("events_by_ts", "1"),
    _fold("events_by_source_ts", "source_ts IS NOT NULL"),
    _fold("events_by_type", "1"),
]
