"""Policies: the PodDisruptionBudget's removal and the NetworkPolicy of the fleet.

The PodDisruptionBudget is applied with the core children (it must exist before a
rollout); here it is removed when ``spec.podDisruptionBudget.enabled`` is false. The
NetworkPolicy admits the operator itself (its namespace and labels from the config) so
its calls to ``/status`` and ``/flush`` pass.
"""

from __future__ import annotations

import logging

from eventfleet_operator import builders, kube, model, naming
from eventfleet_operator.reconcilers.children import Context, Emit, apply_child, remove_child


async def network_policy(
    ctx: Context, spec: model.FleetSpec, log: logging.Logger, emit: Emit
) -> None:
    if not spec.network_policy.enabled:
        name = naming.network_policy(spec.name)
        why = "spec.networkPolicy.enabled is false"
        await remove_child(ctx, kube.NETWORKPOLICIES, spec, name, log, emit, why)
        return
    operator = builders.operator_peer(ctx.config.self_namespace, dict(ctx.config.self_labels))
    await apply_child(ctx, builders.network_policy(spec, operator), log, emit)


async def reconcile(ctx: Context, spec: model.FleetSpec, log: logging.Logger, emit: Emit) -> None:
    """Remove a disabled PodDisruptionBudget; apply or remove the NetworkPolicy."""
    if not spec.pdb.enabled:
        why = "spec.podDisruptionBudget.enabled is false"
        await remove_child(ctx, kube.PDBS, spec, naming.pdb(spec.name), log, emit, why)
    await network_policy(ctx, spec, log, emit)
