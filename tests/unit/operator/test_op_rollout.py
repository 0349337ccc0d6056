"""Managed rollouts: the pure decision, and passes that replace pods one at a time."""

from __future__ import annotations

import copy

from eventfleet_operator import builders, followup, model, naming, rollout
from eventfleet_operator.rollout import PodState
from op_fakes import status_doc
from op_pass import Harness

NEW, OLD = "new", "old"


def pods(*specs):
    """specs: (revision, ready) per ordinal (ready: by its replica and by the kubelet), or
    None for a missing pod."""
    return [
        PodState(i, exists=False)
        if s is None
        else PodState(i, revision=s[0], ready=s[1], pod_ready=s[1])
        for i, s in enumerate(specs)
    ]


def test_nothing_to_do_when_every_pod_is_on_the_new_revision():
    plan = rollout.plan(pods((NEW, True), (NEW, True)), 2, NEW, synced=True)
    assert plan.complete and plan.replace is None and plan.updated == 2
    assert plan.current_revision == NEW


def test_highest_stale_ordinal_first_and_only_when_all_ready_and_synced():
    fleet = pods((OLD, True), (OLD, True), (OLD, True))
    plan = rollout.plan(fleet, 3, NEW, synced=True)
    assert (plan.replace, plan.check_first, plan.current_revision) == (2, True, OLD)
    assert not plan.complete
    waiting = rollout.plan(fleet, 3, NEW, synced=False)
    assert waiting.replace is None and "in sync" in waiting.waiting


def test_waits_for_the_replaced_pod_to_be_ready():
    plan = rollout.plan(pods((OLD, True), (OLD, True), (NEW, False)), 3, NEW, synced=False)
    assert plan.replace is None and "2" in plan.waiting and plan.updated == 1
    plan = rollout.plan(pods((OLD, True), (OLD, True), None), 3, NEW, synced=True)
    assert plan.replace is None and "2" in plan.waiting


def test_a_pod_stuck_on_a_bad_revision_is_replaced_at_once():
    # The bad revision B was rolled to ordinal 2, which crash-loops; the spec is then
    # reverted to A: ordinal 2 is stale and not ready -> replaced without any wait.
    plan = rollout.plan(pods(("A", True), ("A", True), ("B", False)), 3, "A", synced=False)
    assert (plan.replace, plan.check_first) == (2, False)


def test_a_terminating_pod_is_neither_deleted_again_nor_followed_by_another():
    # Ordinal 2 was deleted (grace period running): still listed on the old revision.
    fleet = pods((OLD, True), (OLD, True), (OLD, True))
    fleet[2] = PodState(2, revision=OLD, ready=False, terminating=True)
    plan = rollout.plan(fleet, 3, NEW, synced=True)
    assert plan.replace is None and "2" in plan.waiting and "terminate" in plan.waiting
    pod = {"metadata": {"uid": "u", "deletionTimestamp": "2026-11-24T01:41:00Z"}}
    assert PodState.of(2, pod, ready=True).terminating
    assert not PodState.of(2, {"metadata": {"uid": "u"}}, ready=True).terminating


def test_a_rollout_is_complete_only_once_its_last_new_pod_is_ready():
    # The last old pod was replaced; its successor runs the new revision but starts.
    tail = pods((NEW, True), (NEW, True), (NEW, False))
    plan = rollout.plan(tail, 3, NEW, synced=False, in_progress=True)
    assert not plan.complete and plan.replace is None and plan.updated == 3
    assert "2" in plan.waiting and "ready" in plan.waiting
    done = rollout.plan(pods((NEW, True), (NEW, True), (NEW, True)), 3, NEW, True, True, 3)
    assert done.complete and not done.waiting


def test_a_pod_missing_during_its_replacement_keeps_the_rollout_incomplete():
    # Between the old pod's deletion and its replacement's creation nothing in the pods
    # tells a replacement from a scale-up: the rollout under way (Progressing=True) does.
    plan = rollout.plan(pods((NEW, True), (NEW, True), None), 3, NEW, synced=True, in_progress=True)
    assert not plan.complete and plan.stale == 0 and plan.updated == 2
    assert "2" in plan.waiting


