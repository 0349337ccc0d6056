"""`storage.multirow.insert`: the same rows as ``executemany``, in few statements."""

from __future__ import annotations

import sqlite3

import pytest
from eventfleet_server.storage import multirow

SQL = "INSERT INTO a (seq, x, y) VALUES (?, ?, ?)"


def _tables() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for table in ("a", "b"):
        conn.execute(f"CREATE TABLE {table} (seq INTEGER PRIMARY KEY, x ANY, y ANY) STRICT")
    return conn


def _rows(count: int) -> list[list]:
    return [[i + 1, f"x{i}", bytes([i % 256]) * (i % 7)] for i in range(count)]


# Counts around every chunk boundary: one row, powers of two and their neighbours, the
# full chunk, several full chunks and a remainder.
COUNTS = [0, 1, 2, 3, 7, 8, 9, 1023, 1024, 1025, multirow.INSERT_ROWS, multirow.INSERT_ROWS * 3 + 1]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("max_params", [None, 31, 5])  # default; 10 rows; executemany
def test_insert_stores_what_executemany_stores(count, max_params):
    """`multirow.insert` against ``executemany`` on two tables of the same layout: the
    same rows in the same order. Rows of the wrong width are never flattened into a
    multi-row statement (their values would shift into other rows' columns): they go to
    ``executemany``, whose error names them."""
    conn = _tables()
    if max_params is not None:
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, max_params)
    rows = _rows(count)
    multirow.insert(conn, SQL, rows)
    conn.executemany(SQL.replace(" a ", " b "), rows)
    assert conn.execute("SELECT * FROM a").fetchall() == conn.execute("SELECT * FROM b").fetchall()
    assert conn.execute("SELECT count(*) FROM a").fetchone() == (count,)

    if count < 2:
        return
    conn.execute("DELETE FROM a")
    short = [list(r) for r in rows]
    short[-1] = short[-1][:2]
    with pytest.raises(sqlite3.ProgrammingError, match="bindings"):
        multirow.insert(conn, SQL, short)
    assert conn.execute("SELECT count(*) FROM a").fetchone() == (count - 1,)


@pytest.mark.parametrize("count", [5, 2 * multirow.INSERT_ROWS + 3])
def test_or_ignore_keeps_the_first_row_of_a_key_as_executemany_does(count):
    """The BUS's UUID index (`event_keys.INSERT`, ``INSERT OR IGNORE``): a key already
    held, or repeated in the batch, keeps its first sequence number, within one
    statement and across statements."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for table in ("a", "b"):
        conn.execute(f"CREATE TABLE {table} (key TEXT PRIMARY KEY, seq INTEGER NOT NULL)")
        conn.execute(f"INSERT INTO {table} VALUES ('k0', -1)")
    rows = [(f"k{i % 7}", i) for i in range(count)]
    multirow.insert(conn, "INSERT OR IGNORE INTO a (key, seq) VALUES (?, ?)", rows)
    conn.executemany("INSERT OR IGNORE INTO b (key, seq) VALUES (?, ?)", rows)
    expected = conn.execute("SELECT * FROM b ORDER BY key").fetchall()
    assert conn.execute("SELECT * FROM a ORDER BY key").fetchall() == expected
    assert expected[0] == ("k0", -1) and expected[1] == ("k1", 1)


def test_statements_are_few_and_bounded():
    """Every batch size is inserted in at most ``log2`` statements, from a bounded set:
    what `multirow.STATEMENTS` promises the connection's statement cache."""
    conn = _tables()
    seen: set[int] = set()
    executed: list[str] = []

    def trace(sql: str) -> None:
        # The trace shows the statement with its values in it: its shape is its count
        # of row tuples.
        executed.append(sql)
        seen.add(sql.count("),(") + 1)

    conn.set_trace_callback(trace)
    seq = 0
    for count in range(1, 2 * multirow.INSERT_ROWS + 2, 37):
        executed.clear()
        rows = [[seq + i + 1, "x", b""] for i in range(count)]
        seq += count
        multirow.insert(conn, SQL, rows)
        full, rest = divmod(count, multirow.INSERT_ROWS)
        assert len(executed) == full + rest.bit_count(), count
    assert len(seen) <= multirow.STATEMENTS
    assert conn.execute("SELECT count(*) FROM a").fetchone()[0] == seq
