"""The children of an ``EventServer``: the clients a pass uses, and how one child is
created, repaired or deleted (only ever when this EventServer owns it).

Every feature reconciler (volumes, tls, tokens, ...) writes its objects through
:func:`apply_child` and :func:`remove_child`, so the applied-hash check, the ownership
rule, the write metrics and the Events are the same for every child.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eventfleet_operator import kube, metrics, model, naming
from eventfleet_operator.config import OperatorConfig
from eventfleet_operator.constants import EventType, Operation
from eventfleet_operator.replicas import Endpoints, ReplicaClient

Emit = Callable[[EventType, str, str], None]  # (type, reason, message)


@dataclasses.dataclass
class Context:
    """Process-wide clients and per-fleet locks (timers and watch events run concurrently)."""

    config: OperatorConfig
    kube: kube.KubeClient
    replicas: ReplicaClient
    endpoints: Endpoints
    locks: dict[tuple[str, str], asyncio.Lock] = dataclasses.field(default_factory=dict)

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self.locks.setdefault((namespace, name), asyncio.Lock())

    async def close(self) -> None:
        await self.kube.close()
        await self.replicas.close()


def is_subset(desired: Any, live: Any) -> bool:
    """Does ``live`` already carry every field of ``desired`` (extra live fields allowed)?

    Servers add defaults, so equality would re-apply forever; lists must match
    item by item because the builders emit them whole.
    """
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and is_subset(v, live[k]) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    return desired == live


def with_applied_hash(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` carrying the hash of itself in ``eventfleet.io/applied-hash``.

    The subset check alone cannot see a field the operator *stopped* setting (a removed
    ``spec.podLabels`` entry is still on the live object, so desired ⊂ live holds and
    nothing would be sent). The hash of the whole desired manifest changes whenever any
    field is added, changed or removed; a live hash that differs means "apply", and
    server-side apply then removes the fields this field manager no longer sets.
    """
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    meta = dict(manifest["metadata"])
    annotations = {**(meta.get("annotations") or {}), naming.APPLIED_HASH_ANNOTATION: digest}
    meta["annotations"] = annotations
    return {**manifest, "metadata": meta}


