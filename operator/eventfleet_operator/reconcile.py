"""One level-based reconciliation pass of one ``EventServer``, and its cleanup.

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

from eventfleet_operator import (
    builders,
    kube,
    metrics,
    model,
    naming,
    scaling,
)
from eventfleet_operator import status as status_mod
from eventfleet_operator.constants import (
    OPTIONAL_CHILD_PROBLEMS,
    READY_PROBLEMS,
    ConditionStatus,
    ConditionType,
    EventType,
    Operation,
    Reason,
)
from eventfleet_operator.reconcilers import (
    observe,
    optional,
    policies,
    rollout,
    scale,
    tls,
    tokens,
    volumes,
)
from eventfleet_operator.reconcilers.children import (
    ChildNotOwned,
    Context,
    Emit,
    apply_child,
    delete_owned,
    foreign_children,
)


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


def _emit_transitions(emit: Emit, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
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
            await write_status(ctx, namespace, name, new, previous)
            _emit_transitions(emit, previous, new)
            return new

        paused = (meta.get("annotations") or {}).get(naming.PAUSE_ANNOTATION) == naming.PAUSED
        transient: kube.ApiError | None = None
        obs = dataclasses.replace(
            base, desired=spec.replicas, paused=paused, hibernate=spec.hibernate
        )
        try:
            if paused:
                obs = await _observe_only(ctx, spec, previous, obs)
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
        await write_status(ctx, namespace, name, new, previous)
        _emit_transitions(emit, previous, new)
        if transient is not None:
            raise TransientRefusal(transient, new)
        return new


async def _observe_only(
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
        tokens=tokens_c,
        tokens_digest=digest,
        statefulset=sts,
        decision=scaling.Decision(target=count),
        peers=peers,
        rollout=rollout.plan_of(spec, sts, pods, peers, count),
        pods=status_mod.PodCounts.of(pods, spec.replicas),
        config_hash=str(previous.get("configHash") or ""),
        not_implemented=spec.not_implemented,
    )


async def _apply_children(
    ctx: Context,
    spec: model.FleetSpec,
    meta: Mapping[str, Any],
    previous: Mapping[str, Any],
    obs: status_mod.Observation,
    log: logging.Logger,
    emit: Emit,
) -> status_mod.Observation:
    foreign = await foreign_children(ctx, spec)
    if foreign:
        # Before anything is read from them or written: a same-named StatefulSet, Secret
        # or Service of someone else is neither scaled, flushed, overwritten nor adopted.
        raise ChildNotOwned(foreign, spec.uid)
    sts_live = await ctx.kube.get(kube.STATEFULSETS, spec.namespace, spec.name)
    creds = await tokens.reconcile(ctx, spec, meta, previous, sts_live, log, emit)
    token = creds.token
    tls_ = await tls.reconcile(ctx, spec, previous, log, emit)
    current = (sts_live or {}).get("spec", {}).get("replicas") if sts_live else None
    decision = await scale.decide(ctx, spec, meta, current, log, token)
    # Hibernating keeps the whole mesh in the peer list: waking needs no rewrite.
    peer_count = max(decision.target, spec.replicas) if spec.hibernate else decision.target

    config = builders.replica_config(
        spec, peer_count=peer_count, allow_empty_start=not previous.get("initialized", False)
    )
    config_hash = builders.config_hash(spec, config)
    configmap = builders.configmap(spec, config)
    desired_sts = builders.statefulset(spec, replicas=decision.target, config_hash=config_hash)
    growth = await volumes.reconcile(ctx, spec, previous, desired_sts, sts_live, log, emit)
    sts, frozen, recreating = growth.statefulset, growth.frozen, growth.recreating
    shrinking = current is not None and decision.target < current
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
    await policies.reconcile(ctx, spec, log, emit)
    if current is not None and decision.target != current:
        log.info("StatefulSet %s scaled %s -> %s", spec.name, current, decision.target)
    await scale.set_serving(ctx, spec, log)

    monitoring = await optional.monitoring(ctx, spec, log, emit)
    aggregation = await optional.aggregation(ctx, spec, log, emit)
    last_flush = await scale.flush_on_request(
        ctx, spec, meta, previous, decision.target, log, emit, token
    )
    sts_after = await ctx.kube.get(kube.STATEFULSETS, spec.namespace, spec.name)
    peers = await observe.replicas(ctx, spec, decision.target, token)
    tokens_c, digest = await tokens.tokens_loaded(ctx, spec, peers, previous, emit)
    pods = await observe.pods(ctx, spec)
    schema_version, schema_error = observe.schema(spec, previous, peers, pods)
    plan = await rollout.reconcile(
        ctx, spec, sts_after, pods, peers, decision, frozen, log, emit, token
    )
    return dataclasses.replace(
        obs,
        storage_resize=growth.resize,
        last_flush=last_flush,
        rollout=plan,
        token_error=creds.error,
        immutable_error=growth.immutable_error,
        schema_error=schema_error,
        schema_version=schema_version,
        not_implemented=spec.not_implemented,
        statefulset=sts_after,
        decision=decision,
        peers=peers,
        pods=status_mod.PodCounts.of(pods, spec.replicas),
        monitoring=monitoring,
        aggregation=aggregation,
        config_hash=config_hash,
        tokens=tokens_c,
        tokens_digest=digest,
        peer_token_rotation=creds.rotation,
        tls=tls_[0],
        tls_status=tls_[1],
    )


async def cleanup(ctx: Context, body: Mapping[str, Any], log: logging.Logger) -> list[str]:
    """Delete every child explicitly: garbage collection may not run (or not yet)."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    spec = body.get("spec") or {}
    when_deleted = ((spec.get("storage") or {}).get("retentionPolicy") or {}).get(
        "whenDeleted", "Retain"
    )
    token_ref = ((spec.get("token") or {}).get("secretRef") or {}).get("name")
    peer_token_ref = ((spec.get("peerToken") or {}).get("secretRef") or {}).get("name")
    uid = meta.get("uid", "")
    deleted: list[str] = []
    async with ctx.lock(namespace, name):
        targets: list[tuple[kube.Resource, str]] = [
            (kube.STATEFULSETS, naming.statefulset(name)),
            (kube.SERVICES, naming.client_service(name)),
            (kube.SERVICES, naming.peer_service(name)),
            (kube.CONFIGMAPS, naming.configmap(name)),
            (kube.PDBS, naming.pdb(name)),
            (kube.NETWORKPOLICIES, naming.network_policy(name)),
        ]
        if not token_ref:  # never delete a Secret the user owns
            targets.append((kube.SECRETS, naming.token_secret(name)))
        if not peer_token_ref:
            targets.append((kube.SECRETS, naming.peer_token_secret(name)))
        for optional, child in (
            (kube.SERVICEMONITORS, naming.service_monitor(name)),
            (kube.SPARKAPPS, naming.spark_app(name)),
        ):
            if await ctx.kube.has_resource(optional, ttl=0):
                targets.append((optional, child))
        for resource, child in targets:
            # Only what this EventServer owns: a same-named object of someone else stays.
            if await delete_owned(ctx, resource, namespace, child, uid, log):
                deleted.append(f"{resource.kind}/{child}")
                metrics.CHILD_WRITES.labels(resource.kind, Operation.DELETED).inc()
        if when_deleted == "Delete":
            claims = await ctx.kube.list(
                kube.PVCS, namespace, label_selector=naming.selector_string(name)
            )
            for claim in claims:
                claim_name = claim["metadata"]["name"]
                # Claims belong to the StatefulSet's template (data-NAME-N), not to the
                # EventServer: the name and the labels are what marks them as the fleet's.
                if naming.claim_ordinal(name, claim_name) is None:
                    continue
                if await ctx.kube.delete(
                    kube.PVCS, namespace, claim_name, uid=claim["metadata"].get("uid")
                ):
                    deleted.append(f"PersistentVolumeClaim/{claim_name}")
    ctx.locks.pop((namespace, name), None)
    log.info("deleted children: %s", ", ".join(deleted) or "none left")
    return deleted
