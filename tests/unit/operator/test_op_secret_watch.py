"""A change to a Secret a fleet's pass reads runs that pass at once (the operator's
Secret watch), so a token rotation does not wait for the resync; and while the new
tokens travel to the replicas, the operator re-reads them every few seconds."""

from __future__ import annotations

import asyncio
import base64
import copy
import logging

import kopf
import pytest
from eventfleet_operator import handlers, model, naming, secretrefs
from eventfleet_operator.config import OperatorConfig
from kopf._cogs.structs import patches, references
from kopf._core.actions import invocation
from kopf._core.engines import posting
from kopf._core.intents import causes
from op_pass import Harness

RESOURCE = references.Resource("eventfleet.io", "v1", "eventservers")
SECRETS = references.Resource("", "v1", "secrets")


def fleet(spec, name="demo"):
    return model.parse(name, "ns", spec)


def test_a_fleet_reads_its_token_secrets_generated_or_its_own():
    assert secretrefs.of_spec(fleet({})) == {"demo-token", "demo-peer-token"}
    own = {
        "token": {"secretRef": {"name": "client", "key": "k"}},
        "peerToken": {"secretRef": {"name": "peer"}},
    }
    assert secretrefs.of_spec(fleet(own)) == {"client", "peer"}


def test_the_bus_key_pair_and_the_certificate_only_when_on():
    curve = {"protocols": {"bus": {"enabled": True, "curve": {"enabled": True}}}}
    assert secretrefs.of_spec(fleet(curve)) == {"demo-token", "demo-peer-token", "demo-bus-curve"}
    tls = {"tls": {"enabled": True}}
    assert secretrefs.of_spec(fleet(tls)) == {
        "demo-token",
        "demo-peer-token",
        "demo-tls",
        "demo-ca",
    }
    # Mounted but never read by the pass: BUS allowed keys, backup credentials.
    keys = {"protocols": {"bus": {"enabled": True, "curve": {"allowedKeysSecretRef": {}}}}}
    keys["protocols"]["bus"]["curve"] = {"enabled": True, "allowedKeysSecretRef": {"name": "k"}}
    assert "k" not in secretrefs.of_spec(fleet(keys))


def body(name, spec, namespace="ns", **meta):
    return {"metadata": {"name": name, "namespace": namespace, **meta}, "spec": spec}


def test_index_entries_key_by_namespace_and_secret():
    assert secretrefs.index_entries(body("demo", {}, "team-a")) == {
        ("team-a", "demo-token"): "demo",
        ("team-a", "demo-peer-token"): "demo",
    }
    # Nothing while being deleted (the cleanup runs), nothing for a spec that does not
    # parse (no Secret change can fix it; the spec change that does runs a pass itself).
    assert (
        secretrefs.index_entries(body("demo", {}, deletionTimestamp="2026-11-27T10:00:00Z")) == {}
    )
    assert secretrefs.index_entries(body("demo", {"replicas": "3"})) == {}
    assert secretrefs.index_entries({"metadata": {}}) == {}


def index_of(*bodies):
    """What Kopf's index holds: key -> the values every indexed object returned for it."""
    index: dict = {}
    for b in bodies:
        for key, value in secretrefs.index_entries(b).items():
            index.setdefault(key, []).append(value)
    return index


def test_a_shared_secret_maps_to_every_fleet_that_reads_it_in_its_namespace():
    shared = {"token": {"secretRef": {"name": "clients"}}}
    index = index_of(
        body("b", shared), body("a", shared), body("c", {}), body("a", shared, "other")
    )
    assert secretrefs.fleets_for(index, "ns", "clients") == ["a", "b"]
    assert secretrefs.fleets_for(index, "ns", "c-peer-token") == ["c"]
    assert secretrefs.fleets_for(index, "other", "clients") == ["a"]
    assert secretrefs.fleets_for(index, "ns", "unrelated") == []
    assert secretrefs.fleets_for(index, "third", "clients") == []


@pytest.mark.parametrize(
    ("status", "settling"),
    [
        (None, False),
        ({}, False),
        ({"conditions": [{"type": "TokensLoaded", "status": "True"}]}, False),
        (
            {
                "conditions": [
                    {"type": "TokensLoaded", "status": "False", "reason": "TokensReloading"}
                ]
            },
            True,
        ),
        # Unknown (a replica unreachable or too old to report): no fast polling.
        ({"conditions": [{"type": "TokensLoaded", "status": "Unknown"}]}, False),
        ({"peerTokenRotation": {"step": "Swapping"}}, True),
        ({"peerTokenRotation": {"step": "Pending"}}, True),
        ({"peerTokenRotation": {"step": "Done"}}, False),
        ({"peerTokenRotation": {"step": "Refused"}}, False),
    ],
)
def test_tokens_settling(status, settling):
    assert secretrefs.tokens_settling(status) is settling


# -- The handler path: the Secret event, the index, the pass -------------------------


def posting_queue():
    # kopf.event() posts through the operator's queue; give it one, as kopf.run does.
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    posting.event_queue_var.set(asyncio.Queue())
    posting.settings_var.set(kopf.OperatorSettings())


