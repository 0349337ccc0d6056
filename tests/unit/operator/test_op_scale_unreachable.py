"""Scale-down while a leaving replica is unreachable, through the whole pass: the real
``ReplicaClient`` over HTTP to replica stubs (aiohttp servers speaking the /status and
/flush contract of docs/observability.md) and the operator's own volume-claim lookup
(``reconcilers.volumes.reach``) against the in-memory API. A leaving replica that does not
answer holds the scale-down while its claim ``data-<pod>`` exists (it may hold events
nobody else has); without a claim it never stored anything and the fleet shrinks."""

from __future__ import annotations

import base64
import socket

import pytest
from aiohttp import web
from eventfleet_operator import kube
from eventfleet_operator.replicas import ReplicaClient
from op_fakes import FakeEndpoints, status_doc
from op_pass import Harness


class StubReplica:
    """One replica's HTTP endpoint: /status and POST /flush, both behind the peer token."""

    def __init__(self, server_id: int, last_ids: dict[int, tuple[int, int]]) -> None:
        self.doc = status_doc(server_id, last_ids)
        self.token: str | None = None
        self.seen: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    def _authorised(self, request: web.Request) -> bool:
        self.seen.append(request.headers.get("Authorization", ""))
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _status(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "peer token required"}, status=401)
        return web.json_response(self.doc)

    async def _flush(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "peer token required"}, status=401)
        return web.json_response({"flushed": True, "last_ids": self.doc["last_ids"]})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/status", self._status)
        app.router.add_post("/flush", self._flush)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused: an unreachable replica)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class Urls(FakeEndpoints):
    def __init__(self, urls: dict[int, str]) -> None:
        super().__init__()
        self.urls = urls

    def url(self, namespace, name, ordinal, port):
        return self.urls[ordinal]


def claim(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"app.kubernetes.io/instance": "demo"},
        },
    }


@pytest.fixture
async def fleet():
    """A 3-replica fleet: ordinals 0 and 1 answer (and hold everything), 2 is gone."""
    h = Harness({"replicas": 3})
    await h.run()
    held = {1: (1, 10), 2: (1, 10), 3: (1, 10)}
    stubs = [StubReplica(1, held), StubReplica(2, held)]
    for stub in stubs:
        await stub.start()
    h.ctx.replicas = ReplicaClient(status_timeout=2.0, flush_timeout=2.0)
    h.ctx.endpoints = Urls({0: stubs[0].url, 1: stubs[1].url, 2: closed_port_url()})  # type: ignore[assignment]
    peer = h.kube.obj("Secret", "demo-peer-token")["data"]["token"]
    for stub in stubs:
        stub.token = base64.b64decode(peer).decode().strip()
    try:
        yield h, stubs
    finally:
        await h.ctx.replicas.close()
        for stub in stubs:
            await stub.stop()


async def test_an_unreachable_leaving_replica_with_a_volume_holds_the_scale_down(fleet):
    h, _ = fleet
    h.kube.put(claim("data-demo-2"))
    h.kube.put(claim("data-demo-20"))  # another ordinal's claim is not demo-2's
    h.set_spec({"replicas": 2})
    for _ in range(2):
        await h.run()
    assert h.sts()["spec"]["replicas"] == 3
    held = h.condition("ScaleDownHeld")
    assert (held["status"], held["reason"]) == ("True", "ReplicaUnreachable")
    assert "cannot verify leaving replica demo-2" in held["message"]
    assert h.condition("Ready")["reason"] == "ScaleDownHeld"
    # The leaving replica's volume was lost and its claim deleted: nothing left to lose.
    await h.kube.delete(kube.PVCS, "ns", "data-demo-2")
    await h.run()
    assert h.sts()["spec"]["replicas"] == 2
    done = h.condition("ScaleDownHeld")
    assert (done["status"], done["reason"]) == ("False", "ScaleDownVerified")


async def test_an_unreachable_leaving_replica_without_a_volume_leaves_at_once(fleet):
    h, _ = fleet
    h.kube.put(claim("data-demo-1"))  # the remaining replicas' claims do not matter
    h.set_spec({"replicas": 2})
    await h.run()
    assert h.sts()["spec"]["replicas"] == 2
    assert h.condition("ScaleDownHeld")["status"] == "False"


async def test_a_reachable_leaving_replica_is_flushed_with_the_peer_token(fleet):
    h, stubs = fleet
    third = StubReplica(3, {1: (1, 10), 2: (1, 10), 3: (1, 10)})
    third.token = stubs[0].token
    await third.start()
    try:
        h.ctx.endpoints.urls[2] = third.url  # type: ignore[attr-defined]
        h.kube.put(claim("data-demo-2"))
        h.set_spec({"replicas": 2})
        await h.run()
        assert h.sts()["spec"]["replicas"] == 2
        assert third.seen and set(third.seen) == {f"Bearer {third.token}"}
        assert h.condition("ScaleDownHeld")["reason"] == "ScaleDownVerified"
    finally:
        await third.stop()