def up_to_date(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """Is ``live`` what applying ``desired`` (from :func:`with_applied_hash`) would give?

    Same applied hash (nothing added or removed since the last apply) and every desired
    field present with its value (no hand edit of an owned field).
    """
    if live is None:
        return False
    want = desired["metadata"]["annotations"][naming.APPLIED_HASH_ANNOTATION]
    have = ((live.get("metadata") or {}).get("annotations") or {}).get(
        naming.APPLIED_HASH_ANNOTATION
    )
    return have == want and is_subset(desired, live)


class ChildNotOwned(Exception):
    """Objects with a child's name that this EventServer does not own (never overwritten)."""

    def __init__(self, children: Sequence[str], uid: str) -> None:
        self.children = list(children)
        super().__init__(
            f"{', '.join(self.children)}: already exist without an ownerReference to this "
            f"EventServer (uid {uid}); the operator neither overwrites nor adopts them. "
            "Delete or rename them, or give the EventServer another name"
        )


def _owner_uid(manifest: Mapping[str, Any]) -> str:
    refs = manifest["metadata"].get("ownerReferences") or []
    return str(refs[0].get("uid", "")) if refs else ""


async def ensure(
    ctx: Context,
    manifest: Mapping[str, Any],
    log: logging.Logger,
    read_version: str | None = None,
) -> Operation | None:
    """Create or repair one child; returns what it did, or None (no change).

    ``read_version``: the resourceVersion of the live object the manifest was built
    from (a token Secret keeps the live tokens); when the object changed since, nothing
    is written this pass, so a concurrent edit (a rotation step by hand) is never
    reverted with what was read before it. Raises :class:`ChildNotOwned` when an object
    of that name exists that is not ours.
    """
    resource = kube.resource_of(manifest)
    manifest = with_applied_hash(manifest)
    meta = manifest["metadata"]
    live = await ctx.kube.get(resource, meta["namespace"], meta["name"])
    uid = _owner_uid(manifest)
    if live is not None and uid and not naming.owned_by(live, uid):
        raise ChildNotOwned([f"{manifest['kind']} {meta['name']}"], uid)
    if read_version is not None and live is not None:
        if (live.get("metadata") or {}).get("resourceVersion") != read_version:
            log.info("%s %s changed since it was read: next pass", manifest["kind"], meta["name"])
            return None
    if up_to_date(manifest, live):
        return None
    result = await ctx.kube.apply(manifest)
    if live is None:
        log.info("created %s %s", manifest["kind"], meta["name"])
        metrics.CHILD_WRITES.labels(manifest["kind"], Operation.CREATED).inc()
        return Operation.CREATED
    if result.get("metadata", {}).get("resourceVersion") == live.get("metadata", {}).get(
        "resourceVersion"
    ):
        return None  # the server found nothing to change (e.g. a normalised quantity)
    log.info("updated %s %s (it differed from the desired state)", manifest["kind"], meta["name"])
    metrics.CHILD_WRITES.labels(manifest["kind"], Operation.UPDATED).inc()
    return Operation.UPDATED


async def delete_owned(
    ctx: Context, resource: kube.Resource, namespace: str, name: str, uid: str, log: logging.Logger
) -> bool:
    """Delete a child only if it is ours (owner reference to ``uid``), that very object."""
    live = await ctx.kube.get(resource, namespace, name)
    if live is None:
        return False
    if not naming.owned_by(live, uid):
        log.warning("not deleting %s %s: it is not owned by this EventServer", resource.kind, name)
        return False
    try:
        return await ctx.kube.delete(resource, namespace, name, uid=live["metadata"].get("uid"))
    except kube.ApiError as e:
        if e.status == 409:  # replaced by someone else in the meantime: not ours
            return False
        raise


async def apply_child(
    ctx: Context,
    manifest: Mapping[str, Any],
    log: logging.Logger,
    emit: Emit,
    read_version: str | None = None,
) -> Operation | None:
    """:func:`ensure`, and an Event for the write when it made one."""
    change = await ensure(ctx, manifest, log, read_version)
    if change:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        emit(EventType.NORMAL, change.event_reason, f"{change} {kind} {name}")
    return change


async def remove_child(
    ctx: Context,
    resource: kube.Resource,
    spec: model.FleetSpec,
    name: str,
    log: logging.Logger,
    emit: Emit,
    why: str,
) -> bool:
    """:func:`delete_owned`, counted and told (an Event naming ``why``) when it deleted."""
    if not await delete_owned(ctx, resource, spec.namespace, name, spec.uid, log):
        return False
    log.info("deleted %s %s (%s)", resource.kind, name, why)
    metrics.CHILD_WRITES.labels(resource.kind, Operation.DELETED).inc()
    emit(
        EventType.NORMAL, Operation.DELETED.event_reason, f"deleted {resource.kind} {name} ({why})"
    )
    return True


def core_children(spec: model.FleetSpec) -> list[tuple[kube.Resource, str]]:
    """The always-present children, by type and name (checked for ownership first)."""
    children = [
        (kube.SERVICES, naming.peer_service(spec.name)),
        (kube.SERVICES, naming.client_service(spec.name)),
        (kube.CONFIGMAPS, naming.configmap(spec.name)),
        (kube.STATEFULSETS, naming.statefulset(spec.name)),
    ]
    if spec.pdb.enabled:
        children.append((kube.PDBS, naming.pdb(spec.name)))
    if spec.network_policy.enabled:
        children.append((kube.NETWORKPOLICIES, naming.network_policy(spec.name)))
    if spec.bus_curve.enabled:
        children.insert(0, (kube.SECRETS, naming.bus_curve_secret(spec.name)))
    if spec.peer_token_ref.generated:
        children.insert(0, (kube.SECRETS, naming.peer_token_secret(spec.name)))
    if spec.token_ref.generated:
        children.insert(0, (kube.SECRETS, naming.token_secret(spec.name)))
    return children


async def foreign_children(ctx: Context, spec: model.FleetSpec) -> list[str]:
    """Children's names taken by objects this EventServer does not own."""
    found = []
    for resource, name in core_children(spec):
        live = await ctx.kube.get(resource, spec.namespace, name)
        if live is not None and not naming.owned_by(live, spec.uid):
            found.append(f"{resource.kind} {name}")
    return found


async def refuse_foreign(ctx: Context, spec: model.FleetSpec) -> None:
    """Raise :class:`ChildNotOwned` when a child's name is taken by someone else's object.

    Before anything is read from them or written: a same-named StatefulSet, Secret or
    Service of someone else is neither scaled, flushed, overwritten nor adopted.
    """
    foreign = await foreign_children(ctx, spec)
    if foreign:
        raise ChildNotOwned(foreign, spec.uid)
