"""Backup: one step of an ``EventServerBackup`` (:func:`run`) and the fleet's schedule
and pruning (:func:`tick`, on the fleet's resync timer).

The decisions (which replica, which slot, what to prune, the status of an answer) are
the pure :mod:`eventfleet_operator.backups`; this room reads the fleet, calls the
replicas' admin routes with the peer token and writes the objects.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from eventfleet_operator import certificates, kube, model, naming, tokens
from eventfleet_operator.backups import (
    BACKUP_TIMEOUT,
    COMPLETED,
    DONE,
    FAILED,
    MAX_ATTEMPTS,
    PENDING,
    RESOURCE,
    completed_status,
    due_slot,
    last_scheduled,
    manifest,
    now_rfc3339,
    parse_time,
    pick_replica,
    scheduled_name,
    to_prune,
)
from eventfleet_operator.constants import EventType
from eventfleet_operator.reconcilers.children import Context, Emit
from eventfleet_operator.replicas import ReplicaStatus, ReplicaUnreachable


async def fleet_token(ctx: Context, spec: model.FleetSpec) -> str | None:
    """The fleet's peer token (the first), as the replicas' admin routes want it (read
    only: the fleet's reconciliation creates the generated Secret). With ``spec.tls``
    the calls that follow go over HTTPS trusting the fleet's CA."""
    await certificates.trust_fleet(ctx.kube, ctx.endpoints, spec)
    ref = spec.peer_token_ref
    secret = await ctx.kube.get(kube.SECRETS, spec.namespace, ref.secret_name)
    return next(iter(tokens.decode(secret, ref.key) or ()), None)


async def statuses(
    ctx: Context, spec: model.FleetSpec, token: str | None
) -> list[tuple[int, ReplicaStatus | None]]:
    """Each replica's /status (None: it did not answer), for :func:`pick_replica`."""
    out: list[tuple[int, ReplicaStatus | None]] = []
    for ordinal in range(spec.replicas):
        url = ctx.endpoints.url(spec.namespace, spec.name, ordinal, spec.ports.http)
        try:
            out.append((ordinal, await ctx.replicas.status(url, token)))
        except ReplicaUnreachable:
            out.append((ordinal, None))
    return out


async def run(
    ctx: Context, body: Mapping[str, Any], log: logging.Logger, emit: Emit
) -> dict[str, Any] | None:
    """One step of an EventServerBackup: the status to write, or None when it is done.

    Raises nothing for a problem of the fleet: the status says it (``Pending`` retried
    until `MAX_ATTEMPTS`, then ``Failed``).
    """
    status = dict(body.get("status") or {})
    if status.get("phase") in DONE:
        return None
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    fleet = (body.get("spec") or {}).get("eventServer", "")
    attempts = int(status.get("attempts") or 0) + 1

    def fail(error: str) -> dict[str, Any]:
        emit(EventType.WARNING, "BackupFailed", error)
        log.error("backup %s/%s failed: %s", namespace, name, error)
        return {"phase": FAILED, "error": error, "finishedAt": now_rfc3339(), "attempts": attempts}

    def pending(error: str) -> dict[str, Any]:
        if attempts >= MAX_ATTEMPTS:
            return fail(f"gave up after {attempts} attempts: {error}")
        log.info("backup %s/%s pending: %s", namespace, name, error)
        return {"phase": PENDING, "error": error, "attempts": attempts}

    live = await ctx.kube.get(kube.EVENTSERVERS, namespace, fleet)
    if live is None:
        return fail(f"EventServer {fleet!r} not found in namespace {namespace}")
    try:
        spec = model.parse(fleet, namespace, live.get("spec"), uid=live["metadata"].get("uid", ""))
    except model.SpecError as e:
        return pending(f"EventServer {fleet!r} has an invalid spec: {e}")
    if spec.backup is None:
        return fail(f"EventServer {fleet!r} has no spec.backup (the S3 target)")
    token = await fleet_token(ctx, spec)
    ordinal, why = pick_replica(await statuses(ctx, spec, token))
    if ordinal is None:
        return pending(why)
    pod = naming.pod(fleet, ordinal)
    url = ctx.endpoints.url(namespace, fleet, ordinal, spec.ports.http)
    log.info("backup %s/%s: copying replica %s", namespace, name, pod)
    try:
        answer = await ctx.replicas.backup(url, name, token, timeout=BACKUP_TIMEOUT)
    except ReplicaUnreachable as e:
        # A 409 (a peer fell behind meanwhile) or 429 is worth another try; the rest is
        # reported as it is, the next tick tries again until MAX_ATTEMPTS.
        return pending(f"replica {pod}: {e}")
    new = completed_status(answer, pod, attempts)
    emit(
        EventType.NORMAL,
        "BackupCompleted",
        f"{pod}: {new['digest']['events']} events, {new['digest']['size']} bytes to "
        f"s3://{new['bucket']}/{new['objectKey']} (sha256 {new['digest']['sha256']})",
    )
    return new


async def tick(
    ctx: Context, spec: model.FleetSpec, created: str, log: logging.Logger, emit: Emit
) -> None:
    """The fleet's backup schedule and pruning; called from its resync pass."""
    if spec.backup is None:
        return
    selector = f"{naming.BACKUP_FLEET_LABEL}={spec.name}"
    backups = await ctx.kube.list(RESOURCE, spec.namespace, label_selector=selector)
    if spec.backup.schedule and not spec.backup.suspend:
        now = datetime.datetime.now(datetime.UTC)
        since = last_scheduled(backups) or parse_time(created) or now
        slot = due_slot(spec.backup.schedule, since, now)
        if slot is not None:
            name = scheduled_name(spec.name, slot, spec.backup.schedule)
            try:
                await ctx.kube.create(manifest(spec.name, spec.namespace, name, scheduled=True))
                emit(EventType.NORMAL, "BackupScheduled", f"created EventServerBackup {name}")
            except kube.ApiError as e:
                if e.status != 409:  # 409: this slot's object exists already
                    raise
    doomed = to_prune(backups, spec.backup.retention)
    if not doomed:
        return
    token = await fleet_token(ctx, spec)
    ordinal, why = pick_replica(await statuses(ctx, spec, token))
    for backup in doomed:
        name = backup["metadata"]["name"]
        if (backup.get("status") or {}).get("phase") == COMPLETED:
            if ordinal is None:
                log.info("pruning of %s waits: %s", name, why)
                return
            url = ctx.endpoints.url(spec.namespace, spec.name, ordinal, spec.ports.http)
            try:
                await ctx.replicas.delete_backup(url, name, token)
            except ReplicaUnreachable as e:
                log.warning("pruning of %s waits: the object was not deleted: %s", name, e)
                return
        await ctx.kube.delete(RESOURCE, spec.namespace, name, uid=backup["metadata"].get("uid"))
        emit(EventType.NORMAL, "BackupPruned", f"deleted EventServerBackup {name} and its object")
