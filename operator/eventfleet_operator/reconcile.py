"""One level-based reconciliation pass of one ``EventServer``, and its cleanup.

Each pass reads what exists, builds what should exist (pure builders), applies the
difference and writes the observed status. Nothing depends on which event woke it
(create, update, resume, timer): running it twice in a row does nothing the second
time. Children are ordered so that a scaling fleet never loses its mesh: on the way
up the peer list grows before the StatefulSet; on the way down the StatefulSet shrinks
first, so leaving replicas can still flush to their peers while they stop.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eventfleet_operator import builders, kube, metrics, model, naming, scaling
from eventfleet_operator import status as status_mod
from eventfleet_operator.config import OperatorConfig
from eventfleet_operator.constants import (
    OPTIONAL_CHILD_PROBLEMS,
    READY_PROBLEMS,
    ConditionStatus,
    ConditionType,
    EventType,
    Operation,
    Reason,
)
from eventfleet_operator.replicas import Endpoints, ReplicaClient, ReplicaUnreachable

Emit = Callable[[EventType, str, str], None]  # (type, reason, message)


@dataclasses.dataclass
class Context:
    """Process-wide clients and per-fleet locks (timers and watch events run concurrently)."""

    config: OperatorConfig
    kube: kube.KubeClient
    replicas: ReplicaClient
    endpoints: Endpoints
    locks: dict[tuple[str, str], asyncio.Lock] = dataclasses.field(default_factory=dict)

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self.locks.setdefault((namespace, name), asyncio.Lock())

    async def close(self) -> None:
        await self.kube.close()
        await self.replicas.close()


def is_subset(desired: Any, live: Any) -> bool:
    """Does ``live`` already carry every field of ``desired`` (extra live fields allowed)?

    Servers add defaults, so equality would re-apply forever; lists must match
    item by item because the builders emit them whole.
    """
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and is_subset(v, live[k]) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    return desired == live


async def ensure(
    ctx: Context, manifest: Mapping[str, Any], log: logging.Logger
) -> Operation | None:
    """Create or repair one child; returns what it did, or None (no change)."""
    resource = kube.resource_of(manifest)
    meta = manifest["metadata"]
    live = await ctx.kube.get(resource, meta["namespace"], meta["name"])
    if live is not None and is_subset(manifest, live):
        return None
    result = await ctx.kube.apply(manifest)
    if live is None:
        log.info("created %s %s", manifest["kind"], meta["name"])
        metrics.CHILD_WRITES.labels(manifest["kind"], Operation.CREATED).inc()
        return Operation.CREATED
    if result.get("metadata", {}).get("resourceVersion") == live.get("metadata", {}).get(
        "resourceVersion"
    ):
        return None  # the server found nothing to change (e.g. a normalised quantity)
    log.info("updated %s %s (it differed from the desired state)", manifest["kind"], meta["name"])
    metrics.CHILD_WRITES.labels(manifest["kind"], Operation.UPDATED).inc()
    return Operation.UPDATED


async def _token(
    ctx: Context, spec: model.FleetSpec, log: logging.Logger
) -> tuple[dict[str, Any] | None, str, str | None]:
    """The generated Secret to apply (or None), a problem with a referenced one, and the
    token itself (the operator presents it on the replicas' admin routes)."""
    ref = spec.token_ref
    live = await ctx.kube.get(kube.SECRETS, spec.namespace, ref.secret_name)
    if not ref.generated:
        if live is None:
            return None, f"spec.token.secretRef.name: Secret {ref.secret_name!r} not found", None
        if ref.key not in (live.get("data") or {}):
            return (
                None,
                f"spec.token.secretRef.key: Secret {ref.secret_name!r} has no key {ref.key!r}",
                None,
            )
        return None, "", _first_token(live["data"][ref.key])
    token = ""
    if live is not None:
        try:
            token = base64.b64decode((live.get("data") or {}).get("token", "")).decode()
        except ValueError:
            token = ""
    if not token:
        # Generated once and then kept: rotating it would lock out every client.
        token = secrets.token_urlsafe(32)
        log.info("generated a new token for Secret %s", ref.secret_name)
    return builders.token_secret(spec, token), "", token


def _first_token(data: str) -> str | None:
    """The token a replica presents to peers: the first non-empty line of the file."""
    try:
        text = base64.b64decode(data).decode()
    except ValueError:
        return None
    return next((line.strip() for line in text.splitlines() if line.strip()), None)


async def _claim_exists(ctx: Context, spec: model.FleetSpec, ordinal: int) -> bool:
    claim = f"data-{naming.pod(spec.name, ordinal)}"
    return await ctx.kube.get(kube.PVCS, spec.namespace, claim) is not None


async def _set_serving(ctx: Context, spec: model.FleetSpec, log: logging.Logger) -> None:
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


async def _observe_replicas(
    ctx: Context, spec: model.FleetSpec, count: int, token: str | None = None
) -> list[status_mod.PeerReport]:
    async def one(ordinal: int) -> status_mod.PeerReport:
        url = ctx.endpoints.url(spec.namespace, spec.name, ordinal, spec.ports.http)
        report = status_mod.PeerReport(
            ordinal, naming.pod(spec.name, ordinal), naming.server_id(ordinal)
        )
        try:
            return dataclasses.replace(report, status=await ctx.replicas.status(url, token))
        except ReplicaUnreachable as e:
            return dataclasses.replace(report, error=str(e))

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def _optional(
    ctx: Context,
    enabled: bool,
    resource: kube.Resource,
    build: Callable[[], dict[str, Any]],
    spec: model.FleetSpec,
    name: str,
    log: logging.Logger,
    emit: Emit,
) -> status_mod.OptionalChild:
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
        if await ctx.kube.delete(resource, spec.namespace, name):
            log.info("deleted %s %s (disabled in the spec)", resource.kind, name)
            metrics.CHILD_WRITES.labels(resource.kind, Operation.DELETED).inc()
            emit(
                EventType.NORMAL,
                Operation.DELETED.event_reason,
                f"deleted {resource.kind} {name} (disabled in the spec)",
            )
        return status_mod.OptionalChild(enabled=False)
    try:
        change = await ensure(ctx, build(), log)
    except kube.ApiError as e:
        return status_mod.OptionalChild(enabled=True, error=str(e))
    if change:
        emit(EventType.NORMAL, change.event_reason, f"{change} {resource.kind} {name}")
    return status_mod.OptionalChild(enabled=True, applied=True)


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
        elif kind is ConditionType.PEERS_SYNCED and (is_true or was_true):
            emit(EventType.NORMAL if is_true else EventType.WARNING, reason, message)


async def reconcile(
    ctx: Context, body: Mapping[str, Any], log: logging.Logger, emit: Emit
) -> dict[str, Any]:
    """Bring the children of one ``EventServer`` to the desired state; returns the status."""
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
        except model.SpecError as e:
            log.warning("invalid spec: %s", e)
            sts = await ctx.kube.get(kube.STATEFULSETS, namespace, name)
            new = status_mod.build(
                dataclasses.replace(base, spec_error=(e.field, e.message), statefulset=sts),
                previous,
            )
            await write_status(ctx, namespace, name, new, previous)
            _emit_transitions(emit, previous, new)
            return new

        obs = dataclasses.replace(base, desired=spec.replicas)
        try:
            obs = await _apply_children(ctx, spec, meta, previous, obs, log, emit)
        except kube.ApiError as e:
            # Keep running: report it and let the next pass (timer) retry.
            log.error("applying children failed: %s", e)
            sts = await ctx.kube.get(kube.STATEFULSETS, namespace, name)
            obs = dataclasses.replace(obs, apply_error=str(e), statefulset=sts)
        new = status_mod.build(obs, previous)
        await write_status(ctx, namespace, name, new, previous)
        _emit_transitions(emit, previous, new)
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
    secret, token_error, token = await _token(ctx, spec, log)
    sts_live = await ctx.kube.get(kube.STATEFULSETS, spec.namespace, spec.name)
    current = (sts_live or {}).get("spec", {}).get("replicas") if sts_live else None
    force = (meta.get("annotations") or {}).get(scaling.FORCE_ANNOTATION, "").lower() == "true"

    async def claim_exists(ordinal: int) -> bool:
        return await _claim_exists(ctx, spec, ordinal)

    decision = await scaling.plan(
        spec,
        current,
        endpoints=ctx.endpoints,
        client=ctx.replicas,
        claim_exists=claim_exists,
        force=force,
        token=token,
    )
    if decision.held:
        log.warning("scale-down held: %s", decision.message)

    config = builders.replica_config(
        spec, peer_count=decision.target, allow_empty_start=not previous.get("initialized", False)
    )
    config_hash = builders.config_hash(spec, config)
    configmap = builders.configmap(spec, config)
    sts, frozen = builders.keep_immutable(
        builders.statefulset(spec, replicas=decision.target, config_hash=config_hash), sts_live
    )
    immutable_error = ""
    if frozen:
        fields = [
            "spec.storage" if f == "volumeClaimTemplates" else f"StatefulSet spec.{f}"
            for f in frozen
        ]
        immutable_error = (
            f"{', '.join(fields)}: cannot change on an existing StatefulSet "
            "(Kubernetes forbids it); "
            "the fleet keeps its current volumes. Revert the change, or expand the claims by hand "
            "and recreate the StatefulSet (kubectl delete statefulset NAME --cascade=orphan)"
        )
        log.warning("%s", immutable_error)
    shrinking = current is not None and decision.target < current
    # Down: StatefulSet first (stopping replicas flush to still-connected peers), then peers.
    # Up or steady: peers first, so new replicas start with the whole mesh.
    ordered: Sequence[dict[str, Any]] = [
        *([secret] if secret else []),
        builders.peer_service(spec),
        builders.client_service(spec),
        *([sts, configmap] if shrinking else [configmap, sts]),
        builders.pod_disruption_budget(spec),
    ]
    for manifest in ordered:
        change = await ensure(ctx, manifest, log)
        if change:
            emit(
                EventType.NORMAL,
                change.event_reason,
                f"{change} {manifest['kind']} {manifest['metadata']['name']}",
            )
    if current is not None and decision.target != current:
        log.info("StatefulSet %s scaled %s -> %s", spec.name, current, decision.target)
    await _set_serving(ctx, spec, log)

    monitoring = await _optional(
        ctx,
        spec.service_monitor.enabled,
        kube.SERVICEMONITORS,
        lambda: builders.service_monitor(spec),
        spec,
        naming.service_monitor(spec.name),
        log,
        emit,
    )
    aggregation = await _optional(
        ctx,
        spec.aggregation.enabled,
        kube.SPARKAPPS,
        lambda: builders.scheduled_spark_application(spec),
        spec,
        naming.spark_app(spec.name),
        log,
        emit,
    )
    sts_after = await ctx.kube.get(kube.STATEFULSETS, spec.namespace, spec.name)
    peers = await _observe_replicas(ctx, spec, decision.target, token)
    return dataclasses.replace(
        obs,
        token_error=token_error,
        immutable_error=immutable_error,
        not_implemented=spec.not_implemented,
        statefulset=sts_after,
        decision=decision,
        peers=peers,
        monitoring=monitoring,
        aggregation=aggregation,
        config_hash=config_hash,
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
    deleted: list[str] = []
    async with ctx.lock(namespace, name):
        targets: list[tuple[kube.Resource, str]] = [
            (kube.STATEFULSETS, naming.statefulset(name)),
            (kube.SERVICES, naming.client_service(name)),
            (kube.SERVICES, naming.peer_service(name)),
            (kube.CONFIGMAPS, naming.configmap(name)),
            (kube.PDBS, naming.pdb(name)),
        ]
        if not token_ref:  # never delete a Secret the user owns
            targets.append((kube.SECRETS, naming.token_secret(name)))
        for optional, child in (
            (kube.SERVICEMONITORS, naming.service_monitor(name)),
            (kube.SPARKAPPS, naming.spark_app(name)),
        ):
            if await ctx.kube.has_resource(optional, ttl=0):
                targets.append((optional, child))
        for resource, child in targets:
            if await ctx.kube.delete(resource, namespace, child):
                deleted.append(f"{resource.kind}/{child}")
                metrics.CHILD_WRITES.labels(resource.kind, Operation.DELETED).inc()
        if when_deleted == "Delete":
            claims = await ctx.kube.list(
                kube.PVCS, namespace, label_selector=naming.selector_string(name)
            )
            for claim in claims:
                if await ctx.kube.delete(kube.PVCS, namespace, claim["metadata"]["name"]):
                    deleted.append(f"PersistentVolumeClaim/{claim['metadata']['name']}")
    ctx.locks.pop((namespace, name), None)
    log.info("deleted children: %s", ", ".join(deleted) or "none left")
    return deleted
