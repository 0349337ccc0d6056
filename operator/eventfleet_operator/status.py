"""The ``EventServer`` status: pure functions from observations to the status object.

Conditions (``kubectl wait --for=condition=Ready eventserver/NAME`` works):

* ``Ready`` - spec valid, children applied, the StatefulSet at ``spec.replicas`` and
  that many replicas ready.
* ``PeersSynced`` - every replica reports every other replica's link as synced.
* ``ScaleDownHeld`` - True while a scale-down waits for events to be replicated.
* ``AggregationScheduled`` - the ScheduledSparkApplication exists.
* ``MonitoringConfigured`` - the ServiceMonitor exists.

``phase`` is for display only: Pending, Running, Scaling, Degraded or Failed.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from eventfleet_operator import naming
from eventfleet_operator.constants import (
    ConditionStatus,
    ConditionType,
    Phase,
    Reason,
)
from eventfleet_operator.replicas import ReplicaStatus
from eventfleet_operator.rollout import Plan, kubelet_ready
from eventfleet_operator.scaling import Decision

IN_SYNC_STATES = ("synced", "connected")


@dataclasses.dataclass(frozen=True)
class OptionalChild:
    """An optional child: wanted by the spec? its CRD installed? applied?"""

    enabled: bool
    available: bool = True
    applied: bool = False
    error: str = ""
    note: str = ""  # added to the condition's message once applied (a caveat of the spec)
    report: Mapping[str, Any] | None = None  # its status entry, from the child read this pass


# spark-operator's ScheduledSparkApplication status -> status.aggregation (same names,
# except scheduleState, which is the entry's state).
_SPARK_STATUS_FIELDS = (
    ("lastRun", "lastRun"),
    ("lastRunName", "lastRunName"),
    ("nextRun", "nextRun"),
    ("scheduleState", "state"),
    ("reason", "reason"),
    ("pastSuccessfulRunNames", "pastSuccessfulRunNames"),
    ("pastFailedRunNames", "pastFailedRunNames"),
)


def aggregation_report(live: Mapping[str, Any] | None, output: str) -> dict[str, Any]:
    """``status.aggregation`` from the ScheduledSparkApplication as read in this pass.

    Only what spark-operator wrote is reported (nothing before its first pass over the
    object), plus the output the runs write to.
    """
    observed = (live or {}).get("status") or {}
    report: dict[str, Any] = {"output": output}
    for theirs, ours in _SPARK_STATUS_FIELDS:
        value = observed.get(theirs)
        if value not in (None, "", []):
            report[ours] = list(value) if isinstance(value, list) else str(value)
    return report


# The job's --result-file object (spark/eventfleet_spark/job.py run_result): its keys
# and the types status.aggregation.lastResult keeps of them.
_RESULT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "result": str,
    "window": list,
    "windows": int,
    "events": int,
    "aggregates": int,
    "parquetRows": int,
    "registered": int,
    "seconds": (int, float),
    "error": str,
}


def _terminated_driver(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``terminated`` state of the pod's driver container, if it has ended."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return terminated
    return None


def aggregation_result(driver_pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``status.aggregation.lastResult``: the outcome of the last finished run, from its
    driver pod's termination message (the job's ``--result-file``).

    The run is the driver that finished last (a run still going is not the last result).
    A message that is not the job's JSON (the driver died before writing it) still gives
    the run, its end and ``Failed`` or ``Succeeded`` from the exit code.
    """
    ended = [(p, t) for p in driver_pods if (t := _terminated_driver(p)) is not None]
    if not ended:
        return None
    pod, terminated = max(ended, key=lambda pt: str(pt[1].get("finishedAt") or ""))
    labels = (pod.get("metadata") or {}).get("labels") or {}
    exit_code = terminated.get("exitCode")
    result: dict[str, Any] = {
        "run": labels.get(naming.SPARK_APP_NAME_LABEL) or pod["metadata"].get("name"),
        "result": "Succeeded" if exit_code == 0 else "Failed",
    }
    if terminated.get("finishedAt"):
        result["finishedAt"] = str(terminated["finishedAt"])
    if exit_code is not None:
        result["exitCode"] = int(exit_code)
    try:
        message = json.loads(terminated.get("message") or "")
    except ValueError:
        message = None
    if isinstance(message, dict):
        for key, kind in _RESULT_FIELDS.items():
            value = message.get(key)
            if isinstance(value, kind) and not isinstance(value, bool):
                result[key] = [str(v) for v in value] if key == "window" else value
    return result


