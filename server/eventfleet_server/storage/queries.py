"""Eventer queries over the tables (hat-event 0.9 semantics), each one SQL pass.

Every query runs in two shapes on the same plan: `SBS` selects the stored encoding of
each event (what the Eventer sends; no object per event), `events.COLS` the columns
that rebuild model events (in-process callers). `Rows` carries either.

Timeseries and ``latest`` queries read the folded index tables and the ``latest`` table
(`indexes`), which the storage folds every committed event into first. When that fold
could not be written (a full disk), the storage passes ``folded`` (how far the tables
go) and each query adds the events above it from ``events`` itself (the "tail"): slower,
never incomplete.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, NamedTuple

from eventfleet_server.common.model import (
    Order,
    OrderBy,
    QueryLatestParams,
    QueryServerParams,
    QueryTimeseriesParams,
    Timestamp,
    timestamp_to_us,
)
from eventfleet_server.storage import events, indexes, latest
from eventfleet_server.storage.event_types import TypeCache

SBS = "sbs"

# Up to this many matching types a timeseries query merges per-type index scans;
# beyond it, it scans the timestamp index and filters by type id.
MERGE_MAX_TYPES = 32


class Rows(NamedTuple):
    rows: list[tuple]
    more_follows: bool


_EMPTY = Rows([], False)


def _bounds(lo: Timestamp | None, hi: Timestamp | None) -> tuple[int, int]:
    return (
        events.MIN_I64 if lo is None else timestamp_to_us(lo),
        events.MAX_I64 if hi is None else timestamp_to_us(hi),
    )


def page_size(max_results: int | None, cap: int) -> int:
    if max_results is None:
        return cap
    return max(0, min(max_results, cap))


def reads_folded(params: object) -> bool:
    """Whether `params` reads the folded tables (`indexes`, ``latest``): timeseries and
    ``latest`` queries, which the storage folds every committed event into first."""
    return isinstance(params, QueryTimeseriesParams | QueryLatestParams)


def run(
    conn: sqlite3.Connection,
    cache: TypeCache,
    params: QueryLatestParams | QueryTimeseriesParams | QueryServerParams,
    cap: int,
    cols: str,
    folded: int | None = None,
) -> Rows:
    """Answer `params`. `folded`: None when the folded tables hold every committed
    event, else the sequence number they go up to (a fold failed): the events above it
    are read from ``events`` too."""
    if isinstance(params, QueryTimeseriesParams):
        return timeseries(conn, cache, params, cap, cols, folded)
    if isinstance(params, QueryServerParams):
        return server(conn, params, cap, cols)
    if isinstance(params, QueryLatestParams):
        return latest_query(conn, cache, params, cols, folded)
    raise TypeError(f"query params {params!r} are not a query")


def latest_query(
    conn: sqlite3.Connection,
    cache: TypeCache,
    params: QueryLatestParams,
    cols: str,
    folded: int | None = None,
) -> Rows:
    expansion = cache.expand(params.event_types)
    if expansion is not None and not expansion[0]:
        return _EMPTY
    sql = latest.query_sql(
        "events.sbs" if cols == SBS else latest.EVENTS_COLS,
        types=expansion is not None,
        tail=folded is not None,
    )
    args = {"types": None if expansion is None else expansion[1], "folded": folded}
    return Rows(conn.execute(sql, args).fetchall(), False)


def server(conn: sqlite3.Connection, params: QueryServerParams, cap: int, cols: str) -> Rows:
    page = page_size(params.max_results, cap)
    after = params.last_event_id
    rows = conn.execute(
        events.SERVER_SBS if cols == SBS else events.SERVER,
        (params.server_id, events.MIN_I64 if after is None else after.instance, page + 1),
    ).fetchall()
    return Rows(rows[:page], len(rows) > page)


def timeseries(
    conn: sqlite3.Connection,
    cache: TypeCache,
    params: QueryTimeseriesParams,
    cap: int,
    cols: str,
    folded: int | None = None,
) -> Rows:
    try:
        source = OrderBy(params.order_by) is OrderBy.SOURCE_TIMESTAMP
        descending = Order(params.order) is Order.DESCENDING
        lo, hi = _bounds(params.t_from, params.t_to)
        slo, shi = _bounds(params.source_t_from, params.source_t_to)
    except ValueError as e:
        raise ValueError(f"timeseries query {params!r}: {e}") from e
    source_filter = params.source_t_from is not None or params.source_t_to is not None
    page = page_size(params.max_results, cap)

    expansion = cache.expand(params.event_types)
    if expansion is not None and not expansion[0]:
        return _EMPTY

    args: dict[str, Any] = {"lo": lo, "hi": hi}
    if source or source_filter:
        args["slo"], args["shi"] = slo, shi

    after = params.last_event_id
    if after is not None:
        found = conn.execute(
            events.SENTINEL, (after.server, after.instance, after.session)
        ).fetchall()
        if not found:
            return _EMPTY
        ts, sts, type_id = found[0]
        if (
            not lo <= ts <= hi
            or ((source or source_filter) and (sts is None or not slo <= sts <= shi))
            or (expansion is not None and type_id not in expansion[0])
        ):
            return _EMPTY
        key = (
            (sts, ts, after.server, after.session, after.instance)
            if source
            else (ts, after.server, after.session, after.instance)
        )
        for i, value in enumerate(key):
            args[f"k{i}"] = value

    types: int | None = None
    if expansion is not None:
        ids, text = expansion
        if not source and len(ids) <= MERGE_MAX_TYPES:
            types = len(ids)
            for i, type_id in enumerate(ids):
                args[f"t{i}"] = type_id
        else:
            types = 0
            args["types"] = text

    # One row beyond the page tells whether more follow.
    args["limit"] = page + 1
    if folded is not None:
        args["folded"] = folded
    sql = timeseries_sql(
        source=source,
        descending=descending,
        source_filter=source_filter and not source,
        types=types,
        after=after is not None,
        cols=cols,
        tail=folded is not None,
    )
    rows = conn.execute(sql, args).fetchall()
    return Rows(rows[:page], len(rows) > page)


_TS_KEY = ("ts", "server", "session", "instance")
_SOURCE_KEY = ("source_ts", "ts", "server", "session", "instance")


def timeseries_sql(
    *,
    source: bool,
    descending: bool,
    source_filter: bool,
    types: int | None,
    after: bool,
    cols: str = events.COLS,
    tail: bool = False,
) -> str:
    """The SQL of one timeseries query shape (named parameters).

    Each arm reads a folded index table (`indexes`, aliased ``t``: its primary key gives
    the order) and fetches each event's row by ``seq``. `source`: order by source
    timestamp (``events_by_source_ts``, else ``events_by_ts``). `source_filter`: bound
    the source timestamp while ordering by timestamp. `types`: None for no type filter,
    ``0`` for a ``type_id IN json_each(:types)`` filter on the ordering table, ``n > 0``
    for a merge of n per-type range scans of ``events_by_type`` (SQLite merges the
    ordered arms lazily, so the cost is O(page·log n + n)). `after`: continue after the
    sentinel key (``:k0``..``:k4``) with a row-value comparison on the key. `cols`: what
    each row holds (`events.COLS`, or `SBS`: the stored encoding first). `tail`: one arm
    more, the events above ``:folded`` read from ``events`` (a fold failed).

    Parameters: ``:lo``/``:hi`` bound the timestamp, ``:slo``/``:shi`` the source
    timestamp, ``:t0``.. are type ids, ``:types`` a JSON array of type ids,
    ``:limit`` the page size plus one, ``:folded`` a sequence number.
    """
    if source and types:
        raise ValueError("per-type merge is only built for timestamp order")
    key = _SOURCE_KEY if source else _TS_KEY
    merge = bool(types)
    table = "events_by_type" if merge else "events_by_source_ts" if source else "events_by_ts"
    in_table = set(indexes.COLUMNS[table])

    def col(name: str) -> str:
        return f"t.{name}" if name in in_table else f"events.{name}"

    def plain(name: str) -> str:
        return name

    direction = " DESC" if descending else ""
    conds = _timeseries_conds(col, key, source, descending, source_filter, after)
    # In a compound SELECT every arm carries the sort key (the merge orders by it): with
    # `SBS` a row is ``(sbs, *key)`` and readers take its first value, as everywhere.
    compound = merge or tail
    names = cols.split(", ") if cols != SBS else [SBS, *key] if compound else [SBS]
    select = ", ".join(f"{col(name)} AS {name}" for name in names)
    join = f"FROM {table} AS t CROSS JOIN events ON events.seq = t.seq"
    type_in_json = "type_id IN (SELECT value FROM json_each(:types))"
    if merge:
        arms = [
            f"SELECT {select} {join} WHERE t.type_id = :t{i} AND {' AND '.join(conds)}"
            for i in range(types)  # type: ignore[arg-type]
        ]
    else:
        where = conds + ([f"t.{type_in_json}"] if types == 0 else [])
        arms = [f"SELECT {select} {join} WHERE {' AND '.join(where)}"]
    if tail:
        where = ["seq > :folded"]
        where += _timeseries_conds(plain, key, source, descending, source_filter, after)
        if merge:
            ids = ", ".join(f":t{i}" for i in range(types))  # type: ignore[arg-type]
            where.append(f"type_id IN ({ids})")
        elif types == 0:
            where.append(type_in_json)
        arms.append(f"SELECT {', '.join(names)} FROM events WHERE {' AND '.join(where)}")
    if compound:
        order = ", ".join(k + direction for k in key)
        return f"{' UNION ALL '.join(arms)} ORDER BY {order} LIMIT :limit"
    order = ", ".join(col(k) + direction for k in key)
    return f"{arms[0]} ORDER BY {order} LIMIT :limit"


def _timeseries_conds(
    col: Callable[[str], str],
    key: tuple[str, ...],
    source: bool,
    descending: bool,
    source_filter: bool,
    after: bool,
) -> list[str]:
    """The WHERE terms of a timeseries arm, its columns named by `col`."""
    cmp = "<" if descending else ">"
    # With a sentinel its key already bounds the start of the range; a second bound on
    # the same side would compete with the row-value range for the index.
    start_bound = "hi" if descending else "lo"
    conds: list[str] = []
    ts, sts = col("ts"), col("source_ts")
    if source:
        conds.append(f"{sts} IS NOT NULL")
        for name, op in (("slo", ">="), ("shi", "<=")):
            if not (after and name[1:] == start_bound):
                conds.append(f"{sts} {op} :{name}")
        conds.append(f"{ts} >= :lo AND {ts} <= :hi")
    else:
        for name, op in (("lo", ">="), ("hi", "<=")):
            if not (after and name == start_bound):
                conds.append(f"{ts} {op} :{name}")
        if source_filter:
            conds.append(f"{sts} >= :slo AND {sts} <= :shi")
    if after:
        params = ", ".join(f":k{i}" for i in range(len(key)))
        conds.append(f"({', '.join(map(col, key))}) {cmp} ({params})")
    return conds
