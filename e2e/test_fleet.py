"""`eventfleet fleet`: three replica processes converge (our client and the real
hat-event 0.9.44 client register on every one), a SIGTERM stops them gracefully and a
second run on the same data directory resumes the same fleet; `kill -9` of a replica
under persisted load loses no acknowledged event and never repeats an id."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import pytest
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import EventPayloadJson, RegisterEvent
from hat.drivers import net
from hat.event import common as hat
from hat.event.eventer import client as hat_client

from e2e.fleet_helpers import HOST, FleetProc, free_block, wait_converged

pytestmark = pytest.mark.slow


def eventer_of(line: dict) -> tuple[str, int]:
    host, port = line["eventer"].rsplit(":", 1)
    return host, int(port)


async def register_on_every_replica(lines: dict[str, dict], tag: str, n: int) -> set:
    """`n` events through our client and `n` through hat's client on every replica."""
    ids = set()
    for name, line in sorted(lines.items()):
        host, port = eventer_of(line)
        ours = await connect(host, port, f"e2e/{tag}")
        try:
            for i in range(0, n, 5):
                created = await ours.register(
                    [RegisterEvent((tag, name, "ours", str(i + j)), None, None) for j in range(5)],
                    True,
                )
                ids.update((e.id.server, e.id.instance) for e in created)
        finally:
            await ours.close()
        theirs = await hat_client.connect(net.TcpAddress(host, port), f"e2e/hat/{tag}")
        try:
            for i in range(n):
                created = await theirs.register(
                    [
                        hat.RegisterEvent(
                            (tag, name, "hat", str(i)), None, hat.EventPayloadJson({"i": i})
                        )
                    ],
                    True,
                )
                ids.update((e.id.server, e.id.instance) for e in created)
        finally:
            await theirs.async_close()
    return ids


async def test_fleet_converges_stops_gracefully_and_resumes(tmp_path):
    base = free_block(3)
    fleet = FleetProc(tmp_path / "fleet", 3, base_port=base).start()
    try:
        lines = await fleet.wait_up()
        assert sorted(lines) == ["replica-1", "replica-2", "replica-3"]
        for i, name in enumerate(sorted(lines), start=1):
            line = lines[name]
            assert line["server_id"] == i and line["pid"] > 0
            assert line["eventer"] == f"{HOST}:{base + 10 * (i - 1)}"
            assert line["syncer"] == f"{HOST}:{base + 10 * (i - 1) + 1}"
            bus = base + 10 * (i - 1) + 2  # the Event BUS: P, P+1, P+2 (docs/bus.md)
            assert (line["bus_snapshot"], line["bus_publisher"], line["bus_collector"]) == (
                f"{HOST}:{bus}",
                f"{HOST}:{bus + 1}",
                f"{HOST}:{bus + 2}",
            )
            assert "http" in line
        eventers = [eventer_of(lines[n]) for n in sorted(lines)]
        registered = await register_on_every_replica(lines, "first", 20)
        assert len(registered) == 3 * 40
        held = await wait_converged(eventers, {1, 2, 3})
        assert registered <= set(held)
        assert fleet.stop() == 0  # SIGTERM: every replica stops gracefully
        assert "replica-1 exited with code 0" in fleet.supervisor_log()
    finally:
        fleet.stop()

    # Same data directory, no --base-port: the same fleet on the same ports.
    again = FleetProc(tmp_path / "fleet", 3).start()
    try:
        lines = await again.wait_up()
        assert [eventer_of(lines[n]) for n in sorted(lines)] == eventers
        before_max = {s: max(i for (srv, i) in held if srv == s) for s in (1, 2, 3)}
        more = await register_on_every_replica(lines, "second", 5)
        after = await wait_converged(eventers, {1, 2, 3})
        assert set(held) <= set(after) and more <= set(after)
        for server, instance in more:
            assert instance > before_max[server]
    finally:
        again.stop()


async def test_kill_9_under_persisted_load_loses_nothing_acknowledged(tmp_path):
    fleet = FleetProc(tmp_path / "fleet", 3, base_port=free_block(3)).start()
    acked: dict[tuple[int, int], tuple] = {}
    stop = asyncio.Event()
    failures = []

    async def writer(line: dict, rate: float) -> None:
        # One event per request, with response: an answer means it is committed.
        host, port = eventer_of(line)
        n = 0
        while not stop.is_set():
            try:
                client = await connect(host, port, f"e2e/load/{line['name']}", timeout=2)
            except (OSError, TimeoutError, ConnectionError):
                await asyncio.sleep(0.2)
                continue
            try:
                while not stop.is_set():
                    n += 1
                    payload = EventPayloadJson(json.dumps({"n": n, "t": time.time()}))
                    created = await asyncio.wait_for(
                        client.register(
                            [RegisterEvent(("load", line["name"]), None, payload)], True
                        ),
                        10,
                    )
                    if created is None:
                        failures.append((line["name"], n))  # refused, e.g. while stopping
                    else:
                        e = created[0]
                        acked[(e.id.server, e.id.instance)] = (e.id.session, e.type, e.payload)
                    await asyncio.sleep(1 / rate)
            except (ConnectionError, TimeoutError):
                pass  # the replica went away: reconnect
            finally:
                with contextlib.suppress(Exception):
                    await client.close()

    try:
        lines = await fleet.wait_up()
        eventers = [eventer_of(lines[n]) for n in sorted(lines)]
        writers = [asyncio.create_task(writer(lines[n], 50)) for n in sorted(lines)]
        await asyncio.sleep(3)
        victim = lines["replica-2"]
        before_kill = {k for k in acked if k[0] == 2}
        os.kill(victim["pid"], signal.SIGKILL)
        # The supervisor restarts it (logged reason, backoff) on the same data directory.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            newest = fleet.latest()["replica-2"]
            if newest["pid"] != victim["pid"] and newest["up"]:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("replica-2 was not restarted:\n" + fleet.supervisor_log())
        await asyncio.sleep(4)  # load continues on the restarted replica
        stop.set()
        await asyncio.wait_for(asyncio.gather(*writers), 30)

        held = await wait_converged(eventers, {1, 2, 3}, timeout=60)
        missing = set(acked) - set(held)
        assert not missing, (
            f"{len(missing)} acknowledged events missing, e.g. {sorted(missing)[:5]}"
        )
        for key, (session, type_, payload) in acked.items():
            e = held[key]
            assert (e[0].session, e[1], e[4]) == (session, type_, payload)  # never reused
        after_restart = {k for k in acked if k[0] == 2} - before_kill
        assert after_restart, "no registration acknowledged by the restarted replica"
        assert min(i for _, i in after_restart) > max(i for _, i in before_kill)
        log = fleet.supervisor_log()
        assert "replica-2 (server_id=2" in log and "killed by SIGKILL" in log
        assert "restarting in" in log
        # Load on every replica (a count, not a rate: throughput is the benchmarks' job).
        assert {server for server, _ in acked} == {1, 2, 3}
    finally:
        stop.set()
        fleet.stop()
