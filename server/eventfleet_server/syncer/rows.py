"""A received ``MsgEvents`` straight to merge rows (`storage.merge_rows`): the receiving
replica's catch-up hot path, where every event of a replica that was away passes.

One walk of the SBS encoding gives each event's stored columns and its element bytes
(stored as received, never encoded again); no model object is built (the engine builds
events from the committed rows for its listeners). What keeps the walk short is what
the events of one ``MsgEvents`` share: one server id and one session (the protocol
requires it), one timestamp for a whole session (the engine gives each of its batches
one) and a few types. Those byte runs are compared, not decoded: the server/session
prefix and the previous event's timestamp with ``bytes.startswith``, a type by its
encoded bytes in the stream's cache. An SBS Integer ends at its first byte with bit 0x80
set, so equal bytes at a position are equal values; a differently encoded equal value
just takes the long way. Each distinct type and timestamp is checked once.

The checks are `protocol.decode_events_sbs`'s (the same messages name the same errors):
every event of the stream's server id and of the first event's session, ids in
0..2^63-1, no wildcard type segment, storable timestamps, text valid UTF-8, nothing
truncated and nothing after the last event. Nothing of a message that fails is stored:
the stream is closed instead.

The same walk in C (`_rows.c`, docs/decisions.md "Four small C extensions") runs first:
with it a 200,000-event catch-up went from 108,644 to 209,066 events/s, the receiving
replica from 15.1 to 10.3 µs of CPU per event (docs/performance.md, run AE). It gives
exactly the rows `_walk` gives, or None for anything off its fast path (bad or truncated
data, a type not yet in the cache, an id or timestamp outside the cheap bounds, ...);
`_walk` then handles the message or raises its `ProtocolError`, so every error message
is made here (a message with a type new to the stream takes `_walk` whole, once: only
`_walk` fills the cache). The extension is optional (setup.py): without it every message
takes `_walk`, with the same result.
"""

from __future__ import annotations

from eventfleet_server.common.model import Timestamp, event_type_error, timestamp_to_us
from eventfleet_server.common.sbsint import read_int
from eventfleet_server.syncer.wire import MAX_ID, ProtocolError

try:
    from eventfleet_server.syncer import _rows as _c
except ImportError:  # not built (no C compiler): `_walk` alone, the same rows
    _c = None