def test_a_new_pod_is_ready_only_when_its_replica_and_the_kubelet_say_so():
    # The replica answers ready before the kubelet's readiness probe passes (every 5 s):
    # Ready reads the kubelet's condition, so the rollout is not complete before it.
    fleet = pods((NEW, True), (NEW, True), (NEW, True))
    fleet[2] = PodState(2, revision=NEW, ready=True, pod_ready=False)
    assert not rollout.plan(fleet, 3, NEW, synced=True, in_progress=True).complete
    fleet[2] = PodState(2, revision=NEW, ready=True, pod_ready=True, terminating=True)
    assert not rollout.plan(fleet, 3, NEW, synced=True, in_progress=True).complete
    ready_pod = {"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert PodState.of(2, ready_pod, ready=True).available
    assert not PodState.of(2, {"metadata": {}, "status": {}}, ready=True).available
    # And the StatefulSet, whose readyReplicas Ready reads too, must count them all.
    every = pods((NEW, True), (NEW, True), (NEW, True))
    late = rollout.plan(every, 3, NEW, synced=True, in_progress=True, counted_ready=2)
    assert not late.complete and "StatefulSet" in late.waiting


def test_a_scale_up_or_a_crash_after_a_rollout_is_not_a_rollout():
    # No rollout under way: pods still to be created, or one not ready, are Ready's news.
    assert rollout.plan(pods((NEW, True), None, None), 3, NEW, synced=True).complete
    assert rollout.plan(pods((NEW, True), (NEW, False)), 2, NEW, synced=False).complete


def test_pods_above_the_replica_count_are_not_the_rollouts_business():
    plan = rollout.plan(pods((NEW, True), (OLD, True)), 1, NEW, synced=True)
    assert plan.complete


def test_revision_changes_with_the_template_and_restart_annotation_only():
    spec = model.parse("demo", "ns", {})

    def revision(s, config_hash="h"):
        sts = builders.statefulset(s, replicas=3, config_hash=config_hash)
        return sts["spec"]["template"]["metadata"]["annotations"][naming.REVISION_ANNOTATION]

    base = revision(spec)
    assert revision(spec) == base
    assert (
        builders.statefulset(spec, replicas=5, config_hash="h")["spec"]["template"]["metadata"][
            "annotations"
        ][naming.REVISION_ANNOTATION]
        == base
    )  # scaling is not a rollout
    assert revision(spec, "other") != base
    assert revision(model.parse("demo", "ns", {"image": "x:2"})) != base
    import dataclasses

    assert revision(dataclasses.replace(spec, restart="1")) != base


def test_strategies():
    managed = builders.statefulset(model.parse("demo", "ns", {}), replicas=1, config_hash="h")
    assert managed["spec"]["updateStrategy"] == {"type": "OnDelete"}
    rolling = builders.statefulset(
        model.parse("demo", "ns", {"updateStrategy": {"type": "RollingUpdate"}}),
        replicas=1,
        config_hash="h",
    )
    assert rolling["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def test_restart_reasons():
    old = PodState(0, revision="a", image="x:1", config_hash="c1")
    assert "image x:1 -> x:2" in rollout.restart_reason(
        old, PodState(-1, revision="b", image="x:2", config_hash="c1")
    )
    assert "config" in rollout.restart_reason(
        old, PodState(-1, revision="b", image="x:1", config_hash="c2")
    )
    assert "eventfleet.io/restart='now'" in rollout.restart_reason(
        old, PodState(-1, revision="b", image="x:1", config_hash="c1", restart="now")
    )


class Fleet:
    """A Harness plus a StatefulSet controller for OnDelete: pods from the template."""

    def __init__(self, replicas=3):
        self.h = Harness({"replicas": replicas})
        self.n = replicas

    def make_pods(self):
        sts = self.h.sts()
        template = sts["spec"]["template"]
        for i in range(sts["spec"]["replicas"]):
            if self.h.kube.obj("Pod", f"demo-{i}") is None:
                self.h.kube.put(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"demo-{i}",
                            "namespace": "ns",
                            "labels": dict(template["metadata"]["labels"]),
                            "annotations": dict(template["metadata"]["annotations"]),
                        },
                        "spec": copy.deepcopy(template["spec"]),
                        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                    }
                )
        # As the StatefulSet controller reports once it has acted on the current spec.
        sts["status"] = {
            "replicas": self.n,
            "readyReplicas": self.n,
            "observedGeneration": sts["metadata"]["generation"],
        }
        self.h.kube.objects[("StatefulSet", "ns", "demo")]["status"] = sts["status"]

    def all_ready(self, broken=()):
        held = {i + 1: (1, 5) for i in range(self.n)}
        peers = [
            {"name": f"demo-{j}", "server_id": j + 1, "state": "synced", "last_event_id": None,
             "lag_events": 0, "lag_seconds": 0.0}
            for j in range(self.n)
        ]  # fmt: skip
        self.h.replicas.docs = {
            i: status_doc(i + 1, held, peers=[p for p in peers if p["server_id"] != i + 1])
            for i in range(self.n)
            if i not in broken
        }

    async def run(self):
        status = await self.h.run()
        self.make_pods()
        return status


