"""The Eventer's messages from and to bytes, engine-free and transport-free.

Two parts. The small requests (``MsgInitReq``, ``MsgQueryReq``) are decoded from
untrusted bytes with one refusal type: each decoder runs the bounds walk
(`common.sbsguard`, so the C decoder never sees an absurd announced length), then the
hat-sbs C decoder, then the model conversion and the checks. Whatever a client can send
ends in a value or `BadRequest` naming the problem; any other exception is a bug of
ours, and the fuzz targets (tests/fuzz) fail on it.

``MsgRegisterReq`` is decoded bounded and chunked, and ``MsgRegisterRes`` spliced from
the request's bytes. The hat-sbs C decoder holds the GIL for a whole message, so a
16 MiB request of tiny events would stall the event loop (and ``/healthz``) for seconds
wherever it runs. Instead the request is walked here, element by element, without
building anything: the walk checks the limits (events per request, type segments and
segment length, payload bytes) before any decoding, then the C decoder decodes a
bounded slice of elements at a time and the caller yields to the loop between slices.

A request that fits one slice (nearly all) is first decoded in C (`_register.c`,
docs/decisions.md "Four small C extensions"): the walk, the hat-sbs decode and the
model conversion cost ~4.1 µs per event in Python, the C decode a fraction of that. It
gives exactly the events and spans of the Python path, or None for anything off its
fast path (an error, a limit, more than one slice, ...); the Python path then handles
the request or raises its precise error, so every error message is made here. The
extension is optional (setup.py): without it every request takes the Python path.

SBS layout walked (hat-sbs 0.7): an Integer is big-endian 7-bit groups, the last byte
marked with 0x80, sign from bit 0x40 of the first byte; a String/Bytes is an Integer
length and the bytes; an Array an Integer count and the elements; a Choice/Optional an
Integer index and the chosen value (None: nothing).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    RESERVED_TYPE_PREFIX,
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    InvalidEvent,
    QueryParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Timestamp,
    check_register_event,
    registered_events,
)
from eventfleet_server.common.sbsguard import SbsBoundsError, check_bounds
from eventfleet_server.common.sbsint import SbsIntError, encode_int, read_int
from eventfleet_server.common.subscription import validate_pattern

try:
    from eventfleet_server.eventer import _register as _c
except ImportError:  # not built (no C compiler): the Python path alone, the same events
    _c = None

_P = "HatEventer."

# What the hat-sbs 0.7 C decoder raises for bytes that are not the message: garbage
# lengths and choices (ValueError, UnicodeDecodeError), truncation (EOFError, and a
# SystemError "returned NULL without setting an exception" from its C code).
_DECODER_ERRORS = (SbsBoundsError, ValueError, EOFError, SystemError)


class BadRequest(ValueError):
    """The bytes are not a valid request of the named type (the message says why)."""


def _decode(type_name: str, data: bytes) -> Any:
    try:
        check_bounds(codec.repo, type_name, data)
        return codec.repo.decode(type_name, data)
    except _DECODER_ERRORS as e:
        raise BadRequest(f"{type_name.removeprefix(_P)} does not decode: {e}") from None


def decode_init_req(data: bytes) -> dict:
    """A ``MsgInitReq`` as SBS data (its subscriptions are checked by the caller, which
    answers an invalid one with its own init error)."""
    req = _decode(_P + "MsgInitReq", data)
    if not isinstance(req, dict):
        raise BadRequest(f"MsgInitReq decodes to {type(req).__name__}, not a record")
    return req


def decode_query_req(data: bytes) -> QueryParams:
    """A ``MsgQueryReq`` as query parameters, checked (`check_query`)."""
    value = _decode(_P + "MsgQueryReq", data)
    try:
        params = codec.query_params_from_sbs(value)
        check_query(params)
    except ValueError as e:  # InvalidSubscriptionError included
        raise BadRequest(f"MsgQueryReq: {e}") from None
    return params


def check_query(params: QueryParams) -> None:
    """Reject what no sensible client sends, naming the field (`ValueError`)."""
    types = getattr(params, "event_types", None)
    if types is not None:
        # The one rule a decoded pattern can break: '*' only last. A list of 1,000
        # names is checked in C (`in` on each tuple), the offender named by the full check.
        for pattern in types:
            if "*" in pattern and pattern.index("*") != len(pattern) - 1:
                validate_pattern(pattern)  # raises InvalidSubscriptionError naming it
    max_results = getattr(params, "max_results", None)
    if max_results is not None and max_results < 0:
        raise ValueError(f"maxResults {max_results} is negative")
    if isinstance(params, QueryTimeseriesParams):
        for field in ("t_from", "t_to", "source_t_from", "source_t_to"):
            t = getattr(params, field)
            if t is not None and not 0 <= t.us < 1_000_000:
                raise ValueError(f"{field} has us={t.us}, must be 0..999999")


# -- MsgRegisterReq and MsgRegisterRes ------------------------------------------------------

_REQ = "HatEventer.MsgRegisterReq"

# A slice of the request decoded in one go: at most this many events or bytes.
CHUNK_EVENTS = 128
CHUNK_BYTES = 128 * 1024


@dataclass(frozen=True)
class RegisterLimits:
    """Bounds of one register request; every field is in the Eventer schema."""

    max_events: int = 10_000
    max_payload_bytes: int = 1024 * 1024
    max_type_segments: int = 32
    max_segment_length: int = 256


class InvalidRegistration(ValueError):
    """The one refusal of a ``MsgRegisterReq``: nothing of the request is kept. Raised
    as such for an event that breaks the shared rule (`check_register_event`) or the
    reserved prefix; its subclasses say a limit or bytes that do not decode. Anything
    else out of `decode_register` is a bug (the fuzz target fails on it)."""


class RequestRefused(InvalidRegistration):
    """The request breaks a limit; the message names the event and value."""


class MalformedRequest(InvalidRegistration):
    """The bytes are not a ``MsgRegisterReq`` (garbage, truncated): a protocol error."""


def _int(data: memoryview, pos: int) -> tuple[int, int]:
    try:
        return read_int(data, pos)
    except SbsIntError as e:
        raise MalformedRequest(f"request {e}") from None


def _length(data: memoryview, pos: int, what: str) -> tuple[int, int]:
    n, pos = _int(data, pos)
    if n < 0:
        raise MalformedRequest(f"negative {what}")
    if pos + n > len(data):
        raise MalformedRequest(f"{what} {n} runs past the end of the request")
    return n, pos


def _walk_event(data: bytes, pos: int, i: int, limits: RegisterLimits) -> tuple[int, int]:
    """``(end of its type, end)`` of register event `i` at `pos`, checking the limits on
    the way.

    Every integer of a typical event (counts, choices, short lengths, and not the
    timestamps) fits one byte, ``0b10xxxxxx``: those are read inline, anything longer
    through `_int`. The walk runs for every event of every request, so a function call
    per integer was most of its cost.
    """
    try:
        b = data[pos]
        if b & 0xC0 == 0x80:
            segments = b & 0x3F
            pos += 1
        else:
            segments, pos = _int(data, pos)
        if not 0 <= segments <= limits.max_type_segments:
            if segments < 0:
                raise MalformedRequest(f"event {i}: negative segment count")
            raise RequestRefused(
                f"event {i}: type has {segments} segments (max_type_segments "
                f"{limits.max_type_segments})"
            )
        max_segment_bytes = limits.max_segment_length * 4  # UTF-8: up to 4 bytes a character
        end = len(data)
        for _ in range(segments):
            b = data[pos]
            if b & 0xC0 == 0x80:
                n = b & 0x3F
                pos += 1
                if pos + n > end:
                    raise MalformedRequest(
                        f"event {i}: type segment length {n} runs past the end of the request"
                    )
            else:
                n, pos = _length(data, pos, f"event {i}: type segment length")
            if n > max_segment_bytes:
                raise RequestRefused(
                    f"event {i}: a type segment of {n} bytes (max_segment_length "
                    f"{limits.max_segment_length} characters)"
                )
            pos += n
        type_end = pos
        b = data[pos]  # sourceTimestamp: Optional(Timestamp)
        if b == 0x80:
            pos += 1
        else:
            choice, pos = (1, pos + 1) if b == 0x81 else _int(data, pos)
            if choice != 1:
                raise MalformedRequest(f"event {i}: bad sourceTimestamp choice {choice}")
            for _ in range(2):  # s and us: skipped, only their extent matters
                j = pos
                while not data[j] & 0x80:
                    j += 1
                    if j - pos >= 10:
                        raise MalformedRequest("request integer longer than 64 bits")
                pos = j + 1
        b = data[pos]  # payload: Optional(EventPayload)
        if b == 0x80:
            pos += 1
        else:
            choice, pos = (1, pos + 1) if b == 0x81 else _int(data, pos)
            if choice != 1:
                raise MalformedRequest(f"event {i}: bad payload choice {choice}")
            kind, pos = (1, pos + 1) if data[pos] == 0x81 else _int(data, pos)
            if kind == 1 and data[pos] & 0xC0 == 0x80:  # json, a short one
                n = data[pos] & 0x3F
                pos += 1
                if pos + n > len(data):
                    raise MalformedRequest(
                        f"event {i}: payload length {n} runs past the end of the request"
                    )
            elif kind == 0:  # binary: {type: String, data: Bytes}
                n, pos = _length(data, pos, f"event {i}: binary payload type length")
                pos += n
                n, pos = _length(data, pos, f"event {i}: payload length")
            elif kind == 1:  # json: String
                n, pos = _length(data, pos, f"event {i}: payload length")
            else:
                raise MalformedRequest(f"event {i}: bad payload kind {kind}")
            if n > limits.max_payload_bytes:
                raise RequestRefused(
                    f"event {i}: payload of {n} bytes (max_payload_bytes "
                    f"{limits.max_payload_bytes})"
                )
            pos += n
    except IndexError:
        raise MalformedRequest("request truncated (integer expected)") from None
    return type_end, pos


_encode_count = encode_int


def slices(
    data: bytes, limits: RegisterLimits, spans: list[tuple[int, int, int]] | None = None
) -> Iterator[tuple[int, bytes]]:
    """``(index of the first event, a MsgRegisterReq of a few events)`` per slice.

    The count is checked first; each slice is walked (limits checked, no objects built)
    just before it is handed out, so the caller can yield to the loop between slices
    and still refuse the whole request if a later event breaks a limit. `spans`, if
    given, gets ``(start, end of type, end)`` of every event in `data`.
    """
    view = data  # indexing bytes is cheaper than a memoryview; slices below copy anyway
    count, pos = _int(view, 0)
    if count < 0:
        raise MalformedRequest("negative event count")
    if count > limits.max_events:
        raise RequestRefused(
            f"{count} events in one request (max_events_per_request {limits.max_events})"
        )
    first = 0
    while first < count:
        start = pos
        last = first
        while last < count and last - first < CHUNK_EVENTS and pos - start <= CHUNK_BYTES:
            event_start = pos
            type_end, pos = _walk_event(view, pos, last, limits)
            if spans is not None:
                spans.append((event_start, type_end, pos))
            last += 1
        yield first, _encode_count(last - first) + bytes(view[start:pos])
        first = last
    if pos != len(view):
        raise MalformedRequest(f"{len(view) - pos} bytes after the last event")


def check_client_event(i: int, e: RegisterEvent, limits: RegisterLimits) -> None:
    """`check_register_event`, the segment length in characters, and what only clients
    may not do (the reserved prefix); `InvalidRegistration` naming event `i`."""
    try:
        check_register_event(i, e)
    except InvalidEvent as err:
        raise InvalidRegistration(str(err)) from None
    for segment in e.type:
        if len(segment) > limits.max_segment_length:
            raise RequestRefused(
                f"event {i}: type segment {segment[:40]!r}... has {len(segment)} characters "
                f"(max_segment_length {limits.max_segment_length})"
            )
    if e.type[:1] == (RESERVED_TYPE_PREFIX,):  # an empty type is valid: no [0]
        raise InvalidRegistration(
            f"event {i}: type {list(e.type)!r}: the prefix {RESERVED_TYPE_PREFIX!r} is "
            "reserved for events the servers register themselves"
        )


def _decode_slices(
    data: bytes,
    limits: RegisterLimits,
    spans: list[tuple[int, int, int]] | None,
    events: list[RegisterEvent],
) -> Iterator[None]:
    """Decode and validate a ``MsgRegisterReq`` into `events`, yielding between slices
    (a one-slice request, nearly all, never yields)."""
    for first, chunk in slices(data, limits, spans):
        if first:
            yield
        try:
            raw = codec.repo.decode(_REQ, chunk)
        except Exception as e:
            raise MalformedRequest(f"events {first}..: do not decode: {e}") from None
        for offset, item in enumerate(raw):
            event = codec.register_event_from_sbs(item)
            check_client_event(first + offset, event, limits)
            events.append(event)


async def decode_register(
    data: bytes, limits: RegisterLimits, spans: list[tuple[int, int, int]] | None = None
) -> list[RegisterEvent]:
    """Decode and validate a client's ``MsgRegisterReq`` slice by slice, yielding to the
    loop between slices. Raises `InvalidRegistration` (`RequestRefused`: a limit;
    `MalformedRequest`: not decodable; itself: a bad event); nothing of the request is
    kept. `spans`: see `slices` (for
    `encode_register_res`)."""
    events: list[RegisterEvent] = []
    for _ in _decode_slices(data, limits, spans, events):
        # Between slices only: a one-slice request (nearly all) costs no extra loop
        # iteration, a big one never holds the loop for more than a slice.
        await asyncio.sleep(0)
    return events


def decode_register_now(
    data: bytes,
    limits: RegisterLimits,
    spans: list[tuple[int, int, int]] | None = None,
    *,
    use_c: bool = True,
) -> list[RegisterEvent] | None:
    """`decode_register` of a request that fits one slice, without a coroutine (the
    Eventer session dispatches messages synchronously); None for a larger one (then
    `spans` holds a part and must be discarded: use `decode_register`). Raises as
    `decode_register` does. `use_c=False`: the Python path alone (the tests compare
    the two)."""
    if use_c and _c is not None and type(data) is bytes:
        decoded = _c.decode(
            data,
            limits.max_events,
            limits.max_type_segments,
            limits.max_segment_length * 4,  # as `_walk_event`: UTF-8 bytes
            limits.max_payload_bytes,
            CHUNK_EVENTS,
            CHUNK_BYTES,
            RegisterEvent,
            Timestamp,
            EventPayloadJson,
            EventPayloadBinary,
        )
        if decoded is not None:
            c_events, c_spans = decoded
            if spans is not None:
                spans.extend(c_spans)
            for i, event in enumerate(c_events):
                check_client_event(i, event, limits)
            return c_events
    events: list[RegisterEvent] = []
    for _ in _decode_slices(data, limits, spans, events):
        return None
    return events


_EVENTS_CHOICE = encode_int(0)  # MsgRegisterRes = Choice {events: Array(Event), failure}


_LAST_GROUP = [bytes([0x80 | i]) for i in range(128)]


def event_elements(
    request: bytes, spans: list[tuple[int, int, int]], created: list[Event]
) -> list[bytes] | None:
    """The SBS ``Event`` bytes of each of `created` (the events registered from
    `request`, consecutive ids of one session and one timestamp, as the engine makes
    them), spliced from the request's bytes (`splice_elements`). These are what the
    engine stores, notifies and answers with (`Engine.register`'s `encode`); None when
    they cannot be spliced."""
    if len(spans) != len(created) or not created:
        return None
    head = created[0]
    first, ts = head.id, head.timestamp
    server, session, n = first
    for event in created:
        event_id = event.id
        if (
            event_id.instance != n
            or event_id.session != session
            or event_id.server != server
            or (event.timestamp is not ts and event.timestamp != ts)
        ):
            return None
        n += 1
    return splice_elements(request, spans, first, ts)


def splice_elements(
    request: bytes, spans: list[tuple[int, int, int]], first: EventId, ts: Timestamp
) -> list[bytes] | None:
    """The SBS ``Event`` bytes of the events registered from the request's `spans`
    (`slices`), with ids from `first` on and the registration's timestamp `ts`: each is
    its id, the request's bytes of its type, the timestamp, the request's bytes of the
    rest (an ``Event`` is ``id, type, timestamp, sourceTimestamp, payload``, a
    ``RegisterEvent`` is ``type, sourceTimestamp, payload``, each encoded field by field
    in that order). No SBS values are built and nothing is encoded twice. None when it
    cannot be spliced (negative numbers: `encode_int` writes non-negative ones only).

    Instances are consecutive: an instance's encoding differs from the previous one's
    only in its last 7-bit group until that group wraps, so most are a prefix and a
    byte from a table instead of an `encode_int` call. In C when it is built
    (`_register.splice`, the same bytes); this code takes what the C code leaves to it."""
    if _c is not None and type(request) is bytes and type(spans) is list:
        spliced = _c.splice(
            request, spans, first.server, first.session, first.instance, ts.s, ts.us
        )
        if spliced is not None:
            return spliced
    server, session, n = first.server, first.session, first.instance
    if server < 0 or session < 0 or n < 0 or ts.s < 0 or ts.us < 0:
        return None
    id_prefix = encode_int(server) + encode_int(session)
    ts_bytes = encode_int(ts.s) + encode_int(ts.us)
    out: list[bytes] = []
    append = out.append
    join = b"".join
    last_group = _LAST_GROUP
    high = -1
    prefix = b""
    for start, type_end, end in spans:
        if n >> 7 == high and n >= 128:
            instance = prefix + last_group[n & 0x7F]
        else:
            instance = encode_int(n)
            high, prefix = n >> 7, instance[:-1]
        append(
            join((id_prefix, instance, request[start:type_end], ts_bytes, request[type_end:end]))
        )
        n += 1
    return out


async def _by_slices(
    make: Callable[[list, EventId, Timestamp], list | None],
    items: list,
    first: EventId,
    ts: Timestamp,
) -> list | None:
    """``make(items, first, ts)`` a slice of `CHUNK_EVENTS` at a time, each slice with its
    own first id, yielding to the loop between slices; None if a slice gives None."""
    out: list = []
    for lo in range(0, len(items), CHUNK_EVENTS):
        if lo:
            await asyncio.sleep(0)
        part = make(items[lo : lo + CHUNK_EVENTS], first._replace(instance=first.instance + lo), ts)
        if part is None:
            return None
        out.extend(part)
    return out


async def splice_elements_sliced(
    request: bytes, spans: list[tuple[int, int, int]], first: EventId, ts: Timestamp
) -> list[bytes] | None:
    """`splice_elements` a slice of `CHUNK_EVENTS` at a time, yielding to the loop
    between slices: a maximal request's (10,000 events, 16 MiB) never holds the loop for
    long. For a registration whose ids and timestamp are known before it is made
    (`Engine.next_registration`)."""
    return await _by_slices(functools.partial(splice_elements, request), spans, first, ts)


async def registered_events_sliced(
    events: list[RegisterEvent], first: EventId, ts: Timestamp
) -> list[Event]:
    """`registered_events` a slice of `CHUNK_EVENTS` at a time, yielding to the loop
    between slices (for `Engine.register`'s `prepared`): making a maximal request's
    10,000 events at once held the loop 10-40 ms, a young-generation collection
    included."""
    return await _by_slices(registered_events, events, first, ts)  # type: ignore[return-value]


def register_res(elements: list[bytes]) -> bytes:
    """``MsgRegisterRes`` (the events choice) from the events' SBS bytes."""
    return _EVENTS_CHOICE + codec.events_array(elements)


def register_res_parts(elements: list[bytes]) -> list[bytes]:
    """`register_res` as the pieces to write one after the other (no join: for a
    maximal answer the join was a 16 MiB copy holding the loop ~15 ms)."""
    return [_EVENTS_CHOICE + encode_int(len(elements)), *elements]


def encode_count(n: int) -> bytes:
    """An SBS Integer (an Array's element count, a Choice index)."""
    return _encode_count(n)
