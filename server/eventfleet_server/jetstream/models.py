"""Model classes (clsName -> typed properties) and the checks a fragment's properties get.

Engine-free. The reference client declares its classes in code (`model('Item', function
() { this.has('text', String) })`); the server needs the same declarations to refuse an
unknown clsName or a property of the wrong JSON type before anything is stored.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventfleet_server.common.model import json_value_error

PRIMITIVES = ("string", "number", "boolean", "date", "any")


class SchemaError(ValueError):
    """The configured classes are inconsistent (the message names the class and key)."""


@dataclass(frozen=True)
class PropertyType:
    """`kind` is a primitive name or a class name (a reference); `collection` for lists."""

    kind: str
    collection: bool

    @property
    def is_reference(self) -> bool:
        return self.kind not in PRIMITIVES

    def describe(self) -> str:
        return f"[{self.kind}]" if self.collection else self.kind


@dataclass(frozen=True)
class ModelSchema:
    classes: Mapping[str, Mapping[str, PropertyType]]
    root_class: str

    @classmethod
    def parse(cls, classes: Mapping[str, Mapping[str, Any]], root_class: str) -> ModelSchema:
        parsed: dict[str, dict[str, PropertyType]] = {}
        for name, props in classes.items():
            out: dict[str, PropertyType] = {}
            for key, spec in props.items():
                collection = isinstance(spec, list)
                kind = spec[0] if collection else spec
                if not isinstance(kind, str) or (kind not in PRIMITIVES and kind not in classes):
                    raise SchemaError(
                        f"class {name!r} property {key!r}: type {spec!r} is neither one of "
                        f"{', '.join(PRIMITIVES)} nor a declared class"
                    )
                out[key] = PropertyType(kind, collection)
            parsed[name] = out
        if root_class not in parsed:
            raise SchemaError(f"root_class {root_class!r} is not a declared class")
        return cls(parsed, root_class)

    def check_properties(self, cls_name: str, properties: Any) -> str | None:
        """None if `properties` fit `cls_name` (references not resolved), else why not."""
        declared = self.classes.get(cls_name)
        if declared is None:
            return f"unknown clsName {cls_name!r}"
        if not isinstance(properties, dict):
            return f"properties must be an object, got {_json_type(properties)}"
        for key, value in properties.items():
            ptype = declared.get(key)
            if ptype is None:
                return f"class {cls_name!r} has no property {key!r}"
            why = check_value(ptype, value)
            if why:
                return f"property {key!r} of {cls_name!r}: {why}"
        return None


def check_value(ptype: PropertyType, value: Any) -> str | None:
    """None if `value` is valid JSON for `ptype` (null is always valid: "unset")."""
    if value is None:
        return None
    if ptype.collection:
        if not isinstance(value, list):
            return f"expected a list ({ptype.describe()}), got {_json_type(value)}"
        for i, item in enumerate(value):
            why = _check_scalar(ptype.kind, item, allow_null=not ptype.is_reference)
            if why:
                return f"item {i}: {why}"
        return None
    return _check_scalar(ptype.kind, value, allow_null=True)


def _check_scalar(kind: str, value: Any, *, allow_null: bool) -> str | None:
    if value is None:
        return None if allow_null else "null is not a reference"
    if kind == "any":
        # The shared payload rule (common.model): the frame decoder refused NaN,
        # Infinity and 1e400 already; an integer beyond a double is still JSON text.
        return json_value_error(value)
    if kind == "string":
        return None if isinstance(value, str) else f"expected a string, got {_json_type(value)}"
    if kind == "boolean":
        return None if isinstance(value, bool) else f"expected a boolean, got {_json_type(value)}"
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {_json_type(value)}"
        return None if _finite(value) else f"expected a finite number, got {_short(value)}"
    if kind == "date":
        if isinstance(value, bool):
            return "expected a date (ISO 8601 text or epoch milliseconds), got a boolean"
        if isinstance(value, int | float):
            return None if _finite(value) else f"expected a finite date, got {_short(value)}"
        if isinstance(value, str):
            try:
                datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                return f"expected an ISO 8601 date, got {value[:40]!r}"
            return None
        return f"expected a date (ISO 8601 text or epoch milliseconds), got {_json_type(value)}"
    # A reference: the uuid of a model of class `kind` (resolved by the caller).
    if not isinstance(value, str) or not is_uuid_text(value):
        return f"expected the uuid of a {kind}, got {str(value)[:40]!r}"
    return None


def _finite(value: int | float) -> bool:
    """A number a client's JSON.parse reads as itself: JSON text may carry an integer of
    hundreds of digits, which no double holds (and `math.isfinite` cannot even convert)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _short(value: int | float) -> str:
    text = repr(value) if isinstance(value, float) else str(value)[:30]
    return text if len(text) < 30 else text[:30] + "…"


def is_uuid_text(value: str) -> bool:
    """Model uuids become event type segments: bounded, no wildcards, no separators."""
    return (
        0 < len(value) <= 64
        and value not in ("?", "*")
        and all(c.isalnum() or c in "-_" for c in value)
        and value.isascii()
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