async def test_managed_rollout_replaces_one_pod_per_step_highest_first_with_events():
    f = Fleet(3)
    f.all_ready()
    await f.run()
    await f.run()
    assert f.h.condition("Ready")["status"] == "True"
    f.h.set_spec({"replicas": 3, "image": "x:2"})
    replaced = []
    for _ in range(6):
        before = {i: f.h.kube.obj("Pod", f"demo-{i}") for i in range(3)}
        status = await f.h.run()
        gone = [i for i in range(3) if f.h.kube.obj("Pod", f"demo-{i}") is None and before[i]]
        assert len(gone) <= 1  # one pod at a time
        replaced += gone
        f.make_pods()
        if status["updatedReplicas"] == 3 and f.h.condition("Progressing")["status"] == "False":
            break
    assert replaced == [2, 1, 0]
    status = await f.h.run()
    assert status["currentRevision"] == status["updateRevision"]
    assert f.h.condition("Ready")["status"] == "True"
    restarts = [m for _, r, m in f.h.events if r == "ReplicaRestarted"]
    assert len(restarts) == 3 and all("image" in m and "x:2" in m for m in restarts)
    # Each serving pod was flushed to the two others before its deletion.
    flushed_from = {c[1] for c in f.h.replicas.calls if c[0] == "flush"}
    assert flushed_from == {0, 1, 2}


async def test_rollout_reports_progress_and_ready_false_while_incomplete():
    f = Fleet(2)
    f.all_ready()
    await f.run()
    await f.run()
    f.h.annotate(restart="2026-11-23T18:00:00Z")
    f.h.replicas.flush_fails.add(1)  # the flush of ordinal 1 fails: hold the step
    status = await f.h.run()
    assert f.h.kube.obj("Pod", "demo-1") is not None
    progressing = f.h.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    assert "holding the replacement of demo-1" in progressing["message"]
    ready = f.h.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RolloutInProgress")
    assert status["updatedReplicas"] == 0
    f.h.replicas.flush_fails.clear()
    await f.h.run()
    assert f.h.kube.obj("Pod", "demo-1") is None
    assert any("restart requested" in m for _, r, m in f.h.events if r == "ReplicaRestarted")


