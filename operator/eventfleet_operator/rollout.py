"""Managed rollouts: which replica pod to replace next, and why (pure decisions).

With ``spec.updateStrategy.type: Managed`` (the default) the StatefulSet uses
``OnDelete``: Kubernetes never replaces a pod by itself, the operator does, one pod per
step, highest ordinal first:

1. a pod on an old revision that is **not ready** (crash loop, stuck on a bad image) is
   replaced at once: it serves nobody, and this is what un-sticks a rollout after a bad
   change is reverted (a StatefulSet ``RollingUpdate`` waits forever for such a pod,
   kubernetes/kubernetes#67250);
2. otherwise, only when every replica is ready and in sync, the highest-ordinal pod on
   an old revision is flushed to every other replica and verified (the scale-down check)
   and then deleted; the StatefulSet recreates it from the new template;
3. the next step waits until that pod is ready and every replica is in sync again.

The rollout is complete when every pod of ordinals ``0..replicas-1`` runs the update
revision **and is ready** (its replica, the kubelet and the StatefulSet's count: what
``Ready`` reads), not as soon as no pod is left on an old revision: otherwise
``Progressing=False`` would be written while the last replaced pod starts. Pods only
missing or not ready are a rollout's tail only while a rollout was under way (the last
pass wrote ``Progressing=True``): between the deletion of the last old pod and its
replacement's creation, nothing in the pods tells a replacement from a scale-up, and a
scale-up (or a pod that crashes later) is not a rollout.

Revisions are the operator's own: ``eventfleet.io/revision`` on the pod template is a
hash of the rest of the template, and every pod carries the annotation of the template
it was made from (on any StatefulSet strategy, on any cluster).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from eventfleet_operator import naming


@dataclasses.dataclass(frozen=True)
class PodState:
    """What one replica pod is: its template's facts and whether its replica is ready."""

    ordinal: int
    exists: bool = True
    revision: str = ""
    ready: bool = False  # its replica answers /status ready
    pod_ready: bool = False  # the kubelet's Ready condition (Service, PDB, StatefulSet)
    image: str = ""
    config_hash: str = ""
    restart: str = ""
    uid: str = ""
    terminating: bool = False  # deleted, still shutting down (deletionTimestamp set)

    @classmethod
    def of(cls, ordinal: int, pod: Mapping[str, Any] | None, ready: bool) -> PodState:
        if pod is None:
            return cls(ordinal, exists=False)
        meta = pod.get("metadata") or {}
        notes = meta.get("annotations") or {}
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        return cls(
            ordinal,
            revision=notes.get(naming.REVISION_ANNOTATION, ""),
            ready=ready,
            pod_ready=kubelet_ready(pod),
            image=containers[0].get("image", ""),
            config_hash=notes.get(naming.CONFIG_HASH_ANNOTATION, ""),
            restart=notes.get(naming.RESTART_ANNOTATION, ""),
            uid=meta.get("uid", ""),
            terminating=bool(meta.get("deletionTimestamp")),
        )

    @property
    def available(self) -> bool:
        """Serving: its replica ready, the pod Ready for the kubelet, not shutting down."""
        return self.exists and self.ready and self.pod_ready and not self.terminating

    @classmethod
    def desired(cls, statefulset: Mapping[str, Any]) -> PodState:
        """The state a pod made from the StatefulSet's current template has."""
        template = (statefulset.get("spec") or {}).get("template") or {}
        return cls.of(-1, template, ready=True)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The rollout as seen in one pass, and the one step to take now (if any)."""

    update_revision: str
    current_revision: str
    updated: int
    replicas: int
    stale: int = 0  # pods that exist on another revision
    replace: int | None = None  # ordinal to delete now
    check_first: bool = False  # flush and verify before deleting it (it is serving)
    waiting: str = ""  # why no step is taken (when incomplete)
    # Every pod is on the update revision, but the rollout's last replacements are not
    # all ready yet (or not yet created): the rollout is not complete.
    finishing: bool = False

    @property
    def complete(self) -> bool:
        """No pod on an old revision and, after a rollout, every pod ready again."""
        return self.stale == 0 and not self.finishing


def kubelet_ready(pod: Mapping[str, Any]) -> bool:
    """Is the pod's ``Ready`` condition True (what its Service and PDB go by)?"""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def plan(
    pods: Sequence[PodState],
    replicas: int,
    update_revision: str,
    synced: bool,
    in_progress: bool = False,
    counted_ready: int | None = None,
) -> Plan:
    """The next step of the rollout for the pods of ordinals ``0..replicas-1``.

    ``in_progress``: the last pass reported a rollout under way (``Progressing=True``);
    only then do missing or unready pods on the update revision keep it incomplete.
    ``counted_ready``: the StatefulSet's ``status.readyReplicas``, which ``Ready`` also
    reads (None: not known); the rollout completes only once it counts every replica.
    """
    present = [p for p in pods if p.ordinal < replicas]
    updated = sum(1 for p in present if p.exists and p.revision == update_revision)
    old = collections.Counter(
        p.revision for p in present if p.exists and p.revision != update_revision
    )
    current = old.most_common(1)[0][0] if old else update_revision
    stale = sorted(
        (p for p in present if p.exists and p.revision != update_revision),
        key=lambda p: p.ordinal,
        reverse=True,
    )
    base = Plan(update_revision, current, updated, replicas, stale=len(stale))
    if not stale:
        return _tail(base, present, counted_ready) if in_progress else base
    # A deleted pod shuts down for up to its grace period and is still listed, on its
    # old revision: deleting it again would only repeat the step (and its Event), and
    # replacing another one meanwhile would take two replicas down at once.
    terminating = [p.ordinal for p in present if p.exists and p.terminating]
    if terminating:
        return dataclasses.replace(
            base, waiting=f"waiting for ordinal(s) {_names(terminating)} to terminate"
        )
    broken = [p for p in stale if not p.ready]
    if broken:
        return dataclasses.replace(base, replace=broken[0].ordinal)
    not_ready = [p.ordinal for p in present if not p.available]
    if not_ready:
        return dataclasses.replace(
            base, waiting=f"waiting for ordinal(s) {_names(not_ready)} to be ready"
        )
    if not synced:
        return dataclasses.replace(base, waiting="waiting for every replica to be in sync")
    return dataclasses.replace(base, replace=stale[0].ordinal, check_first=True)


