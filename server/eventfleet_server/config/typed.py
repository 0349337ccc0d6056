"""Frozen dataclasses built from a validated, default-filled configuration mapping."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def build(cls: type[T], mapping: Mapping[str, Any]) -> T:
    """An instance of dataclass `cls` from `mapping` (keys = field names).

    Nested dataclass fields are built recursively and lists become tuples, so the result
    is immutable. Every field must be present: defaults live in the JSON Schema only, and
    `eventfleet_server.config.load` has filled them in.
    """
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        if field.name not in mapping:
            raise KeyError(f"{cls.__name__}: key {field.name!r} missing (defaults not filled?)")
        values[field.name] = _convert(hints[field.name], mapping[field.name])
    return cls(**values)


def _convert(hint: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return build(hint, value)
    origin = typing.get_origin(hint)
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(hint)
        item = args[0] if args else Any
        return tuple(_convert(item, v) for v in value)
    return value
