"""How a payload counts: its class, its usable numbers, its skipped fields.

The rules (the same for the Spark job and the plain-Python `reference`):

* A JSON payload is parsed with Python's ``json``; ``NaN``/``Infinity`` literals make
  it invalid (they are not JSON); of duplicate object keys the last one wins.
* Numbers are JSON numbers (never booleans or numeric strings), taken as IEEE doubles;
  negative zero counts as zero. A payload that *is* a number counts under the field
  ``$``; each top-level field of an object whose value is a number counts under its
  key. Anything else (nested objects, arrays, strings, booleans, null, numbers beyond
  the double range) is skipped; skipped top-level fields of objects are counted.
* Every event has exactly one class (`PAYLOAD_CLASSES`).

This runs in the Spark source's Python workers, next to the Eventer decoding, rather
than as JVM expressions: parsing to VARIANT and testing every value's type with
``schema_of_variant`` measured several times the cost of ``json.loads`` here.

`classify` is the definition (the standard library's parser, used by `reference`);
`classify_fast` is what the workers call: the same result, with msgspec's parser tried
first (~4x faster per payload) and `classify` taking over for any text msgspec refuses.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec

ROOT_FIELD = "$"
"""Field name of a payload that is itself a number (JSONPath's root)."""

NUMERIC, NON_NUMERIC, INVALID_JSON, BINARY, EMPTY = (
    "numeric",
    "non_numeric",
    "invalid_json",
    "binary",
    "empty",
)
PAYLOAD_CLASSES = (NUMERIC, NON_NUMERIC, INVALID_JSON, BINARY, EMPTY)
"""``numeric``: valid JSON that gave at least one number; ``non_numeric``: valid JSON
without a usable number; ``invalid_json``: JSON text that does not parse; ``binary``: a
binary payload; ``empty``: no payload."""

_NO_NUMBERS: dict[str, float] = {}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


_decode = json.JSONDecoder(parse_constant=_reject_constant).decode


def _number(value) -> float | None:
    if type(value) is float:
        return value + 0.0 if math.isfinite(value) else None  # + 0.0: -0.0 → 0.0
    if type(value) is int:  # not bool, an int subclass
        try:
            return float(value) + 0.0
        except OverflowError:
            return None
    return None


def classify(kind: str, text: str | None) -> tuple[str, dict[str, float], int]:
    """``(class, {field: number}, skipped top-level fields)`` of one payload.

    `kind` is the source's ``payload_kind`` (``none``, ``json``, ``binary``) and `text`
    the JSON text for ``json``. The returned dict must not be modified.
    """
    if kind != "json":
        return (EMPTY if kind == "none" else BINARY), _NO_NUMBERS, 0
    try:
        value = _decode(text)
    except (ValueError, RecursionError):
        return INVALID_JSON, _NO_NUMBERS, 0
    if type(value) is dict:
        numbers = {}
        for key, item in value.items():
            x = _number(item)
            if x is not None:
                numbers[key] = x
        return (NUMERIC if numbers else NON_NUMERIC), numbers, len(value) - len(numbers)
    return _scalar(value)


def _scalar(value: Any) -> tuple[str, dict[str, float], int]:
    """The classification of a payload that is not an object: one number or none."""
    x = _number(value)
    if x is None:
        return NON_NUMERIC, _NO_NUMBERS, 0
    return NUMERIC, {ROOT_FIELD: x}, 0


_fast_decode = msgspec.json.Decoder().decode
_FAST_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeError, RecursionError)


def classify_fast(kind: str, text: str | None) -> tuple[str, dict[str, float], int]:
    """`classify`'s result, computed faster for what msgspec parses.

    Where msgspec accepts a text it yields the value the standard library does (the
    same dict with the last of duplicate keys, ints as ints, floats correctly rounded;
    tests/unit/test_payload_classify.py compares the two); everything it refuses (NaN
    and Infinity literals, numbers beyond the double range, lone surrogates, invalid
    JSON) goes to `classify`, which decides as the rules say.
    """
    if kind != "json":
        return (EMPTY if kind == "none" else BINARY), _NO_NUMBERS, 0
    try:
        value = _fast_decode(text)
    except _FAST_ERRORS:
        return classify(kind, text)
    if type(value) is dict:
        numbers = {}
        for key, item in value.items():
            t = type(item)
            if t is float:  # msgspec never yields NaN or an infinity
                numbers[key] = item + 0.0
            elif t is int:
                x = _number(item)
                if x is not None:
                    numbers[key] = x
        return (NUMERIC if numbers else NON_NUMERIC), numbers, len(value) - len(numbers)
    return _scalar(value)