@dataclasses.dataclass(frozen=True)
class PodCounts:
    """The fleet's replica pods as listed in this pass (not the StatefulSet's summary,
    which lags: its ``readyReplicas`` still counts pods that are shutting down, and is of
    an older generation right after a scale)."""

    present: int  # pods of any ordinal that still exist, terminating ones included
    ready: int  # ordinals below the wanted count: not terminating, condition Ready True

    @classmethod
    def of(cls, pods: Mapping[int, Mapping[str, Any]], replicas: int) -> PodCounts:
        ready = sum(
            1
            for ordinal, pod in pods.items()
            if ordinal < replicas
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and kubelet_ready(pod)
        )
        return cls(present=len(pods), ready=ready)


def _statefulset_lag(sts: Mapping[str, Any] | None) -> str:
    """Why the StatefulSet's status does not describe its spec yet ("" when it does)."""
    if not sts:
        return ""
    generation = (sts.get("metadata") or {}).get("generation")
    observed = (sts.get("status") or {}).get("observedGeneration")
    if generation is None or (observed is not None and int(observed) >= int(generation)):
        return ""
    return (
        f"the StatefulSet controller has not yet acted on generation {generation} "
        f"(its status is of generation {observed if observed is not None else 'none'})"
    )


@dataclasses.dataclass(frozen=True)
class PeerReport:
    ordinal: int
    name: str
    server_id: int
    status: ReplicaStatus | None = None
    error: str = ""


@dataclasses.dataclass(frozen=True)
class StorageReport:
    """What the volumes room learned (``reconcilers/volumes.py``)."""

    resize: Verdict | None = None  # StorageResizing; None: keep the last
    immutable_error: str = ""  # a refused change of an immutable field (Ready=False)


@dataclasses.dataclass(frozen=True)
class TokensReport:
    """What the tokens room learned (``reconcilers/tokens.py``)."""

    loaded: Verdict | None = None  # TokensLoaded (tokens.verdict); None: keep the last
    digest: str = ""  # of the token Secrets' fingerprints (a change is an Event)
    error: str = ""  # a referenced Secret or key that is missing (Ready=False)
    rotation: Mapping[str, Any] | None = None  # eventfleet.io/rotate-peer-token


@dataclasses.dataclass(frozen=True)
class TlsReport:
    """What the tls room learned (``reconcilers/tls.py``)."""

    verdict: Verdict | None = None  # CertificateReady; None: not observed, keep the last
    status: Mapping[str, Any] | None = None  # status.tls (None: spec.tls off)


@dataclasses.dataclass(frozen=True)
class Observation:
    """Everything one reconciliation pass learned."""

    name: str
    generation: int
    desired: int
    selector: str
    spec_error: tuple[str, str] | None = None  # (field, message)
    schema_error: str = ""  # a pod refuses a store of a newer storage schema (schema.py)
    schema_version: int | None = None  # the highest storage schema version seen
    not_implemented: tuple[str, ...] = ()  # spec fields enabling unimplemented protocols
    apply_error: str = ""
    ownership_error: str = ""  # children's names taken by objects this EventServer does not own
    statefulset: Mapping[str, Any] | None = None
    decision: Decision = dataclasses.field(default_factory=lambda: Decision(target=0))
    peers: Sequence[PeerReport] = ()
    monitoring: OptionalChild = OptionalChild(enabled=False)
    aggregation: OptionalChild = OptionalChild(enabled=False)
    config_hash: str = ""
    rollout: Plan | None = None  # revisions of the pods and the rollout's next step
    last_flush: Mapping[str, Any] | None = None  # the answer to eventfleet.io/flush
    paused: bool = False  # eventfleet.io/reconcile: paused -- observed, nothing written
    hibernate: bool = False  # spec.hibernate
    pods: PodCounts | None = None  # the pods listed in this pass (None: not listed)
    # The feature rooms' own reports (reconcilers/volumes.py, tokens.py, tls.py).
    storage: StorageReport = StorageReport()
    tokens: TokensReport = TokensReport()
    tls: TlsReport = TlsReport()
    # status.busCurve: the Event BUS CURVE key pair Secret and its public key (None:
    # CURVE off, or not read this pass).
    bus_curve: Mapping[str, Any] | None = None


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# (status, reason, message) of one condition, before it gets its transition time.
Verdict = tuple[ConditionStatus, Reason, str]


