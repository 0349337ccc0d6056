"""Syncer faults with real replica processes: a wiped data directory is recovered from
the peers with ids continuing above the old ones, and replicas whose Syncer links are
cut by a (test-owned, pausable) TCP proxy converge once the links heal."""

from __future__ import annotations

import asyncio
import contextlib
import shutil

import pytest
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import RegisterEvent

from e2e.fleet_helpers import (
    LOOPBACK_CLIENTS,
    PausableProxy,
    ReplicaProc,
    eventually,
    free_block,
    mesh_peers,
    read_all,
    read_ids,
    status,
    wait_converged,
)

pytestmark = pytest.mark.slow


@contextlib.asynccontextmanager
async def replicas(tmp_path, n):
    base = free_block(n)
    token = tmp_path / "token"
    token.write_text("e2e-secret\n")
    procs = [
        ReplicaProc(
            tmp_path, f"r{i}", i, base + 10 * (i - 1), token_file=token, extra=LOOPBACK_CLIENTS
        )
        for i in range(1, n + 1)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


async def register(proc: ReplicaProc, tag: str, n: int, batch: int = 10) -> list:
    client = await connect(*proc.eventer, f"e2e/{tag}")
    created = []
    try:
        for i in range(0, n, batch):
            created += await client.register(
                [RegisterEvent((tag, proc.name, str(i + j)), None, None) for j in range(batch)],
                True,
            )
    finally:
        await client.close()
    return created


async def test_wiped_replica_recovers_history_and_continues_above_its_old_ids(tmp_path):
    async with replicas(tmp_path, 3) as procs:
        for p in procs:
            p.write_config(mesh_peers(procs))
            p.start()
        await asyncio.gather(*(p.wait_ready() for p in procs))
        old = {p.name: await register(p, "before", 100) for p in procs}
        eventers = [p.eventer for p in procs]
        before = await wait_converged(eventers, {1, 2, 3})

        victim = procs[2]
        victim.kill9()
        shutil.rmtree(victim.data_dir)
        victim.start()
        await victim.wait_ready()
        after = await wait_converged(eventers, {1, 2, 3})
        assert set(before) <= set(after)  # the whole history is back on the victim
        assert "identity: server_id=3 learned from peers" in victim.log()

        new = await register(victim, "after", 10)
        old_max = max(old["r3"], key=lambda e: e.id.instance).id
        assert new[0].id.instance > old_max.instance
        assert new[0].id.session > old_max.session
        ids = await read_ids(victim.eventer, 3)
        # Counted before any keying: an id stored twice would appear twice here.
        assert len(ids) == len(set(ids)) and len({(i.server, i.instance) for i in ids}) == len(ids)
        assert len(ids) >= sum(1 for key in before if key[0] == 3) + 10


async def test_cut_syncer_links_heal_and_converge(tmp_path):
    async with replicas(tmp_path, 3) as procs:
        a, b, c = procs
        # Every Syncer link to and from c goes through a proxy the test can cut.
        proxies = {}
        for src, dst in ((a, c), (b, c), (c, a), (c, b)):
            proxies[(src.name, dst.name)] = await PausableProxy(dst.ports["syncer"]).start()

        def peers_of(src):
            return [
                dst.entry(proxies[(src.name, dst.name)].port)
                if (src.name, dst.name) in proxies
                else dst.entry()
                for dst in procs
            ]

        try:
            for p in procs:
                p.write_config(peers_of(p))
                p.start()
            await asyncio.gather(*(p.wait_ready() for p in procs))
            eventers = [p.eventer for p in procs]
            await asyncio.gather(*(register(p, "before", 20) for p in procs))
            await wait_converged(eventers, {1, 2, 3})

            for proxy in proxies.values():
                proxy.pause()

            async def c_cut_off():
                doc = await status(c.http)
                return all(peer["state"] == "disconnected" for peer in doc["peers"])

            await eventually(c_cut_off, "c sees its peers disconnected")
            during = {p.name: await register(p, "during", 30) for p in procs}
            # a and b still replicate to each other; c is on its own.
            await wait_converged([a.eventer, b.eventer], {1, 2})
            on_c = await read_all(c.eventer, {1, 2})
            assert not {(e.id.server, e.id.instance) for e in during["r1"]} & set(on_c)
            on_a = await read_all(a.eventer, {3})
            assert not {(e.id.server, e.id.instance) for e in during["r3"]} & set(on_a)

            for proxy in proxies.values():
                proxy.resume()
            held = await wait_converged(eventers, {1, 2, 3}, timeout=60)
            for created in during.values():
                assert {(e.id.server, e.id.instance) for e in created} <= set(held)
            assert all(proxy.connections >= 2 for proxy in proxies.values())
        finally:
            for proxy in proxies.values():
                await proxy.close()
