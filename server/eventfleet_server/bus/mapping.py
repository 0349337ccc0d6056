"""Events <-> Event BUS records (topic, producer, timestamp, UUID, msgpack data).

Engine-free. docs/bus.md explains the mapping with examples; in short:

- An event that came in over the BUS keeps the client's UUID and producer id *inside its
  payload*, because the payload is the only free field of an event that the Syncer
  carries to every other replica (so every replica broadcasts the same UUID and
  producer). The payload is an envelope:

  * data JSON can hold -> JSON payload ``{"$bus": {"uuid": U, "producer": P}, "data": V}``
  * anything else (bytes, msgpack ext types, non-string map keys, NaN/Infinity) ->
    binary payload of type ``eventfleet.bus`` whose data is the msgpack map
    ``{"uuid": U, "producer": P, "data": <the client's msgpack bytes, verbatim>}``.

- Any other event (Eventer, Syncer from a non-BUS source, ...): UUID = uuid5 of its id
  (deterministic, so every replica derives the same one), producer
  ``eventfleet/<server id>``, data = the JSON payload's value, the binary payload's bytes
  or nil.
"""

from __future__ import annotations

import functools
import json
import math
import uuid as uuidlib
from typing import Any, NamedTuple

import msgpack

from eventfleet_server.common import jsontext
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Payload,
    RegisterEvent,
    Timestamp,
)

ENVELOPE_KEY = "$bus"
BINARY_TYPE = "eventfleet.bus"
# Namespace of the UUIDs of events that did not come in over the BUS (a fixed uuid4).
UUID_NAMESPACE = uuidlib.UUID("6c1b0f0e-3f55-4d0c-9a43-0d6f3e2b9a51")
_NIL = msgpack.packb(None)
# One packer for every value: `msgpack.packb` builds a Packer per call (two thirds of its
# cost for a small value); the bytes are the same. Only used on the event loop's thread.
_PACK = msgpack.Packer(use_bin_type=True).pack


class MappingError(ValueError):
    """The data frame cannot become a payload (message names why)."""


class Record(NamedTuple):
    """What a BROADCAST or SYNC carries besides topic and sequence."""

    producer: str
    uuid: str
    data: bytes  # msgpack
    from_bus: bool  # the UUID is a client's (kept in the payload), not derived


def derived_uuid(event_id: EventId) -> str:
    """The BUS UUID of an event that did not come in over the BUS."""
    return str(
        uuidlib.uuid5(UUID_NAMESPACE, f"{event_id.server}/{event_id.session}/{event_id.instance}")
    )


@functools.lru_cache(maxsize=1024)
def producer_of(server_id: int) -> str:
    """``eventfleet/<server id>``: the producer of events that did not come in over the
    BUS (cached: a fleet has a handful of server ids)."""
    return f"eventfleet/{server_id}"


MAX_JSON_DEPTH = 128
"""Arrays and maps nested deeper than this go into the binary envelope, not JSON: every
replica must read an envelope back (the Syncer's peers, the snapshot), and Python's
parser stops near 1,000 levels minus the caller's stack (other parsers sooner: 128 is
serde_json's limit)."""


def _json_safe(value: Any, depth: int = 0) -> bool:
    # JSON holds: nil, bool, int, finite float, str, arrays, maps with string keys.
    # Exact type checks: msgpack decodes to exactly these types (and bytes, ExtType).
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return True
    if t is float:
        return math.isfinite(value)
    if depth >= MAX_JSON_DEPTH:
        return False
    depth += 1
    if t is dict:
        for k, v in value.items():
            if type(k) is not str or not _json_safe(v, depth):
                return False
        return True
    if t is list or t is tuple:
        for v in value:
            if not _json_safe(v, depth):
                return False
        return True
    return False


def unpack(data: bytes) -> Any:
    """Decode a data frame; an empty frame is nil (the reference client sends one)."""
    if not data:
        return None
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise MappingError(f"data is not valid msgpack: {type(e).__name__}: {e}") from e


# One encoder for every envelope: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ENCODE = _ENCODER.encode


def _c_encode():
    """`_ENCODE` without its per-call cost: `JSONEncoder.encode` builds the C encoder
    anew on every call (2.5 of its 4 µs for a small value); this one is built once, with
    the same arguments, so its text is the same. No circular-reference markers: a value
    decoded from msgpack cannot contain itself. Falls back to `_ENCODE` where CPython's
    C accelerator is missing."""
    make = json.encoder.c_make_encoder
    if make is None:
        return _ENCODE
    iterencode = make(
        None,
        _ENCODER.default,
        json.encoder.encode_basestring,
        None,
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        False,
        False,
        False,
    )
    join = "".join
    return lambda value: join(iterencode(value, 0))


_ENCODE_VALUE = _c_encode()


_PRODUCERS: dict[str, str] = {}  # producer id -> its JSON string (a client has one)


