"""The storage schema: its version, the tables of a new store and the migrations.

One module per table holds its DDL and SQL (hat-event's ``backends/lmdb`` layout):
`events`, `latest`, `event_types` (``types``), `last_ids`, `state` (``state`` and
``meta``), `event_keys`. All tables are STRICT, so a value of the wrong type is an
error instead of being stored with a surprising affinity. `queries` holds the Eventer
queries over them, `backend` the connections and the one transaction helper.

Versions (``PRAGMA user_version``):

1. the first release layout.
2. ``events.sbs`` (the event's SBS ``Event`` bytes, made at commit and served as they
   are) and ``events.bus`` (nullable, for the Event BUS's record). A version-1 store is
   migrated on first start (`migrate`), in one transaction: the columns are added and
   every event's ``sbs`` is encoded from its columns.

   ``events.bus`` was always NULL in the release that introduced it; since the next one
   the Event BUS's record of each BUS envelope is written in the event's INSERT, and
   NULL still means "none stored, build it from the columns" (`events`). That is no
   change of layout or meaning, so the version stays 2: a store of either release opens
   in the other (tests/fixtures/storage-v2.sqlite, written by the earlier one), and old
   rows are not back-filled (they are served from their columns).

3. The ``state`` row and ``last_ids`` are a *mark*, no longer rewritten by every commit
   (`state`): the counters and ids of the events above the mark are read back from them
   at start. A version-2 store is a mark with nothing above it, so the migration only
   sets the version; the bump keeps a version-2 release, which would take the mark for
   the counters (and reuse sequence numbers), from opening a version-3 store.

4. ``events.typed``: the per-type index ``events_type_ts`` holds only rows folded into
   it (``typed = 1``, a partial index), many commits at once, instead of taking one
   leaf per distinct type in every commit (`events`). The migration adds the column
   (existing rows read 1: they are in the index already, no row is rewritten) and
   rebuilds the index as a partial one, in one transaction. `TYPED_UPTO_KEY` (a meta
   key) records up to which sequence number rows are folded.

5. The folded indexes (`indexes`): ``events`` keeps only its identity index; the
   timestamp, source-timestamp and per-type indexes are tables of their own
   (``events_by_ts``, ``events_by_source_ts``, ``events_by_type``) and, with the
   ``latest`` table, are brought up to date by folds after the commit instead of by
   each commit (version 4 folded only the per-type index, by rewriting each row to
   flag it). The migration (from 1-4) creates and fills the tables from ``events`` and
   drops the indexes they replace, in one transaction; every event is then folded
   (`FOLDED_UPTO_KEY`, which replaces version 4's ``typed_upto``). A version-4 store
   keeps its ``typed`` column, unused (dropping a column rewrites every row).

A store of a newer version is refused before anything in it changes (no downgrade).
"""

from __future__ import annotations

import logging
import sqlite3
import time

from eventfleet_server.storage import (
    event_keys,
    event_types,
    events,
    indexes,
    last_ids,
    latest,
    state,
)

SCHEMA_VERSION = 5
MIGRATABLE = (1, 2, 3, 4)  # versions `migrate` upgrades from

FOLDED_UPTO_KEY = "folded_upto"
"""Meta key: every event with a sequence number up to this value is in the folded
indexes and the ``latest`` table (`indexes.FOLD`, `latest.FOLD`); a fold writes it in
its own transaction."""
_V4_TYPED_UPTO_KEY = "typed_upto"  # version 4's, for the per-type index alone

DDL = "".join([state.DDL, event_types.DDL, events.DDL, latest.DDL, last_ids.DDL])
EVENT_KEYS_DDL = event_keys.DDL

log = logging.getLogger(__name__)

_MIGRATE_CHUNK = 5_000

_V2_COLUMNS = (
    # NOT NULL needs a default on ALTER TABLE; every row is filled before the commit.
    "ALTER TABLE events ADD COLUMN sbs BLOB NOT NULL DEFAULT x''",
    "ALTER TABLE events ADD COLUMN bus BLOB",
)
_V1_ROWS = f"SELECT seq, {events.COLS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
_SET_SBS = "UPDATE events SET sbs = ? WHERE seq = ?"


def create(conn: sqlite3.Connection) -> None:
    """The tables of a new store, inside the caller's transaction (statement by
    statement: ``executescript`` would commit it)."""
    code = "\n".join(line for line in DDL.splitlines() if not line.lstrip().startswith("--"))
    for statement in code.split(";"):
        if statement.strip():
            conn.execute(statement)
    create_folded(conn)


def create_folded(conn: sqlite3.Connection) -> None:
    """The folded index tables and their delete trigger (`indexes`)."""
    for statement in indexes.TABLES_DDL:
        conn.execute(statement)
    conn.execute(indexes.DELETE_TRIGGER_DDL)


def migrate(conn: sqlite3.Connection, version: int, path: object) -> None:
    """Upgrade a store of `version` (one of `MIGRATABLE`) to `SCHEMA_VERSION`, inside
    the caller's transaction (all or nothing: a failed or interrupted migration leaves
    the store at `version`)."""
    if version not in MIGRATABLE:
        raise ValueError(f"no migration from storage schema version {version}")
    if version == 1:
        _migrate_v1(conn, path)
    # 2 -> 3: the layout is the same; version 2's state row is exact, i.e. a mark with
    # no events above it. 3 -> 4 -> 5: only the per-type index changed.
    _migrate_to_v5(conn, path)
    log.info("%s: storage schema version %d -> %d", path, version, SCHEMA_VERSION)


def _migrate_to_v5(conn: sqlite3.Connection, path: object) -> None:
    """Versions 1-4 -> 5: the folded index tables created and filled with every event
    (all folded: `FOLDED_UPTO_KEY`), the indexes they replace dropped."""
    started = time.monotonic()
    create_folded(conn)
    for statement in indexes.FILL:
        conn.execute(statement)
    for index in ("events_ts", "events_source_ts", "events_type_ts"):
        conn.execute(f"DROP INDEX IF EXISTS {index}")
    top = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
    count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    conn.execute("DELETE FROM meta WHERE key = ?", (_V4_TYPED_UPTO_KEY,))
    state.set_meta(conn, [(FOLDED_UPTO_KEY, str(top))])
    log.info(
        "%s: folded index tables built for schema version 5 (%d events, %.1f s)",
        path,
        count,
        time.monotonic() - started,
    )


def _migrate_v1(conn: sqlite3.Connection, path: object) -> None:
    """Version 1 -> 2: the ``sbs`` and ``bus`` columns, every event's ``sbs`` encoded."""
    started = time.monotonic()
    for statement in _V2_COLUMNS:
        conn.execute(statement)
    cache = event_types.TypeCache()
    cache.load(conn)
    after, count = 0, 0
    while True:
        rows = conn.execute(_V1_ROWS, (after, _MIGRATE_CHUNK)).fetchall()
        if not rows:
            break
        decoded = events.decode([r[1:] for r in rows], cache.types)
        conn.executemany(
            _SET_SBS, [(events.encode(e), r[0]) for r, e in zip(rows, decoded, strict=True)]
        )
        after = rows[-1][0]
        count += len(rows)
    log.info(
        "%s: storage schema migrated from version 1 to 2 (%d events encoded in %.1f s)",
        path,
        count,
        time.monotonic() - started,
    )
