"""Replication (AppWebsocket) benchmark: initial pass, incremental restart, live latency.

Run from the repository root::

    .venv/bin/python -m e2e.bench.replication_protocol            # 100k rows, ~1-2 min
    .venv/bin/python -m e2e.bench.replication_protocol --rows 5000 --changes 200 --live 200

(`e2e/bench/replication.py` is the Syncer benchmark; this one is the Replication
protocol of docs/replication.md.)

Processes on 127.0.0.1, fresh SQLite stores: A (publisher, server id 1) and B (server
id 2) Syncer-meshed; C, a replica of another fleet whose `replication.upstreams` points
at A (the project's replicator).

- **Initial pass**: A holds `--rows` rows (registered over Eventer in batches of 1,000).
  Measured three ways: (1) a seed-style client sending one ReplicateNext per row and
  waiting for each answer; (2) the same with 256 ReplicateNext in flight (what the
  project's replicator does when the publisher announces the row count), each request
  its own write, and again with the requests leaving in batches through the project's
  `Outbox` (several frames per write, as the project's replicator sends them); (3) C's
  replicator, from its "publishing" log line to "full pass done" (includes writing every
  row into C's store as events).
- **Incremental restart**: `--changes` rows changed on A, then (1) a client reconnects
  with its guid/usn: connect + login + ReplicateStart + pass to the end marker; (2) C is
  restarted: "publishing" -> "incremental pass done".
- **Live latency**: a session on A writes rows (ReplicateAdd, one every 2 ms); a session
  on B (the other replica) receives ReplicateAdd; latency = receive - send, one clock.
  Also to a session on A itself.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import re
import shutil
import statistics
import sys
import tempfile
import time

import aiohttp
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import EventPayloadJson, RegisterEvent
from eventfleet_server.replication.outbox import Outbox

from e2e.appws_client import AppWsClient
from e2e.fleet_helpers import ReplicaProc, free_block, mesh_peers

PASSWORD = "bench-password"
TARGETS = {"pass_rows_per_s": 20_000, "incremental_s": 1.0, "live_p50_ms": 10.0}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def conf(tmp: pathlib.Path, upstreams=()) -> dict:
    pw = tmp / "password"
    pw.write_text(PASSWORD)
    return {
        "replication": {
            "enabled": True,
            "tables": [{"name": "bench"}],
            "password_file": str(pw),
            "upstreams": [{**u, "password_file": str(pw)} for u in upstreams],
        }
    }


def ws(r: ReplicaProc) -> str:
    return r.http.replace("http://", "ws://") + "/replication"


async def fill(r: ReplicaProc, keys: range, tag: str) -> None:
    client = await connect(*r.eventer, "bench/fill")
    try:
        sem = asyncio.Semaphore(4)

        async def batch(lo: int) -> None:
            async with sem:
                await client.register(
                    [
                        RegisterEvent(
                            ("replication", "bench", f"k{i}"),
                            None,
                            EventPayloadJson(
                                json.dumps({"id": f"k{i}", "name": f"row {i}", "v": tag, "n": i})
                            ),
                        )
                        for i in range(lo, min(lo + 1000, keys.stop))
                    ],
                    True,
                )

        await asyncio.gather(*(batch(lo) for lo in range(keys.start, keys.stop, 1000)))
    finally:
        await client.close()


async def session(r: ReplicaProc, **start) -> tuple[AppWsClient, dict]:
    c = await AppWsClient(ws(r)).__aenter__()
    assert (await c.login(PASSWORD))["ok"] is True
    result = await c.start("bench", **start)
    assert "error" not in result, result
    return c, result


async def pass_lockstep(r: ReplicaProc) -> dict:
    c, start = await session(r)
    t0 = time.perf_counter()
    rows, usn, _ = await c.initial_pass("bench")
    elapsed = time.perf_counter() - t0
    await c.__aexit__()
    return {"rows": len(rows), "seconds": elapsed, "guid": start["guid"], "usn": usn}


async def pass_pipelined(
    r: ReplicaProc, window: int = 256, *, batched: bool = False, **start_args
) -> dict:
    """`window` ReplicateNext in flight. `batched`: the requests leave through the
    project's `Outbox` (several frames per write, as the project's replicator sends
    them); otherwise one `send_str` (one write) per request."""
    t0 = time.perf_counter()
    c, start = await session(r, **start_args)
    budget = start["rows"] + 1
    outbox = Outbox(c.ws, 2 * window) if batched else None
    # `is not None`: an empty Outbox is falsy (it has a length).
    drain = asyncio.get_running_loop().create_task(outbox.drain()) if outbox is not None else None
    nxt = {"api": "bench", "mt": "ReplicateNext"}
    text = json.dumps(nxt)

    async def send() -> None:
        if outbox is not None:
            assert outbox.put(nxt), "outbox full"
        else:
            await c.send(text)

    sent = min(window, budget)
    ws_ = c.ws
    text_type = aiohttp.WSMsgType.TEXT
    try:
        for _ in range(sent):
            await send()
        rows = 0
        # One deadline for the whole pass, not a timer per frame (`AppWsClient.recv`
        # arms one per call: ~a fifth of this client's CPU per row). Every answer is
        # still parsed, as a replicator must.
        async with asyncio.timeout(max(60.0, budget / 500)):
            while True:
                frame = await ws_.receive()
                if frame.type != text_type:
                    raise ConnectionError(f"{frame.type.name} frame: {frame.data!r}")
                m = json.loads(frame.data)
                if m["mt"] != "ReplicateNextResult":
                    continue
                if "columns" not in m:
                    break
                rows += 1
                if sent < budget:
                    await send()
                    sent += 1
        elapsed = time.perf_counter() - t0
    finally:
        if outbox is not None and drain is not None:
            outbox.close()
            drain.cancel()
    await c.__aexit__()
    return {"rows": rows, "seconds": elapsed, "guid": start["guid"], "usn": m["usn"]}


def cpu(r: ReplicaProc) -> float:
    """CPU seconds (user + system) used so far by replica `r`'s process."""
    fields = pathlib.Path(f"/proc/{r.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def log_time(text: str, needle: str, occurrence: int = -1) -> float:
    lines = [line for line in text.splitlines() if needle in line]
    stamp = _TS.match(lines[occurrence]).group(1)
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


async def wait_log(r: ReplicaProc, needle: str, count: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while r.log_path.read_text().count(needle) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{r.name}: no {needle!r} within {timeout} s")
        await asyncio.sleep(0.05)


async def live_latency(writer_on: ReplicaProc, reader_on: ReplicaProc, n: int, tag: str) -> dict:
    reader, _ = await session(reader_on)
    await pass_drain(reader)
    writer, _ = await session(writer_on)
    await pass_drain(writer)
    await asyncio.sleep(0.5)
    sent: dict[str, float] = {}
    lat: list[float] = []
    done = asyncio.Event()

    async def receive():
        while len(lat) < n:
            m = await reader.recv(30)
            if m.get("mt") == "ReplicateAdd":
                t = sent.pop(m["columns"]["id"], None)
                if t is not None:
                    lat.append((time.perf_counter() - t) * 1000)
        done.set()

    task = asyncio.get_running_loop().create_task(receive())
    for i in range(n):
        key = f"{tag}{i}"
        sent[key] = time.perf_counter()
        await writer.send({"api": "bench", "mt": "ReplicateAdd", "columns": {"id": key, "i": i}})
        await asyncio.sleep(0.002)
    await asyncio.wait_for(done.wait(), 60)
    await task
    await reader.__aexit__()
    await writer.__aexit__()
    return {
        "samples": len(lat),
        "p50_ms": round(pct(lat, 50), 2),
        "p90_ms": round(pct(lat, 90), 2),
        "p99_ms": round(pct(lat, 99), 2),
        "max_ms": round(max(lat), 2),
        "mean_ms": round(statistics.fmean(lat), 2),
    }


async def pass_drain(c: AppWsClient) -> None:
    """Go live without a full pass: start again from the guid/usn the first start gave."""
    first = await c.request({"api": "bench", "mt": "ReplicateStart", "columns": {}})
    again = await c.start("bench", guid=first["guid"], usn=first["usn"])
    assert again["full"] is False, again
    await c.initial_pass("bench")


async def main(args) -> dict:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-repl-"))
    base = free_block(3)
    a = ReplicaProc(tmp, "A", 1, base, extra=conf(tmp))
    b = ReplicaProc(tmp, "B", 2, base + 10, extra=conf(tmp))
    results: dict = {
        "rows": args.rows,
        "changes": args.changes,
        "load_before": round(os.getloadavg()[0], 1),
    }
    c = None
    try:
        for r in (a, b):
            r.write_config(mesh_peers([a, b]))
            r.start()
        await asyncio.gather(a.wait_ready(), b.wait_ready())
        log(f"filling {args.rows} rows on A")
        t0 = time.perf_counter()
        await fill(a, range(args.rows), "v1")
        log(f"  filled in {time.perf_counter() - t0:.1f} s")

        lock = await pass_lockstep(a)
        results["pass_lockstep_rows_per_s"] = round(lock["rows"] / lock["seconds"])
        log(f"initial pass, lockstep: {lock['rows']} rows in {lock['seconds']:.2f} s")
        # The client's CPU too (this process: only the pass runs meanwhile): a pass
        # is as fast as the slower of the two with a core each.
        a0, h0 = cpu(a), time.process_time()
        pipe = await pass_pipelined(a)
        results["pass_pipelined_rows_per_s"] = round(pipe["rows"] / pipe["seconds"])
        results["pass_publisher_cpu_us_per_row"] = round((cpu(a) - a0) * 1e6 / pipe["rows"], 1)
        results["pass_client_cpu_us_per_row"] = round(
            (time.process_time() - h0) * 1e6 / pipe["rows"], 1
        )
        log(f"initial pass, 256 in flight: {pipe['rows']} rows in {pipe['seconds']:.2f} s")
        a0, h0 = cpu(a), time.process_time()
        batched = await pass_pipelined(a, batched=True)
        results["pass_batched_rows_per_s"] = round(batched["rows"] / batched["seconds"])
        results["pass_batched_publisher_cpu_us_per_row"] = round(
            (cpu(a) - a0) * 1e6 / batched["rows"], 1
        )
        results["pass_batched_client_cpu_us_per_row"] = round(
            (time.process_time() - h0) * 1e6 / batched["rows"], 1
        )
        log(
            f"initial pass, 256 in flight, requests batched: {batched['rows']} rows in "
            f"{batched['seconds']:.2f} s"
        )
        if args.pass_only:
            results["load_after"] = round(os.getloadavg()[0], 1)
            return results

        upstream = {"name": "a", "url": ws(a), "table": "bench", "reconnect_min_delay": 0.2}
        c = ReplicaProc(tmp, "C", 1, base + 20, extra=conf(tmp, [upstream]))
        c.start()
        await wait_log(c, "replication publishing", 1)
        c0, a0 = cpu(c), cpu(a)
        await wait_log(c, "full pass done", 1)
        c1, a1 = cpu(c), cpu(a)
        results["pass_replicator_cpu_us_per_row"] = round((c1 - c0) * 1e6 / args.rows, 1)
        results["pass_replicator_publisher_cpu_us_per_row"] = round((a1 - a0) * 1e6 / args.rows, 1)
        text = c.log_path.read_text()
        secs = log_time(text, "full pass done") - log_time(text, "replication publishing")
        results["pass_replicator_rows_per_s"] = round(args.rows / secs)
        log(f"initial pass, project replicator C: {args.rows} rows in {secs:.2f} s")

        # Incremental restart after `changes` changes.
        await fill(a, range(args.changes), "v2")
        t0 = time.perf_counter()
        inc = await pass_pipelined(a, guid=pipe["guid"], usn=pipe["usn"])
        results["incremental_client_s"] = round(time.perf_counter() - t0, 3)
        results["incremental_client_rows"] = inc["rows"]
        log(f"incremental (client): {inc['rows']} rows in {results['incremental_client_s']} s")
        c.stop()
        await fill(a, range(args.changes), "v3")
        c.start()
        await wait_log(c, "incremental pass done", 1)
        text = c.log_path.read_text()
        secs = log_time(text, "incremental pass done") - log_time(
            text, "replication publishing", -1
        )
        results["incremental_replicator_s"] = round(secs, 3)
        log(f"incremental (replicator C restart): {secs:.3f} s")

        results["live_other_replica"] = await live_latency(a, b, args.live, "x")
        log(f"live A -> session on B: {results['live_other_replica']}")
        results["live_same_replica"] = await live_latency(a, a, args.live, "y")
        log(f"live A -> session on A: {results['live_same_replica']}")
        results["load_after"] = round(os.getloadavg()[0], 1)
    finally:
        if c is not None:
            c.stop()
        for r in (a, b):
            r.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def pass_markdown(r: dict) -> str:
    return "\n".join(
        [
            "| figure | result | target |",
            "|---|---|---|",
            f"| initial pass of {r['rows']:,} rows, seed-style client | "
            f"{r['pass_lockstep_rows_per_s']:,} rows/s | |",
            f"| initial pass, 256 ReplicateNext in flight | **{r['pass_pipelined_rows_per_s']:,} "
            f"rows/s** | ≥ {TARGETS['pass_rows_per_s']:,} rows/s |",
            f"| CPU per row in that pass, publisher / client | "
            f"{r['pass_publisher_cpu_us_per_row']} / {r['pass_client_cpu_us_per_row']} µs | |",
            f"| the same, requests sent in batches | **{r['pass_batched_rows_per_s']:,} rows/s**; "
            f"CPU {r['pass_batched_publisher_cpu_us_per_row']} / "
            f"{r['pass_batched_client_cpu_us_per_row']} µs | |",
            f"| load average before / after | {r['load_before']} / {r['load_after']} | |",
        ]
    )


def markdown(r: dict) -> str:
    o, s = r["live_other_replica"], r["live_same_replica"]
    return "\n".join(
        [
            "| figure | result | target |",
            "|---|---|---|",
            f"| initial pass of {r['rows']:,} rows, seed-style client (1 ReplicateNext in flight) "
            f"| {r['pass_lockstep_rows_per_s']:,} rows/s | |",
            f"| initial pass, 256 ReplicateNext in flight | **{r['pass_pipelined_rows_per_s']:,} "
            f"rows/s** | ≥ {TARGETS['pass_rows_per_s']:,} rows/s |",
            f"| publisher CPU per row in that pass | {r['pass_publisher_cpu_us_per_row']} µs "
            f"(≈ {round(1e6 / r['pass_publisher_cpu_us_per_row']):,} rows/s per core) | |",
            f"| client CPU per row in that pass | {r['pass_client_cpu_us_per_row']} µs | |",
            f"| initial pass, 256 in flight, requests sent in batches (as the project's "
            f"replicator sends them) | **{r['pass_batched_rows_per_s']:,} rows/s** | "
            f"≥ {TARGETS['pass_rows_per_s']:,} rows/s |",
            f"| CPU per row in that pass, publisher / client | "
            f"{r['pass_batched_publisher_cpu_us_per_row']} / "
            f"{r['pass_batched_client_cpu_us_per_row']} µs | |",
            f"| initial pass into another replica (project replicator, rows stored as events) | "
            f"{r['pass_replicator_rows_per_s']:,} rows/s | |",
            f"| CPU per row in that pass, replicator / publisher | "
            f"{r['pass_replicator_cpu_us_per_row']} / "
            f"{r['pass_replicator_publisher_cpu_us_per_row']} µs | |",
            f"| incremental restart after {r['changes']:,} changes, client (connect to end) | "
            f"**{r['incremental_client_s']} s** | ≤ {TARGETS['incremental_s']} s |",
            f"| incremental restart, project replicator restarted | "
            f"{r['incremental_replicator_s']} s | |",
            f"| live change -> session on another replica, p50 / p90 / p99 | **{o['p50_ms']}** / "
            f"{o['p90_ms']} / {o['p99_ms']} ms | p50 ≤ {TARGETS['live_p50_ms']} ms |",
            f"| live change -> session on the same replica, p50 / p99 | {s['p50_ms']} / "
            f"{s['p99_ms']} ms | |",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--live", type=int, default=1_000, help="live samples")
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument(
        "--pass-only",
        action="store_true",
        help="only the client passes on A (lockstep, 256 in flight, batched): no replicator "
        "C, no incremental restart, no live latency",
    )
    args = parser.parse_args()
    out = asyncio.run(main(args))
    print(json.dumps(out, indent=2))
    print(pass_markdown(out) if args.pass_only else markdown(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
