"""The peer credential on Kubernetes: its own Secret, mounted, configured, presented."""

from __future__ import annotations

import base64

import pytest
from eventfleet_operator import builders, model, naming, reconcile
from eventfleet_operator.reconcilers import deletion
from op_pass import LOG, Harness


def fleet(spec):
    return model.parse("demo", "ns", spec, uid="u-1")


def text(secret, key="token"):
    return base64.b64decode(secret["data"][key]).decode()


def volume(sts, name):
    return next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == name)


def test_replicas_read_the_peer_token_from_their_own_mount():
    spec = fleet({})
    config = builders.replica_config(spec, peer_count=3, allow_empty_start=True)
    assert config["peer_token_file"] == naming.PEER_TOKEN_PATH
    assert config["token_file"] == naming.TOKEN_PATH
    sts = builders.statefulset(spec, replicas=3, config_hash="h")
    assert volume(sts, "peer-token")["secret"] == {
        "secretName": "demo-peer-token",
        "items": [{"key": "token", "path": "token"}],
        "defaultMode": 0o440,
    }
    mounts = {
        m["name"]: m for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert mounts["peer-token"]["mountPath"] == naming.PEER_TOKEN_DIR
    assert naming.PEER_TOKEN_PATH.startswith(naming.PEER_TOKEN_DIR + "/")


def test_a_user_peer_secret_is_mounted_with_its_key_and_changes_the_config_hash():
    mine = fleet({"peerToken": {"secretRef": {"name": "peers", "key": "k"}}})
    assert mine.peer_token_ref == model.TokenRef("peers", "k", generated=False)
    sts = builders.statefulset(mine, replicas=1, config_hash="h")
    assert volume(sts, "peer-token")["secret"]["secretName"] == "peers"
    assert volume(sts, "peer-token")["secret"]["items"] == [{"key": "k", "path": "token"}]
    default = fleet({})
    config = builders.replica_config(default, peer_count=1, allow_empty_start=True)
    assert builders.config_hash(mine, config) != builders.config_hash(default, config)


def test_the_peer_secret_may_not_be_the_client_secret():
    with pytest.raises(model.SpecError) as e:
        fleet(
            {
                "token": {"secretRef": {"name": "t", "key": "k"}},
                "peerToken": {"secretRef": {"name": "t", "key": "k"}},
            }
        )
    assert e.value.field == "spec.peerToken.secretRef"
    fleet(
        {
            "token": {"secretRef": {"name": "t", "key": "k"}},
            "peerToken": {"secretRef": {"name": "t", "key": "peer"}},
        }
    )


def test_peer_token_secret_builder_is_owned_and_keeps_every_line():
    secret = builders.peer_token_secret(fleet({}), "new\nold\n")
    assert secret["metadata"]["name"] == "demo-peer-token"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert text(secret) == "new\nold\n"


async def test_a_new_fleet_gets_two_different_generated_secrets_and_keeps_them():
    h = Harness({"replicas": 2})
    await h.run()
    client, peer = h.kube.obj("Secret", "demo-token"), h.kube.obj("Secret", "demo-peer-token")
    assert naming.owned_by(peer, h.uid) and naming.owned_by(client, h.uid)
    assert len(text(peer).split()) == 1 and text(peer) != text(client)
    before = text(peer)
    await h.run()
    assert text(h.kube.obj("Secret", "demo-peer-token")) == before
    # Every call to a replica presented the peer token, never the client token.
    assert h.replicas.tokens and set(h.replicas.tokens) == {before}


async def test_a_user_peer_secret_is_used_not_generated_and_survives_cleanup():
    h = Harness({"replicas": 1, "peerToken": {"secretRef": {"name": "peers"}}})
    h.kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "peers", "namespace": "ns"},
            "data": {"token": base64.b64encode(b"p-new\np-old\n").decode()},
        }
    )
    await h.run()
    assert h.kube.obj("Secret", "demo-peer-token") is None
    assert set(h.replicas.tokens) == {"p-new"}  # the first line: what peers present
    await deletion.cleanup(h.ctx, h.body, LOG)
    assert h.kube.obj("Secret", "peers") is not None


async def test_a_missing_user_peer_secret_is_reported():
    h = Harness({"replicas": 1, "peerToken": {"secretRef": {"name": "nope"}}})
    await h.run()
    ready = h.condition("Ready")
    assert ready["status"] == "False"
    assert "spec.peerToken.secretRef.name: Secret 'nope' not found" in ready["message"]


async def test_an_upgraded_fleet_starts_its_peer_secret_with_the_client_token_first():
    # A fleet built before the peer Secret existed: its running pods accept only the
    # client token from peers and on /flush.
    h = Harness({"replicas": 2})
    await h.run()
    sts = h.sts()
    sts["spec"]["template"]["spec"]["volumes"] = [
        v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] != "peer-token"
    ]
    await h.kube.delete(reconcile.kube.SECRETS, "ns", "demo-peer-token")
    h.replicas.tokens.clear()
    await h.run()
    client = text(h.kube.obj("Secret", "demo-token"))
    lines = text(h.kube.obj("Secret", "demo-peer-token")).split()
    assert len(lines) == 2 and lines[0] == client and lines[1] != client
    assert set(h.replicas.tokens) == {client}
    assert volume(h.sts(), "peer-token")["secret"]["secretName"] == "demo-peer-token"
