"""The SBS ``HatEventer.Event`` bytes of events registered from PUBs, built by hand.

The engine stores, notifies and sends (Syncer) each event's SBS encoding, and builds it
with the C codec unless the registering protocol hands it over (`Engine.register`'s
`encode`). For PUB batches the codec was a fifth of the replica's event-loop samples in
the throughput benchmark (a dict of SBS values per event, then the generic encoder). An
``Event`` is encoded field by field: ``id`` (three Integers), ``type`` (an Array of
Strings), ``timestamp`` (two Integers), ``sourceTimestamp`` and ``payload`` (Optionals:
one Integer, 0 none / 1 value, then the value; the payload a Choice, 0 binary / 1 JSON).
So a batch's events share their id's server and session, their type bytes come from a
cache and their timestamp is one per session; only the instance, the source timestamp
and the payload are per event. `encode` falls back to the codec for any event it does
not build (negative integers: `encode_int` writes non-negative ones only), and a unit
test checks it byte for byte against the codec.
"""

from __future__ import annotations

from eventfleet_server.common import codec
from eventfleet_server.common.model import Event, EventPayloadBinary, EventPayloadJson, EventType
from eventfleet_server.common.sbsint import encode_int

_NONE = b"\x80"  # Optional none (Integer 0)
_JSON = b"\x81\x81"  # Optional value, Choice 1 (json)
_BINARY = b"\x81\x80"  # Optional value, Choice 0 (binary)
_VALUE = b"\x81"  # Optional value
_LAST_GROUP = [bytes([0x80 | i]) for i in range(128)]
_TYPES: dict[EventType, bytes] = {}
_TYPES_MAX = 65536


def _string(text: str) -> bytes:
    data = text.encode()
    return encode_int(len(data)) + data


def _type_bytes(event_type: EventType) -> bytes:
    """The Array(String) of an event type (cached: PUB streams repeat a few topics)."""
    data = _TYPES.get(event_type)
    if data is None:
        data = encode_int(len(event_type)) + b"".join(map(_string, event_type))
        if len(_TYPES) >= _TYPES_MAX:
            _TYPES.clear()
        _TYPES[event_type] = data
    return data


def encode(created: list[Event]) -> list[bytes]:
    """The SBS ``Event`` bytes of `created` (one engine session), in order."""
    out: list[bytes] = []
    if not created:
        return out
    append = out.append
    join = b"".join
    head = created[0]
    server, session, ts = head.id.server, head.id.session, head.timestamp
    fast = server >= 0 and session >= 0 and ts.s >= 0 and ts.us >= 0
    if fast:
        id_prefix = encode_int(server) + encode_int(session)
        ts_bytes = encode_int(ts.s) + encode_int(ts.us)
    high = -1  # instance >> 7 of `prefix`: the instance's bytes but its last
    prefix = b""
    last_group = _LAST_GROUP
    last_source = None
    source_bytes = _NONE
    json_type = EventPayloadJson
    binary_type = EventPayloadBinary
    for event in created:
        event_id = event.id
        instance = event_id.instance
        source = event.source_timestamp
        if (
            not fast
            or instance < 0
            or event_id.server != server
            or event_id.session != session
            or event.timestamp != ts
        ):
            append(codec.encode_event(event))
            continue
        if source is not last_source:
            if source is None:
                source_bytes = _NONE
            elif source.s >= 0 and source.us >= 0:
                source_bytes = _VALUE + encode_int(source.s) + encode_int(source.us)
            else:
                append(codec.encode_event(event))
                continue
            last_source = source
        payload = event.payload
        kind = type(payload)
        if kind is json_type:
            data = payload.data.encode()
            payload_bytes = join((_JSON, encode_int(len(data)), data))
        elif kind is binary_type:
            data = payload.data
            payload_bytes = join((_BINARY, _string(payload.type), encode_int(len(data)), data))
        elif payload is None:
            payload_bytes = _NONE
        else:
            append(codec.encode_event(event))
            continue
        # Instances are consecutive: one differs from the previous one only in its last
        # 7-bit group until that group wraps (a prefix and a byte from a table).
        if instance >> 7 == high and instance >= 128:
            instance_bytes = prefix + last_group[instance & 0x7F]
        else:
            instance_bytes = encode_int(instance)
            high, prefix = instance >> 7, instance_bytes[:-1]
        append(
            join(
                (
                    id_prefix,
                    instance_bytes,
                    _type_bytes(event.type),
                    ts_bytes,
                    source_bytes,
                    payload_bytes,
                )
            )
        )
    return out
