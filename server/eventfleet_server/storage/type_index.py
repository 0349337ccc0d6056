"""The ``events_by_type`` table: the per-type index of ``events``, kept as a table of its
own (schema version 5) and filled by *folds*, many commits at once.

One row per event: its natural key led by the type (``type_id, ts, server, session,
instance``, the primary key of a ``WITHOUT ROWID`` table) and its ``seq``. A timeseries
of a few types merges one ordered range scan of this table per type, each joined to
``events`` by ``seq`` for what it answers with; `latest.repair` finds a type's next
newest event here after retention deleted its latest.

Why not an index on ``events``, and why folds: an index (or table) led by the type puts
each commit's entries on one b-tree leaf per distinct type, i.e. one WAL frame (a 4 KiB
page) per type per commit. Rows go into ``events`` alone at commit and are folded into
this table later (`FOLD`, `Storage.fold_types`): a fold of thousands of rows writes each
type's leaf once. Unlike schema 4's partial index over a ``typed`` flag, a fold writes
only these small entries; it never rewrites an event's row (with large events, the
flag's ``UPDATE`` wrote every table page a second time). Every query that reads the
table runs after a fold of everything committed before it.

A row deleted from ``events`` takes its entry with it (`DELETE_TRIGGER`), whichever
statement deletes it; rows not folded yet have no entry, and the trigger finds none.
"""

from __future__ import annotations

KEY = ("type_id", "ts", "server", "session", "instance")

TABLE_DDL = """
CREATE TABLE events_by_type (
    type_id INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    server INTEGER NOT NULL,
    session INTEGER NOT NULL,
    instance INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (type_id, ts, server, session, instance)
) STRICT, WITHOUT ROWID
"""

DELETE_TRIGGER_DDL = """
CREATE TRIGGER events_by_type_delete AFTER DELETE ON events BEGIN
    DELETE FROM events_by_type WHERE type_id = old.type_id AND ts = old.ts
        AND server = old.server AND session = old.session AND instance = old.instance;
END
"""

# `schema.create` splits its DDL on ";", which a trigger's body holds: the trigger is
# created on its own (`schema.create`, `schema._migrate_to_v5`).
DDL = TABLE_DDL + ";\n"

# The entries of a seq range: one pass in seq order over ``events``; within the
# transaction the entries go in per type, each type's leaf written once.
FOLD = (
    "INSERT INTO events_by_type (type_id, ts, server, session, instance, seq)"
    " SELECT type_id, ts, server, session, instance, seq FROM events"
    " WHERE seq > ? AND seq <= ?"
)

# Every event's entry, in the table's own order (a migration fills the table at once).
FILL = (
    "INSERT INTO events_by_type (type_id, ts, server, session, instance, seq)"
    " SELECT type_id, ts, server, session, instance, seq FROM events"
    " ORDER BY type_id, ts, server, session, instance"
)
