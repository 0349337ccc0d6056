"""Rollout: the managed replacement of pods on a new revision (a changed template or
``eventfleet.io/restart``), one pod per pass, a serving one only after its events are
verified on the others (the plan is the pure :mod:`eventfleet_operator.rollout`).

With ``updateStrategy: RollingUpdate`` the StatefulSet controller replaces the pods and
this room only reports the plan (``Progressing``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from eventfleet_operator import kube, model, naming, rollout, scaling
from eventfleet_operator import status as status_mod
from eventfleet_operator.constants import ConditionType, EventType, Reason
from eventfleet_operator.reconcilers import volumes
from eventfleet_operator.reconcilers.children import Context, Emit


def plan_of(
    spec: model.FleetSpec,
    sts: Mapping[str, Any] | None,
    pods: Mapping[int, Mapping[str, Any]],
    peers: Sequence[status_mod.PeerReport],
    count: int,
    previous: Mapping[str, Any],
) -> rollout.Plan | None:
    """The rollout as the pods, the replicas and the StatefulSet show it in this pass.

    ``previous`` is the last status written: its ``Progressing=True`` says a rollout is
    under way, so pods still missing or starting on the new revision are its tail.
    """
    if sts is None:
        return None
    desired = rollout.PodState.desired(sts)
    ready = {p.ordinal: bool(p.status and p.status.ready) for p in peers}
    states = [rollout.PodState.of(i, pods.get(i), ready.get(i, False)) for i in range(count)]
    entries = [status_mod.peer_entry(p, [q.server_id for q in peers]) for p in peers]
    synced = bool(entries) and all(e.get("syncState") == "synced" for e in entries)
    return rollout.plan(
        states,
        count,
        desired.revision,
        synced,
        in_progress=status_mod.condition_true(previous, ConditionType.PROGRESSING),
        counted_ready=int((sts.get("status") or {}).get("readyReplicas") or 0),
    )


async def roll(
    ctx: Context,
    spec: model.FleetSpec,
    sts: Mapping[str, Any],
    pods: Mapping[int, Mapping[str, Any]],
    plan: rollout.Plan,
    log: logging.Logger,
    emit: Emit,
    token: str | None = None,
) -> rollout.Plan:
    """Take the plan's one step: replace one pod (after a flush/verify if it serves)."""
    ordinal = plan.replace
    if ordinal is None:
        return plan
    name = naming.pod(spec.name, ordinal)
    if plan.check_first:
        problem = await scaling.check_leaving(
            spec, ordinal, volumes.reach(ctx, spec, token), remaining=range(plan.replicas)
        )
        if problem is not None:
            log.warning("not replacing %s yet: %s", name, problem.message)
            return dataclasses.replace(
                plan, replace=None, waiting=f"holding the replacement of {name}: {problem.message}"
            )
    pod = pods[ordinal]
    state = rollout.PodState.of(ordinal, pod, ready=not plan.check_first)
    why = rollout.restart_reason(state, rollout.PodState.desired(sts))
    try:
        deleted = await ctx.kube.delete(kube.PODS, spec.namespace, name, uid=state.uid or None)
    except kube.ApiError as e:
        if e.status != 409:
            raise
        deleted = False  # already replaced by someone else
    if deleted:
        log.info(
            "replaced pod %s (revision %s -> %s): %s",
            name,
            state.revision,
            plan.update_revision,
            why,
        )
        emit(
            EventType.NORMAL,
            Reason.REPLICA_RESTARTED,
            f"deleted pod {name} to move it from revision {state.revision or '?'} to "
            f"{plan.update_revision}"
            + ("" if plan.check_first else " (it was not ready)")
            + f": {why}",
        )
    return plan


async def reconcile(
    ctx: Context,
    spec: model.FleetSpec,
    sts: Mapping[str, Any] | None,
    pods: Mapping[int, Mapping[str, Any]],
    peers: Sequence[status_mod.PeerReport],
    decision: scaling.Decision,
    frozen: Sequence[str],
    previous: Mapping[str, Any],
    log: logging.Logger,
    emit: Emit,
    token: str | None = None,
) -> rollout.Plan | None:
    """The rollout plan of this pass, its one step taken when the fleet is steady.

    Steady: not hibernating, no scale-down held, at its size and with no refused
    immutable change (``frozen``), so a replacement never races a scale or a resize.
    """
    plan = plan_of(spec, sts, pods, peers, decision.target, previous)
    steady = not spec.hibernate and not decision.held and decision.target == spec.replicas
    if plan is not None and sts is not None:
        if spec.update_strategy == "Managed" and steady and not frozen:
            plan = await roll(ctx, spec, sts, pods, plan, log, emit, token)
        elif plan.replace is not None:
            # RollingUpdate: the StatefulSet controller replaces the pods; only report.
            plan = dataclasses.replace(plan, replace=None, waiting="the StatefulSet rolls the pods")
    return plan
