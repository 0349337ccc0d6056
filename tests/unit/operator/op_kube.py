"""An in-memory ``KubeClient`` look-alike for reconciliation unit tests (no network).

Objects live in a dict keyed by ``(kind, namespace, name)``. Server-side apply for one
field manager (``op_patching.apply``: fields this manager applied before and no longer
applies are removed), so a unit test sees the same removals as a real server. ``uid``,
``resourceVersion`` and ``generation`` are set; ``resourceVersion`` only moves when an
object really changes. Every write is recorded
in ``writes`` as ``(verb, kind, name)``.
"""

from __future__ import annotations

import copy
import datetime
import itertools
from typing import Any

import op_patching as patching
from eventfleet_operator import kube

_uids = itertools.count(1)


def _selected(obj: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (p.split("=", 1) for p in selector.split(",")))


class FakeKube:
    def __init__(self, *, missing: tuple[kube.Resource, ...] = ()) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.applied: dict[tuple[str, str, str], Any] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.reads: list[tuple[str, str]] = []  # (kind, name) of every get
        self.propagations: list[tuple[str, str, str]] = []
        self.missing = set(missing)
        self._rv = itertools.count(1)

    # --- helpers for tests
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as if someone else had created it (no field manager)."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{next(_uids)}")
        meta["resourceVersion"] = str(next(self._rv))
        meta.setdefault("generation", 1)
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return obj

    def obj(self, kind: str, name: str, namespace: str = "ns") -> dict[str, Any] | None:
        return self.objects.get((kind, namespace, name))

    def kinds(self) -> set[tuple[str, str]]:
        return {(k, n) for k, _, n in self.objects}

    # --- the KubeClient surface the reconciler uses
    async def close(self) -> None:
        pass

    async def get(self, resource: kube.Resource, namespace: str | None, name: str) -> Any:
        self.reads.append((resource.kind, name))
        found = self.objects.get((resource.kind, namespace or "", name))
        return copy.deepcopy(found)

    async def list(
        self, resource: kube.Resource, namespace: str | None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (kind, ns, _), o in sorted(self.objects.items())
            if kind == resource.kind and ns == (namespace or "") and _selected(o, label_selector)
        ]

    def _commit(self, key: tuple[str, str, str], old: Any, new: dict[str, Any]) -> dict:
        meta = new["metadata"]
        if old is not None:
            meta["uid"] = old["metadata"]["uid"]
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            meta["generation"] = old["metadata"].get("generation", 1)
            if new == old:
                return copy.deepcopy(old)
            if new.get("spec") != old.get("spec"):
                meta["generation"] += 1
        else:
            meta.setdefault("uid", f"uid-{next(_uids)}")
            meta["generation"] = 1
        meta["resourceVersion"] = str(next(self._rv))
        self.objects[key] = new
        return copy.deepcopy(new)

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        key = (manifest["kind"], meta["namespace"], meta["name"])
        if key in self.objects:
            raise kube.ApiError(409, "AlreadyExists", f"{manifest['kind']} {meta['name']} exists")
        new = copy.deepcopy(manifest)
        new["metadata"].setdefault(
            "creationTimestamp",
            datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.writes.append(("create", manifest["kind"], meta["name"]))
        return self._commit(key, None, new)

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        key = (manifest["kind"], meta["namespace"], meta["name"])
        old = self.objects.get(key)
        previous = self.applied.get(key, {})
        new = patching.apply(copy.deepcopy(old) if old else {}, previous, manifest)
        self.applied[key] = copy.deepcopy(manifest)
        self.writes.append(("apply", manifest["kind"], meta["name"]))
        return self._commit(key, old, new)

    async def patch(
        self,
        resource: kube.Resource,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        key = (resource.kind, namespace or "", name)
        old = self.objects.get(key)
        if old is None:
            raise kube.ApiError(404, "NotFound", f"{resource.kind} {name} not found")
        new = patching.merge_patch(copy.deepcopy(old), patch)
        verb = f"patch/{subresource}" if subresource else "patch"
        self.writes.append((verb, resource.kind, name))
        return self._commit(key, old, new)

    async def delete(
        self,
        resource: kube.Resource,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        propagation: str = "Background",
    ) -> bool:
        key = (resource.kind, namespace or "", name)
        found = self.objects.get(key)
        if found is None:
            return False
        if uid is not None and found["metadata"]["uid"] != uid:
            raise kube.ApiError(409, "Conflict", f"uid precondition failed for {name}")
        del self.objects[key]
        self.applied.pop(key, None)
        self.writes.append(("delete", resource.kind, name))
        self.propagations.append((resource.kind, name, propagation))
        return True

    async def has_resource(self, resource: kube.Resource, *, ttl: float | None = None) -> bool:
        return resource not in self.missing