async def test_a_reverted_bad_revision_unsticks_without_manual_steps():
    f = Fleet(3)
    f.all_ready()
    await f.run()
    await f.run()
    good = f.h.sts()["spec"]["template"]["metadata"]["annotations"][naming.REVISION_ANNOTATION]
    f.h.set_spec({"replicas": 3, "image": "bad:1"})
    await f.run()  # replaces ordinal 2 -> recreated on the bad revision
    f.all_ready(broken={2})  # and it never gets ready
    for _ in range(3):
        await f.run()
    assert f.h.kube.obj("Pod", "demo-1")["spec"]["containers"][0]["image"] != "bad:1"
    # Revert: ordinal 2 is replaced at once, though nothing is ready or in sync.
    f.h.set_spec({"replicas": 3})
    await f.h.run()
    assert f.h.kube.obj("Pod", "demo-2") is None
    f.make_pods()
    f.all_ready()
    status = await f.run()
    assert status["updateRevision"] == good
    assert f.h.condition("Progressing")["reason"] == "RolloutComplete"
    assert f.h.condition("Ready")["status"] == "True"
    for i in (0, 1):  # never touched
        assert sum(1 for w in f.h.kube.writes if w == ("delete", "Pod", f"demo-{i}")) == 0


async def test_rolling_update_strategy_only_reports():
    h = Harness({"replicas": 1, "updateStrategy": {"type": "RollingUpdate"}})
    await h.run()
    assert h.sts()["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def _refusing(pod, found=2, known=1):
    """The pod's replica container stopped on a store of a newer schema (its last log
    line is the termination message: FallbackToLogsOnError)."""
    line = (
        f'{{"level": "CRITICAL", "message": "cannot start: /var/lib/eventfleet/events.sqlite: '
        f"storage schema version {found} is newer than this replica's {known} (the store "
        f'was written by a newer eventfleet): run that version or a newer one"}}'
    )
    pod["status"] = {
        "containerStatuses": [
            {
                "name": "replica",
                "ready": False,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": line}},
            }
        ]
    }


async def test_a_downgrade_across_storage_schemas_stops_at_one_pod_with_a_condition():
    f = Fleet(3)
    f.all_ready()
    for doc in f.h.replicas.docs.values():
        doc["storage"]["schema_version"] = 2
    await f.run()
    status = await f.run()
    assert status["storageSchemaVersion"] == 2
    container = f.h.sts()["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"

    f.h.set_spec({"replicas": 3, "image": "eventfleet/server:0.9"})  # an older image
    await f.h.run()
    assert f.h.kube.obj("Pod", "demo-2") is None  # the first step: flushed and replaced
    f.make_pods()
    _refusing(f.h.kube.obj("Pod", "demo-2"))
    f.all_ready(broken={2})  # it refused to start: no /status
    for _ in range(3):
        status = await f.run()
    ready = f.h.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "StorageSchemaTooNew")
    assert "demo-2 (image eventfleet/server:0.9, storage schema 1)" in ready["message"]
    assert "/var/lib/eventfleet/events.sqlite of storage schema 2" in ready["message"]
    assert status["storageSchemaVersion"] == 2  # never goes down
    # No other pod was touched: the older image runs nowhere else.
    assert (
        f.h.kube.obj("Pod", "demo-1")["spec"]["containers"][0]["image"] != "eventfleet/server:0.9"
    )
    assert (
        f.h.kube.obj("Pod", "demo-0")["spec"]["containers"][0]["image"] != "eventfleet/server:0.9"
    )
    assert ("Warning", "StorageSchemaTooNew") in [(t, r) for t, r, _ in f.h.events]

    # Reverting the image replaces the refusing pod at once; Ready comes back.
    f.h.set_spec({"replicas": 3})
    await f.h.run()
    assert f.h.kube.obj("Pod", "demo-2") is None
    f.make_pods()
    f.all_ready()
    for doc in f.h.replicas.docs.values():
        doc["storage"]["schema_version"] = 2
    await f.run()
    await f.run()
    assert f.h.condition("Ready")["status"] == "True"


def test_schema_refusal_is_read_from_either_container_state():
    from eventfleet_operator import schema

    pod = {"status": {"containerStatuses": [{"state": {"terminated": {"message": "x"}}}]}}
    assert schema.refusal(pod) is None
    _refusing(pod, found=5, known=3)
    assert schema.refusal(pod) == ("/var/lib/eventfleet/events.sqlite", 5, 3)
    assert schema.highest(None, [None, 1, 3]) == 3 and schema.highest(4, [1]) == 4
    assert schema.highest(None, [None]) is None


async def test_progressing_stays_true_until_the_last_replaced_pod_is_ready():
    """The runbook waits for Progressing=False and then expects a Ready fleet: no pass
    may write it while the last replaced pod is missing or still starting."""
    f = Fleet(2)
    f.all_ready()
    await f.run()
    await f.run()
    f.h.set_spec({"replicas": 2, "image": "x:2"})
    for _ in range(6):
        await f.h.run()
        if f.h.kube.obj("Pod", "demo-0") is None:
            break
        f.make_pods()
    assert f.h.kube.obj("Pod", "demo-0") is None  # the last old pod is deleted

    def conditions():
        return tuple(
            (f.h.condition(c)["status"], f.h.condition(c)["reason"])
            for c in ("Progressing", "Ready")
        )

    rolling = (("True", "RollingOut"), ("False", "RolloutInProgress"))
    f.all_ready(broken={0})
    await f.h.run()  # not recreated yet: no pod on an old revision, one missing
    assert conditions() == rolling
    assert "waiting for ordinal(s) 0" in f.h.condition("Progressing")["message"]
    f.make_pods()  # recreated from the new template; the kubelet has not probed it yet
    f.h.kube.obj("Pod", "demo-0")["status"] = {"conditions": [{"type": "Ready", "status": "False"}]}
    await f.h.run()
    assert conditions() == rolling
    f.all_ready()  # its replica answers ready; the kubelet's condition is still False
    await f.h.run()
    assert conditions() == rolling
    f.h.kube.obj("Pod", "demo-0")["status"]["conditions"][0]["status"] = "True"
    status = await f.h.run()
    assert conditions() == (("False", "RolloutComplete"), ("True", "AllReplicasReady"))
    assert status["updatedReplicas"] == 2 and status["currentRevision"] == status["updateRevision"]


async def test_a_plain_scale_up_never_reports_a_rollout():
    f = Fleet(2)
    f.all_ready()
    await f.run()
    await f.run()
    f.h.set_spec({"replicas": 4})
    f.n = 4
    seen = []
    for _ in range(4):
        await f.h.run()  # new ordinals missing, then starting: a scale-up, not a rollout
        seen.append(f.h.condition("Progressing")["status"])
        f.make_pods()
        f.h.kube.obj("Pod", "demo-3")["status"] = {}  # ordinal 3 never gets ready
        f.all_ready(broken={3})
    assert seen == ["False"] * 4
    ready = f.h.condition("Ready")
    assert (ready["reason"], ready["message"]) == ("ReplicasNotReady", "3 of 4 replicas ready")


async def test_every_pass_of_a_rollout_is_followed_up_until_ready():
    """The operator does not watch pods: while a pass leaves the fleet rolling out (or
    Ready=False until pods are ready) the follow-up timer runs the next pass within
    seconds, so each step, and Ready after the last one, do not wait for the resync;
    the pass that ends the rollout writes Progressing=False and Ready=True together."""
    f = Fleet(3)
    status = await f.run()
    assert followup.needed(status)  # pods created, none ready yet: ReplicasNotReady
    f.all_ready()
    await f.run()
    status = await f.run()
    assert f.h.condition("Ready")["status"] == "True"
    assert not followup.needed(status)  # an idle, ready fleet: the resync alone
    f.h.set_spec({"replicas": 3, "image": "x:2"})
    seen = []
    for _ in range(8):
        status = await f.run()
        seen.append(followup.needed(status))
        if f.h.condition("Progressing")["status"] == "False":
            break
    assert f.h.condition("Ready")["status"] == "True" and status["updatedReplicas"] == 3
    assert len(seen) >= 3 and all(seen[:-1]) and not seen[-1], seen
