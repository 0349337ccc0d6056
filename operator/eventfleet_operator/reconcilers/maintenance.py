"""Maintenance: a paused fleet (``eventfleet.io/reconcile: paused``) and a hibernating
one (``spec.hibernate``).

Paused: the pass only observes (StatefulSet, replicas, tokens, rollout) and writes the
status, so a hand repair is never undone. Hibernating: the replicas go to zero under the
scale-down rule (:func:`eventfleet_operator.scaling.plan_hibernation`, chosen by
:func:`eventfleet_operator.reconcilers.scale.decide`) while the claims and the whole
peer list stay, so waking is a scale-up and no rewrite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import kube, model, naming, scaling
from eventfleet_operator import status as status_mod
from eventfleet_operator.reconcilers import observe, rollout, tokens
from eventfleet_operator.reconcilers.children import Context


def paused(meta: Mapping[str, Any]) -> bool:
    """Does the EventServer carry ``eventfleet.io/reconcile: paused``?"""
    return (meta.get("annotations") or {}).get(naming.PAUSE_ANNOTATION) == naming.PAUSED


def peer_count(spec: model.FleetSpec, decision: scaling.Decision) -> int:
    """How many peers the replicas' config lists."""
    # Hibernating keeps the whole mesh in the peer list: waking needs no rewrite.
    return max(decision.target, spec.replicas) if spec.hibernate else decision.target


async def observe_only(
    ctx: Context,
    spec: model.FleetSpec,
    previous: Mapping[str, Any],
    obs: status_mod.Observation,
) -> status_mod.Observation:
    """A paused fleet: read the StatefulSet and the replicas, write nothing but status."""
    sts = await ctx.kube.get(kube.STATEFULSETS, spec.namespace, spec.name)
    if not naming.owned_by(sts, spec.uid):
        sts = None
    count = int(((sts or {}).get("spec") or {}).get("replicas") or 0)
    token = await tokens.read_peer_token(ctx, spec)
    peers = await observe.replicas(ctx, spec, count, token)
    tokens_c, digest = await tokens.tokens_loaded(ctx, spec, peers, previous)
    pods = await observe.pods(ctx, spec)
    return dataclasses.replace(
        obs,
        tokens=status_mod.TokensReport(loaded=tokens_c, digest=digest),
        statefulset=sts,
        decision=scaling.Decision(target=count),
        peers=peers,
        rollout=rollout.plan_of(spec, sts, pods, peers, count, previous),
        pods=status_mod.PodCounts.of(pods, spec.replicas),
        config_hash=str(previous.get("configHash") or ""),
        not_implemented=spec.not_implemented,
    )
