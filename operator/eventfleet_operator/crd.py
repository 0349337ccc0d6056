"""The ``EventServer`` CRD: the one source of the spec's defaults and choices.

The API server applies the ``default`` of every field of the CRD's ``openAPIV3Schema``
on admission. The operator applies the same defaults again (:func:`with_defaults`), read
from the same schema, because it must not depend on API-server defaulting (an object
stored before a CRD upgrade reaches it as stored); :mod:`~eventfleet_operator.model`
parses the defaulted spec and states no default of its own that the CRD states.

The package carries a byte copy of ``crds/eventfleet.io_eventservers.yaml`` (a wheel and
the operator image hold only the package): ``scripts/sync-chart-files`` writes it along
with the chart's copy and tests/unit/chart/test_chart_sync.py fails when it drifts.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
from collections.abc import Mapping
from typing import Any

import yaml

FILE = "eventfleet.io_eventservers.yaml"


@functools.cache
def spec_schema() -> Mapping[str, Any]:
    """The ``spec`` schema of the CRD's storage version."""
    text = (importlib.resources.files(__package__) / FILE).read_text(encoding="utf-8")
    crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def schema_at(path: str) -> Mapping[str, Any]:
    """The schema of the field at ``path``: ``spec.storage.size``; ``[]`` steps into a
    list's items (``spec.protocols.replication.tables[].key``)."""
    head, _, rest = path.partition(".")
    if head != "spec":
        raise KeyError(f"{path!r}: CRD paths start at spec")
    schema = spec_schema()
    for part in rest.split(".") if rest else ():
        name, items = (part[:-2], True) if part.endswith("[]") else (part, False)
        try:
            schema = schema["properties"][name]
            if items:
                schema = schema["items"]
        except KeyError:
            raise KeyError(f"the EventServer CRD has no field {path!r}") from None
    return schema


def default(path: str) -> Any:
    """The CRD's default of the field at ``path`` (a fresh copy: safe to keep)."""
    schema = schema_at(path)
    if "default" not in schema:
        raise KeyError(f"the EventServer CRD states no default for {path!r}")
    return copy.deepcopy(schema["default"])


def choices(path: str) -> tuple[str, ...]:
    """The CRD's ``enum`` of the field at ``path``."""
    schema = schema_at(path)
    if "enum" not in schema:
        raise KeyError(f"the EventServer CRD states no enum for {path!r}")
    return tuple(schema["enum"])


def with_defaults(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with the CRD's defaults applied as the API server applies them.

    A default fills an absent field, recursively (defaults inside a defaulted object
    apply too), and a ``null`` (the API server prunes nulls of non-nullable fields
    before defaulting). Two leniences the operator has always had: an empty string is
    absent where the field has a default (``size: ""`` is ``1Gi``), and an empty object
    whose schema requires fields (``secretRef: {}``, which the API server rejects) gets
    no defaults, so the parser sees it as given (empty) rather than half-filled. Values
    of the wrong type are left alone: the parser names them. The input is not changed.
    """
    return _apply(spec_schema(), copy.deepcopy(dict(spec)))


def _apply(schema: Mapping[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        if not value and schema.get("required"):
            return value
        props = schema.get("properties") or {}
        for key, sub in props.items():
            current = value.get(key)
            absent = current is None or (current == "" and sub.get("type") == "string")
            if absent and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = _apply(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key in value:
                if key not in props:
                    value[key] = _apply(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_apply(schema["items"], item) for item in value]
    return value


def defaults() -> dict[str, Any]:
    """Every default the CRD states, by path (``spec.storage.size``, ``...tables[].key``)."""
    out: dict[str, Any] = {}

    def walk(schema: Mapping[str, Any], path: str) -> None:
        if "default" in schema:
            out[path] = copy.deepcopy(schema["default"])
        for key, sub in (schema.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        if isinstance(schema.get("items"), Mapping):
            walk(schema["items"], f"{path}[]")

    walk(spec_schema(), "spec")
    return out
