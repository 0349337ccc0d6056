"""Refusals that lift by themselves are retried within seconds, not at the next resync.

Seen on a real cluster: the first pass after `helm install` got a 403 from the API
server's OwnerReferencesPermissionEnforcement admission ("cannot find RESTMapping" for
the seconds-old EventServer CRD), and the operator waited for the 30 s resync.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from eventfleet_operator import handlers, kube, reconcile
from kopf._core.engines import posting
from op_kube import FakeKube
from op_pass import Harness

OWNER_REFS_403 = (
    'statefulsets.apps "demo" is forbidden: cannot set blockOwnerDeletion in this case '
    "because cannot find RESTMapping for APIVersion eventfleet.io/v1 Kind EventServer: "
    'no matches for kind "EventServer" in version "eventfleet.io/v1"'
)


class RefusingKube(FakeKube):
    """Refuses the first ``times`` applies with ``error``."""

    def __init__(self, error: kube.ApiError, times: int = 1) -> None:
        super().__init__()
        self.error = error
        self.times = times

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.times > 0:
            self.times -= 1
            raise self.error
        return await super().apply(manifest)


def harness(error: kube.ApiError, times: int = 1) -> Harness:
    h = Harness({"replicas": 3})
    refusing = RefusingKube(error, times)
    refusing.objects = h.kube.objects  # the EventServer the harness stored
    h.kube = refusing
    h.ctx.kube = refusing  # type: ignore[assignment]
    return h


@pytest.mark.parametrize(
    ("status", "message", "transient"),
    [
        (403, OWNER_REFS_403, True),
        (429, "too many requests", True),
        (503, "the server is currently unable to handle the request", True),
        (403, 'statefulsets.apps is forbidden: User "x" cannot create resource', False),
        (422, "spec.replicas: Invalid value", False),
        (409, "conflict", False),
    ],
)
def test_which_refusals_are_transient(status, message, transient):
    assert kube.ApiError(status, "Reason", message).transient is transient


async def test_a_transient_refusal_writes_the_status_then_asks_for_a_prompt_retry():
    h = harness(kube.ApiError(403, "Forbidden", OWNER_REFS_403, method="PATCH", path="/apis/apps"))
    with pytest.raises(reconcile.TransientRefusal) as raised:
        await h.run()
    # The status says what happened (as for any refused write) before the retry.
    stored = h.kube.obj("EventServer", "demo")["status"]
    assert stored == raised.value.status
    ready = next(c for c in stored["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ApplyFailed"
    assert "cannot find RESTMapping" in ready["message"]
    # The retry succeeds once the server knows the kind.
    status = await h.run()
    assert h.kube.obj("StatefulSet", "demo") is not None
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["reason"] != "ApplyFailed"


async def test_a_lasting_refusal_waits_for_the_resync():
    h = harness(kube.ApiError(403, "Forbidden", 'User "x" cannot patch statefulsets'))
    status = await h.run()  # no exception: the timer's next pass is the retry
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ApplyFailed"


async def test_the_handler_turns_it_into_a_temporary_error_with_a_short_delay():
    # kopf.event() posts through the operator's queue; give it one, as kopf.run does.
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    posting.event_queue_var.set(asyncio.Queue())
    posting.settings_var.set(kopf.OperatorSettings())
    h = harness(kube.ApiError(403, "Forbidden", OWNER_REFS_403))
    memo = kopf.Memo()
    memo.ctx = h.ctx
    memo.last_status = {}
    body = kopf.Body(h.kube.obj("EventServer", "demo"))
    with pytest.raises(kopf.TemporaryError) as raised:
        await handlers.run_pass(body, memo, logging.getLogger("test"))
    assert raised.value.delay == handlers.TRANSIENT_RETRY_SECONDS <= 5
    assert "cannot find RESTMapping" in str(raised.value)
    # The status this pass wrote is what the retry starts from.
    assert memo.last_status[h.uid] == h.kube.obj("EventServer", "demo")["status"]
