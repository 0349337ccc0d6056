"""One scope's models in memory: ScopeState, validation of a ScopeSync, fan-out fragments.

Engine-free. A model is identified by its uuid and holds the full property set of the
latest event of its type (last writer wins, by the store's natural order). A
client's ``change`` fragment carries only the changed properties: the server merges them
into the current set and stores the whole set, so any single event is a complete model.

Removal: the reference client has no ``remove`` fragment it can apply; a model leaves a
scope when no reachable parent refers to it any more (a ``change`` of the parent's
collection). ScopeState therefore sends only the models reachable from the root.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventfleet_server.jetstream.models import ModelSchema, is_uuid_text
from eventfleet_server.jetstream.wire import dumps, error_json

_ROOT_NAMESPACE = uuidlib.UUID("6f0c2f9e-5d1e-4c62-9a56-0e7f3c1d2b44")


def root_uuid(type_prefix: Sequence[str], scope_name: str) -> str:
    """The root model's uuid: derived from the scope's event subtree, so every replica
    (and every restart) names the same root without coordination."""
    return str(uuidlib.uuid5(_ROOT_NAMESPACE, "\x1f".join([*type_prefix, "jetstream", scope_name])))


@dataclass
class Model:
    cls_name: str
    properties: dict[str, Any]
    key: tuple  # natural order key of the event it came from; () = never stored


@dataclass(frozen=True)
class ModelRecord:
    """One stored event seen as a model: `properties` None = a deletion (no payload)."""

    cls_name: str
    uuid: str
    properties: dict[str, Any] | None
    key: tuple


@dataclass(frozen=True)
class ModelWrite:
    cls_name: str
    uuid: str
    properties: dict[str, Any]


@dataclass
class SyncPlan:
    """What a ScopeSync becomes: one reply per fragment, and the writes (one batch)."""

    replies: list[dict]
    writes: list[ModelWrite] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        return sum(1 for r in self.replies if "error" in r)


class Scope:
    def __init__(self, name: str, root: str, schema: ModelSchema):
        self.name = name
        self.root_uuid = root
        self.schema = schema
        self.models: dict[str, Model] = {}
        self.version = 0  # bumped by every change; keys the encoded-state cache
        self._state_cache: tuple[int, list[dict], str] | None = None

    # -- stored events -> models ------------------------------------------------------------

    def apply(self, records: Iterable[ModelRecord]) -> list[dict]:
        """Apply stored events; returns the fragments that tell a client what changed."""
        changed: dict[str, dict] = {}
        for r in records:
            current = self.models.get(r.uuid)
            if current is not None and current.key >= r.key:
                continue  # an older event (e.g. a peer's, merged late): latest wins
            if r.properties is None:
                if self.models.pop(r.uuid, None) is not None:
                    self.version += 1
                changed.pop(r.uuid, None)
                continue
            if r.cls_name not in self.schema.classes or (
                r.uuid == self.root_uuid and r.cls_name != self.schema.root_class
            ):
                continue  # not a model of this schema: stays out of the scope
            self.models[r.uuid] = Model(r.cls_name, r.properties, r.key)
            self.version += 1
            kind = "change" if current is not None or r.uuid == self.root_uuid else "add"
            if r.uuid in changed and changed[r.uuid]["type"] == "add":
                kind = "add"
            changed[r.uuid] = _fragment(kind, r.cls_name, r.uuid, r.properties)
        # Adds first: a client resolves references to models it already knows.
        return sorted(changed.values(), key=lambda f: f["type"] != "add")

    # -- ScopeState --------------------------------------------------------------------------

    def state(self) -> tuple[list[dict], str]:
        """`state_fragments` and their JSON text, cached until the scope changes: a burst
        of fetches (clients reconnecting after a deploy) encodes a large scope once."""
        cached = self._state_cache
        if cached is not None and cached[0] == self.version:
            return cached[1], cached[2]
        fragments = self.state_fragments()
        encoded = dumps(fragments)
        self._state_cache = (self.version, fragments, encoded)
        return fragments, encoded

    def state_fragments(self) -> list[dict]:
        """``add`` fragments of the root (always first) and every model reachable from it."""
        root = self.models.get(self.root_uuid)
        root_props = root.properties if root else {}
        out = [_fragment("add", self.schema.root_class, self.root_uuid, root_props)]
        seen = {self.root_uuid}
        queue = [(self.schema.root_class, root_props)]
        while queue:
            cls_name, props = queue.pop()
            for child in self._references(cls_name, props):
                if child in seen:
                    continue
                seen.add(child)
                model = self.models.get(child)
                if model is None:
                    continue
                out.append(_fragment("add", model.cls_name, child, model.properties))
                queue.append((model.cls_name, model.properties))
        return out

    def _references(self, cls_name: str, props: dict) -> list[str]:
        refs: list[str] = []
        for key, ptype in self.schema.classes.get(cls_name, {}).items():
            if not ptype.is_reference:
                continue
            value = props.get(key)
            if isinstance(value, str):
                refs.append(value)
            elif isinstance(value, list):
                refs.extend(v for v in value if isinstance(v, str))
        return refs

    # -- ScopeSync -------------------------------------------------------------------------

    def plan_sync(self, fragments: Any, atomic: bool) -> SyncPlan:
        """Validate a client's fragments against the schema and the current models.

        Each fragment is answered ``{}`` or ``{"error": {message, type}}``; the writes are
        the accepted fragments as full property sets. With `atomic`, one bad fragment
        rejects them all and nothing is written.
        """
        n = len(fragments)
        errors: list[dict | None] = [None] * n
        parsed: list[tuple[str, str, str, dict] | None] = [None] * n
        known: dict[str, str] = {}  # uuid -> clsName of models this sync adds (pass 1)
        for i, frag in enumerate(fragments):
            result = self._check_fragment(frag, known)
            if isinstance(result, dict):
                errors[i] = result
            else:
                parsed[i] = result
                if result[0] == "add":
                    known[result[2]] = result[1]
        # Pass 2, until nothing changes: references must name a model of the declared
        # class (stored, or added by an accepted fragment of this sync), and an added model
        # must be referred to by an accepted fragment of this sync (its parent), as the
        # reference server requires. Refusing one fragment can orphan another.
        changed = True
        while changed:
            changed = False
            adds = {p[2]: p[1] for p in parsed if p is not None and p[0] == "add"}
            referenced: set[str] = set()
            for p in parsed:
                if p is not None:
                    referenced.update(r.lower() for r in self._references(p[1], p[3]))
            for i, p in enumerate(parsed):
                if p is None:
                    continue
                why = self._check_references(p[1], p[3], adds)
                if why:
                    errors[i] = error_json("invalid-reference", why)
                elif p[0] == "add" and p[2] not in referenced:
                    errors[i] = error_json(
                        "no-parent",
                        f"added {p[1]} {p[2]} is not referred to by any model of this sync",
                    )
                else:
                    continue
                parsed[i] = None
                changed = True
        failed = [i for i, e in enumerate(errors) if e is not None]
        if atomic and failed:
            first = failed[0]
            reason = errors[first]["error"]["message"]
            replies = [
                e
                if e is not None
                else error_json(
                    "atomic-sync-rejected",
                    f"not applied: fragment {first} of this atomic sync failed ({reason})",
                )
                for e in errors
            ]
            return SyncPlan(replies)
        overlay: dict[str, ModelWrite] = {}
        for p in parsed:
            if p is None:
                continue
            _kind, cls_name, uid, props = p
            base = overlay.get(uid)
            if base is not None:
                merged = {**base.properties, **props}
            else:
                current = self.models.get(uid)
                merged = {**(current.properties if current else {}), **props}
            overlay[uid] = ModelWrite(cls_name, uid, merged)
        replies = [e if e is not None else {} for e in errors]
        return SyncPlan(replies, list(overlay.values()))

    def _check_fragment(self, frag: Any, known: dict[str, str]) -> tuple | dict:
        if not isinstance(frag, dict):
            return error_json("invalid-fragment", "a fragment must be an object")
        kind = frag.get("type")
        if kind == "remove":
            return error_json(
                "remove-not-supported",
                "remove fragments are not supported: remove a model by changing its parent",
            )
        if kind not in ("add", "change"):
            return error_json(
                "invalid-fragment", f"fragment type {str(kind)[:40]!r} is not add/change"
            )
        cls_name = frag.get("clsName")
        uid = frag.get("uuid")
        if not isinstance(cls_name, str) or cls_name not in self.schema.classes:
            return error_json("unknown-class", f"unknown clsName {str(cls_name)[:60]!r}")
        if not isinstance(uid, str) or not is_uuid_text(uid):
            return error_json("invalid-uuid", f"uuid {str(uid)[:70]!r} is not a model uuid")
        uid = uid.lower()
        props = frag.get("properties", {})
        if props is None:
            props = {}
        why = self.schema.check_properties(cls_name, props)
        if why:
            return error_json("invalid-property", why)
        props = self._lower_references(cls_name, props)
        if uid == self.root_uuid:
            if cls_name != self.schema.root_class:
                return error_json(
                    "class-mismatch",
                    f"the root {uid} is a {self.schema.root_class}, not a {cls_name}",
                )
            return ("change", cls_name, uid, props)
        current = self.models.get(uid)
        current_cls = current.cls_name if current else known.get(uid)
        if current_cls is not None and current_cls != cls_name:
            return error_json("class-mismatch", f"model {uid} is a {current_cls}, not a {cls_name}")
        if kind == "change" and current_cls is None:
            return error_json("model-not-found", f"change of unknown model {uid} ({cls_name})")
        if kind == "add" and current is not None:
            kind = "change"  # a resent add of a stored model: its parent already exists
        return (kind, cls_name, uid, props)

    def _lower_references(self, cls_name: str, props: dict) -> dict:
        """References as the stored uuids they resolve to. Model uuids are kept lower-case
        (a fragment's own uuid is lowered) and references are resolved case-blind, so an
        upper-case reference was accepted, stored as sent, and its model then missing from
        every ScopeState (the walk looks it up as written)."""
        declared = self.schema.classes[cls_name]
        out = dict(props)
        for key, value in props.items():
            ptype = declared[key]
            if ptype.is_reference and value is not None:
                out[key] = [v.lower() for v in value] if ptype.collection else value.lower()
        return out

    def _check_references(self, cls_name: str, props: dict, known: dict[str, str]) -> str | None:
        declared = self.schema.classes[cls_name]
        for key, value in props.items():
            ptype = declared[key]
            if not ptype.is_reference or value is None:
                continue
            for ref in value if ptype.collection else [value]:
                ref = ref.lower()
                model = self.models.get(ref)
                target = model.cls_name if model else known.get(ref)
                if ref == self.root_uuid:
                    target = self.schema.root_class
                if target is None:
                    return f"property {key!r} of {cls_name!r} refers to unknown model {ref}"
                if target != ptype.kind:
                    return (
                        f"property {key!r} of {cls_name!r} must refer to a {ptype.kind}, "
                        f"{ref} is a {target}"
                    )
        return None


def _fragment(kind: str, cls_name: str, uid: str, props: dict) -> dict:
    return {"type": kind, "uuid": uid, "clsName": cls_name, "properties": props}
