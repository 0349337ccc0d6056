"""Kopf wiring: every cause (create, update, resume, timer, a referenced Secret's change)
runs the same reconciliation.

Handlers are registered into a given registry so that the CLI runs with its own
registry and options, and ``kopf run -m eventfleet_operator.kopf_module`` uses Kopf's
default registry with options from the environment.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from eventfleet_operator import (
    GROUP,
    PLURAL,
    VERSION,
    backups,
    followup,
    kube,
    metrics,
    model,
    naming,
    secretrefs,
)
from eventfleet_operator.config import OperatorConfig
from eventfleet_operator.constants import ConditionType, EventType, Operation, PassResult, Reason
from eventfleet_operator.reconcile import Context, TransientRefusal, reconcile
from eventfleet_operator.reconcilers import backup
from eventfleet_operator.reconcilers.deletion import cleanup
from eventfleet_operator.replicas import Endpoints, ReplicaClient
from eventfleet_operator.status import find_condition

# Seconds before a pass refused for a transient reason is retried (see run_pass).
TRANSIENT_RETRY_SECONDS = 2
# While the last status waits for what the operator does not watch (followup.needed: pods
# of a rollout or a new fleet getting ready, replicas reloading tokens), the pass runs this
# often (at most every resync): each rollout step, Ready, TokensLoaded and each step of a
# peer-token rotation then follow within seconds instead of at the next resync.
FOLLOW_UP_SECONDS = 3.0
# How often Kopf checks whether a timer stopped after its EventServer was deleted.
TIMER_EXIT_POLL_SECONDS = 1.0


def configure_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Kopf state lives in our own annotations/finalizer; only explicit Events are posted."""
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.reporting_component = naming.MANAGER
    settings.posting.loggers = False  # Events come from emit(), not from every log line
    settings.networking.request_timeout = config.api_timeout
    # Re-list now and then even if a watch silently stalls (proxies, LB idle timeouts).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # An EventServer deleted while one of its timers runs a pass (the follow-up timer
    # runs every few seconds while a fleet starts) keeps its finalizer until Kopf sees
    # that timer gone, and Kopf looks again only every `cancellation_polling` seconds
    # (60 by default): `kubectl delete` then took 61 s instead of ~10. A pass takes
    # seconds, so a look every second ends the wait soon after it.
    settings.background.cancellation_polling = TIMER_EXIT_POLL_SECONDS


class QuietResync(logging.Filter):
    """Drop Kopf's "Timer 'resync' succeeded." line: one per fleet per resync is noise;
    so are the same line of the follow-up timer (every few seconds while pods start or
    tokens reload), "Handler 'secret-changed' succeeded." (one per change of any Secret in
    the watched namespaces, most of them no fleet's) and "Handler 'requests-changed'
    succeeded." (one per event of an EventServer, status writes included).

    Failures and everything the pass itself logs still get through.
    """

    QUIET = frozenset(
        {
            "Timer 'resync' succeeded.",
            "Timer 'follow-up' succeeded.",
            "Handler 'secret-changed' succeeded.",
            "Handler 'requests-changed' succeeded.",
        }
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage() in self.QUIET)


async def run_pass(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger) -> None:
    """One reconciliation pass of an EventServer (every cause: create, update, resume,
    timer, a referenced Secret's change), its status remembered and counted in the
    metrics. Passes of one fleet run one after the other.

    A transient refusal by the API server (:class:`TransientRefusal`) becomes a
    ``kopf.TemporaryError`` retried after ``TRANSIENT_RETRY_SECONDS``, not at the next
    resync (30 s by default): the first pass after installing the chart met one.
    """
    raw: dict[str, Any] = copy.deepcopy(dict(body))
    uid = raw["metadata"].get("uid", "")
    # One pass of a fleet at a time, each starting from the status the last one wrote:
    # several causes (an update, the timers, a Secret's change) can ask at once, and a
    # pass waiting for another must not decide from the status before it (a peer-token
    # rotation step would then be taken twice).
    async with _pass_lock(memo, uid):
        # The watch may not have delivered our last status write yet (short resync
        # intervals): prefer what this process wrote last for this very object.
        if uid in memo.last_status:
            raw["status"] = memo.last_status[uid]
        await _run_pass(raw, body, memo, logger)


