"""Token rotation on Kubernetes: the operator sees a changed token Secret, follows the
replicas' reload (their reported fingerprints) and restarts nothing."""

from __future__ import annotations

import base64

from eventfleet_operator import tokens
from eventfleet_operator.constants import ConditionStatus, Reason
from eventfleet_server.listener.tokens import parse_tokens, token_fingerprint
from op_pass import Harness


def test_parse_and_fingerprint_agree_with_the_replica():
    text = "# rotated 2026-11\n\n new-token \nold-token\nnew-token\n"
    assert tokens.parse(text) == parse_tokens(text) == ("new-token", "old-token")
    assert tokens.fingerprint("new-token") == token_fingerprint("new-token")


def test_verdict():
    exp = tokens.Expected.of(["c"], ["p2", "p1"])
    good = {"client": [tokens.fingerprint("c")], "peer": list(exp.peer)}
    old = {"client": [tokens.fingerprint("c")], "peer": [tokens.fingerprint("p1")]}
    v = tokens.verdict(exp, [("a-0", good, True), ("a-1", good, True)], "S")
    assert v[:2] == (ConditionStatus.TRUE, Reason.ALL_TOKENS_LOADED)
    v = tokens.verdict(exp, [("a-0", good, True), ("a-1", old, True)], "S")
    assert v[:2] == (ConditionStatus.FALSE, Reason.TOKENS_RELOADING) and "(a-1)" in v[2]
    # The order counts: the first peer token is the one presented.
    swapped = {**good, "peer": list(reversed(exp.peer))}
    assert tokens.verdict(exp, [("a-0", swapped, True)], "S")[0] is ConditionStatus.FALSE
    v = tokens.verdict(exp, [("a-0", good, True), ("a-1", None, True)], "S")
    assert v[:2] == (ConditionStatus.UNKNOWN, Reason.TOKENS_UNKNOWN) and "a-1" in v[2]
    assert tokens.verdict(None, [("a-0", good, True)], "S")[0] is ConditionStatus.UNKNOWN
    assert exp.digest() != tokens.Expected.of(["c"], ["p1", "p2"]).digest()


def _set_peer_secret(h, text):
    secret = h.kube.obj("Secret", "demo-peer-token")
    secret["data"]["token"] = base64.b64encode(text.encode()).decode()


async def test_a_peer_rotation_is_followed_without_restarting_anything():
    h = Harness({"replicas": 2})
    await h.run()
    h.replicas_load(2)
    status = await h.run()
    assert h.condition("TokensLoaded")["status"] == "True"
    digest = status["tokensDigest"]
    template = h.sts()["spec"]["template"]
    (old,) = h.secret_tokens("demo-peer-token")

    # Step 1: the new token second. Nothing has reloaded yet.
    _set_peer_secret(h, f"{old}\nnew-peer\n")
    h.events.clear()
    h.replicas.tokens.clear()
    status = await h.run()
    assert status["tokensDigest"] != digest
    loaded = h.condition("TokensLoaded")
    assert (loaded["status"], loaded["reason"]) == ("False", "TokensReloading")
    assert "demo-0, demo-1" in loaded["message"]
    reasons = [r for _, r, _ in h.events]
    assert "TokensChanged" in reasons and "TokensReloading" in reasons
    # The operator keeps presenting what every replica accepts: the first line.
    assert set(h.replicas.tokens) == {old}
    # Not a restart: the pod template (config hash, revision) is unchanged.
    assert h.sts()["spec"]["template"] == template
    # The operator keeps what the user put into its Secret.
    assert h.secret_tokens("demo-peer-token") == (old, "new-peer")

    # The replicas reload: the condition turns True, with an Event.
    h.replicas_load(2)
    h.events.clear()
    await h.run()
    assert h.condition("TokensLoaded")["status"] == "True"
    assert ("Normal", "AllTokensLoaded") in [(t, r) for t, r, _ in h.events]

    # Step 2 and 3: the new one first, then alone; presented from then on.
    _set_peer_secret(h, f"new-peer\n{old}\n")
    h.replicas_load(2)
    h.replicas.tokens.clear()
    await h.run()
    _set_peer_secret(h, "new-peer\n")
    h.replicas_load(2)
    await h.run()
    assert set(h.replicas.tokens) == {"new-peer"}
    assert h.condition("TokensLoaded")["status"] == "True"
    assert h.sts()["spec"]["template"] == template


