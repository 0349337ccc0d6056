"""Core children: the token Secrets, the two Services, the ConfigMap with the peer list,
the StatefulSet and the PodDisruptionBudget, applied in the order that keeps the mesh.

On the way up the peer list grows before the StatefulSet, so new replicas start with the
whole mesh; on the way down the StatefulSet shrinks first, so leaving replicas can still
flush to their peers while they stop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import builders, model
from eventfleet_operator.reconcilers import tokens, volumes
from eventfleet_operator.reconcilers.children import Context, Emit, apply_child


@dataclasses.dataclass(frozen=True)
class Desired:
    """The replicas' configuration and StatefulSet this pass wants."""

    config_hash: str  # on the pod template: a change that needs a restart rolls the pods
    configmap: dict[str, Any]
    statefulset: dict[str, Any]  # before the immutable fields are kept (volumes.reconcile)


def desired(
    spec: model.FleetSpec, previous: Mapping[str, Any], replicas: int, peer_count: int
) -> Desired:
    """The ConfigMap (listing ``peer_count`` peers) and a StatefulSet of ``replicas``."""
    config = builders.replica_config(
        spec, peer_count=peer_count, allow_empty_start=not previous.get("initialized", False)
    )
    config_hash = builders.config_hash(spec, config)
    configmap = builders.configmap(spec, config)
    desired_sts = builders.statefulset(spec, replicas=replicas, config_hash=config_hash)
    return Desired(config_hash, configmap, desired_sts)


async def apply(
    ctx: Context,
    spec: model.FleetSpec,
    creds: tokens.Secrets,
    want: Desired,
    growth: volumes.Growth,
    current: int | None,
    target: int,
    log: logging.Logger,
    emit: Emit,
) -> None:
    """Apply the core children in the mesh-safe order (see the module docstring)."""
    sts, configmap, recreating = growth.statefulset, want.configmap, growth.recreating
    shrinking = current is not None and target < current
    # Down: StatefulSet first (stopping replicas flush to still-connected peers), then peers.
    # Up or steady: peers first, so new replicas start with the whole mesh.
    ordered: list[dict[str, Any]] = [
        *creds.manifests(),
        builders.peer_service(spec),
        builders.client_service(spec),
        *([sts, configmap] if shrinking else [configmap, sts]),
    ]
    if recreating:
        ordered = [m for m in ordered if m is not sts]
    if spec.pdb.enabled:
        ordered.append(builders.pod_disruption_budget(spec))
    for manifest in ordered:
        read = (
            creds.read_versions.get(manifest["metadata"]["name"])
            if manifest["kind"] == "Secret"
            else None
        )
        await apply_child(ctx, manifest, log, emit, read)
    if current is not None and target != current:
        log.info("StatefulSet %s scaled %s -> %s", spec.name, current, target)
