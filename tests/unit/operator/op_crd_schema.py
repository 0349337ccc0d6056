"""CRD structural schemas: validation as the API server applies it (defaulting:
op_k8s_schema.apply_defaults).

The OpenAPI v3 dialect of CRDs is translated to JSON Schema for ``jsonschema``:
``nullable``, ``x-kubernetes-int-or-string`` and (with strict field validation)
``additionalProperties: false`` wherever unknown fields are not preserved. CEL rules
(``x-kubernetes-validations``) are not evaluated.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema


def to_jsonschema(schema: Any, *, strict: bool = True) -> Any:
    """Translate a CRD (OpenAPI v3 structural) schema to JSON Schema (draft 7)."""
    if isinstance(schema, list):
        return [to_jsonschema(s, strict=strict) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties"):
            out[key] = {k: to_jsonschema(v, strict=strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = to_jsonschema(value, strict=strict)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_jsonschema(v, strict=strict) for v in value]
        elif key.startswith("x-kubernetes-") or key in (
            "nullable",
            "default",
            "description",
            "example",
        ):
            continue
        else:
            out[key] = copy.deepcopy(value)
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if strict and schema.get("type") == "object" and "properties" in schema and not preserve:
        out.setdefault("additionalProperties", False)
    return out


def validate(schema: dict[str, Any], obj: Any, *, strict: bool = False) -> list[str]:
    """Problems as ``path: message`` (metadata is the API server's own business)."""
    js = to_jsonschema(schema, strict=strict)
    js.get("properties", {}).pop("metadata", None)
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in jsonschema.Draft7Validator(js).iter_errors(obj)
    ]
