"""/readyz and /status against real peers (the Syncer): initial sync, a peer leaving and
coming back. test_http.py pins the same HTTP behaviour with a stand-in syncer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import aiohttp
import pytest
from eventfleet_server import config
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import RegisterEvent
from eventfleet_server.main import Replica
from prometheus_client.parser import text_string_to_metric_families

WAIT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One replica of a two-replica mesh, with fixed Syncer ports so it can restart."""

    def __init__(self, tmp_path, name, server_id, syncer_port, *, allow_empty_start=True):
        self.name = name
        self.server_id = server_id
        self.syncer_port = syncer_port
        self.data_dir = tmp_path / name
        self.allow_empty_start = allow_empty_start
        self.peers: list[Node] = []
        self.replica: Replica | None = None
        self.start_task: asyncio.Task | None = None

    def conf(self):
        return config.load(
            None,
            environ={},
            overrides={
                "server_id": self.server_id,
                "data_dir": str(self.data_dir),
                "allow_empty_start": self.allow_empty_start,
                "eventer": {"port": 0},
                "syncer": {"port": self.syncer_port},
                "http": {"port": 0},
                "bus": {"port": 0, "enabled": False},
                "peers": [
                    {
                        "name": p.name,
                        "host": "127.0.0.1",
                        "port": p.syncer_port,
                        "server_id": p.server_id,
                    }
                    for p in self.peers
                ],
            },
        )

    async def start(self):
        """Begin starting; returns once /readyz can be asked (start may still be running)."""
        self.replica = Replica(self.conf(), None)
        self.start_task = asyncio.get_running_loop().create_task(self.replica.start())
        async with asyncio.timeout(WAIT):
            while not self._http_bound():
                if self.start_task.done():
                    self.start_task.result()  # raises what start() raised
                    break
                await asyncio.sleep(0.01)

    def _http_bound(self) -> bool:
        try:
            return self.replica.http is not None and self.replica.http.port > 0
        except (IndexError, RuntimeError):  # created, not started / not listening yet
            return False

    async def stop(self):
        if self.start_task and not self.start_task.done():
            self.start_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.start_task
        if self.replica:
            await self.replica.stop()
        self.replica = None

    def url(self, path):
        return f"http://127.0.0.1:{self.replica.http.port}{path}"


async def get_json(node, path):
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
        s.get(node.url(path)) as resp,
    ):
        return resp.status, await resp.json()


async def eventually(check, what):
    last = None
    try:
        async with asyncio.timeout(WAIT):
            while True:
                last = await check()
                if last[0]:
                    return last[1]
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}; last seen: {last}")


def peer_state(doc, name):
    return next((p["state"] for p in doc["peers"] if p["name"] == name), None)


@contextlib.asynccontextmanager
async def mesh(tmp_path, *, r1_allow_empty_start=True):
    r1 = Node(tmp_path, "r1", 1, free_port(), allow_empty_start=r1_allow_empty_start)
    r2 = Node(tmp_path, "r2", 2, free_port())
    r1.peers, r2.peers = [r2], [r1]
    try:
        yield r1, r2
    finally:
        await r2.stop()
        await r1.stop()


async def test_readyz_is_not_ready_before_the_initial_sync_and_ready_after(tmp_path):
    async with mesh(tmp_path, r1_allow_empty_start=False) as (r1, r2):
        # r1 may not start empty and its only peer is down: alive, not ready.
        await r1.start()
        status, body = await get_json(r1, "/healthz")
        assert status == 200
        status, body = await get_json(r1, "/readyz")
        assert status == 503 and body["ready"] is False, body
        _, doc = await get_json(r1, "/status")
        assert doc["ready"] is False

        await r2.start()
        await r2.start_task
        client = await connect("127.0.0.1", r2.replica.eventer.port, "test/sync")
        try:
            created = await client.register(
                [RegisterEvent(("sync", str(i)), None, None) for i in range(3)], True
            )
        finally:
            await client.close()

        async def r1_ready():
            status, body = await get_json(r1, "/readyz")
            return status == 200, body

        await eventually(r1_ready, "r1 ready after its initial sync with r2")

        async def r1_holds_r2_events():
            _, doc = await get_json(r1, "/status")
            held = doc["last_ids"].get("2")
            return held is not None and held["instance"] >= created[-1].id.instance, doc

        doc = await eventually(r1_holds_r2_events, "r2's events on r1")
        assert doc["ready"] is True and doc["status"] == "operational"


async def test_status_reflects_a_peer_going_away_and_coming_back(tmp_path):
    async with mesh(tmp_path) as (r1, r2):
        await r1.start()
        await r2.start()
        await asyncio.gather(r1.start_task, r2.start_task)

        async def r2_state_is(states):
            async def check():
                _, doc = await get_json(r1, "/status")
                return peer_state(doc, "r2") in states, doc

            return check

        doc = await eventually(await r2_state_is({"synced"}), "r1 synced with r2")
        entry = next(p for p in doc["peers"] if p["name"] == "r2")
        assert entry["server_id"] == 2

        assert await peer_metrics(r1, "r2") == (1.0, 1.0)

        await r2.stop()
        doc = await eventually(await r2_state_is({"disconnected"}), "r2 reported gone")
        # Losing a peer does not make r1 unready: it still serves its clients.
        assert doc["ready"] is True
        assert (await get_json(r1, "/readyz"))[0] == 200
        assert await peer_metrics(r1, "r2") == (0.0, 0.0)

        await r2.start()
        await r2.start_task
        await eventually(await r2_state_is({"synced"}), "r2 back and synced")
        assert await peer_metrics(r1, "r2") == (1.0, 1.0)


async def peer_metrics(node, peer) -> tuple[float, float]:
    """(eventfleet_syncer_peer_connected, eventfleet_syncer_peer_synced) for `peer`."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
        s.get(node.url("/metrics")) as resp,
    ):
        text = await resp.text()
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("peer") == peer
    }
    return (
        values["eventfleet_syncer_peer_connected"],
        values["eventfleet_syncer_peer_synced"],
    )