def _producer_json(producer: str) -> str:
    text = _PRODUCERS.get(producer)
    if text is None:
        if len(_PRODUCERS) >= 4096:
            _PRODUCERS.clear()
        text = _PRODUCERS[producer] = _ENCODE(producer)
    return text


def to_payload(uuid: str, producer: str, data: bytes) -> Payload:
    """The payload envelope of a PUB (see the module doc); `MappingError` on bad data.

    Written for the PUB hot path: the JSON envelope is put together from its encoded
    parts, exactly the text ``json.dumps({"$bus": {"uuid": ..., "producer": ...},
    "data": ...})`` with compact separators gives.
    """
    try:
        value = unpack(data)
    except MappingError:
        raise
    except UnicodeDecodeError as e:  # a str that is not UTF-8
        raise MappingError(f"data is not valid msgpack: {e}") from e
    if _json_safe(value):  # bounded by MAX_JSON_DEPTH: no RecursionError here
        return EventPayloadJson(
            f'{{"$bus":{{"uuid":{_ENCODE(uuid)},"producer":{_producer_json(producer)}}},'
            f'"data":{_ENCODE_VALUE(value)}}}'
        )
    envelope = msgpack.packb(
        {"uuid": uuid, "producer": producer, "data": data or _NIL}, use_bin_type=True
    )
    return EventPayloadBinary(BINARY_TYPE, envelope)


def to_register_event(
    event_type: tuple[str, ...],
    source_timestamp: Timestamp | None,
    uuid: str,
    producer: str,
    data: bytes,
) -> RegisterEvent:
    return RegisterEvent(event_type, source_timestamp, to_payload(uuid, producer, data))


def envelope_uuid(payload: Payload) -> str | None:
    """The client UUID an envelope carries, or None (for the dedup index).

    A JSON payload in the exact layout `to_payload` writes is answered from its head and
    a check that its data is one JSON value, without re-encoding the data as msgpack
    (`_envelope_fast` does: a replica without BUS subscribers spent a sixth of its loop
    in `envelope_uuid` for the events it merged)."""
    if type(payload) is EventPayloadJson:
        text = payload.data
        if ENVELOPE_KEY not in text[:32]:
            # Not an envelope (`_envelope`'s own first test, done here: nearly every
            # Eventer event ends here, once per committed event).
            return None
        uuid = _fast_uuid(text)
        if uuid is not None:
            return uuid
    found = _envelope(payload)
    return found[0] if found else None


def _fast_uuid(text: str) -> str | None:
    """The UUID of a JSON envelope in `to_payload`'s layout (None: not that layout)."""
    if not text.startswith(_FAST_HEAD) or text[53:67] != _FAST_PRODUCER:
        return None
    uuid = text[17:53]
    end = text.find('"', 67)
    if (
        end < 0
        or '"' in uuid
        or "\\" in uuid
        or "\\" in text[67:end]
        or not text.startswith(_FAST_DATA, end)
        or not text.endswith("}")
    ):
        return None
    if _one_value(text, end + len(_FAST_DATA)) is _NOT_ONE_VALUE:  # a two-key envelope
        return None
    return uuid


# json's own scanner, called at an index: one JSON value without `json.loads`'s wrapper
# (a slice, two whitespace matches); 3.3 -> 0.9 µs for the BUS benchmark's data, on every
# envelope a replica merges from its peers.
_SCAN = (json.scanner.c_make_scanner or json.scanner.py_make_scanner)(json.JSONDecoder())
_NOT_ONE_VALUE = object()


def _one_value(text: str, start: int) -> Any:
    """The JSON value that fills ``text[start:-1]`` exactly, or `_NOT_ONE_VALUE` (not
    JSON, more than one value, whitespace around it, or nested too deeply to parse: the
    general parser decides those). Where it answers, ``json.loads(text[start:-1])``
    gives the same value."""
    try:
        value, end = _SCAN(text, start)
    except (ValueError, StopIteration, RecursionError):
        return _NOT_ONE_VALUE
    return value if end == len(text) - 1 else _NOT_ONE_VALUE


def _envelope(payload: Payload) -> tuple[str, str, bytes] | None:
    """(uuid, producer, msgpack data) if `payload` is a BUS envelope, else None."""
    if isinstance(payload, EventPayloadJson):
        text = payload.data
        if ENVELOPE_KEY not in text[:32]:
            return None
        return _envelope_fast(text) or _envelope_json(text)
    if isinstance(payload, EventPayloadBinary) and payload.type == BINARY_TYPE:
        try:
            obj = msgpack.unpackb(payload.data, raw=False)
            uuid, producer, data = obj["uuid"], obj["producer"], obj["data"]
        except Exception:
            return None
        if isinstance(uuid, str) and isinstance(producer, str) and isinstance(data, bytes):
            return uuid, producer, data
    return None


