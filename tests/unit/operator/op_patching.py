"""Patch semantics of the Kubernetes API for the in-memory client of the unit tests
(``op_kube.py``), close enough for the operator's calls.

* JSON merge patch (RFC 7386): dicts merge, ``null`` deletes, lists are replaced.
* Strategic merge patch (built-in kinds only): like merge patch, but lists of objects
  that share a merge key (``name``, ``containerPort``, ...) merge item by item,
  ``$patch: delete`` removes an item and the ``$setElementOrder``/``$retainKeys``/
  ``$deleteFromPrimitiveList`` directives are honoured or dropped. Real servers know
  each field's merge key from the Go types; here the key is guessed from the items.
* JSON patch (RFC 6902), including ``test`` (kopf guards finalizer edits with it).
* Server-side apply, for one field manager at a time: fields that the manager applied
  before but no longer applies are removed, then the applied configuration is merged.
  (Real SSA tracks field ownership per manager in ``managedFields``; this keeps each
  manager's last applied configuration instead.)
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_KEYS = (
    "name",
    "containerPort",
    "mountPath",
    "devicePath",
    "ip",
    "type",
    "topologyKey",
    "port",
)


class PatchError(ValueError):
    """The patch cannot be applied (the API server answers 422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_key(items: list[Any]) -> str | None:
    dicts = [i for i in items if isinstance(i, dict)]
    if not dicts or len(dicts) != len(items):
        return None
    for key in MERGE_KEYS:
        if all(key in {k for k in d if not k.startswith("$")} for d in dicts):
            return key
    return None


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    retain = patch.get("$retainKeys")
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for key, value in patch.items():
        if key.startswith("$"):
            if key.startswith("$deleteFromPrimitiveList/"):
                field = key.split("/", 1)[1]
                result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _strategic_list(result.get(key), value, orders.get(key))
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    for key, order in orders.items():
        if key not in patch and isinstance(result.get(key), list):
            result[key] = _strategic_list(result[key], [], order)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _strategic_list(live: Any, patch: list[Any], order: list[Any] | None) -> list[Any]:
    key = _merge_key(patch + list(order or [])) if patch or order else None
    if key is None or not isinstance(live, list) or _merge_key(live) not in (key, None):
        return [
            copy.deepcopy(v)
            for v in patch
            if not (isinstance(v, dict) and v.get("$patch") == "delete")
        ]
    merged = {item.get(key): copy.deepcopy(item) for item in live if isinstance(item, dict)}
    sequence = [item.get(key) for item in live if isinstance(item, dict)]
    for item in patch:
        ident = item.get(key)
        if item.get("$patch") == "delete":
            merged.pop(ident, None)
            continue
        merged[ident] = strategic_merge_patch(merged.get(ident), item)
        if ident not in sequence:
            sequence.append(ident)
    if order:
        wanted = [o.get(key) for o in order if isinstance(o, dict)]
        sequence = [k for k in wanted if k in merged] + [k for k in sequence if k not in wanted]
    return [merged[k] for k in sequence if k in merged]


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict):
            doc = doc[part]
        else:
            raise KeyError(part)
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "test":
                if _resolve(doc, parts) != op.get("value"):
                    raise PatchError(f"test failed at {op.get('path')}: not {op.get('value')!r}")
                continue
            if kind in ("move", "copy"):
                value = copy.deepcopy(_resolve(doc, _pointer(op["from"])))
                if kind == "move":
                    doc = _remove(doc, _pointer(op["from"]))
                doc = _add(doc, parts, value)
            elif kind == "add":
                doc = _add(doc, parts, copy.deepcopy(op.get("value")))
            elif kind == "remove":
                doc = _remove(doc, parts)
            elif kind == "replace":
                doc = _remove(doc, parts)
                doc = _add(doc, parts, copy.deepcopy(op.get("value")))
            else:
                raise PatchError(f"unknown JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as e:
            if isinstance(e, PatchError):
                raise
            raise PatchError(f"{kind} {op.get('path')}: {e!r}") from e
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        parent[last] = value
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _resolve(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        del parent[int(last)]
    else:
        del parent[last]
    return doc


def _prune(live: Any, previous: Any, applied: Any) -> Any:
    """Drop from ``live`` what ``previous`` set and ``applied`` no longer sets."""
    if not (isinstance(live, dict) and isinstance(previous, dict)):
        return live
    applied = applied if isinstance(applied, dict) else {}
    for key, prev_value in previous.items():
        if key not in applied:
            live.pop(key, None)
        elif key in live:
            live[key] = _prune(live[key], prev_value, applied[key])
    return live


def apply(live: Any, previous: Any, applied: Any) -> Any:
    """Server-side apply of ``applied`` by a manager whose last apply was ``previous``."""
    result = _prune(copy.deepcopy(live), previous or {}, applied)
    return _apply_merge(result, applied)


def _apply_merge(target: Any, applied: Any) -> Any:
    if not isinstance(applied, dict):
        return copy.deepcopy(applied)
    result = target if isinstance(target, dict) else {}
    for key, value in applied.items():
        result[key] = _apply_merge(result.get(key), value)
    return result
