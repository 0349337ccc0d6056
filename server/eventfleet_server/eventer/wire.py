"""Decoding of the Eventer's small requests (``MsgInitReq``, ``MsgQueryReq``) from
untrusted bytes, with one refusal type.

Each decoder runs the bounds walk (`common.sbsguard`, so the C decoder never sees an
absurd announced length), then the hat-sbs C decoder, then the model conversion and the
checks. Whatever a client can send ends in a value or `BadRequest` naming the problem;
any other exception is a bug of ours, and the fuzz targets (tests/fuzz) fail on it.
"""

from __future__ import annotations

from typing import Any

from eventfleet_server.common import codec
from eventfleet_server.common.model import QueryParams, QueryTimeseriesParams
from eventfleet_server.common.sbsguard import SbsBoundsError, check_bounds
from eventfleet_server.common.subscription import validate_pattern

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
