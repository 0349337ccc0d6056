"""Abuse against a real replica process (`eventfleet server`), each with a number:

* a maximal register request (max_events_per_request events filling max_msg_size)
  while another process polls ``/healthz``: every answer under 100 ms (plus the worst
  answer of the idle second before: a few ms on a quiet machine). On a machine busier
  than its cores (load average / cores > 1, e.g. several engineers' test runs on two
  cores) the replica gets that much less CPU, and the 100 ms scale with that factor;
  CI runs the suite alone, where the factor is 1;
* a client that sends queries (and pings) but never reads: closed with a logged,
  counted reason (``slow_client``), memory back near the baseline;
* the N+1st connection refused (``too_many_connections``), the first N served;
* 1,000 and 10,000 idle raw TCP connections (from the client's own address, from one
  other address, spread over 100 addresses): a client with a valid token still connects
  and registers. The time it takes is printed; the only bound is `connect`'s own 10 s
  timeout, far above the ~10 ms it takes (so a busy CI machine cannot fail it): what the
  test asserts is that the client is admitted at all, which it was not before
  connections that have not initialised got their own budget (issue 26).
* 1,000 idle raw TCP connections to the HTTP port: ``/readyz`` and ``/metrics`` still
  answer (the time printed, no bound asserted); before the pre-request budget
  (http/budget.py) aiohttp held every one of them open, without a time limit.

The latencies and memory figures are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from eventfleet_server import chatter
from eventfleet_server.client.eventer import connect
from eventfleet_server.common import codec
from eventfleet_server.common.model import (
    EventPayloadBinary,
    QueryLatestParams,
    RegisterEvent,
)
from eventfleet_server.http.budget import HTTP_LIMITS

from e2e.fleet_helpers import ReplicaProc, free_block, mesh_peers, read_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

POLLER = r"""
import http.client, json, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
lat = []
end = time.monotonic() + seconds
print("ready", flush=True)
while time.monotonic() < end:
    t = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", "/healthz")
    assert c.getresponse().status == 200
    c.close()
    lat.append((time.time(), time.perf_counter() - t))
    time.sleep(0.01)
