"""Consistent copies of a store (backups) and their digest.

`take` writes a copy with SQLite's ``VACUUM INTO`` on a connection of its own, opened
read-only on the live WAL database: a WAL reader sees one committed state for the whole
statement and never blocks the writer, so the replica keeps registering and serving
while the copy is written. Both functions block (file I/O, a full scan for the digest):
run them in a worker thread, never on the event loop.

The digest (`SnapshotInfo`) is what a restore checks before it starts from a copy:

- ``sha256`` and ``size`` of the file (the bytes uploaded and downloaded);
- ``events`` (count), ``last_ids`` (highest id per server id) and ``events_sha256``, a
  digest of every event by content (type as text, not the store-local type id, in
  (server, instance) order), equal for two stores that hold the same events whatever
  their arrival order or file layout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pathlib
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from eventfleet_server.storage import last_ids as last_id_table
from eventfleet_server.storage import schema, state

_CHUNK = 1 << 20

EVENTS_IN_ORDER = (
    "SELECT e.server, e.session, e.instance, t.type, e.ts, e.source_ts, e.kind, e.ptype,"
    " e.payload FROM events e JOIN types t ON t.type_id = e.type_id"
    " ORDER BY e.server, e.instance"
)


class SnapshotError(Exception):
    """A copy could not be written, or a file is not a sound eventfleet store."""


@dataclass(frozen=True)
class SnapshotInfo:
    """The digest of one store file (see the module doc)."""

    sha256: str
    size: int
    events: int
    events_sha256: str
    last_ids: dict[int, tuple[int, int]]  # server id -> (session, instance)
    schema_version: int

    def as_json(self) -> dict:
        return {
            "sha256": self.sha256,
            "size": self.size,
            "events": self.events,
            "events_sha256": self.events_sha256,
            "last_ids": {
                str(server): {"server": server, "session": s, "instance": i}
                for server, (s, i) in sorted(self.last_ids.items())
            },
            "schema_version": self.schema_version,
        }


def take(db_path: pathlib.Path, dest: pathlib.Path) -> SnapshotInfo:
    """Write a consistent copy of the live store `db_path` to `dest` (which must not
    exist) and return its digest. Blocking: call from a worker thread."""
    dest = pathlib.Path(dest)
    if dest.exists():
        raise SnapshotError(f"{dest} already exists")
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as e:
        raise SnapshotError(f"{db_path}: cannot open for a copy: {e}") from e
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("VACUUM INTO ?", (str(dest),))
    except sqlite3.Error as e:
        with contextlib.suppress(OSError):
            dest.unlink()
        raise SnapshotError(f"copy of {db_path} to {dest} failed: {e}") from e
    finally:
        conn.close()
    return inspect(dest, quick_check=False)


def inspect(path: pathlib.Path, *, quick_check: bool = True) -> SnapshotInfo:
    """The digest of the store file `path`, after ``PRAGMA quick_check`` when asked.

    Raises `SnapshotError` naming the file when it is not an SQLite database, is
    damaged, or is not an eventfleet store of a schema this version reads.
    """
    path = pathlib.Path(path)
    try:
        size = path.stat().st_size
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    except (OSError, sqlite3.Error) as e:
        raise SnapshotError(f"{path}: cannot open: {e}") from e
    try:
        if quick_check:
            rows = conn.execute("PRAGMA quick_check(5)").fetchall()
            problems = [" ".join(str(r[0]).split()) for r in rows if r[0] != "ok"]
            if problems:
                raise SnapshotError(f"{path} is damaged (quick_check: {'; '.join(problems)[:300]})")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        # An older version the replica migrates on open is a sound store too.
        if version not in (schema.SCHEMA_VERSION, *schema.MIGRATABLE):
            raise SnapshotError(
                f"{path}: schema version {version} is not {schema.SCHEMA_VERSION} "
                "(not an eventfleet store of this version)"
            )
        # The state mark plus the events above it (`state`), as the replica reads them.
        _, events, mark = state.counters(conn)
        last_ids = {
            server: (held.session, held.instance)
            for server, held in last_id_table.load(conn, mark).items()
        }
        digest = events_digest(conn)
    except sqlite3.Error as e:
        raise SnapshotError(f"{path} is not a readable eventfleet store: {e}") from e
    finally:
        conn.close()
    return SnapshotInfo(
        sha256=file_sha256(path),
        size=size,
        events=events,
        events_sha256=digest,
        last_ids=last_ids,
        schema_version=version,
    )


def events_digest(conn: sqlite3.Connection, upto: Mapping[int, int] | None = None) -> str:
    """SHA-256 over every event by content, in (server, instance) order.

    With `upto` ({server id: instance}), only the events up to those ids: what a store
    that went on after a restore still shares with the copy it started from.
    """
    h = hashlib.sha256()
    for row in conn.execute(EVENTS_IN_ORDER):
        if upto is not None and not (row[0] in upto and row[2] <= upto[row[0]]):
            continue
        # JSON of the row: unambiguous field boundaries; bytes payloads as hex.
        fields = [v.hex() if isinstance(v, bytes) else v for v in row]
        h.update(json.dumps(fields, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def file_sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