def _envelope_json(text: str) -> tuple[str, str, bytes] | None:
    """`_envelope` of a JSON payload, by parsing it."""
    try:
        obj = json.loads(text)
        if not isinstance(obj, dict) or len(obj) != 2 or "data" not in obj:
            return None
        meta = obj[ENVELOPE_KEY]
        uuid, producer = meta["uuid"], meta["producer"]
        if not isinstance(uuid, str) or not isinstance(producer, str):
            return None
        return uuid, producer, _PACK(obj["data"])
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return None


_FAST_HEAD = '{"$bus":{"uuid":"'
_FAST_PRODUCER = '","producer":"'
_FAST_DATA = '"},"data":'


def _envelope_fast(text: str) -> tuple[str, str, bytes] | None:
    """`_envelope` of a JSON envelope exactly as `to_payload` writes it, without
    parsing the envelope itself (only the data). None: not that form, or not an
    envelope at all; the general parser decides then. When this answers, the general
    parser's answer is the same: the text is the head, a UUID and a producer string
    without escapes, and one JSON value, so it is a two-key object of that content."""
    if not text.startswith(_FAST_HEAD) or text[53:67] != _FAST_PRODUCER:
        return None
    uuid = text[17:53]
    end = text.find('"', 67)
    if end < 0 or not text.endswith("}"):
        return None
    producer = text[67:end]
    if "\\" in producer or '"' in uuid or "\\" in uuid:
        return None
    if not text.startswith(_FAST_DATA, end):
        return None
    value = _one_value(text, end + len(_FAST_DATA))
    if value is _NOT_ONE_VALUE:
        return None
    try:
        return uuid, producer, _PACK(value)
    except (ValueError, TypeError, OverflowError):
        return None


def to_record(event: Event) -> Record:
    """The BUS view of any stored event."""
    payload = event.payload
    if isinstance(payload, EventPayloadJson):
        ptype, data = None, payload.data
    elif isinstance(payload, EventPayloadBinary):
        ptype, data = payload.type, payload.data
    else:
        ptype = data = None
    eid = event.id
    return record_of(eid.server, eid.session, eid.instance, ptype, data)


def record_of(
    server: int, session: int, instance: int, ptype: str | None, data: str | bytes | None
) -> Record:
    """`to_record` of an event given by its id's parts and its payload as stored: JSON
    text (`ptype` None), binary (`ptype` its type) or none (both None). For bulk
    readers that have no event objects (the snapshot)."""
    if ptype is None:
        if data is None:
            return Record(
                producer_of(server), derived_uuid(EventId(server, session, instance)), _NIL, False
            )
        if ENVELOPE_KEY in data[:32]:
            found = _envelope_fast(data) or _envelope_json(data)
            if found is not None:
                uuid, producer, value = found
                return Record(producer, uuid, value, True)
        parsed = jsontext.parse(data)
        try:
            value = _PACK(data if parsed is jsontext.NOT_JSON else parsed)
        except (ValueError, TypeError, OverflowError):
            # Stored as sent; not JSON (or nested too deeply to parse), or an integer
            # msgpack cannot hold: the text.
            value = _PACK(data)
    else:
        if ptype == BINARY_TYPE:
            found = _envelope(EventPayloadBinary(ptype, data))
            if found is not None:
                uuid, producer, value = found
                return Record(producer, uuid, value, True)
        value = _PACK(data)
    return Record(
        producer_of(server), derived_uuid(EventId(server, session, instance)), value, False
    )


# The stored record (``events.bus``): the msgpack array of a BROADCAST's frames after
# the topic, as bin values (one C call to pack, one to unpack into the frames).
_UNPACK_RECORD = functools.partial(msgpack.unpackb, use_list=False)


def pack_record(producer: bytes, timestamp: bytes, uuid: bytes, data: bytes) -> bytes:
    """The stored BUS record of an event: ``[producer, timestamp, uuid, data]`` frames."""
    return _PACK((producer, timestamp, uuid, data))


def unpack_record(record: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    """The ``(producer, timestamp, uuid, data)`` frames of a `pack_record` value."""
    return _UNPACK_RECORD(record)


def envelope_of_stored(kind_json: bool, ptype: str | None, data: str | bytes) -> tuple | None:
    """`_envelope` of a stored payload (JSON text, or binary with its type) in the
    layouts this replica writes — `to_payload`'s JSON text, the binary envelope — else
    None (also for envelopes in another JSON layout: their readers build the record
    from the payload, which gives the same frames)."""
    if kind_json:
        if not data.startswith(_FAST_HEAD):  # type: ignore[union-attr]
            return None
        return _envelope_fast(data)  # type: ignore[arg-type]
    if ptype == BINARY_TYPE:
        return _envelope(EventPayloadBinary(ptype, data))  # type: ignore[arg-type]
    return None


def producer_timestamp(event: Event) -> Timestamp:
    """The producer timestamp frame: the source timestamp, else the server's."""
    return event.source_timestamp or event.timestamp
