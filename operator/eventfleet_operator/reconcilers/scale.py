"""Scale: the StatefulSet's replica count this pass, the flush a user asks for, and
which pods serve clients.

Scaling down is held until every leaving replica's events are verified on the replicas
that stay (the pure :mod:`eventfleet_operator.scaling`; ``ScaleDownHeld`` says what it
waits for); ``eventfleet.io/force-scale-down`` overrides it. Leaving replicas lose the
``serving`` label first, so new clients go elsewhere while they flush.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import kube, model, naming, scaling
from eventfleet_operator import status as status_mod
from eventfleet_operator.constants import EventType, Reason
from eventfleet_operator.reconcilers import volumes
from eventfleet_operator.reconcilers.children import Context, Emit


async def set_serving(ctx: Context, spec: model.FleetSpec, log: logging.Logger) -> None:
    """Take leaving replicas out of the client Service (new clients go elsewhere)."""
    pods = await ctx.kube.list(
        kube.PODS, spec.namespace, label_selector=naming.selector_string(spec.name)
    )
    for pod in pods:
        name = pod["metadata"]["name"]
        suffix = name.rsplit("-", 1)[-1]
        if not suffix.isdigit():
            continue
        want = "true" if int(suffix) < spec.replicas else "false"
        if (pod["metadata"].get("labels") or {}).get(naming.SERVING_LABEL) != want:
            await ctx.kube.patch(
                kube.PODS,
                spec.namespace,
                name,
                {"metadata": {"labels": {naming.SERVING_LABEL: want}}},
            )
            log.info("pod %s serving=%s", name, want)


async def flush_on_request(
    ctx: Context,
    spec: model.FleetSpec,
    meta: Mapping[str, Any],
    previous: Mapping[str, Any],
    count: int,
    log: logging.Logger,
    emit: Emit,
    token: str | None = None,
) -> dict[str, Any] | None:
    """Answer a new ``eventfleet.io/flush`` value once: flush and verify every pair."""
    request = str((meta.get("annotations") or {}).get(naming.FLUSH_ANNOTATION) or "")
    if not request or (previous.get("lastFlush") or {}).get("requested") == request:
        return None

    problem = await scaling.verify_all(spec, count, volumes.reach(ctx, spec, token))
    if problem is None:
        result, message = "Verified", f"all {count} replicas hold each other's events"
        emit(EventType.NORMAL, Reason.FLUSH_VERIFIED, message)
    else:
        result, message = str(problem.reason), problem.message
        emit(EventType.WARNING, problem.reason, f"flush requested by {request!r}: {message}")
    log.info("flush %r: %s: %s", request, result, message)
    return {
        "requested": request,
        "result": result,
        "message": message[:500],
        "time": status_mod.now_iso(),
        "replicas": count,
    }


async def decide(
    ctx: Context,
    spec: model.FleetSpec,
    meta: Mapping[str, Any],
    current: int | None,
    log: logging.Logger,
    token: str | None = None,
) -> scaling.Decision:
    """The replica count to apply: the spec's, or held while a leaving replica's events
    are not verified elsewhere (hibernation: down to zero under the same rule)."""
    force = (meta.get("annotations") or {}).get(scaling.FORCE_ANNOTATION, "").lower() == "true"
    planner = scaling.plan_hibernation if spec.hibernate else scaling.plan
    decision = await planner(spec, current, volumes.reach(ctx, spec, token), force=force)
    if decision.held:
        log.warning("scale-down held: %s", decision.message)
    return decision
