"""Optional children: the ServiceMonitor (``spec.monitoring``) and the aggregation's
ScheduledSparkApplication (``spec.aggregation``).

Each is applied when enabled and its CRD is installed, removed when disabled, and
reported (``MonitoringConfigured``, ``AggregationScheduled``) without ever failing the
pass: a missing CRD or a refused write is the condition's reason, not an error.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from eventfleet_operator import builders, kube, model, naming
from eventfleet_operator import status as status_mod
from eventfleet_operator.reconcilers.children import (
    ChildNotOwned,
    Context,
    Emit,
    apply_child,
    remove_child,
)


async def optional_child(
    ctx: Context,
    enabled: bool,
    resource: kube.Resource,
    build: Callable[[], dict[str, Any]],
    spec: model.FleetSpec,
    name: str,
    log: logging.Logger,
    emit: Emit,
    *,
    note: str = "",
    report: Callable[[Mapping[str, Any] | None], Mapping[str, Any]] | None = None,
) -> status_mod.OptionalChild:
    """Apply or remove one optional child; ``report`` turns the child as read back after
    the apply (its controller's status) into the EventServer's status entry."""
    available = await ctx.kube.has_resource(resource)
    if not available:
        if enabled:
            log.warning(
                "%s requested but its CRD (%s) is not installed",
                resource.kind,
                resource.api_version,
            )
        return status_mod.OptionalChild(enabled=enabled, available=False)
    if not enabled:
        # Turned off in the spec: level-based means the child goes away too.
        await remove_child(ctx, resource, spec, name, log, emit, "disabled in the spec")
        return status_mod.OptionalChild(enabled=False)
    try:
        await apply_child(ctx, build(), log, emit)
    except (kube.ApiError, ChildNotOwned) as e:
        return status_mod.OptionalChild(enabled=True, error=str(e))
    observed = None
    if report is not None:
        observed = report(await ctx.kube.get(resource, spec.namespace, name))
    return status_mod.OptionalChild(enabled=True, applied=True, note=note, report=observed)


def aggregation_note(agg: model.Aggregation) -> str:
    if not agg.output_is_ephemeral:
        return ""
    return (
        f"its output {agg.output} is in the driver pod and lost after every run: set "
        "spec.aggregation.output to an s3a:// URL or mount a claim with "
        "spec.aggregation.outputVolume"
    )


async def monitoring(
    ctx: Context, spec: model.FleetSpec, log: logging.Logger, emit: Emit
) -> status_mod.OptionalChild:
    """The ServiceMonitor of ``spec.monitoring.serviceMonitor``."""
    return await optional_child(
        ctx,
        spec.service_monitor.enabled,
        kube.SERVICEMONITORS,
        lambda: builders.service_monitor(spec),
        spec,
        naming.service_monitor(spec.name),
        log,
        emit,
    )


async def aggregation(
    ctx: Context, spec: model.FleetSpec, log: logging.Logger, emit: Emit
) -> status_mod.OptionalChild:
    """The ScheduledSparkApplication of ``spec.aggregation``, with its last runs and the
    result of the last finished one (``lastResult``, from its driver pod)."""
    child = await optional_child(
        ctx,
        spec.aggregation.enabled,
        kube.SPARKAPPS,
        lambda: builders.scheduled_spark_application(spec),
        spec,
        naming.spark_app(spec.name),
        log,
        emit,
        note=aggregation_note(spec.aggregation),
        report=lambda live: status_mod.aggregation_report(live, spec.aggregation.output),
    )
    if child.report is None:
        return child
    try:
        drivers = await ctx.kube.list(
            kube.PODS, spec.namespace, label_selector=naming.aggregation_driver_selector(spec.name)
        )
    except kube.ApiError as e:
        # The last result is a report, never a reason to fail the pass.
        log.warning("cannot list the aggregation's driver pods: %s", e)
        return child
    result = status_mod.aggregation_result(drivers)
    if result is None:
        return child
    return dataclasses.replace(child, report={**child.report, "lastResult": result})