def condition(
    type_: ConditionType,
    status: ConditionStatus,
    reason: Reason,
    message: str,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    now: str,
) -> dict[str, Any]:
    """A condition that keeps its lastTransitionTime while its status does not change."""
    old = find_condition(previous, type_)
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    return {
        # Plain strings: the status is also YAML-dumped, which refuses str subclasses.
        "type": str(type_),
        "status": str(status),
        "reason": str(reason),
        "message": message,
        "lastTransitionTime": since or now,
        "observedGeneration": generation,
    }


def peer_entry(report: PeerReport, expected: Sequence[int]) -> dict[str, Any]:
    """One ``status.peers[]`` item: the replica's own view and its worst Syncer link."""
    entry: dict[str, Any] = {"name": report.name, "serverId": report.server_id}
    st = report.status
    if st is None:
        entry.update(reachable=False, ready=False, syncState="unknown", message=report.error[:300])
        return entry
    links = {p.server_id: p for p in st.peers}
    missing = [sid for sid in expected if sid != report.server_id and sid not in links]
    relevant = [links[sid] for sid in expected if sid in links and sid != report.server_id]
    if missing or any(p.state == "disconnected" for p in relevant):
        sync = "disconnected"
    elif any(p.state not in IN_SYNC_STATES or p.lag_events > 0 for p in relevant):
        sync = "syncing"
    else:
        sync = "synced"
    own = st.own_last_id()
    entry.update(
        reachable=True,
        ready=st.ready,
        status=st.status,
        syncState=sync,
        lastEventId=own.as_dict() if own else None,
        lagEvents=max((p.lag_events for p in relevant), default=0),
        lagSeconds=max((p.lag_seconds for p in relevant), default=0.0),
    )
    if st.events is not None:
        entry["events"] = int(st.events)
    if missing:
        entry["message"] = "no link to server ids " + ", ".join(map(str, missing))
    return entry


T, F, U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


def _peers_condition(entries: Sequence[Mapping[str, Any]]) -> Verdict:
    if not entries:
        return U, Reason.NO_REPLICAS, "no replica is running"
    unreachable = [e["name"] for e in entries if not e.get("reachable")]
    if unreachable:
        return U, Reason.STATUS_UNAVAILABLE, "cannot read /status of " + ", ".join(unreachable)
    behind = [f"{e['name']} ({e['syncState']})" for e in entries if e.get("syncState") != "synced"]
    if behind:
        return F, Reason.PEERS_SYNCING, "not in sync: " + ", ".join(behind)
    return T, Reason.ALL_PEERS_SYNCED, f"all {len(entries)} replicas are in sync with each other"


def _optional_condition(
    kind: str, opt: OptionalChild, missing_reason: Reason, missing_what: str
) -> Verdict:
    if not opt.enabled:
        return F, Reason.DISABLED, f"{kind} is disabled in the spec"
    if not opt.available:
        return F, missing_reason, f"{missing_what} is not installed: no {kind} can be created"
    if opt.error:
        return F, Reason.APPLY_FAILED, opt.error[:300]
    return (
        (T, Reason.APPLIED, f"{kind} is in place{'; ' + opt.note if opt.note else ''}")
        if opt.applied
        else (F, Reason.PENDING, f"{kind} not yet applied")
    )


