"""Token rotation on Kubernetes: the operator sees a changed token Secret, follows the
replicas' reload (their reported fingerprints) and restarts nothing."""

from __future__ import annotations

import base64

from eventfleet_operator import tokens
from eventfleet_operator.constants import ConditionStatus, Reason
from eventfleet_server.listener.tokens import parse_tokens, token_fingerprint
from op_fakes import status_doc
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


def _secret_tokens(h, name):
    return tokens.parse(base64.b64decode(h.kube.obj("Secret", name)["data"]["token"]).decode())


def _replicas_load(h, count):
    """The fake replicas report the tokens the Secrets hold now (their reload)."""
    client, peer = _secret_tokens(h, "demo-token"), _secret_tokens(h, "demo-peer-token")
    for i in range(count):
        doc = status_doc(i + 1, {j + 1: (1, 0) for j in range(count)})
        doc["credentials"] = {
            "client": [tokens.fingerprint(t) for t in client],
            "peer": [tokens.fingerprint(t) for t in peer],
        }
        h.replicas.docs[i] = doc


def _set_peer_secret(h, text):
    secret = h.kube.obj("Secret", "demo-peer-token")
    secret["data"]["token"] = base64.b64encode(text.encode()).decode()


async def test_a_peer_rotation_is_followed_without_restarting_anything():
    h = Harness({"replicas": 2})
    await h.run()
    _replicas_load(h, 2)
    status = await h.run()
    assert h.condition("TokensLoaded")["status"] == "True"
    digest = status["tokensDigest"]
    template = h.sts()["spec"]["template"]
    (old,) = _secret_tokens(h, "demo-peer-token")

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
    assert _secret_tokens(h, "demo-peer-token") == (old, "new-peer")

    # The replicas reload: the condition turns True, with an Event.
    _replicas_load(h, 2)
    h.events.clear()
    await h.run()
    assert h.condition("TokensLoaded")["status"] == "True"
    assert ("Normal", "AllTokensLoaded") in [(t, r) for t, r, _ in h.events]

    # Step 2 and 3: the new one first, then alone; presented from then on.
    _set_peer_secret(h, f"new-peer\n{old}\n")
    _replicas_load(h, 2)
    h.replicas.tokens.clear()
    await h.run()
    _set_peer_secret(h, "new-peer\n")
    _replicas_load(h, 2)
    await h.run()
    assert set(h.replicas.tokens) == {"new-peer"}
    assert h.condition("TokensLoaded")["status"] == "True"
    assert h.sts()["spec"]["template"] == template
