"""Conversion between SBS values (hat-sbs data) and the model.

hat-sbs represents a Record as a dict, a Choice as ``(name, value)`` and an
Optional as ``('value', x)`` / ``('none', None)``. Decoders raise `ValueError` with
the offending field named so a connection can answer with a clear error.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence

from hat import sbs

from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Order,
    OrderBy,
    QueryLatestParams,
    QueryParams,
    QueryResult,
    QueryServerParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Status,
    Timestamp,
)
from eventfleet_server.common.sbsint import encode_int, read_int

NONE = ("none", None)


def _load_repo() -> sbs.Repository:
    folder = importlib.resources.files(__package__) / "sbs"
    texts = [
        (folder / name).read_text()
        for name in ("HatChatter.sbs", "HatEventer.sbs", "HatSyncer.sbs")
    ]
    return sbs.Repository(*texts)


repo: sbs.Repository = _load_repo()
"""The SBS repository with the HatChatter, HatEventer and HatSyncer modules."""


def opt(value):
    return NONE if value is None else ("value", value)


def _unopt(data):
    return data[1] if data[0] == "value" else None


def timestamp_to_sbs(t: Timestamp) -> dict:
    return {"s": t.s, "us": t.us}


def timestamp_from_sbs(data: dict) -> Timestamp:
    return Timestamp(data["s"], data["us"])


def event_id_to_sbs(i: EventId) -> dict:
    return {"server": i.server, "session": i.session, "instance": i.instance}


def event_id_from_sbs(data: dict) -> EventId:
    return EventId(data["server"], data["session"], data["instance"])


def status_to_sbs(status: Status) -> tuple:
    return (status.value, None)


def status_from_sbs(data: tuple) -> Status:
    return Status(data[0])


def payload_to_sbs(payload) -> tuple:
    if payload is None:
        return NONE
    if isinstance(payload, EventPayloadJson):
        return ("value", ("json", payload.data))
    return ("value", ("binary", {"type": payload.type, "data": payload.data}))


def payload_from_sbs(data: tuple):
    if data[0] != "value":
        return None
    kind, value = data[1]
    if kind == "json":
        return EventPayloadJson(value)
    return EventPayloadBinary(value["type"], bytes(value["data"]))


def event_to_sbs(e: Event) -> dict:
    st = e.source_timestamp
    return {
        "id": {"server": e.id.server, "session": e.id.session, "instance": e.id.instance},
        "type": list(e.type),
        "timestamp": {"s": e.timestamp.s, "us": e.timestamp.us},
        "sourceTimestamp": NONE if st is None else ("value", {"s": st.s, "us": st.us}),
        "payload": payload_to_sbs(e.payload),
    }


_EVENT = "HatEventer.Event"


def encode_event(e: Event) -> bytes:
    """The SBS ``HatEventer.Event`` bytes of `e`: what the storage keeps next to each
    event and every Eventer/Syncer message carries as an array element."""
    return repo.encode(_EVENT, event_to_sbs(e))


def events_array(items: Sequence[bytes]) -> bytes:
    """An SBS ``Array(Event)`` from encoded elements (`encode_event` bytes): the count,
    then the elements as they are. This is the whole body of ``MsgEventsNotify``, the
    Syncer's ``MsgEvents`` and the array inside ``MsgQueryRes``/``MsgRegisterRes``."""
    return b"".join([encode_int(len(items)), *items])


def query_res(items: Sequence[bytes], more_follows: bool) -> bytes:
    """``MsgQueryRes`` (Record {events: Array(Event), moreFollows: Boolean}) from
    encoded elements; a Boolean is one byte, 1 or 0."""
    return b"".join([encode_int(len(items)), *items, b"\x01" if more_follows else b"\x00"])


def _length(data: bytes, pos: int) -> tuple[int, int]:
    # A String/Bytes length: one byte (0b10xxxxxx) nearly always, else the long way.
    b = data[pos]
    if b & 0xC0 == 0x80:
        return b & 0x3F, pos + 1
    n, pos = read_int(data, pos)
    if n < 0:
        raise ValueError("negative length")
    return n, pos


