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
event instead of two) and puts the type back if the write fails, so the same rows can
be written again. The producer (the Syncer's decoder) has checked every value: ids in
0..2^63-1, timestamps storable, text valid UTF-8.
"""

from __future__ import annotations

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