def _pass_lock(memo: kopf.Memo, uid: str) -> asyncio.Lock:
    locks = memo.setdefault("pass_locks", {})  # set at startup; a bare Memo in tests
    return locks.setdefault(uid, asyncio.Lock())


async def _run_pass(
    raw: dict[str, Any], body: kopf.Body, memo: kopf.Memo, logger: logging.Logger
) -> None:
    uid = raw["metadata"].get("uid", "")

    def emit(type_: EventType, reason: str, message: str) -> None:
        kopf.event(body, type=str(type_), reason=str(reason), message=message[:1024])

    started = time.monotonic()
    result = PassResult.ERROR
    try:
        try:
            status = await reconcile(memo.ctx, raw, logger, emit)
        except TransientRefusal as e:
            memo.last_status[uid] = e.status
            result = PassResult.APPLY_FAILED
            raise kopf.TemporaryError(
                f"{e} (transient; retrying in {TRANSIENT_RETRY_SECONDS} s)",
                delay=TRANSIENT_RETRY_SECONDS,
            ) from e
        reason = find_condition(status["conditions"], ConditionType.READY).get("reason", "")
        result = {
            Reason.INVALID_SPEC: PassResult.INVALID_SPEC,
            Reason.APPLY_FAILED: PassResult.APPLY_FAILED,
        }.get(reason, PassResult.OK)
        memo.last_status[uid] = status
        meta = raw["metadata"]
        desired = (raw.get("spec") or {}).get("replicas") or 0
        metrics.observe_status(meta["namespace"], meta["name"], int(desired), status)
    finally:
        metrics.RECONCILES.labels(result).inc()
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


async def secret_changed(
    event_type: str | None,
    namespace: str,
    name: str,
    index: Mapping[secretrefs.Key, Any],
    memo: kopf.Memo,
    settings: kopf.OperatorSettings,
) -> list[str]:
    """A watched Secret's event: run the pass of every EventServer whose pass reads it
    (``index``: the ``secret_refs`` index); returns their names.

    The initial listing (``event_type`` None) is skipped: the resume handlers run every
    fleet's pass then. A pass that fails is logged, not retried: the timers retry it.
    """
    if event_type not in ("ADDED", "MODIFIED", "DELETED"):
        return []
    ran = []
    for fleet in secretrefs.fleets_for(index, namespace, name):
        live = await memo.ctx.kube.get(kube.EVENTSERVERS, namespace, fleet)
        if live is None or live["metadata"].get("deletionTimestamp"):
            continue
        body = kopf.Body(live)
        logger = kopf.LocalObjectLogger(body=body, settings=settings)
        logger.info("Secret %s %s: reconciling", name, event_type.lower())
        try:
            await run_pass(body, memo, logger)
        except (kopf.TemporaryError, kube.ApiError) as e:
            logger.warning("pass after Secret %s changed: %s (the timer retries)", name, e)
        ran.append(fleet)
    return ran