_US = 1_000_000
_MIN_S = -(MAX_ID // _US) + 1
_MAX_S = MAX_ID // _US - 1
_KIND_NONE, _KIND_BINARY, _KIND_JSON = 0, 1, 2  # storage.events' payload kinds

_TYPE_FIND_MAX = 512  # bytes searched for a known type and the timestamp after it

TYPE_CACHE_MAX = 4096
"""Distinct encoded types a stream remembers (then it starts over)."""


def decode_rows(
    data: bytes, server_id: int, types: dict[bytes, tuple], *, use_c: bool = True
) -> list[list]:
    """The merge rows of one ``MsgEvents`` of a stream for `server_id`.

    `types`: the stream's cache of encoded type -> checked type (filled here, by the
    Python walk only). Raises `ProtocolError` naming the bad event and value.
    `use_c=False`: the Python walk alone (the tests compare the two).
    """
    if type(data) is not bytes:
        data = bytes(data)  # both walks slice it into the cache's bytes keys
    if use_c and _c is not None:
        rows = _c.walk(data, server_id, types)
        if rows is not None:
            return rows
    try:
        return _walk(data, server_id, types)
    except IndexError:
        raise ProtocolError("MsgEvents does not decode: truncated") from None
    except ValueError as e:  # SbsIntError, UnicodeDecodeError, a bad length or choice
        raise ProtocolError(f"MsgEvents does not decode: {e}") from e


def _walk(data: bytes, server_id: int, types: dict[bytes, tuple]) -> list[list]:
    end = len(data)
    count, pos = read_int(data, 0)
    if count == 0:
        raise ProtocolError("MsgEvents is empty")
    if count < 0 or count > end:
        raise ValueError(f"bad event count {count}")
    # The first event's server and session, as encoded: every event starts with them.
    first = pos
    server, pos = read_int(data, pos)
    session, pos = read_int(data, pos)
    head = data[first:pos]
    pos = first
    rows: list[list] = []
    append = rows.append
    startswith = data.startswith
    find = data.find
    last_ts: bytes | None = None  # the previous event's timestamp, as encoded
    ts_us = 0
    last_sts: bytes | None = None  # the last source timestamp decoded, as encoded
    last_source_us = 0
    for i in range(count):
        start = pos
        if startswith(head, pos):
            pos += len(head)
            # The instance, read here (a call of read_int per event was 6% of a
            # catch-up's CPU): non-negative, at most 10 bytes like any SBS Integer (the
            # range check below refuses what is above 2^63-1).
            b = data[pos]
            if b & 0x40:  # negative: read_int, then the range check refuses it
                instance, pos = read_int(data, pos)
            else:
                instance = b & 0x7F
                last = pos + 10
                pos += 1
                while not b & 0x80:
                    if pos >= last:
                        raise ValueError("an integer longer than 64 bits")
                    b = data[pos]
                    instance = (instance << 7) | (b & 0x7F)
                    pos += 1
            if i == 0 and not 0 <= session <= MAX_ID:
                _id_error(i, server, session, instance, server_id, session)
        else:
            s_server, pos = read_int(data, pos)
            s_session, pos = read_int(data, pos)
            instance, pos = read_int(data, pos)
            if s_server != server or s_session != session:
                _id_error(i, s_server, s_session, instance, server_id, session)
        if server != server_id or not 0 <= instance <= MAX_ID:
            _id_error(i, server, session, instance, server_id, session)

        # type: Array(String), looked up by its encoding. Nearly always a type seen
        # before, followed by the previous event's timestamp: the bytes up to the next
        # occurrence of that timestamp are looked up first (one `find`, no walk of the
        # segments). A hit is exactly what the walk gives: a cached key is bytes a walk
        # consumed whole, and the walk from `pos` is fixed by the bytes, so bytes that
        # start with a cached key walk to its end (no key is a proper prefix of another).
        # Anything else takes the walk.
        event_type = None
        if last_ts is not None:
            found = find(last_ts, pos, pos + _TYPE_FIND_MAX)
            if found > pos:
                event_type = types.get(data[pos:found])
                if event_type is not None:
                    pos = found + len(last_ts)
        if event_type is None:
            type_start = pos
            b = data[pos]
            if b & 0xC0 == 0x80:  # a one-byte non-negative Integer, nearly always
                segments = b & 0x3F
                pos += 1
            else:
                segments, pos = read_int(data, pos)
                if segments < 0 or segments > end - pos:
                    raise ValueError(f"bad type segment count {segments}")
            for _ in range(segments):
                b = data[pos]
                if b & 0xC0 == 0x80:
                    pos += 1 + (b & 0x3F)
                else:
                    n, pos = read_int(data, pos)
                    if n < 0:
                        raise ValueError("negative length")
                    pos += n
            if pos > end:
                raise ValueError("a type segment runs past the end")
            key = data[type_start:pos]
            event_type = types.get(key)
            if event_type is None:
                event_type = _new_type(i, (server, session, instance), key, types)

            # timestamp, the previous event's nearly always
            if last_ts is not None and startswith(last_ts, pos):
                pos += len(last_ts)
            else:
                ts_start = pos
                s, pos = read_int(data, pos)
                us, pos = read_int(data, pos)
                ts_us = _us(i, (server, session, instance), s, us)
                last_ts = data[ts_start:pos]

        b = data[pos]  # sourceTimestamp: Optional(Timestamp)
        pos += 1
        if b == 0x80:
            source_us = None
        elif b == 0x81:
            # The previous source timestamp, as encoded, is tried first (as for the
            # timestamp above: its two Integers are prefix-free, so bytes that start with
            # it decode to it): producers stamp at millisecond resolution or coarser, so
            # a burst repeats one, and two read_int calls per event were a tenth of a
            # merge's CPU.
            if last_sts is not None and startswith(last_sts, pos):
                pos += len(last_sts)
                source_us = last_source_us
            else:
                sts_start = pos
                s, pos = read_int(data, pos)
                us, pos = read_int(data, pos)
                source_us = last_source_us = _us(i, (server, session, instance), s, us)
                last_sts = data[sts_start:pos]
        else:
            raise ValueError(f"bad sourceTimestamp option at {pos - 1}")

        b = data[pos]  # payload: Optional(Choice {binary: Record {type, data}, json: String})
        pos += 1
        if b == 0x80:
            kind, ptype, payload = _KIND_NONE, None, None
        elif b == 0x81:
            choice = data[pos]
            pos += 1
            b = data[pos]
            if b & 0xC0 == 0x80:
                n = b & 0x3F
                pos += 1
            else:
                n, pos = read_int(data, pos)
                if n < 0:
                    raise ValueError("negative length")
            if pos + n > end:
                raise ValueError("a payload runs past the end")
            if choice == 0x81:
                kind, ptype, payload = _KIND_JSON, None, data[pos : pos + n].decode()
                pos += n
            elif choice == 0x80:
                kind, ptype = _KIND_BINARY, data[pos : pos + n].decode()
                pos += n
                n, pos = read_int(data, pos)
                if n < 0 or pos + n > end:
                    raise ValueError("a payload runs past the end")
                payload = data[pos : pos + n]
                pos += n
            else:
                raise ValueError(f"bad payload choice {choice:#x}")
        else:
            raise ValueError(f"bad payload option at {pos - 1}")
        append(
            [
                None,
                server,
                session,
                instance,
                event_type,
                ts_us,
                source_us,
                kind,
                ptype,
                payload,
                data[start:pos],
            ]
        )
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last event")
    return rows


def _id_error(
    i: int, server: int, session: int, instance: int, server_id: int, first_session: int
) -> None:
    eid = (server, session, instance)
    if server != server_id:
        raise ProtocolError(
            f"event {i} {eid} is of server {server}, this stream is for server {server_id}"
        )
    if session != first_session:
        raise ProtocolError(f"MsgEvents mixes sessions {first_session} and {session} (event {i})")
    if not (0 <= session <= MAX_ID and 0 <= instance <= MAX_ID):
        raise ProtocolError(f"event {i}: id {eid} is outside 0..2^63-1")
    # Equal values encoded differently: not an error, the caller goes on.


def _new_type(i: int, eid: tuple, key: bytes, types: dict[bytes, tuple]) -> tuple:
    count, pos = read_int(key, 0)
    parts = []
    for _ in range(count):
        n, pos = read_int(key, pos)
        parts.append(key[pos : pos + n].decode())
        pos += n
    event_type = tuple(parts)
    if (error := event_type_error(event_type)) is not None:  # the shared rule
        raise ProtocolError(f"event {i} {eid}: {error}")
    if len(types) >= TYPE_CACHE_MAX:
        types.clear()
    types[key] = event_type
    return event_type


def _us(i: int, eid: tuple, s: int, us: int) -> int:
    # Cheap bounds first; the exact rule (timestamp_to_us) only near the edges.
    if 0 <= us < _US and _MIN_S < s < _MAX_S:
        return s * _US + us
    try:
        return timestamp_to_us(Timestamp(s, us))
    except ValueError as err:
        raise ProtocolError(f"event {i} {eid}: {err}") from err