def _ready_verdict(
    obs: Observation, sts_replicas: Any, sts_lag: str, ready: int, hibernated: bool
) -> Verdict:
    """``Ready``: the first problem found is the reason, the most fundamental first."""
    if obs.spec_error:
        field, message = obs.spec_error
        return (F, Reason.INVALID_SPEC, f"{field}: {message}")
    elif obs.ownership_error:
        return (F, Reason.CHILD_NOT_OWNED, obs.ownership_error[:500])
    elif obs.apply_error:
        return (F, Reason.APPLY_FAILED, obs.apply_error[:300])
    elif obs.tokens.error:
        return (F, Reason.TOKEN_SECRET_NOT_FOUND, obs.tokens.error)
    elif obs.schema_error:
        return (F, Reason.STORAGE_SCHEMA_TOO_NEW, obs.schema_error[:500])
    elif obs.storage.immutable_error:
        return (F, Reason.IMMUTABLE_FIELD_CHANGED, obs.storage.immutable_error[:500])
    elif obs.not_implemented:
        return (
            F,
            Reason.PROTOCOL_NOT_IMPLEMENTED,
            f"{', '.join(obs.not_implemented)}: this protocol is not implemented in this "
            "version; it is not served and its ports are not exposed (set it to false)",
        )
    elif obs.hibernate:
        return (
            (
                F,
                Reason.HIBERNATED,
                f"hibernated: no replica runs, the {obs.desired} volumes are kept",
            )
            if hibernated
            else (F, Reason.HIBERNATING, obs.decision.message or "scaling to 0")
        )
    elif obs.decision.held:
        return (F, Reason.SCALE_DOWN_HELD, obs.decision.message)
    elif sts_replicas != obs.desired:
        return (
            F,
            Reason.SCALING,
            f"StatefulSet at {sts_replicas} replicas, want {obs.desired}",
        )
    elif obs.rollout is not None and not obs.rollout.complete:
        return (F, Reason.ROLLOUT_IN_PROGRESS, _rollout_message(obs.rollout))
    elif sts_lag:
        return (F, Reason.STATEFULSET_STATUS_STALE, sts_lag)
    elif ready < obs.desired:
        return (F, Reason.REPLICAS_NOT_READY, f"{ready} of {obs.desired} replicas ready")
    else:
        return (T, Reason.ALL_REPLICAS_READY, f"{ready} of {obs.desired} replicas ready")


def _peers_verdict(obs: Observation, entries: Sequence[Mapping[str, Any]]) -> Verdict:
    """``PeersSynced``: every replica reachable and in sync with the others."""
    if obs.spec_error:
        return U, Reason.INVALID_SPEC, "the spec is invalid"
    return _peers_condition(entries)


def _scale_down_verdict(obs: Observation, prev_conditions: Sequence[Mapping[str, Any]]) -> Verdict:
    """``ScaleDownHeld``: what a held scale-down waits for, or how the last one ended."""
    held_c: Verdict = (
        (T, obs.decision.reason, obs.decision.message)
        if obs.decision.held
        else (F, obs.decision.reason, obs.decision.message or "no scale-down is waiting")
    )
    last_held = find_condition(prev_conditions, ConditionType.SCALE_DOWN_HELD)
    if (
        obs.decision.reason is Reason.NOT_SCALING_DOWN
        and last_held.get("status") == F
        and last_held.get("reason") in (Reason.SCALE_DOWN_VERIFIED, Reason.SCALE_DOWN_FORCED)
    ):
        # Keep saying how the last scale-down ended until the next one starts (a pass
        # later the fleet is no longer scaling down; the outcome is still the news).
        return F, Reason(last_held["reason"]), str(last_held.get("message") or "")
    return held_c


def _paused_verdict(obs: Observation) -> Verdict:
    """``ReconcilePaused``: ``eventfleet.io/reconcile: paused`` (only the status is written)."""
    return (
        (
            T,
            Reason.PAUSED,
            f"{naming.PAUSE_ANNOTATION}: {naming.PAUSED} -- only the status is updated",
        )
        if obs.paused
        else (F, Reason.NOT_PAUSED, "reconciling")
    )


def _hibernated_verdict(obs: Observation, hibernated: bool) -> Verdict:
    """``Hibernated``: ``spec.hibernate`` and no replica pod left."""
    if not obs.hibernate:
        return (F, Reason.NOT_HIBERNATING, "spec.hibernate is false")
    elif hibernated:
        return (T, Reason.HIBERNATED, "no replica runs; the volume claims are kept")
    else:
        return (F, Reason.HIBERNATING, obs.decision.message or "scaling to 0")


def _progressing_verdict(obs: Observation) -> Verdict:
    """``Progressing``: a rollout under way, or the revision every replica runs."""
    if obs.rollout is None or obs.rollout.complete:
        rev = obs.rollout.update_revision if obs.rollout else ""
        return (
            F,
            Reason.ROLLOUT_COMPLETE,
            f"every replica runs revision {rev}" if rev else "no rollout",
        )
    else:
        return (T, Reason.ROLLING_OUT, _rollout_message(obs.rollout))