def _tail(base: Plan, present: Sequence[PodState], counted_ready: int | None) -> Plan:
    """A rollout under way with no pod left on an old revision: complete once every pod
    exists on the update revision and is ready, and the StatefulSet counts them."""
    serving = {p.ordinal for p in present if p.revision == base.update_revision and p.available}
    waiting = [o for o in range(base.replicas) if o not in serving]
    if waiting:
        return dataclasses.replace(
            base,
            finishing=True,
            waiting=f"waiting for ordinal(s) {_names(waiting)} to be ready on the new revision",
        )
    if counted_ready is not None and counted_ready < base.replicas:
        return dataclasses.replace(
            base,
            finishing=True,
            waiting=f"waiting for the StatefulSet to count every replica ready "
            f"({counted_ready} of {base.replicas})",
        )
    return base


def _names(ordinals: Sequence[int]) -> str:
    return ", ".join(str(o) for o in ordinals)


def restart_reason(pod: PodState, desired: PodState) -> str:
    """Why the pod's template differs from the current one, for the Event."""
    reasons = []
    if pod.image != desired.image:
        reasons.append(f"image {pod.image or '?'} -> {desired.image}")
    if pod.config_hash != desired.config_hash:
        reasons.append("configuration changed (config hash)")
    if pod.restart != desired.restart:
        reasons.append(f"restart requested ({naming.RESTART_ANNOTATION}={desired.restart!r})")
    if not reasons:
        reasons.append("pod template changed")
    return "; ".join(reasons)
