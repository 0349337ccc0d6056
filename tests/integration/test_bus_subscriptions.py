"""The Event BUS in a replica in this process, through real ZeroMQ sockets: a
subscription made before SYNCSTART gets every commit after the snapshot's SYNCEND,
however recently the publisher's subscriptions were last read."""

from __future__ import annotations

import asyncio

import pytest
from eventfleet_server.bus import server as bus_server

from e2e.bus_client import BusClient
from e2e.ports import free_block
from tests.conftest import running_replica


async def _snapshot_until(client: BusClient, data: str, timeout: float = 10.0) -> None:
    """SYNCSTART until the snapshot holds a PUB of `data` (it is committed)."""
    async with asyncio.timeout(timeout):
        while True:
            events, _ = await client.syncstart("")
            if any(e.data == data for e in events):
                return
            await asyncio.sleep(0.05)


async def test_a_subscription_made_before_syncstart_gets_the_next_commit(tmp_path, monkeypatch):
    # Commits read the publisher's subscriptions at most every _SUBSCRIPTIONS_EVERY
    # (2 ms); stretched here, so that the read a commit made before this client
    # subscribed is still the one in force when the next commit comes.
    monkeypatch.setattr(bus_server, "_SUBSCRIPTIONS_EVERY", 3600.0)
    port = free_block(3)
    async with running_replica(tmp_path / "r1", bus={"port": port, "enabled": True}):
        async with BusClient(port) as publisher, BusClient(port) as subscriber:
            await publisher.publish("/clone/state", "before")
            await _snapshot_until(publisher, "before")  # committed: nobody subscribed then
            subscriber.subscribe("")
            await asyncio.sleep(0.5)  # the subscription reaches the server's socket
            events, head = await subscriber.syncstart("")
            assert [e.data for e in events] == ["before"]
            await publisher.publish("/clone/state", "after")
            try:
                event = await subscriber.recv(timeout=5)
            except TimeoutError:
                pytest.fail("the commit after SYNCEND was not broadcast to the subscriber")
            assert (event.topic, event.data, event.sequence) == ("/clone/state", "after", head + 1)