def split_events_array(data: bytes) -> list[bytes]:
    """The element bytes of an SBS ``Array(Event)`` (a ``MsgEvents``/``MsgEventsNotify``
    body), each exactly what `encode_event` gives for that event, by walking the
    encoding without decoding it: an Integer ends at its first byte with bit 0x80 set,
    so skipping one is a scan. Raises ValueError on bytes that are not such an array
    (run the C decoder on `data` too: it validates the values themselves).

    This is the Syncer's receiving hot path (every merged event is stored with these
    bytes), hence one flat loop."""
    try:
        count, pos = read_int(data, 0)
        if count < 0:
            raise ValueError("negative event count")
        out: list[bytes] = []
        append = out.append
        length = _length
        for _ in range(count):
            start = pos
            for _ in range(3):  # id: server, session, instance
                while data[pos] < 0x80:
                    pos += 1
                pos += 1
            segments, pos = length(data, pos)  # type: Array(String)
            for _ in range(segments):
                n, pos = length(data, pos)
                pos += n
            for _ in range(2):  # timestamp: s, us
                while data[pos] < 0x80:
                    pos += 1
                pos += 1
            b = data[pos]  # sourceTimestamp: Optional(Timestamp)
            pos += 1
            if b == 0x81:
                for _ in range(2):
                    while data[pos] < 0x80:
                        pos += 1
                    pos += 1
            elif b != 0x80:
                raise ValueError(f"bad sourceTimestamp option at {pos - 1}")
            b = data[pos]  # payload: Optional(Choice {binary: Record, json: String})
            pos += 1
            if b == 0x81:
                kind = data[pos]
                pos += 1
                if kind == 0x81:  # json: the text
                    n, pos = length(data, pos)
                    pos += n
                elif kind == 0x80:  # binary: type, data
                    n, pos = length(data, pos)
                    n, pos = length(data, pos + n)
                    pos += n
                else:
                    raise ValueError(f"bad payload choice at {pos - 1}")
            elif b != 0x80:
                raise ValueError(f"bad payload option at {pos - 1}")
            if pos > len(data):
                raise ValueError("truncated")
            append(data[start:pos])
    except IndexError:
        raise ValueError("truncated") from None
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes after the last event")
    return out


def _read_int(data: bytes, pos: int) -> tuple[int, int]:
    # An SBS Integer: big-endian 7-bit groups, the last byte marked with 0x80, the sign
    # from bit 0x40 of the first; at most 10 bytes (64 bits), so garbage cannot make a
    # huge Python int.
    b = data[pos]
    value = -1 if b & 0x40 else 0
    end = pos + 10
    while True:
        value = (value << 7) | (b & 0x7F)
        pos += 1
        if b & 0x80:
            return value, pos
        if pos >= end:
            raise ValueError("an integer longer than 64 bits")
        b = data[pos]


def decode_events_array(data: bytes) -> tuple[list[Event], list[bytes]]:
    """The events of an SBS ``Array(Event)`` and each one's element bytes (what
    `encode_event` gives for it), in one walk of the encoding: the Syncer's receiving
    hot path, where the C decoder's dicts plus a second walk for the bytes cost more.
    Raises ValueError on bytes that are not such an array (truncated, a bad choice, an
    integer over 64 bits, text that is not UTF-8). Values are not range-checked here."""
    new = tuple.__new__
    read_int = _read_int
    end = len(data)
    try:
        count, pos = read_int(data, 0)
        if count < 0 or count > end:
            raise ValueError(f"bad event count {count}")
        events: list[Event] = []
        elements: list[bytes] = []
        for _ in range(count):
            start = pos
            server, pos = read_int(data, pos)
            session, pos = read_int(data, pos)
            instance, pos = read_int(data, pos)
            segments, pos = read_int(data, pos)
            if segments < 0 or segments > end - pos:
                raise ValueError(f"bad type segment count {segments}")
            parts = []
            for _ in range(segments):
                n, pos = read_int(data, pos)
                if n < 0 or pos + n > end:
                    raise ValueError("a type segment runs past the end")
                parts.append(data[pos : pos + n].decode())
                pos += n
            s, pos = read_int(data, pos)
            us, pos = read_int(data, pos)
            b = data[pos]
            pos += 1
            if b == 0x81:
                ss, pos = read_int(data, pos)
                sus, pos = read_int(data, pos)
                source = new(Timestamp, (ss, sus))
            elif b == 0x80:
                source = None
            else:
                raise ValueError(f"bad sourceTimestamp option at {pos - 1}")
            b = data[pos]
            pos += 1
            if b == 0x80:
                payload = None
            elif b == 0x81:
                kind = data[pos]
                pos += 1
                n, pos = read_int(data, pos)
                if n < 0 or pos + n > end:
                    raise ValueError("a payload runs past the end")
                if kind == 0x81:  # json
                    payload = new(EventPayloadJson, (data[pos : pos + n].decode(),))
                    pos += n
                elif kind == 0x80:  # binary: type, data
                    ptype = data[pos : pos + n].decode()
                    pos += n
                    n, pos = read_int(data, pos)
                    if n < 0 or pos + n > end:
                        raise ValueError("a payload runs past the end")
                    payload = new(EventPayloadBinary, (ptype, data[pos : pos + n]))
                    pos += n
                else:
                    raise ValueError(f"bad payload choice at {pos - 1}")
            else:
                raise ValueError(f"bad payload option at {pos - 1}")
            events.append(
                new(
                    Event,
                    (
                        new(EventId, (server, session, instance)),
                        tuple(parts),
                        new(Timestamp, (s, us)),
                        source,
                        payload,
                    ),
                )
            )
            elements.append(data[start:pos])
    except IndexError:
        raise ValueError("truncated") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"text is not UTF-8: {e}") from None
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last event")
    return events, elements


