"""Eventer queries over the tables (hat-event 0.9 semantics), each one SQL pass.

Every query runs in two shapes on the same plan: `SBS` selects the stored encoding of
each event (what the Eventer sends; no object per event), `events.COLS` the columns
that rebuild model events (in-process callers). `Rows` carries either.
"""

from __future__ import annotations

import sqlite3
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
from eventfleet_server.storage import events, latest, type_index
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


def may_read_type_index(params: object) -> bool:
    """Whether `params` may be answered from ``events_by_type`` (a timestamp-ordered
    timeseries of a few types), which holds only folded events: the storage folds every
    committed event into it first (`type_index`). Errs on the side of True."""
    return isinstance(params, QueryTimeseriesParams) and params.event_types is not None


def run(
    conn: sqlite3.Connection,
    cache: TypeCache,
    params: QueryLatestParams | QueryTimeseriesParams | QueryServerParams,
    cap: int,
    cols: str,
    type_index: bool = True,
) -> Rows:
    """Answer `params`. `type_index`: False when ``events_by_type`` may lack committed
    events (a fold failed): type filters then read the timestamp index instead."""
    if isinstance(params, QueryTimeseriesParams):
        return timeseries(conn, cache, params, cap, cols, type_index)
    if isinstance(params, QueryServerParams):
        return server(conn, params, cap, cols)
    if isinstance(params, QueryLatestParams):
        return latest_query(conn, cache, params, cols)
    raise TypeError(f"query params {params!r} are not a query")


def latest_query(
    conn: sqlite3.Connection, cache: TypeCache, params: QueryLatestParams, cols: str
) -> Rows:
    expansion = cache.expand(params.event_types)
    sbs = cols == SBS
    if expansion is None:
        rows = conn.execute(latest.ALL_SBS if sbs else latest.ALL).fetchall()
    elif not expansion[0]:
        return _EMPTY
    else:
        rows = conn.execute(latest.TYPES_SBS if sbs else latest.TYPES, (expansion[1],)).fetchall()
    return Rows(rows, False)


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
    type_index: bool = True,
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
        if not source and len(ids) <= MERGE_MAX_TYPES and type_index:
            types = len(ids)
            for i, type_id in enumerate(ids):
                args[f"t{i}"] = type_id
        else:
            types = 0
            args["types"] = text

    # One row beyond the page tells whether more follow.
    args["limit"] = page + 1
    sql = timeseries_sql(
        source=source,
        descending=descending,
        source_filter=source_filter and not source,
        types=types,
        after=after is not None,
        cols=cols,
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
) -> str:
    """The SQL of one timeseries query shape (named parameters).

    `source`: order by source timestamp (else timestamp). `source_filter`: bound the
    source timestamp while ordering by timestamp. `types`: None for no type filter,
    ``0`` for a ``type_id IN json_each(:types)`` filter on the ordering index, ``n > 0``
    for a merge of n per-type range scans of ``events_by_type`` (`type_index`), each
    joined to ``events`` by ``seq`` (SQLite merges the ordered arms lazily, so the cost
    is O(page·log n + n)). `after`: continue after the sentinel key (``:k0``..``:k4``)
    with a row-value comparison on the index.
    `cols`: what each row holds (`events.COLS`, or `SBS`: the stored encoding first).

    Parameters: ``:lo``/``:hi`` bound the timestamp, ``:slo``/``:shi`` the source
    timestamp, ``:t0``.. are type ids, ``:types`` a JSON array of type ids,
    ``:limit`` the page size plus one.
    """
    if source and types:
        raise ValueError("per-type merge is only built for timestamp order")
    key = _SOURCE_KEY if source else _TS_KEY
    cmp = "<" if descending else ">"
    direction = " DESC" if descending else ""
    order = ", ".join(k + direction for k in key)
    # With a sentinel its key already bounds the start of the range; a second bound on
    # the same side would compete with the row-value range for the index.
    start_bound = "hi" if descending else "lo"

    # A per-type arm reads the key from ``events_by_type`` (aliased ``t``, whose primary
    # key gives the order) and the rest from ``events``; the other shapes read ``events``.
    merge = bool(types)

    def col(name: str) -> str:
        if not merge:
            return name
        return f"t.{name}" if name in type_index.KEY else f"events.{name}"

    conds: list[str] = []
    if source:
        conds.append("source_ts IS NOT NULL")
        for name, op in (("slo", ">="), ("shi", "<=")):
            if not (after and name[1:] == start_bound):
                conds.append(f"source_ts {op} :{name}")
        conds.append("ts >= :lo AND ts <= :hi")
    else:
        for name, op in (("lo", ">="), ("hi", "<=")):
            if not (after and name == start_bound):
                conds.append(f"{col('ts')} {op} :{name}")
        if source_filter:
            sts = col("source_ts")
            conds.append(f"{sts} >= :slo AND {sts} <= :shi")
    if after:
        params = ", ".join(f":k{i}" for i in range(len(key)))
        conds.append(f"({', '.join(map(col, key))}) {cmp} ({params})")

    if merge:
        # The sort keys ride along in every arm (the merge orders by them): with `SBS`
        # a row is ``(sbs, *key)`` and readers take its first value, as everywhere.
        names = [SBS, *key] if cols == SBS else cols.split(", ")
        select = ", ".join(f"{col(name)} AS {name}" for name in names)
        arms = [
            f"SELECT {select} FROM events_by_type AS t CROSS JOIN events ON events.seq = t.seq"
            f" WHERE t.type_id = :t{i} AND {' AND '.join(conds)}"
            for i in range(types)  # type: ignore[arg-type]
        ]
        return f"{' UNION ALL '.join(arms)} ORDER BY {order} LIMIT :limit"

    if types == 0:
        conds.append("type_id IN (SELECT value FROM json_each(:types))")
    index = "events_source_ts" if source else "events_ts"
    return (
        f"SELECT {cols} FROM events INDEXED BY {index}"
        f" WHERE {' AND '.join(conds)} ORDER BY {order} LIMIT :limit"
    )