def memo_of(h: Harness) -> kopf.Memo:
    memo = kopf.Memo()
    memo.ctx = h.ctx
    memo.last_status = {}
    memo.pass_locks = {}
    return memo


def set_peer_secret(h, text):
    h.kube.obj("Secret", "demo-peer-token")["data"]["token"] = base64.b64encode(
        text.encode()
    ).decode()


async def test_a_changed_token_secret_runs_the_pass_of_the_fleet_that_reads_it():
    posting_queue()
    h = Harness({"replicas": 2})
    other = h.kube.put(body("other", {"replicas": 1}) | {"kind": "EventServer"})
    memo, settings = memo_of(h), kopf.OperatorSettings()
    await handlers.run_pass(kopf.Body(h.kube.obj("EventServer", "demo")), memo, h_log())
    h.replicas_load(2)
    await handlers.run_pass(kopf.Body(h.kube.obj("EventServer", "demo")), memo, h_log())
    before = copy.deepcopy(h.kube.obj("EventServer", "demo")["status"])
    assert condition(before, "TokensLoaded")["status"] == "True"
    assert not secretrefs.tokens_settling(before)
    index = index_of(h.kube.obj("EventServer", "demo"), other)
    (old,) = h.secret_tokens("demo-peer-token")
    set_peer_secret(h, f"{old}\nnew-peer\n")

    # The initial listing and Secrets no fleet reads run nothing.
    assert await handlers.secret_changed(None, "ns", "demo-peer-token", index, memo, settings) == []
    assert await handlers.secret_changed("MODIFIED", "ns", "x", index, memo, settings) == []
    assert (
        await handlers.secret_changed("MODIFIED", "b", "demo-peer-token", index, memo, settings)
        == []
    )
    assert h.kube.obj("EventServer", "demo")["status"] == before

    # The change: the pass sees it (digest moved, replicas reloading) and the fast
    # polling starts; the other fleet is left alone.
    ran = await handlers.secret_changed("MODIFIED", "ns", "demo-peer-token", index, memo, settings)
    assert ran == ["demo"]
    after = h.kube.obj("EventServer", "demo")["status"]
    assert after["tokensDigest"] != before["tokensDigest"]
    loaded = condition(after, "TokensLoaded")
    assert (loaded["status"], loaded["reason"]) == ("False", "TokensReloading")
    assert secretrefs.tokens_settling(after)
    assert "status" not in h.kube.obj("EventServer", "other")
    # A deleted Secret (the generated one: the pass makes it again) runs the pass too.
    h.kube.objects.pop(("Secret", "ns", "demo-token"))
    assert await handlers.secret_changed("DELETED", "ns", "demo-token", index, memo, settings) == [
        "demo"
    ]
    assert h.kube.obj("Secret", "demo-token") is not None


async def test_passes_asked_at_once_each_start_from_the_status_of_the_one_before():
    """A Secret event arrives while the pass that wrote the Secret still runs: the
    waiting pass must decide from that pass's status, or a peer-token rotation step
    is undone (the status falls back to Pending)."""
    posting_queue()
    h = Harness({"replicas": 2})
    memo = memo_of(h)
    es = lambda: kopf.Body(copy.deepcopy(h.kube.obj("EventServer", "demo")))  # noqa: E731
    await handlers.run_pass(es(), memo, h_log())
    h.replicas_load(2)
    await handlers.run_pass(es(), memo, h_log())
    (old,) = h.secret_tokens("demo-peer-token")
    h.annotate(rotate_peer_token="r1")
    h.kube.obj("EventServer", "demo")["metadata"]["annotations"] = h.body["metadata"]["annotations"]
    first, second = es(), es()  # both read before either pass ran
    await asyncio.gather(
        handlers.run_pass(first, memo, h_log()), handlers.run_pass(second, memo, h_log())
    )
    status = h.kube.obj("EventServer", "demo")["status"]
    assert status["peerTokenRotation"]["step"] == "Adding"
    live = h.secret_tokens("demo-peer-token")
    assert live[0] == old and len(live) == 2
    # And it goes on from there once the replicas reloaded.
    h.replicas_load(2)
    await handlers.run_pass(es(), memo, h_log())
    await handlers.run_pass(es(), memo, h_log())
    assert h.kube.obj("EventServer", "demo")["status"]["peerTokenRotation"]["step"] == "Swapping"
    assert h.secret_tokens("demo-peer-token") == (live[1], old)


