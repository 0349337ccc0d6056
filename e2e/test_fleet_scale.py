"""Scale a running fleet from 3 to 5 replicas and back to 3 by rewriting the peer lists
(hot reload, no restart): no client connection drops, no event is lost."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import RegisterEvent

from e2e.fleet_helpers import (
    LOOPBACK_CLIENTS,
    ReplicaProc,
    eventually,
    free_block,
    mesh_peers,
    status,
    wait_converged,
)

pytestmark = pytest.mark.slow


async def register(proc: ReplicaProc, tag: str, n: int) -> set:
    client = await connect(*proc.eventer, f"e2e/{tag}")
    try:
        created = await client.register(
            [RegisterEvent((tag, proc.name, str(i)), None, None) for i in range(n)], True
        )
    finally:
        await client.close()
    return {(e.id.server, e.id.instance) for e in created}


async def flush(leaving: ReplicaProc, peer: str) -> None:
    """The operator's scale-down step: the leaving replica proves `peer` holds its events."""
    url = f"{leaving.http}/flush?peer={peer}&timeout=10"
    # /flush changes state: it needs the peer token (here the one shared token).
    token = leaving.token_file.read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as s, s.post(url, headers=headers) as resp:
        body = await resp.json()
        assert resp.status == 200 and body["flushed"], body


async def test_scale_3_to_5_to_3_without_dropping_clients_or_events(tmp_path):
    base = free_block(5)
    token = tmp_path / "token"
    token.write_text("e2e-secret\n")
    procs = [
        ReplicaProc(
            tmp_path, f"r{i}", i, base + 10 * (i - 1), token_file=token, extra=LOOPBACK_CLIENTS
        )
        for i in range(1, 6)
    ]
    core, extra = procs[:3], procs[3:]
    watchers = []
    seen: dict[str, set] = {}
    try:
        for p in core:
            p.write_config(mesh_peers(core))
            p.start()
        await asyncio.gather(*(p.wait_ready() for p in core))
        for p in core:
            got = seen[p.name] = set()
            watchers.append(
                await connect(
                    *p.eventer,
                    f"e2e/watch/{p.name}",
                    subscriptions=[("scale", "*")],
                    events_cb=lambda events, got=got: got.update(
                        (e.id.server, e.id.instance) for e in events
                    ),
                )
            )
        registered = set()
        for p in core:
            registered |= await register(p, "scale", 10)

        # Up: two new replicas with the full list, then the three rewrite theirs.
        for p in extra:
            p.write_config(mesh_peers(procs))
            p.start()
        for p in core:
            p.write_config(mesh_peers(procs))
        await asyncio.gather(*(p.wait_ready() for p in extra))

        async def all_five_synced():
            for p in procs:
                doc = await status(p.http)
                states = {peer["name"]: peer["state"] for peer in doc["peers"]}
                if len(states) != 4 or set(states.values()) != {"synced"}:
                    return False
            return True

        await eventually(all_five_synced, "every replica synced with the four others")
        for p in procs:
            registered |= await register(p, "scale", 10)
        await wait_converged([p.eventer for p in procs], {1, 2, 3, 4, 5})

        # Down: flush the leaving replicas to every remaining one, stop them, rewrite.
        for p in extra:
            for peer in core:
                await flush(p, peer.name)
            assert p.stop() == 0
        for p in core:
            p.write_config(mesh_peers(core))

        async def three_left():
            for p in core:
                doc = await status(p.http)
                if sorted(peer["name"] for peer in doc["peers"]) != sorted(
                    q.name for q in core if q is not p
                ):
                    return False
            return True

        await eventually(three_left, "the three replicas dropped the two others")
        for p in core:
            registered |= await register(p, "scale", 10)
        held = await wait_converged([p.eventer for p in core], {1, 2, 3, 4, 5})
        assert registered <= set(held)
        assert len(registered) == 3 * 10 + 5 * 10 + 3 * 10

        # No client connection dropped, and every watcher saw every event.
        assert all(not w.is_closed for w in watchers)
        for name, got in seen.items():
            assert registered <= got, f"{name}'s watcher missed {len(registered - got)} events"
    finally:
        for w in watchers:
            await w.close()
        for p in procs:
            p.stop()


async def test_sighup_reloads_the_peer_list_at_once(tmp_path):
    base = free_block(2)
    no_polling = {"syncer": {"reload_interval": 3600.0}}  # only SIGHUP can reload
    a = ReplicaProc(tmp_path, "a", 1, base, extra=no_polling)
    b = ReplicaProc(tmp_path, "b", 2, base + 10, extra=no_polling)
    try:
        for p in (a, b):
            p.write_config([])
            p.start()
        await asyncio.gather(a.wait_ready(), b.wait_ready())
        assert (await status(a.http))["peers"] == []
        for p in (a, b):
            p.write_config(mesh_peers([a, b]))
            p.proc.send_signal(signal.SIGHUP)

        async def synced():
            for p in (a, b):
                peers = (await status(p.http))["peers"]
                if [x["state"] for x in peers] != ["synced"]:
                    return False
            return True

        await eventually(synced, "both replicas synced after SIGHUP", timeout=20)
        created = await register(b, "hup", 3)
        held = await wait_converged([a.eventer, b.eventer], {1, 2})
        assert created <= set(held)
        assert "peer reload (SIGHUP)" in a.log()
    finally:
        a.stop()
        b.stop()