async def requests_changed(
    event_type: str | None, body: kopf.Body, memo: kopf.Memo, logger: logging.Logger
) -> bool:
    """An EventServer's event: run its pass when a request annotation
    (``naming.REQUEST_ANNOTATIONS``: restart, flush, rotate-peer-token, pause) changed
    since the last event this process saw; returns whether it ran.

    Kopf reports no change for them (they share its annotations' prefix). ``memo`` is
    the object's own: the first event seen (the listing, a creation) only records them,
    the resume and create handlers run the pass then.
    """
    meta = body.get("metadata") or {}
    seen = naming.requests(meta)
    before = memo.get("request_annotations")
    memo["request_annotations"] = seen
    if before is None or before == seen or event_type not in ("ADDED", "MODIFIED"):
        return False
    if meta.get("deletionTimestamp"):
        return False
    changed = sorted({k for k, _ in set(seen) ^ set(before)})
    logger.info("annotations %s changed: reconciling", ", ".join(changed))
    try:
        await run_pass(body, memo, logger)
    except (kopf.TemporaryError, kube.ApiError) as e:
        logger.warning("pass after annotations changed: %s (the timer retries)", e)
    return True


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Register the operator's handlers into ``registry``."""
    resource = dict(group=GROUP, version=VERSION, plural=PLURAL)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of Kopf's implicit login handlers: use the same
        # `kubernetes` loaders as our own client (in-cluster account, else KUBECONFIG).
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(
        settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any
    ) -> None:
        configure_settings(settings, config)
        quiet = logging.getLogger("kopf.objects")
        if not any(isinstance(f, QuietResync) for f in quiet.filters):
            quiet.addFilter(QuietResync())
        endpoints = Endpoints(config.replica_url_template, config.replica_urls_file)
        memo.ctx = Context(
            config=config,
            kube=kube.KubeClient(
                kube.load_credentials(),
                timeout=config.api_timeout,
                # Notice an optional CRD installed later within about one resync.
                discovery_ttl=min(60.0, max(1.0, config.resync_seconds)),
            ),
            replicas=ReplicaClient(
                status_timeout=config.status_timeout,
                flush_timeout=config.flush_timeout,
                tls_for=endpoints.tls_for,  # fleets with spec.tls: their CA and names
            ),
            endpoints=endpoints,
        )
        memo.last_status = {}
        # Here, in the operator's memo, which every object's memo shares: a Secret's
        # handler and the fleet's own handlers must find the same lock.
        memo.pass_locks = {}
        memo.settings = settings  # for the loggers of passes a Secret's event runs
        memo.metrics_runner = (
            await metrics.serve(config.metrics_endpoint) if config.metrics_endpoint else None
        )
        logger.info(
            "eventfleet operator starting: %s, resync every %ss",
            "all namespaces"
            if config.all_namespaces
            else "namespaces " + (", ".join(config.namespaces) or "as given to kopf run"),
            config.resync_seconds,
        )

    @kopf.on.cleanup(registry=registry)
    async def shutdown(memo: kopf.Memo, **_: Any) -> None:
        ctx = getattr(memo, "ctx", None)
        if ctx is not None:
            await ctx.close()
        runner = getattr(memo, "metrics_runner", None)
        if runner is not None:
            await runner.cleanup()

    @kopf.on.resume(**resource, registry=registry, id="reconcile-resume", backoff=5)
    @kopf.on.create(**resource, registry=registry, id="reconcile-create", backoff=5)
    @kopf.on.update(**resource, registry=registry, id="reconcile-update", backoff=5)
    async def on_change(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        await run_pass(body, memo, logger)

    @kopf.timer(
        **resource,
        registry=registry,
        id="resync",
        interval=config.resync_seconds,
        initial_delay=config.resync_seconds,
        errors=kopf.ErrorsMode.IGNORED,  # the next tick is the retry
    )
    async def on_timer(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        await run_pass(body, memo, logger)
        await backup_schedule(body, memo, logger)

    @kopf.on.event(**resource, registry=registry, id="requests-changed")
    async def on_requests(
        event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any
    ) -> None:
        await requests_changed(event.get("type"), body, memo, logger)

    # -- Referenced Secrets: a change runs the pass of every fleet that reads the Secret --
    # A token rotation is a Secret change the operator would otherwise only see at the
    # next resync; the index maps (namespace, Secret) to the EventServers whose pass reads
    # it (secretrefs.of_spec), kept by Kopf from the EventServer watch.
    @kopf.index(**resource, registry=registry, id="secret_refs")
    def secret_refs(body: kopf.Body, **_: Any) -> dict[secretrefs.Key, str]:
        return secretrefs.index_entries(body)

    @kopf.on.event("", "v1", "secrets", registry=registry, id="secret-changed")
    async def on_secret(
        event: kopf.RawEvent,
        name: str,
        namespace: str,
        memo: kopf.Memo,
        secret_refs: kopf.Index,
        **_: Any,
    ) -> None:
        # Kopf gives `settings` to activity handlers only: the startup's, kept in the memo.
        await secret_changed(event.get("type"), namespace, name, secret_refs, memo, memo.settings)

    # Only while the last status waits for pods or replicas (followup.needed): Kopf starts
    # and stops a timer as its filter starts and stops matching, and every status write
    # is a watch event. Its passes queue behind the others of the fleet (run_pass's lock).
    @kopf.timer(
        **resource,
        registry=registry,
        id="follow-up",
        interval=min(FOLLOW_UP_SECONDS, config.resync_seconds),
        initial_delay=min(FOLLOW_UP_SECONDS, config.resync_seconds),
        errors=kopf.ErrorsMode.IGNORED,  # the next tick is the retry
        when=lambda status, **_: followup.needed(status),
    )
    async def on_follow_up(
        body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any
    ) -> None:
        await run_pass(body, memo, logger)

    async def backup_schedule(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger) -> None:
        meta = body["metadata"]
        try:
            spec = model.parse(meta["name"], meta["namespace"], dict(body.get("spec") or {}))
        except model.SpecError:
            return  # the pass reported it
        if spec.backup is None:
            return

        def emit(type_: EventType, reason: str, message: str) -> None:
            kopf.event(body, type=str(type_), reason=reason, message=message[:1024])

        try:
            await backup.tick(memo.ctx, spec, meta.get("creationTimestamp", ""), logger, emit)
        except (kube.ApiError, OSError) as e:
            logger.warning("backup schedule of %s: %s (retried next tick)", meta["name"], e)

    # -- EventServerBackup: one backup, run until Completed or Failed --------------------
    backup_resource = dict(group=GROUP, version=VERSION, plural=backups.PLURAL)

    async def backup_step(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger) -> None:
        meta = body["metadata"]
        # The create handler and the retry timer must never both ask for a copy.
        async with memo.ctx.lock(meta["namespace"], f"backup/{meta['name']}"):
            live = await memo.ctx.kube.get(backups.RESOURCE, meta["namespace"], meta["name"])
            if live is None:
                return

            def emit(type_: EventType, reason: str, message: str) -> None:
                kopf.event(body, type=str(type_), reason=reason, message=message[:1024])

            if (live.get("status") or {}).get("phase") not in backups.DONE:
                running = {"phase": backups.RUNNING, "startedAt": backups.now_rfc3339()}
                await memo.ctx.kube.patch(
                    backups.RESOURCE,
                    meta["namespace"],
                    meta["name"],
                    {"status": running},
                    subresource="status",
                )
            status = await backup.run(memo.ctx, live, logger, emit)
            if status is not None:
                await memo.ctx.kube.patch(
                    backups.RESOURCE,
                    meta["namespace"],
                    meta["name"],
                    {"status": status},
                    subresource="status",
                )

    @kopf.on.resume(**backup_resource, registry=registry, id="backup-resume", backoff=10)
    @kopf.on.create(**backup_resource, registry=registry, id="backup-create", backoff=10)
    async def on_backup(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        await backup_step(body, memo, logger)

    @kopf.timer(
        **backup_resource,
        registry=registry,
        id="backup-retry",
        interval=config.resync_seconds,
        initial_delay=config.resync_seconds,
        errors=kopf.ErrorsMode.IGNORED,
        when=lambda status, **_: (status or {}).get("phase") == backups.PENDING,
    )
    async def on_backup_timer(
        body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any
    ) -> None:
        await backup_step(body, memo, logger)

    @kopf.on.delete(**resource, registry=registry, id="cleanup", backoff=5)
    async def on_delete(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        deleted = await cleanup(memo.ctx, copy.deepcopy(dict(body)), logger)
        memo.last_status.pop(body.get("metadata", {}).get("uid", ""), None)
        memo.get("pass_locks", {}).pop(body.get("metadata", {}).get("uid", ""), None)
        metrics.forget(body["metadata"]["namespace"], body["metadata"]["name"])
        if deleted:
            kopf.event(
                body,
                type=EventType.NORMAL.value,
                reason=Operation.DELETED.event_reason,
                message="deleted " + ", ".join(deleted)[:1000],
            )


def namespaces_of(config: OperatorConfig) -> Mapping[str, Any]:
    """kopf.run() arguments for the watched namespaces."""
    if config.all_namespaces:
        return {"clusterwide": True}
    return {"namespaces": list(config.namespaces)}
