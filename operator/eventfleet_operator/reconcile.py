"""One level-based reconciliation pass of one ``EventServer`` (its deletion is
:mod:`eventfleet_operator.reconcilers.deletion`).

Each pass reads what exists, builds what should exist (pure builders), applies the
difference and writes the observed status. Nothing depends on which event woke it
(create, update, resume, timer): running it twice in a row does nothing the second
time. Children are ordered so that a scaling fleet never loses its mesh: on the way
up the peer list grows before the StatefulSet; on the way down the StatefulSet shrinks
first, so leaving replicas can still flush to their peers while they stop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import kube, model, naming
from eventfleet_operator import status as status_mod
from eventfleet_operator.constants import ConditionType, Reason
from eventfleet_operator.reconcilers import (
    buscurve,
    children,
    core,
    maintenance,
    observe,
    optional,
    policies,
    report,
    rollout,
    scale,
    tls,
    tokens,
    volumes,
)
from eventfleet_operator.reconcilers.children import ChildNotOwned, Context, Emit


class TransientRefusal(Exception):
    """A pass's writes were refused for a reason the API server lifts by itself
    (:attr:`kube.ApiError.transient`). The pass's ``status`` is written already; the
    caller retries within seconds instead of waiting for the next resync."""

    def __init__(self, error: kube.ApiError, status: dict[str, Any]) -> None:
        super().__init__(str(error))
        self.error = error
        self.status = status


async def reconcile(
    ctx: Context, body: Mapping[str, Any], log: logging.Logger, emit: Emit
) -> dict[str, Any]:
    """Bring the children of one ``EventServer`` to the desired state; returns the status.

    Raises :class:`TransientRefusal` (after writing the status) when the API server
    refused a write for a reason that lifts within seconds.
    """
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    generation = int(meta.get("generation") or 0)
    previous = body.get("status") or {}
    async with ctx.lock(namespace, name):
        base = status_mod.Observation(
            name=name,
            generation=generation,
            desired=int((body.get("spec") or {}).get("replicas") or 0),
            selector=naming.selector_string(name),
        )
        try:
            spec = model.parse(name, namespace, body.get("spec"), uid=meta.get("uid", ""))
            restart = (meta.get("annotations") or {}).get(naming.RESTART_ANNOTATION, "")
            spec = dataclasses.replace(spec, restart=str(restart))
        except model.SpecError as e:
            log.warning("invalid spec: %s", e)
            sts = await ctx.kube.get(kube.STATEFULSETS, namespace, name)
            if not naming.owned_by(sts, meta.get("uid", "")):
                sts = None
            new = status_mod.build(
                dataclasses.replace(base, spec_error=(e.field, e.message), statefulset=sts),
                previous,
            )
            await report.write_status(ctx, namespace, name, new, previous)
            report.emit_transitions(emit, previous, new)
            return new

        paused = maintenance.paused(meta)
        transient: kube.ApiError | None = None
        obs = dataclasses.replace(
            base, desired=spec.replicas, paused=paused, hibernate=spec.hibernate
        )
        try:
            if paused:
                obs = await maintenance.observe_only(ctx, spec, previous, obs)
            else:
                obs = await _apply_children(ctx, spec, meta, previous, obs, log, emit)
        except ChildNotOwned as e:
            # Once per change, not once per resync: the status and the Event carry it.
            was = status_mod.find_condition(previous.get("conditions"), ConditionType.READY)
            repeat = (
                was.get("reason") == Reason.CHILD_NOT_OWNED and was.get("message") == str(e)[:500]
            )
            log.log(logging.DEBUG if repeat else logging.ERROR, "%s", e)
            obs = dataclasses.replace(obs, ownership_error=str(e))
        except kube.ApiError as e:
            # Keep running: report it and let the next pass retry — the timer's, or a
            # prompt one for a refusal that lifts by itself (TransientRefusal below).
            log.error("applying children failed: %s", e)
            transient = e if e.transient else None
            sts = await ctx.kube.get(kube.STATEFULSETS, namespace, name)
            if not naming.owned_by(sts, spec.uid):
                sts = None
            obs = dataclasses.replace(obs, apply_error=str(e), statefulset=sts)
        new = status_mod.build(obs, previous)
        await report.write_status(ctx, namespace, name, new, previous)
        report.emit_transitions(emit, previous, new)
        if transient is not None:
            raise TransientRefusal(transient, new)
        return new


async def _apply_children(
    ctx: Context,
    spec: model.FleetSpec,
    meta: Mapping[str, Any],
    previous: Mapping[str, Any],
    obs: status_mod.Observation,
    log: logging.Logger,
    emit: Emit,
) -> status_mod.Observation:
    """The pass of a fleet that is not paused: each feature's step, in this order."""
    await children.refuse_foreign(ctx, spec)
    sts_live = await ctx.kube.get(kube.STATEFULSETS, spec.namespace, spec.name)
    current = (sts_live or {}).get("spec", {}).get("replicas") if sts_live else None
    creds = await tokens.reconcile(ctx, spec, meta, previous, sts_live, log, emit)
    token = creds.token  # presented on every call to a replica from here on
    cert = await tls.reconcile(ctx, spec, previous, log, emit)
    bus_curve = await buscurve.reconcile(ctx, spec, log, emit)  # before the pods mount it
    decision = await scale.decide(ctx, spec, meta, current, log, token)
    peer_count = maintenance.peer_count(spec, decision)
    want = core.desired(spec, previous, decision.target, peer_count)
    growth = await volumes.reconcile(ctx, spec, previous, want.statefulset, sts_live, log, emit)
    await core.apply(ctx, spec, creds, want, growth, current, decision.target, log, emit)
    await policies.reconcile(ctx, spec, log, emit)
    await scale.set_serving(ctx, spec, log)
    monitoring = await optional.monitoring(ctx, spec, log, emit)
    aggregation = await optional.aggregation(ctx, spec, log, emit)
    last_flush = await scale.flush_on_request(
        ctx, spec, meta, previous, decision.target, log, emit, token
    )
    # Observed after the writes: what the status reports.
    sts_after = await ctx.kube.get(kube.STATEFULSETS, spec.namespace, spec.name)
    peers = await observe.replicas(ctx, spec, decision.target, token)
    loaded, digest = await tokens.tokens_loaded(ctx, spec, peers, previous, emit)
    pods = await observe.pods(ctx, spec)
    schema_version, schema_error = observe.schema(spec, previous, peers, pods)
    plan = await rollout.reconcile(
        ctx, spec, sts_after, pods, peers, decision, growth.frozen, previous, log, emit, token
    )
    return dataclasses.replace(
        obs,
        last_flush=last_flush,
        rollout=plan,
        schema_error=schema_error,
        schema_version=schema_version,
        not_implemented=spec.not_implemented,
        statefulset=sts_after,
        decision=decision,
        peers=peers,
        pods=status_mod.PodCounts.of(pods, spec.replicas),
        monitoring=monitoring,
        aggregation=aggregation,
        config_hash=want.config_hash,
        storage=status_mod.StorageReport(growth.resize, growth.immutable_error),
        tokens=status_mod.TokensReport(loaded, digest, creds.error, creds.rotation),
        tls=cert,
        bus_curve=buscurve.serving(bus_curve, peers),
    )