def _feature_fields(obs: Observation, previous: Mapping[str, Any]) -> dict[str, Any]:
    """The features' own status fields; each keeps its last value while not observed."""
    status: dict[str, Any] = {}
    if obs.config_hash:
        status["configHash"] = obs.config_hash
    schema_version = obs.schema_version or previous.get("storageSchemaVersion")
    if schema_version:
        status["storageSchemaVersion"] = int(schema_version)
    rotation = obs.tokens.rotation or previous.get("peerTokenRotation")
    if rotation:
        status["peerTokenRotation"] = dict(rotation)
    digest = obs.tokens.digest or previous.get("tokensDigest")
    if digest:
        status["tokensDigest"] = digest
    if obs.tls.verdict is not None:
        if obs.tls.status:
            status["tls"] = dict(obs.tls.status)
    elif previous.get("tls"):
        status["tls"] = dict(previous["tls"])
    if obs.bus_curve:
        status["busCurve"] = dict(obs.bus_curve)
    elif (obs.apply_error or obs.ownership_error) and previous.get("busCurve"):
        status["busCurve"] = dict(previous["busCurve"])  # not reached this pass: keep
    if obs.aggregation.enabled:
        if obs.aggregation.report is not None:
            status["aggregation"] = dict(obs.aggregation.report)
        elif obs.aggregation.error and previous.get("aggregation"):
            # Not read this pass (the apply failed): keep the last report.
            status["aggregation"] = dict(previous["aggregation"])
    last_flush = obs.last_flush if obs.last_flush is not None else previous.get("lastFlush")
    if last_flush:
        status["lastFlush"] = dict(last_flush)
    if obs.rollout is not None and obs.rollout.update_revision:
        status["currentRevision"] = obs.rollout.current_revision
        status["updateRevision"] = obs.rollout.update_revision
        status["updatedReplicas"] = obs.rollout.updated
    return status


def build(
    obs: Observation, previous: Mapping[str, Any] | None, now: str | None = None
) -> dict[str, Any]:
    """The complete ``status`` for one pass (previous status keeps transition times)."""
    previous = previous or {}
    prev_conditions = previous.get("conditions") or []
    now = now or now_iso()
    sts_spec = (obs.statefulset or {}).get("spec") or {}
    sts_status = (obs.statefulset or {}).get("status") or {}
    sts_replicas = sts_spec.get("replicas")
    replicas = int(sts_status.get("replicas") or 0)
    ready = int(sts_status.get("readyReplicas") or 0)
    sts_lag = _statefulset_lag(obs.statefulset)
    if obs.pods is not None:
        # Only pods seen ready in this pass count: never one that is shutting down.
        ready = min(ready, obs.pods.ready)
    # Hibernated once no replica pod is left, not when the StatefulSet is told 0.
    hibernated = sts_replicas == 0 and not sts_lag and not (obs.pods and obs.pods.present)

    entries = [peer_entry(p, [q.server_id for q in obs.peers]) for p in obs.peers]

    ready_c = _ready_verdict(obs, sts_replicas, sts_lag, ready, hibernated)
    # One verdict per feature, in the order the conditions are listed.
    verdicts: list[tuple[ConditionType, Verdict]] = [
        (ConditionType.READY, ready_c),
        (ConditionType.PEERS_SYNCED, _peers_verdict(obs, entries)),
        (ConditionType.SCALE_DOWN_HELD, _scale_down_verdict(obs, prev_conditions)),
        (
            ConditionType.AGGREGATION_SCHEDULED,
            _optional_condition(
                "ScheduledSparkApplication",
                obs.aggregation,
                Reason.SPARK_OPERATOR_NOT_INSTALLED,
                "spark-operator (sparkoperator.k8s.io/v1beta2)",
            ),
        ),
        (
            ConditionType.MONITORING_CONFIGURED,
            _optional_condition(
                "ServiceMonitor",
                obs.monitoring,
                Reason.PROMETHEUS_OPERATOR_NOT_INSTALLED,
                "prometheus-operator (monitoring.coreos.com/v1)",
            ),
        ),
        (ConditionType.RECONCILE_PAUSED, _paused_verdict(obs)),
        (ConditionType.HIBERNATED, _hibernated_verdict(obs, hibernated)),
        (ConditionType.PROGRESSING, _progressing_verdict(obs)),
        (ConditionType.STORAGE_RESIZING, obs.storage.resize or _kept_resize(prev_conditions)),
        (
            ConditionType.TOKENS_LOADED,
            obs.tokens.loaded
            or _kept(prev_conditions, ConditionType.TOKENS_LOADED, Reason.TOKENS_UNKNOWN),
        ),
        (
            ConditionType.CERTIFICATE_READY,
            obs.tls.verdict
            or _kept(prev_conditions, ConditionType.CERTIFICATE_READY, Reason.CERTIFICATE_PENDING),
        ),
    ]
    conditions = [condition(t, *c, obs.generation, prev_conditions, now) for t, c in verdicts]

    if obs.spec_error or obs.ownership_error:
        phase = Phase.FAILED
    elif obs.hibernate and hibernated:
        phase = Phase.HIBERNATED
    elif ready_c[0] is T:
        phase = Phase.RUNNING
    elif sts_replicas is not None and sts_replicas != obs.desired:
        phase = Phase.SCALING
    elif ready > 0:
        phase = Phase.DEGRADED
    else:
        phase = Phase.PENDING

    initialized = bool(previous.get("initialized")) or (ready_c[0] is T)
    status: dict[str, Any] = {
        "observedGeneration": obs.generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "statefulSetReplicas": int(sts_replicas or 0),
        "selector": obs.selector,
        "phase": str(phase),
        "initialized": initialized,
        "conditions": conditions,
        "peers": entries,
    }
    status.update(_feature_fields(obs, previous))
    return status


