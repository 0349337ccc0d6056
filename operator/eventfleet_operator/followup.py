"""Which statuses the operator follows up within seconds instead of at the next resync.

The operator watches EventServers and the Secrets their passes read, not pods and not
the replicas: what changes there is seen by the next pass. While the last status written
waits for such a change, the handlers' ``follow-up`` timer runs the pass every few
seconds (Kopf runs a timer while its filter matches the object; every status write is a
watch event that re-evaluates the filter):

* a managed rollout under way (``Progressing=True``): each step follows the previous
  pod's readiness, and ``Progressing=False`` the last one's, within seconds (at the
  30 s resync a three-replica rollout took about 30 s a pod);
* ``Ready=False`` only because pods are starting or the StatefulSet's status catches up
  (:data:`WAITING_FOR_PODS`): a new fleet, a scale-up, a pod the kubelet restarted;
* a token change on its way to the replicas (:func:`secretrefs.tokens_settling`);
* a volume growth under way (``StorageResizing=True``): the claims' capacity is the
  storage side's answer, and the StatefulSet is recreated once every claim has it.

A fleet whose pods never get ready is therefore passed every few seconds until they
are (or until its status says something else). Pure: no Kopf, no API calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventfleet_operator import secretrefs
from eventfleet_operator.constants import ConditionStatus, ConditionType, Reason
from eventfleet_operator.status import condition_true, find_condition

# Ready=False reasons that only pods becoming ready, or the StatefulSet's status catching
# up, end: no event of the EventServer or of a Secret announces that.
WAITING_FOR_PODS = frozenset(
    {Reason.ROLLOUT_IN_PROGRESS, Reason.REPLICAS_NOT_READY, Reason.STATEFULSET_STATUS_STALE}
)


def waiting_for_pods(status: Mapping[str, Any] | None) -> bool:
    """Does the last written status wait for pods: a rollout under way (``Progressing``),
    or ``Ready=False`` for a reason in :data:`WAITING_FOR_PODS`?"""
    if condition_true(status, ConditionType.PROGRESSING):
        return True
    ready = find_condition((status or {}).get("conditions"), ConditionType.READY)
    return ready.get("status") == ConditionStatus.FALSE and ready.get("reason") in WAITING_FOR_PODS


def resizing(status: Mapping[str, Any] | None) -> bool:
    """Does the last written status wait for claims to grow (``StorageResizing=True``)?"""
    return condition_true(status, ConditionType.STORAGE_RESIZING)


def needed(status: Mapping[str, Any] | None) -> bool:
    """Should the pass run again within seconds (the ``follow-up`` timer's filter)?"""
    return waiting_for_pods(status) or secretrefs.tokens_settling(status) or resizing(status)