def test_rotation_steps_keep_every_pair_of_replicas_compatible():
    step = tokens.rotation_step("", ("old",), loaded=False, new_token="new")
    assert (step.step, step.write) == ("Pending", None)
    step = tokens.rotation_step("Pending", ("old",), loaded=True, new_token="new")
    assert (step.step, step.write) == ("Adding", ("old", "new"))
    # Not loaded yet: no step, whatever the Secret holds.
    assert tokens.rotation_step("Adding", ("old", "new"), False, "x").write is None
    step = tokens.rotation_step("Adding", ("old", "new"), True, "x")
    assert (step.step, step.write) == ("Swapping", ("new", "old"))
    step = tokens.rotation_step("Swapping", ("new", "old"), True, "x")
    assert (step.step, step.write) == ("Removing", ("new",))
    step = tokens.rotation_step("Removing", ("new",), True, "x")
    assert (step.step, step.write) == ("Done", None)
    assert tokens.rotation_step("Done", ("new",), True, "x").write is None
    # Someone edited the Secret meanwhile: stop rather than guess.
    step = tokens.rotation_step("Swapping", ("a", "b", "c"), True, "x")
    assert step.step == "Refused" and "changed during the rotation" in step.message


async def test_the_operator_rotates_the_generated_peer_token_step_by_step():
    h = Harness({"replicas": 2})
    await h.run()
    h.replicas_load(2)
    await h.run()
    (old,) = h.secret_tokens("demo-peer-token")
    template = h.sts()["spec"]["template"]
    h.annotate(rotate_peer_token="r1")
    seen = []
    for _ in range(12):
        status = await h.run()
        rotation = status["peerTokenRotation"]
        live = h.secret_tokens("demo-peer-token")
        if not seen or seen[-1] != (rotation["step"], live):
            seen.append((rotation["step"], live))
        # Every call to a replica presents what every replica accepts right now.
        assert set(h.replicas.tokens[-4:]) <= set(live) | {old}
        h.replicas.tokens.clear()
        if rotation["step"] == "Done":
            break
        h.replicas_load(2)  # the replicas reload what the Secret holds now
    new = seen[0][1][1]
    assert new != old
    assert [s for s, _ in seen] == ["Adding", "Swapping", "Removing", "Done"]
    assert [live for _, live in seen] == [(old, new), (new, old), (new,), (new,)]
    assert h.sts()["spec"]["template"] == template  # nothing restarted
    reasons = [r for _, r, _ in h.events]
    assert reasons.count("PeerTokenRotation") == 3 and reasons.count("PeerTokenRotated") == 1
    # Done is kept: the same annotation value does nothing more.
    await h.run()
    assert h.secret_tokens("demo-peer-token") == (new,)
    assert h.body["status"]["peerTokenRotation"]["requested"] == "r1"


async def test_a_step_waits_until_every_replica_has_loaded_the_last_one():
    h = Harness({"replicas": 2})
    await h.run()
    h.replicas_load(2)
    await h.run()
    h.annotate(rotate_peer_token="r1")
    await h.run()
    assert h.body["status"]["peerTokenRotation"]["step"] == "Adding"
    for _ in range(3):  # the replicas still run the old tokens
        await h.run()
    assert h.body["status"]["peerTokenRotation"]["step"] == "Adding"
    assert len(h.secret_tokens("demo-peer-token")) == 2


async def test_a_users_peer_secret_is_not_rotated_by_the_operator():
    h = Harness({"replicas": 1, "peerToken": {"secretRef": {"name": "peers"}}})
    h.kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "peers", "namespace": "ns"},
            "data": {"token": base64.b64encode(b"mine\n").decode()},
        }
    )
    h.annotate(rotate_peer_token="r1")
    status = await h.run()
    assert status["peerTokenRotation"]["step"] == "Refused"
    assert "rotate it by hand" in status["peerTokenRotation"]["message"]
    assert h.kube.obj("Secret", "peers")["data"]["token"] == base64.b64encode(b"mine\n").decode()
    assert ("Warning", "PeerTokenRotationRefused") in [(t, r) for t, r, _ in h.events]


async def test_an_edit_of_the_token_secret_during_a_pass_is_not_reverted():
    h = Harness({"replicas": 1})
    await h.run()
    (old,) = h.secret_tokens("demo-peer-token")
    _set_peer_secret(h, f"{old}\nstep-1\n")  # a hand edit: the next pass re-applies it
    real_get = h.kube.get
    reads = []

    async def get(resource, namespace, name):
        live = await real_get(resource, namespace, name)
        if name == "demo-peer-token":
            reads.append(name)
            if len(reads) == 2:
                # Right after the operator read it to build the Secret (the first read of
                # a pass is the ownership check): the next rotation step lands.
                edited = h.kube.objects[("Secret", "ns", name)]
                edited["data"]["token"] = base64.b64encode(f"step-1\n{old}\n".encode()).decode()
                edited["metadata"]["resourceVersion"] = str(
                    int(edited["metadata"]["resourceVersion"]) + 1000
                )
        return live

    h.kube.get = get  # type: ignore[method-assign]
    await h.run()
    assert h.secret_tokens("demo-peer-token") == ("step-1", old)
    h.kube.get = real_get  # type: ignore[method-assign]
    await h.run()
    assert h.secret_tokens("demo-peer-token") == ("step-1", old)