def event_from_sbs(data: dict) -> Event:
    st = data["sourceTimestamp"]
    return Event(
        id=event_id_from_sbs(data["id"]),
        type=tuple(data["type"]),
        timestamp=timestamp_from_sbs(data["timestamp"]),
        source_timestamp=None if st[0] != "value" else timestamp_from_sbs(st[1]),
        payload=payload_from_sbs(data["payload"]),
    )


def register_event_to_sbs(e: RegisterEvent) -> dict:
    st = e.source_timestamp
    return {
        "type": list(e.type),
        "sourceTimestamp": NONE if st is None else ("value", timestamp_to_sbs(st)),
        "payload": payload_to_sbs(e.payload),
    }


def register_event_from_sbs(data: dict) -> RegisterEvent:
    st = data["sourceTimestamp"]
    return RegisterEvent(
        type=tuple(data["type"]),
        source_timestamp=None if st[0] != "value" else timestamp_from_sbs(st[1]),
        payload=payload_from_sbs(data["payload"]),
    )


def _types_to_sbs(types):
    return NONE if types is None else ("value", [list(t) for t in types])


def _types_from_sbs(data):
    return None if data[0] != "value" else [tuple(t) for t in data[1]]


def _ts_opt_to_sbs(t):
    return NONE if t is None else ("value", timestamp_to_sbs(t))


def _ts_opt_from_sbs(data):
    return None if data[0] != "value" else timestamp_from_sbs(data[1])


def _id_opt_to_sbs(i):
    return NONE if i is None else ("value", event_id_to_sbs(i))


def _id_opt_from_sbs(data):
    return None if data[0] != "value" else event_id_from_sbs(data[1])


def query_params_to_sbs(params: QueryParams) -> tuple:
    if isinstance(params, QueryLatestParams):
        return ("latest", {"eventTypes": _types_to_sbs(params.event_types)})
    if isinstance(params, QueryTimeseriesParams):
        return (
            "timeseries",
            {
                "eventTypes": _types_to_sbs(params.event_types),
                "tFrom": _ts_opt_to_sbs(params.t_from),
                "tTo": _ts_opt_to_sbs(params.t_to),
                "sourceTFrom": _ts_opt_to_sbs(params.source_t_from),
                "sourceTTo": _ts_opt_to_sbs(params.source_t_to),
                "order": (params.order.value, None),
                "orderBy": (params.order_by.value, None),
                "maxResults": opt(params.max_results),
                "lastEventId": _id_opt_to_sbs(params.last_event_id),
            },
        )
    if isinstance(params, QueryServerParams):
        return (
            "server",
            {
                "serverId": params.server_id,
                "persisted": params.persisted,
                "maxResults": opt(params.max_results),
                "lastEventId": _id_opt_to_sbs(params.last_event_id),
            },
        )
    raise TypeError(f"unsupported query params {params!r}")


def query_params_from_sbs(data: tuple) -> QueryParams:
    kind, value = data
    if kind == "latest":
        return QueryLatestParams(event_types=_types_from_sbs(value["eventTypes"]))
    if kind == "timeseries":
        return QueryTimeseriesParams(
            event_types=_types_from_sbs(value["eventTypes"]),
            t_from=_ts_opt_from_sbs(value["tFrom"]),
            t_to=_ts_opt_from_sbs(value["tTo"]),
            source_t_from=_ts_opt_from_sbs(value["sourceTFrom"]),
            source_t_to=_ts_opt_from_sbs(value["sourceTTo"]),
            order=Order(value["order"][0]),
            order_by=OrderBy(value["orderBy"][0]),
            max_results=_unopt(value["maxResults"]),
            last_event_id=_id_opt_from_sbs(value["lastEventId"]),
        )
    if kind == "server":
        return QueryServerParams(
            server_id=value["serverId"],
            persisted=value["persisted"],
            max_results=_unopt(value["maxResults"]),
            last_event_id=_id_opt_from_sbs(value["lastEventId"]),
        )
    raise ValueError(f"unsupported query type {kind!r}")


def query_result_to_sbs(result: QueryResult) -> dict:
    return {"events": [event_to_sbs(e) for e in result.events], "moreFollows": result.more_follows}


def query_result_from_sbs(data: dict) -> QueryResult:
    return QueryResult([event_from_sbs(e) for e in data["events"]], data["moreFollows"])
