"""Kubernetes structural schemas (CRD openAPIV3Schema) as JSON Schema, for tests.

The API server validates a custom resource against its CRD schema with OpenAPI v3
extensions; ``jsonschema`` knows none of them, so they are translated:

* ``nullable: true`` -> the type also allows null;
* ``x-kubernetes-int-or-string`` -> integer or string;
* objects with ``properties`` and no ``x-kubernetes-preserve-unknown-fields`` get
  ``additionalProperties: false``: with field validation ``Strict`` (kubectl's default
  since 1.27) the API server rejects unknown fields instead of pruning them silently.

``apply_defaults`` performs structural defaulting the way the API server does (a
default applies when the field is absent, recursively, including defaults inside
defaulted objects).
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import jsonschema
import yaml
from op_crd_schema import to_jsonschema

ROOT = pathlib.Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "crds" / "eventfleet.io_eventservers.yaml"
EXTERNAL = ROOT / "e2e" / "k8s" / "external-crds"  # vendored, see SOURCES.md there


def load_crd(path: pathlib.Path = CRD_PATH) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def crd_schema(crd: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    chosen = next(v for v in versions if version is None or v["name"] == version)
    return chosen["schema"]["openAPIV3Schema"]


def validator(schema: dict[str, Any]) -> jsonschema.Draft7Validator:
    js = to_jsonschema(schema)
    # metadata is validated by the API server itself, not by the CRD schema.
    js.get("properties", {}).get("metadata", {}).pop("additionalProperties", None)
    return jsonschema.Draft7Validator(js)


def errors(schema: dict[str, Any], doc: Any) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in validator(schema).iter_errors(doc)
    ]


def external_crd(relative: str) -> dict[str, Any]:
    return crd_schema(load_crd(EXTERNAL / relative))


def apply_defaults(schema: dict[str, Any], doc: Any) -> Any:
    doc = copy.deepcopy(doc)
    if isinstance(doc, dict) and schema.get("type") == "object":
        for key, sub in (schema.get("properties") or {}).items():
            if key not in doc and "default" in sub:
                doc[key] = copy.deepcopy(sub["default"])
            if key in doc:
                doc[key] = apply_defaults(sub, doc[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in doc:
                if key not in (schema.get("properties") or {}):
                    doc[key] = apply_defaults(extra, doc[key])
    elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
        doc = [apply_defaults(schema["items"], item) for item in doc]
    return doc
