"""The Event BUS across a three-replica `eventfleet fleet`: an event published on one
replica's COLLECTOR reaches the BUS subscribers of the others (through the Syncer) and
Eventer subscribers using the real hat-event 0.9.44 client, with the same UUID and
producer everywhere; an Eventer registration reaches BUS subscribers everywhere; a
client failing over re-synchronises by SYNCSTART; a replica killed with SIGKILL under
BUS load comes back and every event it had broadcast is held by every replica."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import aiohttp
import pytest
from hat.drivers import net
from hat.event import common as hat
from hat.event.eventer import client as hat_client

from e2e.bus_client import BusClient, wait_live
from e2e.fleet_helpers import FleetProc, eventually

pytestmark = pytest.mark.slow


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def host_port(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.rsplit(":", 1)
    return host, int(port)


async def wait_ready(lines: dict[str, dict], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
        for line in lines.values():
            while True:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with s.get(f"http://{line['http']}/readyz") as resp:
                        if resp.status == 200:
                            break
                assert time.monotonic() < deadline, f"{line['name']} not ready"
                await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def fleet(tmp_path):
    proc = FleetProc(tmp_path / "fleet", 3).start()
    try:
        lines = await proc.wait_up()
        await wait_ready(lines)
        token = (tmp_path / "fleet" / "token").read_text().strip()
        yield proc, dict(sorted(lines.items())), token
    finally:
        proc.stop()


async def test_bus_and_eventer_across_the_fleet_both_ways(tmp_path):
    async with fleet(tmp_path) as (_, lines, token):
        a, b, c = lines.values()
        clients = {
            name: BusClient(port_of(line["bus_snapshot"]), plain=("e2e", token))
            for name, line in lines.items()
        }
        received: dict[str, list] = {"b": [], "c": []}
        hats = []
        try:
            for client in clients.values():
                client.subscribe("/fleet/")
            for client in clients.values():
                await wait_live(client, client, "/fleet/probe")

            def collect(key):
                def cb(_client, events):
                    received[key].extend(events)

                return cb

            for key, line in (("b", b), ("c", c)):
                hats.append(
                    await hat_client.connect(
                        net.TcpAddress(*host_port(line["eventer"])),
                        f"e2e/hat/{key}",
                        client_token=token,
                        subscriptions=[("fleet", "bus", "*")],
                        events_cb=collect(key),
                    )
                )

            # BUS on A -> BUS on B and C, Eventer (hat) on B and C.
            pub = clients[a["name"]]
            sent = {}
            for i in range(40):
                u = await pub.publish(f"/fleet/bus/{i % 4}", {"i": i}, producer="plc-7")
                sent[u] = i
            for name in (b["name"], c["name"]):
                got = {}
                while len(got) < len(sent):
                    event = await clients[name].recv(timeout=20)
                    if event.topic.startswith("/fleet/bus/"):
                        got[event.uuid] = event
                assert set(got) == set(sent), name
                assert all(
                    e.producer == "plc-7" and e.data == {"i": sent[u]} for u, e in got.items()
                )
                seqs = [e.sequence for e in got.values()]
                assert seqs == sorted(seqs)  # each replica's own sequence, increasing
            for key in ("b", "c"):
                await eventually(
                    _async(lambda key=key: len(received[key]) >= len(sent)), f"hat on {key}"
                )
                payloads = [e.payload.data for e in received[key]]
                assert sorted(p["data"]["i"] for p in payloads) == sorted(sent.values())
                assert {p["$bus"]["uuid"] for p in payloads} == set(sent)
                assert {tuple(e.type[:2]) for e in received[key]} == {("fleet", "bus")}

            # Eventer (hat) on B -> BUS on A and C, the same derived UUID on both.
            result = await hats[0].register(
                [
                    hat.RegisterEvent(("fleet", "eventer", str(i)), None, hat.EventPayloadJson(i))
                    for i in range(5)
                ],
                with_response=True,
            )
            assert result is not None and len(result) == 5
            views = {}
            for name in (a["name"], c["name"]):
                got = {}
                while len(got) < 5:
                    event = await clients[name].recv(timeout=20)
                    if event.topic.startswith("/fleet/eventer/"):
                        got[event.topic] = (event.uuid, event.producer, event.data)
                views[name] = got
            assert views[a["name"]] == views[c["name"]]
            assert {p for _, p, _ in views[a["name"]].values()} == {f"eventfleet/{b['server_id']}"}

            # Failover: a client of A re-synchronises on C by SYNCSTART from 0 (sequences
            # are per replica) and finds the same events under the same UUIDs.
            on_a, _ = await clients[a["name"]].syncstart("/fleet/")
            on_c, _ = await clients[c["name"]].syncstart("/fleet/")
            key = lambda e: (e.uuid, e.topic, e.producer, repr(e.data))  # noqa: E731
            assert {key(e) for e in on_a if "probe" not in e.topic} == {
                key(e) for e in on_c if "probe" not in e.topic
            }
        finally:
            for h in hats:
                await h.async_close()
            for client in clients.values():
                client.close()


def _async(check):
    async def run():
        return check()

    return run


async def test_kill_9_under_bus_load_every_broadcast_event_is_held_everywhere(tmp_path):
    async with fleet(tmp_path) as (proc, lines, token):
        a = next(iter(lines.values()))
        victim = BusClient(port_of(a["bus_snapshot"]), plain=("e2e", token))
        try:
            victim.subscribe("/load/")
            await wait_live(victim, victim, "/load/probe")
            broadcast: dict[str, str] = {}  # uuid -> topic, as A broadcast them

            async def publish() -> None:
                with contextlib.suppress(Exception):
                    for i in range(100_000):
                        await victim.publish(f"/load/{i % 3}", i)
                        if i % 20 == 0:
                            await asyncio.sleep(0.002)

            async def listen() -> None:
                with contextlib.suppress(TimeoutError):
                    while True:
                        event = await victim.recv(timeout=3)
                        broadcast[event.uuid] = event.topic

            publisher = asyncio.create_task(publish())
            listener = asyncio.create_task(listen())
            await eventually(_async(lambda: len(broadcast) > 1500), "load broadcast")
            os.kill(a["pid"], signal.SIGKILL)
            await listener
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
            assert broadcast
            # The supervisor restarts A; then every replica holds every broadcast event,
            # with the UUID A broadcast.
            await eventually(
                _async(lambda: (proc.latest()[a["name"]].get("restarts") or 0) >= 1
                       and proc.latest()[a["name"]].get("up")),
                "the supervisor restarted A",
                60,
            )  # fmt: skip
            lines = proc.latest()
            await wait_ready(lines)
            for line in lines.values():
                client = BusClient(port_of(line["bus_snapshot"]), plain=("e2e", token))
                try:

                    async def holds(client=client):
                        events, _ = await client.syncstart("/load/")
                        have = {e.uuid: e.topic for e in events}
                        return all(have.get(u) == t for u, t in broadcast.items())

                    await eventually(holds, f"{line['name']} holds A's broadcasts", 60)
                finally:
                    client.close()
        finally:
            victim.close()
