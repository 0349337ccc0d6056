"""Events to encode and decode in the Syncer's wire and merge-row tests, and SBS bytes
the encoders refuse to write."""

from __future__ import annotations

from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Timestamp,
)


def ev(server=1, session=1, instance=1, type_=("a",), ts=Timestamp(1, 0), payload=None) -> Event:
    """One event, every field defaulted but the ones a test is about."""
    return Event(EventId(server, session, instance), tuple(type_), ts, None, payload)


def varied(n: int, session: int | None = 7) -> list[Event]:
    """Every SBS shape: long and short integers, empty and long type segments (some
    types repeated, some timestamps repeated and some not), with and without source
    timestamps (negative seconds too), none/JSON/binary payloads of many lengths.

    All in `session` (one session's MsgEvents); None: each in its own session, of many
    lengths (an events array that is not one session's)."""
    out = []
    for i in range(n):
        payload = [
            None,
            EventPayloadJson(f'{{"a": {i}, "é": "{"x" * (i % 90)}"}}'),
            EventPayloadBinary("t" * (i % 70), bytes(range(256))[: i % 200]),
        ][i % 3]
        out.append(
            Event(
                EventId(
                    1,
                    i * 99_999 if session is None else session,
                    1 + i * 7_777_777 + (1 << 40) * (i % 2),
                ),
                tuple(f"s{j}" * (i % 40) for j in range(1 + i % 4)) if i % 5 else ("x", "y"),
                Timestamp(1_700_000_000 + i // 4, i // 4 * 13 % 1_000_000),
                Timestamp(i * 1000 - 500_000, i % 1_000_000) if i % 2 else None,
                payload,
            )
        )
    return out


def sbs_int(n: int) -> bytes:
    """Any int as an SBS Integer, also beyond 64 bits (the encoder refuses what no int64
    holds): for the decoders' bounds."""
    groups = []
    while True:
        groups.append(n & 0x7F)
        n >>= 7
        if n == (-1 if groups[-1] & 0x40 else 0):
            break
    groups.reverse()
    groups[-1] |= 0x80
    return bytes(groups)
