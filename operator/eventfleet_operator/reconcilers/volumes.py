"""Volumes: the fleet's claims, and growing them when ``spec.storage.size`` grows.

The growth is a state machine across passes (the decisions are the pure
:mod:`eventfleet_operator.volumes`): patch every claim, wait for the expansion, then
recreate the StatefulSet (orphan: the pods keep running) with the grown claim
template, since Kubernetes forbids changing it in place. The ``StorageResizing``
verdict says where it stands; a shrink or an unexpandable class is refused by name.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import builders, kube, model, naming, scaling, volumes
from eventfleet_operator import status as status_mod
from eventfleet_operator.constants import ConditionStatus, ConditionType, EventType, Reason
from eventfleet_operator.reconcilers.children import Context, Emit


def reach(ctx: Context, spec: model.FleetSpec, token: str | None) -> scaling.Reach:
    """How :mod:`scaling`'s checks reach this fleet's replicas; a replica that does not
    answer counts as holding nothing when its claim (``data-NAME-N``) does not exist."""

    async def claim_exists(ordinal: int) -> bool:
        claim = f"data-{naming.pod(spec.name, ordinal)}"
        return await ctx.kube.get(kube.PVCS, spec.namespace, claim) is not None

    return scaling.Reach(ctx.endpoints, ctx.replicas, claim_exists, token)


@dataclasses.dataclass(frozen=True)
class Growth:
    """What this pass does with the StatefulSet, as far as its volumes decide."""

    statefulset: dict[str, Any]  # the manifest to apply (immutable fields kept as live)
    frozen: list[str]  # immutable fields the spec would change (refused)
    recreating: bool  # the old StatefulSet is being deleted: do not apply it this pass
    resize: status_mod.Verdict | None  # StorageResizing (None: no growth under way)
    immutable_error: str  # a refused change, naming the field


async def reconcile(
    ctx: Context,
    spec: model.FleetSpec,
    previous: Mapping[str, Any],
    desired_sts: dict[str, Any],
    sts_live: Mapping[str, Any] | None,
    log: logging.Logger,
    emit: Emit,
) -> Growth:
    """One step of the volume-growth state machine, and the StatefulSet to apply."""
    sts, frozen = builders.keep_immutable(desired_sts, sts_live)
    immutable_error = ""
    resize: status_mod.Verdict | None = None
    was_resizing = status_mod.condition_true(previous, ConditionType.STORAGE_RESIZING)
    # The StatefulSet is being deleted with orphan propagation (recreated with a grown
    # claim template): the API server keeps the old object until the garbage collector
    # has released its pods, and refuses any change to its claim template meanwhile.
    recreating = bool(sts_live and (sts_live.get("metadata") or {}).get("deletionTimestamp"))
    if recreating:
        frozen = []
        resize = (
            ConditionStatus.TRUE,
            Reason.RESIZING,
            f"growing the volumes to {spec.storage.size}; waiting for the old StatefulSet "
            f"{spec.name} to be deleted (orphan: its pods keep running) to create it again",
        )
    elif sts_live is None and was_resizing:
        # Deleted for the recreation: this pass creates it with the grown template.
        resize, _ = await grow_claims(ctx, spec, True, log, emit)
    elif sts_live is not None and (
        was_resizing
        or ("volumeClaimTemplates" in frozen and volumes.only_size_differs(desired_sts, sts_live))
    ):
        live_size = volumes.template_size(sts_live) or spec.storage.size
        if volumes.quantity(spec.storage.size) < volumes.quantity(live_size):
            frozen = [f for f in frozen if f != "volumeClaimTemplates"]
            immutable_error = (
                f"spec.storage.size: volumes only grow: the claims have {live_size}, "
                f"the spec asks for {spec.storage.size}; set it back to {live_size} or more"
            )
            log.warning("%s", immutable_error)
        else:
            frozen = [f for f in frozen if f != "volumeClaimTemplates"]
            grown = volumes.quantity(live_size) == volumes.quantity(spec.storage.size)
            resize, recreate = await grow_claims(ctx, spec, grown, log, emit)
            if resize[1] is Reason.EXPANSION_NOT_ALLOWED:
                immutable_error = resize[2]
            if recreate:
                # Orphan: the pods (and their claims) stay; the StatefulSet is created
                # again below from the new template and adopts them.
                await ctx.kube.delete(
                    kube.STATEFULSETS,
                    spec.namespace,
                    spec.name,
                    uid=sts_live["metadata"].get("uid"),
                    propagation="Orphan",
                )
                log.info("recreating StatefulSet %s with %s volumes", spec.name, spec.storage.size)
                emit(
                    EventType.NORMAL,
                    Reason.RESIZING,
                    f"every claim has grown to {spec.storage.size}: recreating StatefulSet "
                    f"{spec.name} (orphan: the pods keep running) with the new claim template",
                )
                sts = desired_sts
                # A real API server keeps the object until the garbage collector has
                # released its pods, and refuses the new claim template meanwhile:
                # then the next pass creates it (see `recreating` above).
                still = await ctx.kube.get(kube.STATEFULSETS, spec.namespace, spec.name)
                if still is not None:
                    recreating = True
                    resize = (
                        ConditionStatus.TRUE,
                        Reason.RESIZING,
                        f"growing the volumes to {spec.storage.size}; waiting for the old "
                        f"StatefulSet {spec.name} to be deleted (orphan: its pods keep running) "
                        "to create it again",
                    )
    if frozen:
        fields = [
            "spec.storage" if f == "volumeClaimTemplates" else f"StatefulSet spec.{f}"
            for f in frozen
        ]
        immutable_error = (
            f"{', '.join(fields)}: cannot change on an existing StatefulSet "
            "(Kubernetes forbids it); the fleet keeps its current volumes. Revert the change "
            "(spec.storage.size may grow; the storage class may not change)"
        )
        log.warning("%s", immutable_error)
    return Growth(sts, frozen, recreating, resize, immutable_error)


async def grow_claims(
    ctx: Context, spec: model.FleetSpec, template_grown: bool, log: logging.Logger, emit: Emit
) -> tuple[status_mod.Verdict, bool]:
    """One step of growing the claims; (StorageResizing verdict, recreate the StatefulSet)."""
    size = spec.storage.size
    want = volumes.quantity(size)
    assert want is not None
    pvcs = await ctx.kube.list(
        kube.PVCS, spec.namespace, label_selector=naming.selector_string(spec.name)
    )
    claims = [
        volumes.Claim.of(c)
        for c in pvcs
        if naming.claim_ordinal(spec.name, c["metadata"]["name"]) is not None
    ]
    class_name = spec.storage.storage_class_name or next(
        (c.storage_class for c in claims if c.storage_class), None
    )
    if class_name:
        storage_class = await ctx.kube.get(kube.STORAGECLASSES, None, class_name)
    else:
        storage_class = volumes.default_class(await ctx.kube.list(kube.STORAGECLASSES, None))
    step = volumes.plan(want, claims, template_grown)
    if (step.patch or not template_grown) and not volumes.expandable(storage_class):
        # Checked before anything is touched, claims or not: an unexpandable class
        # means the size stays.
        which = f"StorageClass {class_name!r}" if class_name else "the default StorageClass"
        found = "" if storage_class is not None else " (not found)"
        return (
            ConditionStatus.FALSE,
            Reason.EXPANSION_NOT_ALLOWED,
            f"spec.storage.size: cannot grow the volumes to {size}: {which}{found} does not "
            "allow volume expansion (allowVolumeExpansion: true); set the size back",
        ), False
    for name in step.patch:
        await ctx.kube.patch(
            kube.PVCS,
            spec.namespace,
            name,
            {"spec": {"resources": {"requests": {"storage": size}}}},
        )
        log.info("requested %s for claim %s", size, name)
        emit(
            EventType.NORMAL, Reason.RESIZING, f"requested {size} for PersistentVolumeClaim {name}"
        )
    if step.done and template_grown:
        return (ConditionStatus.FALSE, Reason.RESIZED, f"every claim has {size}"), False
    parts = [
        f"{label}: {', '.join(names)}"
        for label, names in (
            ("requested now", step.patch),
            ("expanding", step.expanding),
            ("file system resize pending on the node", step.fs_pending),
        )
        if names
    ]
    if step.recreate:
        parts.append("recreating the StatefulSet with the new claim template")
    message = f"growing the volumes to {size}" + (f"; {'; '.join(parts)}" if parts else "")
    return (ConditionStatus.TRUE, Reason.RESIZING, message), step.recreate