print(json.dumps(lat))
"""


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kib = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
    return kib / 1024


async def metric(replica: ReplicaProc, sample: str) -> float | None:
    """The value of one sample of the replica's ``/metrics`` (name and labels exactly as
    exposed), None when it is not there."""
    async with aiohttp.ClientSession() as s, s.get(replica.http + "/metrics") as res:
        text = await res.text()
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def rejected(replica: ReplicaProc, reason: str, protocol: str = "eventer") -> float:
    sample = f'eventfleet_rejected_total{{protocol="{protocol}",reason="{reason}"}}'
    return await metric(replica, sample) or 0.0


async def open_connections(replica: ReplicaProc, protocol: str = "eventer") -> float:
    sample = f'eventfleet_connections{{protocol="{protocol}"}}'
    value = await metric(replica, sample)
    assert value is not None, f"no {sample} in /metrics"
    return value


async def connections_drop_to(replica: ReplicaProc, n: int, timeout: float = 10.0) -> None:
    """Until the replica reports at most `n` open Eventer connections (bounded)."""
    deadline = time.monotonic() + timeout
    while (now := await open_connections(replica)) > n:
        assert time.monotonic() < deadline, f"still {now} Eventer connections after {timeout} s"
        await asyncio.sleep(0.05)


async def start(tmp_path, extra: dict) -> ReplicaProc:
    replica = ReplicaProc(tmp_path, "r1", 1, free_block(1), extra=extra).start()
    await replica.wait_ready()
    return replica


@pytest.mark.parametrize("peered", [False, True], ids=["alone", "with-a-peer"])
async def test_maximal_register_request_keeps_healthz_under_100ms(tmp_path, peered):
    # With a peer, the replica also sends the whole session to it over the Syncer.
    base = free_block(2)
    procs = [ReplicaProc(tmp_path, f"r{i}", i, base + 10 * (i - 1)) for i in (1, 2)]
    procs = procs if peered else procs[:1]
    for p in procs:
        p.write_config(mesh_peers(procs) if peered else [])
        p.start()
    for p in procs:
        await p.wait_ready()
    replica = procs[0]
    try:
        # 10,000 events (max_events_per_request) filling 16 MiB (max_msg_size).
        payload = EventPayloadBinary("blob", b"x" * 1600)
        events = [RegisterEvent(("abuse", "big", str(i)), None, payload) for i in range(10_000)]
        poller = subprocess.Popen(  # noqa: ASYNC220 (its output is read after the run)
            [sys.executable, "-c", POLLER, "127.0.0.1", str(replica.ports["http"]), "8"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert poller.stdout.readline().strip() == "ready"
        client = await connect(*replica.eventer, "big", timeout=60)
        try:
            idle_from = time.time()
            await asyncio.sleep(1.5)  # the poller's baseline
            started = time.time()
            created = await client.register(events, with_response=True)
            ended = time.time()
        finally:
            await client.close()
        polls = json.loads(poller.communicate(timeout=60)[0])
        assert created is not None and len(created) == 10_000
        idle = [lat for at, lat in polls if idle_from + 0.3 <= at < started]
        during = [lat for at, lat in polls if started <= at <= ended + 0.05]
        assert len(idle) > 20 and len(during) > 5, (len(idle), len(during))
        worst, noise = max(during), max(idle)
        load = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
        limit = 0.1 * load + noise
        print(
            f"\nmaximal register (10,000 events, 16 MiB, {'with' if peered else 'no'} peer): "
            f"{ended - started:.2f} s; /healthz "
            f"{len(during)} polls meanwhile, worst {worst * 1000:.1f} ms, median "
            f"{sorted(during)[len(during) // 2] * 1000:.1f} ms; idle worst {noise * 1000:.1f} ms; "
            f"load factor {load:.1f}, limit {limit * 1000:.0f} ms"
        )
        assert worst < limit, f"/healthz took {worst * 1000:.0f} ms during the request"
        if peered:

            async def replicated() -> int:
                held = await read_all(procs[1].eventer, {1})
                return sum(1 for e in held.values() if e[1][0] == "abuse")

            deadline = time.monotonic() + 60
            while (count := await replicated()) < 10_000:
                assert time.monotonic() < deadline, f"{count} of 10,000 replicated"
                await asyncio.sleep(0.5)
            assert count == 10_000
    finally:
        for p in procs:
            p.stop()


async def test_client_that_never_reads_is_closed_and_memory_returns(tmp_path):
    extra = {"eventer": {"max_write_buffer": 4 * 1024 * 1024, "send_timeout": 3}}
    replica = await start(tmp_path, extra)
    try:
        writer = await connect(*replica.eventer, "writer")
        payload = EventPayloadBinary("blob", b"y" * 1000)
        for chunk in range(4):
            batch = [RegisterEvent(("mem", str(chunk), str(i)), None, payload) for i in range(500)]
            await writer.register(batch, with_response=True)
        # Warm up with the same query answered to a reader: caches are part of the baseline.
        for _ in range(3):
            await writer.query(QueryLatestParams([("mem", "*")]))
        await writer.close()
        await asyncio.sleep(1)
        baseline = rss_mib(replica.proc.pid)

        # A raw chatter connection: init, then queries and pings, never a read.
        conn = await chatter.connect(*replica.eventer, ping_delay=None)
        init = codec.repo.encode(
            "HatEventer.MsgInitReq",
            {
                "clientName": "sink",
                "clientToken": ("none", None),
                "subscriptions": [],
                "serverId": ("none", None),
                "persisted": False,
            },
        )
        conn.send("HatEventer.MsgInitReq", init, last=False)
        await conn.receive()
        query = codec.repo.encode(
            "HatEventer.MsgQueryReq", codec.query_params_to_sbs(QueryLatestParams([("mem", "*")]))
        )
        peak = baseline
        closed_after = None
        started = time.monotonic()
        while time.monotonic() - started < 60:
            try:
                conn.send("HatEventer.MsgQueryReq", query, last=False)
                conn.send("HatChatter.Ping", b"", last=False)
            except ConnectionError:
                pass
            await asyncio.sleep(0.05)
            peak = max(peak, rss_mib(replica.proc.pid))
            if await rejected(replica, "slow_client") >= 1:
                closed_after = time.monotonic() - started
                break
        assert closed_after is not None, "the non-reading client was never closed"
        conn.abort()
        await asyncio.sleep(2)
        after = rss_mib(replica.proc.pid)
        print(
            f"\nnever-reading client closed after {closed_after:.1f} s; RSS baseline "
            f"{baseline:.0f} MiB, peak {peak:.0f} MiB, after {after:.0f} MiB"
        )
        assert "not reading" in replica.log()
        assert after < baseline + 16, (baseline, peak, after)
        # The replica serves others as before.
        other = await connect(*replica.eventer, "other")
        result = await other.query(QueryLatestParams([("mem", "0", "1")]))
        await other.close()
        assert len(result.events) == 1
    finally:
        replica.stop()


async def test_connection_beyond_max_connections_is_refused(tmp_path):
    n = 20
    replica = await start(tmp_path, {"eventer": {"admission": {"max_connections": n}}})
    try:
        clients = [await connect(*replica.eventer, f"c{i}") for i in range(n)]
        try:
            with pytest.raises((ConnectionError, OSError, TimeoutError, asyncio.TimeoutError)):
                await connect(*replica.eventer, "one-too-many", timeout=5)
            assert await rejected(replica, "too_many_connections") == 1
            # The first N still work.
            result = await clients[-1].query(QueryLatestParams([("*",)]))
            assert result.events == []
        finally:
            for c in clients:
                await c.close()
        # Places are freed once the replica has seen the closes (a client's close does
        # not wait for the server's side), then a new client is admitted again.
        await connections_drop_to(replica, 0)
        again = await connect(*replica.eventer, "again")
        await again.close()
        assert await rejected(replica, "too_many_connections") == 1
    finally:
        replica.stop()


async def _open_idle(port: int, sources: list[str], n: int) -> list[socket.socket]:
    """`n` raw TCP connections to 127.0.0.1:`port`, round-robin over the `sources`
    addresses, that never send a byte; opened 200 at a time (the listen backlog)."""
    loop = asyncio.get_running_loop()
    held: list[socket.socket] = []

    async def one(source: str) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        held.append(sock)
        sock.bind((source, 0))
        with contextlib.suppress(OSError):  # refused or reset: the server chose
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), 20)

    for start in range(0, n, 200):
        batch = range(start, min(n, start + 200))
        await asyncio.gather(*(one(sources[i % len(sources)]) for i in batch))
    return held


def _socket_fds(pid: int) -> int:
    """Sockets the process `pid` holds open (the server's side of the count)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return n


def _still_open(socks: list[socket.socket]) -> int:
    """How many of `socks` the server has not closed (no EOF, no reset, nothing sent)."""
    n = 0
    for sock in socks:
        try:
            sock.getpeername()
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # b"": closed
        except BlockingIOError:
            n += 1  # connected, nothing to read: open and idle
        except OSError:
            pass  # reset (evicted) or never connected
    return n


@pytest.mark.parametrize(
    ("flood", "sources"),
    [
        (1000, ["127.0.0.1"]),
        (10_000, [f"127.0.1.{i}" for i in range(1, 101)]),
    ],
    ids=["1k-same-address", "10k-100-addresses"],
)
async def test_idle_connections_never_take_a_token_clients_place(tmp_path, flood, sources):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = flood + 1000
    if hard < need:
        pytest.fail(f"this test holds {flood} sockets: ulimit -n is {hard}, needs {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    replica = ReplicaProc(tmp_path, "r1", 1, free_block(1), token_file=token_file).start()
    await replica.wait_ready()
    socks: list[socket.socket] = []
    try:
        baseline = _socket_fds(replica.proc.pid)
        started = time.monotonic()
        socks = await _open_idle(replica.ports["eventer"], sources, flood)
        opened = time.monotonic() - started
        # Until the replica has accepted what was still in its listen backlog.
        held, kept = -1, _socket_fds(replica.proc.pid) - baseline
        while kept != held:
            await asyncio.sleep(0.5)
            held, kept = kept, _socket_fds(replica.proc.pid) - baseline
        open_here = _still_open(socks)
        started = time.perf_counter()
        client = await connect(*replica.eventer, "real", client_token="s3cret", timeout=10)
        try:
            created = await client.register([RegisterEvent(("real", "one"), None, None)], True)
            took = time.perf_counter() - started
            result = await client.query(QueryLatestParams([("real", "*")]))
        finally:
            await client.close()
        assert created is not None and len(created) == 1
        assert [e.type for e in result.events] == [("real", "one")]
        evicted = await rejected(replica, "evicted_before_init")
        print(
            f"\n{flood} idle connections from {len(sources)} address(es), opened in "
            f"{opened:.1f} s: the replica holds {kept} of them ({open_here} open on this "
            f"side), {evicted:.0f} evicted before init; a token "
            f"client connected and registered in {took * 1000:.1f} ms"
        )
        # The pre-init budget held (max_pending 256): every idle connection beyond it
        # was dropped, the oldest first, none refused for lack of a place.
        assert kept <= 256, kept
        # Every idle connection is either evicted or still open on this side (held by
        # the replica, or never accepted: a full listen backlog leaves the kernel
        # holding some in limbo).
        assert evicted + open_here >= flood, (kept, open_here, evicted)
        assert await rejected(replica, "too_many_connections") == 0
    finally:
        for sock in socks:
            sock.close()
        replica.stop()


async def test_idle_connections_on_the_http_port_never_block_probes_or_scrapes(tmp_path):
    flood = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = flood + 1000
    if hard < need:
        pytest.fail(f"this test holds {flood} sockets: ulimit -n is {hard}, needs {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    replica = await start(tmp_path, {})
    socks: list[socket.socket] = []
    try:
        baseline = _socket_fds(replica.proc.pid)
        started = time.monotonic()
        socks = await _open_idle(replica.ports["http"], ["127.0.0.1"], flood)
        opened = time.monotonic() - started
        # Until the replica has accepted what was still in its listen backlog.
        held, kept = -1, _socket_fds(replica.proc.pid) - baseline
        while kept != held:
            await asyncio.sleep(0.5)
            held, kept = kept, _socket_fds(replica.proc.pid) - baseline
        open_here = _still_open(socks)
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            started = time.perf_counter()
            async with s.get(replica.http + "/readyz") as res:
                ready = res.status, await res.json()
            ready_took = time.perf_counter() - started
            started = time.perf_counter()
            async with s.get(replica.http + "/metrics") as res:
                scraped = res.status, await res.text()
            scrape_took = time.perf_counter() - started
        assert ready == (200, {"ready": True})
        assert scraped[0] == 200 and "eventfleet_rejected_total" in scraped[1]
        evicted = await rejected(replica, "evicted_before_init", protocol="http")
        print(
            f"\n{flood} idle connections to the HTTP port, opened in {opened:.1f} s: the "
            f"replica holds {kept} of them ({open_here} open on this side), {evicted:.0f} "
            f"evicted before a request; /readyz answered in {ready_took * 1000:.1f} ms, "
            f"/metrics in {scrape_took * 1000:.1f} ms"
        )
        # The pre-request budget held: every idle connection beyond it was dropped,
        # the oldest first; each is either evicted or still open on this side (held by
        # the replica, or still in the listen backlog).
        assert kept <= HTTP_LIMITS.max_pending, kept
        assert evicted + open_here >= flood, (kept, open_here, evicted)
    finally:
        for sock in socks:
            sock.close()
        replica.stop()
