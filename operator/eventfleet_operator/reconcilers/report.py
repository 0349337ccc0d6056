"""Report: the status subresource written once per change, and the Kubernetes Events
for the conditions' transitions (one per transition, never one per pass)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventfleet_operator import kube
from eventfleet_operator import status as status_mod
from eventfleet_operator.constants import (
    OPTIONAL_CHILD_PROBLEMS,
    READY_PROBLEMS,
    ConditionStatus,
    ConditionType,
    EventType,
    Reason,
)
from eventfleet_operator.reconcilers.children import Context, Emit


async def write_status(
    ctx: Context, namespace: str, name: str, new: Mapping[str, Any], old: Mapping[str, Any] | None
) -> bool:
    """Patch the status subresource, only when something changed (no watch churn)."""
    if dict(new) == dict(old or {}):
        return False
    await ctx.kube.patch(
        kube.EVENTSERVERS, namespace, name, {"status": dict(new)}, subresource="status"
    )
    return True


def emit_transitions(emit: Emit, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
    """Kubernetes Events for what changed: one per transition, never one per pass."""
    before = {c.get("type"): c for c in (old or {}).get("conditions") or []}
    for c in status_mod.transitions(old, new):
        kind, state, reason, message = (
            ConditionType(c["type"]),
            ConditionStatus(c["status"]),
            Reason(c["reason"]),
            c["message"] or c["reason"],
        )
        was_true = (before.get(kind) or {}).get("status") == ConditionStatus.TRUE
        is_true = state is ConditionStatus.TRUE
        if kind is ConditionType.READY:
            if is_true:
                emit(EventType.NORMAL, reason, message)
            elif was_true or reason in READY_PROBLEMS:
                emit(EventType.WARNING, reason, message)
        elif kind is ConditionType.SCALE_DOWN_HELD:
            if is_true:
                emit(EventType.WARNING, Reason.SCALE_DOWN_HELD, message)
            elif reason in (Reason.SCALE_DOWN_VERIFIED, Reason.SCALE_DOWN_FORCED):
                emit(EventType.NORMAL, reason, message)
        elif kind in (ConditionType.AGGREGATION_SCHEDULED, ConditionType.MONITORING_CONFIGURED):
            if reason in OPTIONAL_CHILD_PROBLEMS:
                emit(EventType.WARNING, reason, message)
        elif kind is ConditionType.PROGRESSING:
            if is_true or was_true:
                emit(EventType.NORMAL, reason, message)
        elif kind in (ConditionType.RECONCILE_PAUSED, ConditionType.HIBERNATED):
            if is_true or was_true or reason is Reason.HIBERNATING:
                emit(EventType.NORMAL, reason, message)
        elif kind is ConditionType.TOKENS_LOADED:
            # Only a rotation's progress: not the first check of a new fleet.
            was_reloading = (before.get(kind) or {}).get("reason") == Reason.TOKENS_RELOADING
            if reason is Reason.TOKENS_RELOADING or (is_true and was_reloading):
                emit(EventType.NORMAL, reason, message)
        elif kind is ConditionType.PEERS_SYNCED and (is_true or was_true):
            emit(EventType.NORMAL if is_true else EventType.WARNING, reason, message)
