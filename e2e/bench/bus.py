"""Event BUS benchmark: PUB -> BROADCAST throughput and latency, across replicas, and
snapshot time.

Run from the repository root::

    .venv/bin/python -m e2e.bench.bus            # ~1-2 min on 2 cores
    .venv/bin/python -m e2e.bench.bus --quick    # small counts (smoke)

Two replica processes, A (server id 1) and B (server id 2), Syncer-connected, fresh
SQLite stores (synchronous NORMAL), no token.

- **Throughput**: a separate publisher *process* sends N PUBs to A's COLLECTOR as fast
  as it can (plain pyzmq DEALER, frames prebuilt, only the UUID changes); a subscriber on
  A counts BROADCASTs. Rate = N / (last BROADCAST received - first PUB sent). Every
  event is committed before it is broadcast. The replica's CPU seconds per event come
  from /proc.
- **Latency**: this process publishes on A at a steady rate (default 2,000 events/s,
  each PUB carrying its send time); subscribers on A and on B (the event reaches B
  through the Syncer and B's commit) record receive - send. First second is warm-up.
- **Snapshot**: A is filled to `--snapshot` events; one client times SYNCSTART "" 0 to
  SYNCEND (every event streamed).

There is no runnable reference BUS server here (see docs/performance.md), so the
figures are compared with the issue's targets, not with a reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

from e2e.bench.servers import read_proc
from e2e.bus_client import BusClient
from e2e.fleet_helpers import ReplicaProc, free_block, mesh_peers

TARGETS = {
    "throughput_events_per_s": 20_000,
    "local_p50_ms": 5.0,
    "cross_p50_ms": 10.0,
    "snapshot_100k_s": 2.0,
}

_PUBLISHER = r"""
import sys, time, uuid, zmq
port, n = int(sys.argv[1]), int(sys.argv[2])
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.sndhwm = 0
s.connect(f"tcp://127.0.0.1:{port}")
time.sleep(0.3)
data = b"\x81\xa1v\x01"  # msgpack {"v": 1}
ts = b"2024-01-01T00:00:00Z"
print(time.time(), flush=True)
for i in range(n):
    u = str(uuid.uuid4()).encode()
    s.send_multipart([b"/bench/t/%d" % (i % 10), b"", b"bench", ts, u, data])
s.close(linger=-1)
ctx.term()
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def throughput(a: ReplicaProc, n: int) -> dict:
    sub = BusClient(a.ports["bus"])
    sub.subscribe("/bench/t/")
    await asyncio.sleep(0.5)
    before = read_proc(a.proc.pid)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PUBLISHER, str(a.ports["bus"] + 2), str(n),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        started = float(await proc.stdout.readline())
        got = 0
        last = time.time()
        while got < n:
            try:
                await sub.recv(timeout=30)
            except TimeoutError:
                break
            got += 1
            last = time.time()
        after = read_proc(a.proc.pid)
    finally:
        await asyncio.wait_for(proc.wait(), 60)
        sub.close()
    seconds = last - started
    return {
        "events": n,
        "received": got,
        "seconds": round(seconds, 3),
        "events_per_s": round(got / seconds),
        "replica_cpu_us_per_event": round((after.cpu_s - before.cpu_s) / max(got, 1) * 1e6, 1),
    }


async def latency(a: ReplicaProc, b: ReplicaProc, rate: float, seconds: float) -> dict:
    pub = BusClient(a.ports["bus"])
    on_a = BusClient(a.ports["bus"])
    on_b = BusClient(b.ports["bus"])
    samples: dict[str, list[float]] = {"a": [], "b": []}
    total = int(rate * seconds)
    warmup = int(rate)

    async def listen(client: BusClient, key: str) -> None:
        seen = 0
        while seen < total:
            try:
                event = await client.recv(timeout=10)
            except TimeoutError:
                return
            if not event.topic.startswith("/bench/lat/"):
                continue
            seen += 1
            index, sent = event.data
            if index >= warmup:
                samples[key].append((time.monotonic() - sent) * 1000)

    try:
        for c in (on_a, on_b):
            c.subscribe("/bench/lat/")
        await asyncio.sleep(0.5)
        listeners = [asyncio.create_task(listen(on_a, "a")), asyncio.create_task(listen(on_b, "b"))]
        start = time.monotonic()
        for i in range(total):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await pub.publish("/bench/lat/x", [i, time.monotonic()])
        await asyncio.gather(*listeners)
    finally:
        for c in (pub, on_a, on_b):
            c.close()
    out = {"rate": rate, "seconds": seconds}
    for key, name in (("a", "local"), ("b", "cross")):
        values = samples[key]
        out[f"{name}_received"] = len(values)
        if values:
            out[f"{name}_p50_ms"] = round(percentile(values, 50), 2)
            out[f"{name}_p99_ms"] = round(percentile(values, 99), 2)
    return out


async def snapshot(a: ReplicaProc, size: int) -> dict:
    client = BusClient(a.ports["bus"])
    try:
        # Fill A up to `size` events with the publisher process, wait for the commits.
        _, head = await client.syncstart("/none/", 0)
        if head < size:
            filler = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _PUBLISHER, str(a.ports["bus"] + 2), str(size - head),
                stdout=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.wait_for(filler.wait(), 300)
        deadline = time.monotonic() + 120
        while head < size and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            _, head = await client.syncstart("/none/", 0)
        started = time.perf_counter()
        events, head = await client.syncstart("", 0, timeout=120)
        seconds = time.perf_counter() - started
    finally:
        client.close()
    return {"events": len(events), "head": head, "seconds": round(seconds, 3)}


async def run(args) -> dict:
    load_before = os.getloadavg()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="eventfleet-bench-bus-"))
    base = free_block(2)
    extra = {"log": {"level": "WARNING"}, "bus": {"enabled": True}}
    a = ReplicaProc(workdir, "a", 1, base, extra=extra)
    b = ReplicaProc(workdir, "b", 2, base + 10, extra=extra)
    try:
        for p in (a, b):
            p.write_config(mesh_peers([a, b]))
            p.start()
        await asyncio.gather(a.wait_ready(), b.wait_ready())
        await asyncio.sleep(1)
        log(f"throughput: {args.events} PUBs")
        thr = await throughput(a, args.events)
        log(f"throughput: {thr}")
        log(f"latency at {args.rate}/s for {args.seconds} s")
        lat = await latency(a, b, args.rate, args.seconds)
        log(f"latency: {lat}")
        log(f"snapshot of {args.snapshot}")
        snap = await snapshot(a, args.snapshot)
        log(f"snapshot: {snap}")
    finally:
        a.stop()
        b.stop()
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "load_average": load_before,
        "throughput": thr,
        "latency": lat,
        "snapshot": snap,
        "targets": TARGETS,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.bus", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=50_000, help="throughput: PUBs sent")
    p.add_argument("--rate", type=float, default=2000.0, help="latency: PUBs/s")
    p.add_argument("--seconds", type=float, default=10.0, help="latency: duration")
    p.add_argument("--snapshot", type=int, default=100_000, help="events in the snapshot")
    p.add_argument("--quick", action="store_true", help="small counts (smoke run)")
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args(argv)
    if args.quick:
        args.events, args.seconds, args.snapshot = 2_000, 2.0, 5_000
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
