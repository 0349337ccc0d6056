"""Many rows in few ``INSERT`` statements: how every event write and the BUS's UUID index
insert their rows.

Why not ``executemany``: it binds and steps one row at a time, and the ``sqlite3``
module releases the GIL around each step and takes it back after. On the writer thread,
while the event loop runs Python (decoding a catch-up, reading a flood of BUS PUBs), that
is one wait for the GIL per row, each up to the interpreter's switch interval
(`eventfleet_server.eventloop`). One multi-row ``INSERT`` is one step with the GIL
released for all its rows, and costs SQLite and the binding less too (6.0 -> 4.7 µs of
CPU per merged row, docs/performance.md run M).

A batch of ``n`` rows is inserted in chunks of `INSERT_ROWS` rows, then the largest
power of two that fits what is left, and so on: at most ``log2(INSERT_ROWS) + 1``
distinct statements per base statement, each prepared once and kept in the
connection's statement cache.
"""

from __future__ import annotations

import functools
import itertools
import sqlite3
from collections.abc import Sequence

INSERT_ROWS = 2000
"""Rows per statement at most (fewer if SQLite's limit of bound parameters, 32,766 by
default, allows fewer)."""

STATEMENTS = INSERT_ROWS.bit_length() + 1
"""Distinct statements `insert` prepares for one base statement at most: the base, the
full chunk and the powers of two below it (what it adds to a connection's statement
cache)."""


def insert(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence]) -> None:
    """Insert `rows` with `sql` (``INSERT ... VALUES (?, ...)``, each row exactly its
    parameters) as ``conn.executemany(sql, rows)`` would, in as few statements as the
    chunking above gives. Rows of another width than `sql`'s take ``executemany``, which
    names the error; so does a single row."""
    count = len(rows)
    if count < 2:
        if count:
            conn.execute(sql, rows[0])
        return
    width = sql.count("?")
    per = min(INSERT_ROWS, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)
    if per < 2 or not all(len(r) == width for r in rows):
        conn.executemany(sql, rows)
        return
    flat = list(itertools.chain.from_iterable(rows))
    start = 0
    while count - start >= 2:
        left = count - start
        chunk = per if left >= per else 1 << (left.bit_length() - 1)
        conn.execute(_statement(sql, chunk), flat[start * width : (start + chunk) * width])
        start += chunk
    if start < count:
        conn.execute(sql, rows[start])


@functools.cache
def _statement(sql: str, count: int) -> str:
    head, values = sql.split(" VALUES ")
    return f"{head} VALUES {','.join([values] * count)}"