def find_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any]:
    """The condition ``type_`` among `conditions` ({} when absent)."""
    return next((c for c in conditions or () if c.get("type") == type_), {})


def condition_true(status: Mapping[str, Any] | None, type_: str) -> bool:
    """Is condition ``type_`` of a written `status` True?"""
    found = find_condition((status or {}).get("conditions"), type_)
    return found.get("status") == ConditionStatus.TRUE


def _kept(previous: Sequence[Mapping[str, Any]], type_: ConditionType, unknown: Reason) -> Verdict:
    """Not observed this pass (an invalid spec, a failed apply): keep the last verdict."""
    last = find_condition(previous, type_)
    if last.get("reason") in (r.value for r in Reason):
        return (
            ConditionStatus(last["status"]),
            Reason(last["reason"]),
            str(last.get("message") or ""),
        )
    return (U, unknown, "not checked yet")


def _kept_resize(previous: Sequence[Mapping[str, Any]]) -> Verdict:
    """No resize verdict this pass: keep that the last one finished (Resized) or is still
    going (Resizing: a pass that failed must not end it), else NotResizing."""
    last = find_condition(previous, ConditionType.STORAGE_RESIZING)
    kept = {
        (Reason.RESIZED.value, ConditionStatus.FALSE.value): F,
        (Reason.RESIZING.value, ConditionStatus.TRUE.value): T,
    }
    status = kept.get((str(last.get("reason")), str(last.get("status"))))
    if status is not None:
        return (status, Reason(last["reason"]), str(last.get("message") or ""))
    return (F, Reason.NOT_RESIZING, "no volume resize in progress")


def _rollout_message(plan: Plan) -> str:
    step = (
        f"replacing ordinal {plan.replace}"
        if plan.replace is not None
        else plan.waiting or "waiting for the next step"
    )
    # No pod left on the old revision (the rollout's tail): it is no longer known.
    origin = (
        f" (from {plan.current_revision})" if plan.current_revision != plan.update_revision else ""
    )
    return (
        f"{plan.updated} of {plan.replicas} replicas on revision {plan.update_revision}"
        f"{origin}; {step}"
    )


def transitions(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Conditions whose status or reason changed (each becomes a Kubernetes Event)."""
    before = {c.get("type"): c for c in (old or {}).get("conditions") or []}
    changed = []
    for c in new.get("conditions") or []:
        b = before.get(c["type"])
        if b is None or b.get("status") != c["status"] or b.get("reason") != c["reason"]:
            changed.append(c)
    return changed