def condition(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def h_log():
    return logging.getLogger("test.operator")


# -- Kopf's own calls: the registered handlers get only the kwargs Kopf gives ---------


def registered(kind: str, handler_id: str):
    registry = kopf.OperatorRegistry()
    handlers.register(registry, OperatorConfig(namespaces=("ns",)))
    registries = {
        "watching": registry._watching,
        "indexing": registry._indexing,
        "spawning": registry._spawning,
    }
    (handler,) = [h for h in registries[kind].get_all_handlers() if h.id == handler_id]
    return handler


async def test_kopf_runs_the_secret_handler_from_its_index(caplog):
    """Through Kopf's invocation, with the kwargs Kopf gives each kind of cause (an
    event handler gets no ``settings``: the first cluster run of this watch failed so)."""
    posting_queue()
    h = Harness({"replicas": 2})
    memo = memo_of(h)
    memo.settings = kopf.OperatorSettings()
    await handlers.run_pass(kopf.Body(h.kube.obj("EventServer", "demo")), memo, h_log())
    h.replicas_load(2)
    await handlers.run_pass(kopf.Body(h.kube.obj("EventServer", "demo")), memo, h_log())
    es = kopf.Body(h.kube.obj("EventServer", "demo"))
    log = logging.getLogger("test.operator")
    index_handler = registered("indexing", "secret_refs")
    entries = await invocation.invoke(
        index_handler.fn,
        kwargsrc=causes.IndexingCause(
            logger=log, indices={}, memo=memo, resource=RESOURCE, patch=patches.Patch(), body=es
        ),
    )
    assert entries == {("ns", "demo-token"): "demo", ("ns", "demo-peer-token"): "demo"}
    index = {key: [value] for key, value in entries.items()}
    secret = kopf.Body(h.kube.obj("Secret", "demo-peer-token"))
    (old,) = h.secret_tokens("demo-peer-token")
    set_peer_secret(h, f"{old}\nnew-peer\n")
    digest = h.kube.obj("EventServer", "demo")["status"]["tokensDigest"]
    event = {"type": "MODIFIED", "object": dict(secret)}
    with caplog.at_level(logging.INFO):
        await invocation.invoke(
            registered("watching", "secret-changed").fn,
            kwargsrc=causes.WatchingCause(
                logger=log,
                indices={"secret_refs": index},
                memo=memo,
                resource=SECRETS,
                patch=patches.Patch(),
                body=secret,
                type="MODIFIED",
                event=event,
            ),
        )
    status = h.kube.obj("EventServer", "demo")["status"]
    assert status["tokensDigest"] != digest
    assert "Secret demo-peer-token modified: reconciling" in caplog.text
    assert condition(status, "TokensLoaded")["reason"] == "TokensReloading"
    # The follow-up timer's filter, as Kopf calls it with the fleet's new status.
    timer = registered("spawning", "follow-up")
    spawning = causes.SpawningCause(
        logger=log,
        indices={},
        memo=memo,
        resource=RESOURCE,
        patch=patches.Patch(),
        body=kopf.Body(h.kube.obj("EventServer", "demo")),
        reset=False,
    )
    assert timer.when(**spawning.kwargs) is True
    assert timer.interval == handlers.FOLLOW_UP_SECONDS


async def test_a_request_annotation_runs_the_pass_at_once():
    """Kopf reports no change for eventfleet.io/* annotations (its own progress prefix):
    ``kubectl annotate ... eventfleet.io/rotate-peer-token=...`` waited for the resync."""
    posting_queue()
    h = Harness({"replicas": 2})
    memo = memo_of(h)
    object_memo = kopf.Memo(memo)  # Kopf gives each object a copy of the operator's memo
    await handlers.run_pass(kopf.Body(h.kube.obj("EventServer", "demo")), memo, h_log())
    h.replicas_load(2)
    await handlers.run_pass(kopf.Body(h.kube.obj("EventServer", "demo")), memo, h_log())
    handler = registered("watching", "requests-changed")

    async def event(type_):
        es = kopf.Body(copy.deepcopy(h.kube.obj("EventServer", "demo")))
        cause = causes.WatchingCause(
            logger=h_log(),
            indices={},
            memo=object_memo,
            resource=RESOURCE,
            patch=patches.Patch(),
            body=es,
            type=type_,
            event={"type": type_, "object": dict(es)},
        )
        await invocation.invoke(handler.fn, kwargsrc=cause)
        return h.kube.obj("EventServer", "demo")["status"]

    status = await event(None)  # the listing: recorded, no pass
    assert "peerTokenRotation" not in status
    h.kube.obj("EventServer", "demo")["metadata"]["labels"] = {"x": "y"}
    assert "peerTokenRotation" not in await event("MODIFIED")  # not a request
    notes = h.kube.obj("EventServer", "demo")["metadata"].setdefault("annotations", {})
    notes["eventfleet.io/rotate-peer-token"] = "r1"
    notes["eventfleet.io/reconcile-update"] = "{}"  # Kopf's own: not a request
    status = await event("MODIFIED")
    assert status["peerTokenRotation"]["requested"] == "r1"
    assert status["peerTokenRotation"]["step"] == "Adding"


def test_request_annotations():
    meta = {
        "annotations": {
            "eventfleet.io/flush": "f1",
            "eventfleet.io/last-handled-configuration": "{}",
            "eventfleet.io/reconcile": "paused",
            "other.io/x": "1",
        }
    }
    assert naming.requests(meta) == (
        ("eventfleet.io/flush", "f1"),
        ("eventfleet.io/reconcile", "paused"),
    )
    assert naming.requests({}) == ()
