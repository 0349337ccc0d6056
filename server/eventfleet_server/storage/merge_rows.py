"""Merge rows: events received from peers in the form the store inserts them, so that a
replica catching up stores each event without building a model object for it.

A merge row is a ``list`` of the ``events`` table's `events.INSERT` parameters, with the
event's type (a tuple of str) in the place of its type id and no sequence number yet::

    [None, server, session, instance, type, ts_us, source_ts_us | None,
     kind, ptype, payload, sbs]

``kind``/``ptype``/``payload`` are as in `events` (`events.KIND_NONE`, `KIND_BINARY` with
the payload type and bytes, `KIND_JSON` with the text); ``sbs`` is the event's SBS
``Event`` encoding as received (stored as it is). `Storage.write_rows` fills in the
sequence number and the type id in place (a list, not a tuple: one allocation per
event instead of two) and, when its recorder made Event BUS records, appends each row's
(slot `BUS`, bytes or None); if the write fails it puts the type back and takes the slot
off again, so the same rows can be written again. The producer (the Syncer's
decoder) has checked every value: ids in 0..2^63-1, timestamps storable, text valid
UTF-8.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    EventType,
    Timestamp,
)
from eventfleet_server.storage.events import KIND_BINARY, KIND_JSON

_US = 1_000_000

# Positions in a merge row.
SEQ, SERVER, SESSION, INSTANCE, TYPE, TS, SOURCE_TS, KIND, PTYPE, PAYLOAD, SBS = range(11)
BUS = 11  # appended by `Storage.write_rows` when there are records
_server_of = operator.itemgetter(SERVER)
_type_of = operator.itemgetter(TYPE)


def to_events(rows: list[list], types: list[EventType | None]) -> list[Event]:
    """The model events of written rows (type ids filled in), for the engine's listeners.

    The NamedTuples are built with tuple.__new__ (their generated __new__ is a
    Python-level call per object), and one `Timestamp` is shared by consecutive rows of
    one timestamp (a session's events have one). (Column-wise construction with
    `map`/`zip`/`itemgetter` and ``partial(tuple.__new__, ...)`` measured 1.8x slower.)
    """
    out: list[Event] = []
    append = out.append
    new = tuple.__new__
    last_ts = None
    ts = None
    for r in rows:
        t = r[5]
        if t != last_ts:
            ts = new(Timestamp, divmod(t, _US))
            last_ts = t
        sts = r[6]
        kind = r[7]
        if kind == KIND_JSON:
            payload = new(EventPayloadJson, (r[9],))
        elif kind == KIND_BINARY:
            payload = new(EventPayloadBinary, (r[8], r[9]))
        else:
            payload = None
        append(
            new(
                Event,
                (
                    new(EventId, (r[1], r[2], r[3])),
                    types[r[4]],
                    ts,
                    None if sts is None else new(Timestamp, divmod(sts, _US)),
                    payload,
                ),
            )
        )
    return out


def sessions(rows: list[list]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of one ``(server, session)`` in `rows`: the unit the
    engine notifies (see `model.split_sessions`)."""
    runs: list[tuple[int, int]] = []
    start = 0
    if not rows:
        return runs
    server, session = rows[0][1], rows[0][2]
    for i, r in enumerate(rows):
        if r[2] != session or r[1] != server:
            runs.append((start, i))
            start = i
            server, session = r[1], r[2]
    runs.append((start, len(rows)))
    return runs


class RowEvents(Sequence[Event]):
    """The events of written merge rows, built on first use: what the engine hands its
    listeners after a merge. Building them is as much CPU as decoding the received
    events, and during a catch-up most listeners look at the first event only (whose
    server id a protocol has no subscriber for) or at nothing; those never build the rest.
    Indexing and iterating behave as on a list (slices are lists).
    """

    __slots__ = ("_events", "_rows", "_types")

    def __init__(self, rows: list[list], types: list[EventType | None]):
        self._rows = rows
        self._types = types
        self._events: list[Event] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index):
        events = self._events
        if events is None:
            if type(index) is int and index in (0, -1):
                return to_events([self._rows[index]], self._types)[0]
            events = self._built()
        return events[index]

    def __iter__(self) -> Iterator[Event]:
        return iter(self._built())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowEvents | list | tuple):
            return self._built() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RowEvents({self._built()!r})"

    def _built(self) -> list[Event]:
        if self._events is None:
            self._events = to_events(self._rows, self._types)
        return self._events

    def server_ids(self) -> set[int]:
        """The server ids of the events (without building them)."""
        return set(map(_server_of, self._rows))  # no Python frame per row

    def of_types(self, wanted: Callable[[EventType], bool]) -> list[Event]:
        """The events whose type is `wanted` (building only those)."""
        types = self._types
        ids = {t for t in set(map(_type_of, self._rows)) if wanted(types[t])}  # type: ignore[arg-type]
        if not ids:
            return []
        if self._events is not None:
            return [e for e, r in zip(self._events, self._rows, strict=True) if r[TYPE] in ids]
        return to_events([r for r in self._rows if r[TYPE] in ids], types)
