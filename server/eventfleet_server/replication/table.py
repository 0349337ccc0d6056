"""The table <-> event mapping and the in-memory row index of each table.

A row of table ``T`` with key ``K`` is the latest event (hat-event's natural order:
timestamp, then id) of type ``prefix + [T, K]``. Its columns are the top-level keys of
the event's JSON object payload; the key column is always among them (taken from the
type when the payload lacks it). A *tombstone* — an event of that type without a
payload, or with JSON ``null`` — deletes the row. A latest event whose payload is not a
JSON object (binary, array, ...) is not representable as a row and counts as deleted.

A row's usn is the local sequence number of that latest event: the row changed when
that event was stored, and a late event from a peer that is older than the latest does
not change the row (nor its usn). The index keeps every row (and tombstone) of every
published table in memory: the sequence number, the order key, the parsed columns and
their JSON text, encoded once when the row changes: every session's initial pass and
live push of the row joins that text into its frame (`wire.with_columns`) instead of
encoding the row per session and per request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from eventfleet_server.common import jsontext
from eventfleet_server.common.model import Event, EventPayloadJson, EventType, natural_key

log = logging.getLogger(__name__)


_UNKNOWN: Any = object()
# The frames' JSON form (`wire.encode`): compact, non-ASCII as is.
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# The same for rows this replica writes: NaN and infinities are refused (not JSON).
dumps_row = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


class Row(NamedTuple):
    seq: int
    order: tuple[int, int, int, int]
    columns: dict[str, Any] | None  # None = deleted (tombstone)
    text: str | None = None  # `columns` as compact JSON (None: deleted, or not encodable)


UNKNOWN = _UNKNOWN


class Change(NamedTuple):
    """One row changed: its state before and after (None = absent or deleted)."""

    table: str
    key: str
    seq: int
    event: Event
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    after_text: str | None = None  # `after` as compact JSON, made once for every session


def encode_columns(columns: dict[str, Any] | None) -> str | None:
    """The compact JSON of a row's columns (what the frames carry), or None when there
    is no row or it does not encode (then the sessions encode the dict themselves, and
    report what fails)."""
    if columns is None:
        return None
    try:
        return _dumps(columns)
    except (TypeError, ValueError, RecursionError):
        return None


def row_key(value: Any) -> str:
    """The type segment for a key column value (strings as is, integers in decimal)."""
    if isinstance(value, str) and value and value not in ("?", "*"):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"row key {value!r} must be a non-empty string (not '?'/'*') or an integer")


class Table:
    """Rows of one table, keyed by row key."""

    def __init__(self, name: str, key: str, prefix: tuple[str, ...]):
        self.name = name
        self.key = key
        self.type_prefix: EventType = (*prefix, name)
        self.rows: dict[str, Row] = {}
        self.unrepresentable = 0

    def event_type(self, key: str) -> EventType:
        return (*self.type_prefix, key)

    @property
    def subscription(self) -> EventType:
        return (*self.type_prefix, "?")

    def row_key_of(self, event_type: EventType) -> str | None:
        n = len(self.type_prefix)
        if len(event_type) == n + 1 and event_type[:n] == self.type_prefix:
            return event_type[n]
        return None

    def columns_of(self, key: str, event: Event) -> dict[str, Any] | None:
        payload = event.payload
        if payload is None:
            return None
        if type(payload) is EventPayloadJson:
            value = jsontext.parse(payload.data)
            if value is None:
                return None
            if isinstance(value, dict):
                if self.key not in value:
                    value[self.key] = key
                return value
        self.unrepresentable += 1
        if self.unrepresentable <= 3 or self.unrepresentable % 1000 == 0:
            log.warning(
                "replication table %s row %r: latest event %s has a payload that is not a "
                "JSON object; the row counts as deleted (%d such events so far)",
                self.name,
                key,
                tuple(event.id),
                self.unrepresentable,
            )
        return None

    def apply(
        self,
        seq: int,
        event: Event,
        key: str,
        columns: Any = _UNKNOWN,
        text: str | None = None,
    ) -> Change | None:
        """Take a newly stored event of this table; the change, or None if the row did
        not change (an older event than the row's latest). `columns`: the row the event
        was made from, when the caller has it (saves parsing the payload again), and
        `text` its `dumps_row` JSON (saves encoding it again)."""
        order = natural_key(event)
        old = self.rows.get(key)
        if old is not None and old.order >= order:
            return None
        if columns is _UNKNOWN:
            columns = self.columns_of(key, event)
            text = None
        elif columns is not None and self.key not in columns:
            columns = {**columns, self.key: key}
            text = None
        if text is None:
            text = encode_columns(columns)
        self.rows[key] = Row(seq, order, columns, text)
        before = old.columns if old is not None else None
        return Change(self.name, key, seq, event, before, columns, text)

    def alive_by_seq(self) -> list[tuple[int, str]]:
        return sorted((row.seq, key) for key, row in self.rows.items() if row.columns is not None)

    def changed_since(self, usn: int) -> list[tuple[int, str]]:
        """Rows (alive or deleted) whose usn is above `usn`, by usn."""
        return sorted((row.seq, key) for key, row in self.rows.items() if row.seq > usn)

    def get(self, key: str) -> dict[str, Any] | None:
        row = self.rows.get(key)
        return None if row is None else row.columns

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Alive rows (for tests and status)."""
        return {k: r.columns for k, r in self.rows.items() if r.columns is not None}


class OwnWrites:
    """Ids of events a session wrote itself, so their changes are not echoed back.

    An id normally leaves when its change arrives. A write that never becomes a change
    (a newer event of the same row arrived first) would stay forever; the oldest ids are
    dropped beyond `limit` (insertion order), far above what can be in flight.
    """

    def __init__(self, limit: int = 200_000):
        self._ids: dict[Any, None] = {}
        self._limit = limit

    def add(self, event_id: Any) -> None:
        self._ids[event_id] = None
        if len(self._ids) > self._limit:
            for old in list(self._ids)[: self._limit // 2]:
                del self._ids[old]

    def update(self, event_ids: Iterable[Any]) -> None:
        for event_id in event_ids:
            self.add(event_id)

    def take(self, event_id: Any) -> bool:
        """True (and forgotten) if `event_id` is one of ours."""
        return self._ids.pop(event_id, False) is None

    def __len__(self) -> int:
        return len(self._ids)


class Tables:
    """The indexes of every configured table, fed with stored events in commit order."""

    def __init__(self, prefix: Iterable[str], tables: Iterable[tuple[str, str]]):
        self.prefix = tuple(prefix)
        self.tables: dict[str, Table] = {
            name: Table(name, key, self.prefix) for name, key in tables
        }

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tables

    def subscriptions(self) -> list[EventType]:
        return [t.subscription for t in self.tables.values()]

    def apply(
        self,
        items: Iterable[tuple[int, Event]],
        known: Callable[[Any], Any] | None = None,
    ) -> list[Change]:
        """Feed stored events; `known(event_id)` may return ``(columns, text)`` of the
        row an event was made from (or `UNKNOWN`)."""
        n = len(self.prefix)
        prefix = self.prefix
        changes = []
        for seq, event in items:
            t = event.type
            if len(t) != n + 2 or t[:n] != prefix:
                continue
            table = self.tables.get(t[n])
            if table is None:
                continue
            written = known(event.id) if known is not None else _UNKNOWN
            if written is _UNKNOWN:
                change = table.apply(seq, event, t[n + 1])
            else:
                change = table.apply(seq, event, t[n + 1], *written)
            if change is not None:
                changes.append(change)
        return changes
