"""Jetstream benchmark: eventfleet's replica vs the reference server, side by side.

Run from the repository root (after ``scripts/bootstrap server,test`` and
``scripts/tools/jetstream.sh``)::

    .venv/bin/python -m e2e.bench.jetstream            # 3 runs each, ~3 min on 2 cores
    .venv/bin/python -m e2e.bench.jetstream --quick --repeat 1   # small counts, < 30 s

Servers: one eventfleet replica process (SQLite, every sync committed before its reply)
and the reference server from the npm package ``jetstream`` 0.13.4 (models in memory),
both with the demo's classes (List/Item), on 127.0.0.1, one after the other, each on a
fresh store. The client is a raw-protocol asyncio client in this process (the reference
JS client batches edits on a 10 ms timer, which would hide the servers' latency); it
speaks exactly the frames the reference client sends.

Scenarios:
- **round trip, 1 session**: ScopeSync (one ``change`` of the root's title) ->
  ScopeSyncReply, one at a time.
- **round trip, 50 sessions**: 50 sessions, each on its own scope, each doing the same
  loop at once (no fan-out between them).
- **fan-out to 100 sessions**: 100 sessions fetched one scope; a 101st sends a sync every
  50 ms; latency = arrival of the server ScopeSync at a session - send time.
- **ScopeState of 10k models**: a scope with 10,000 items (on eventfleet written in syncs
  of 200 adds and the root's change; the reference cannot take those syncs and builds the
  scope in memory); a new session's ScopeFetch -> complete ScopeState received. The scope
  is open (another session holds it), the first fetch included.
Server CPU seconds are read from /proc for each server process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import pathlib
import statistics
import sys
import tempfile
import time
import uuid

import aiohttp

from e2e.bench.servers import read_proc
from e2e.fleet_helpers import ReplicaProc, free_block
from e2e.jetstream.refclient import ReferenceServer, ensure_tools


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class RawSession:
    """A Jetstream session on the wire: SessionCreate, one ScopeFetch, syncs."""

    def __init__(self, http: aiohttp.ClientSession, url: str):
        self._http = http
        self._url = url
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._index = itertools.count(1)
        self._replies: dict[int, asyncio.Future] = {}
        self._state: asyncio.Future | None = None
        self._reader: asyncio.Task | None = None
        self.root: str | None = None
        self.scope_index = 0
        self.state_fragments = 0
        self.state_bytes = 0
        self.on_sync = None  # callback(fragments, arrival) for server ScopeSync

    async def open(self, scope: str) -> RawSession:
        self._ws = await self._http.ws_connect(self._url, max_msg_size=0)
        await self._ws.send_str(
            json.dumps({"type": "SessionCreate", "index": 0, "version": "0.1.0", "params": {}})
        )
        (reply,) = json.loads((await self._ws.receive(timeout=10)).data)
        assert reply.get("sessionToken"), reply
        self._reader = asyncio.get_running_loop().create_task(self._read())
        await self.fetch(scope)
        return self

    async def fetch(self, scope: str) -> float:
        """ScopeFetch -> seconds until the complete ScopeState was received and parsed."""
        self._state = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        index = next(self._index)
        reply = self._expect(index)
        await self._ws.send_str(
            json.dumps({"type": "ScopeFetch", "index": index, "name": scope, "params": {}})
        )
        fetch_reply = await reply
        assert "error" not in fetch_reply or not fetch_reply["error"], fetch_reply
        state = await asyncio.wait_for(self._state, 120)
        elapsed = time.perf_counter() - started
        self.scope_index = fetch_reply["scopeIndex"]
        self.root = state["rootUUID"]
        self.state_fragments = len(state["fragments"])
        return elapsed

    def _expect(self, index: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._replies[index] = fut
        return fut

    async def sync(self, fragments: list[dict]) -> dict:
        index = next(self._index)
        reply = self._expect(index)
        await self._ws.send_str(
            json.dumps(
                {
                    "type": "ScopeSync",
                    "index": index,
                    "scopeIndex": self.scope_index,
                    "atomic": False,
                    "fragments": fragments,
                }
            )
        )
        return await asyncio.wait_for(reply, 120)

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            arrival = time.perf_counter()
            data = json.loads(msg.data)
            for m in data if isinstance(data, list) else [data]:
                t = m.get("type")
                if "replyTo" in m and m["replyTo"] in self._replies:
                    fut = self._replies.pop(m["replyTo"])
                    if not fut.done():
                        fut.set_result(m)
                elif t == "ScopeState" and self._state is not None and not self._state.done():
                    self.state_bytes = len(msg.data)
                    self._state.set_result(m)
                elif t == "ScopeSync" and self.on_sync is not None:
                    self.on_sync(m["fragments"], arrival)

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


def add(u: str) -> dict:
    props = {"text": f"item {u[:8]}", "done": False}
    return {"type": "add", "clsName": "Item", "uuid": u, "properties": props}


def title(root: str, text: str) -> dict:
    return {"type": "change", "clsName": "List", "uuid": root, "properties": {"title": text}}


async def rtt_loop(s: RawSession, n: int, tag: str) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        reply = await s.sync([title(s.root, f"{tag}-{i}")])
        out.append(time.perf_counter() - started)
        assert reply["fragmentReplies"] == [{}], reply
    return out


async def run_server(url: str, args, label: str, cpu=lambda: 0.0) -> dict:
    """One server, every scenario; `cpu()` reads the server's CPU seconds (the building
    of the big scope is left out of the CPU figure)."""
    res: dict = {}
    cpu_start = cpu()
    run = uuid.uuid4().hex[:6]
    # No connector limit: aiohttp's default (100) would park the 101st websocket.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        # 1 session
        s = await RawSession(http, url).open(f"rtt1-{run}")
        await rtt_loop(s, 20, "warm")
        lat = await rtt_loop(s, args.syncs, "one")
        res["rtt1_p50_ms"], res["rtt1_p99_ms"] = pct(lat, 50) * 1e3, pct(lat, 99) * 1e3
        await s.close()
        log(f"{label}: rtt 1 session p50 {res['rtt1_p50_ms']:.2f} ms")
        # 50 sessions, own scopes
        sessions = [
            await RawSession(http, url).open(f"rtt50-{run}-{i}") for i in range(args.sessions)
        ]
        started = time.perf_counter()
        lats = await asyncio.gather(
            *(rtt_loop(x, args.syncs_each, f"s{i}") for i, x in enumerate(sessions))
        )
        wall = time.perf_counter() - started
        flat = [v for lst in lats for v in lst]
        res["rtt50_p50_ms"], res["rtt50_p99_ms"] = pct(flat, 50) * 1e3, pct(flat, 99) * 1e3
        res["rtt50_syncs_per_s"] = len(flat) / wall
        for x in sessions:
            await x.close()
        log(f"{label}: rtt {args.sessions} sessions p50 {res['rtt50_p50_ms']:.2f} ms")
        # fan-out to 100
        scope = f"fan-{run}"
        writer = await RawSession(http, url).open(scope)
        subs = [await RawSession(http, url).open(scope) for _ in range(args.subscribers)]
        sent: dict[str, float] = {}
        arrivals: list[float] = []
        last: dict[str, float] = {}

        def on_sync(fragments, arrival):
            for f in fragments:
                t = f.get("properties", {}).get("title")
                if t in sent:
                    arrivals.append(arrival - sent[t])
                    last[t] = max(last.get(t, 0.0), arrival - sent[t])

        for x in subs:
            x.on_sync = on_sync
        for i in range(args.fanouts):
            text = f"fan-{i}"
            sent[text] = time.perf_counter()
            await writer.sync([title(writer.root, text)])
            await asyncio.sleep(0.05)
        expected = args.fanouts * args.subscribers
        for _ in range(600):  # at most 30 s for the stragglers
            if len(arrivals) >= expected:
                break
            await asyncio.sleep(0.05)
        res["fanout_p50_ms"] = pct(arrivals, 50) * 1e3
        res["fanout_p99_ms"] = pct(arrivals, 99) * 1e3
        res["fanout_last_p50_ms"] = statistics.median(last.values()) * 1e3
        res["fanout_delivered"] = f"{len(arrivals)}/{args.fanouts * args.subscribers}"
        for x in [writer, *subs]:
            await x.close()
        log(f"{label}: fan-out p50 {res['fanout_p50_ms']:.2f} ms ({res['fanout_delivered']})")
        # ScopeState of N models. The reference overflows its stack (RangeError) when a
        # sync sets a collection of thousands, so its scope is built in its own memory
        # ("preload-N-...", see e2e/jetstream/reference_server.js); ours is written by
        # syncs of 200 adds and the root's change, i.e. stored as N + 1 events.
        scope = f"preload-{args.models}-{run}" if label == "reference" else f"big-{run}"
        cpu_used = cpu() - cpu_start
        w = await RawSession(http, url).open(scope)
        uuids: list[str] = []
        while label != "reference" and len(uuids) < args.models:
            chunk = [str(uuid.uuid4()) for _ in range(min(200, args.models - len(uuids)))]
            uuids.extend(chunk)
            frags = [add(u) for u in chunk]
            frags.append(
                {
                    "type": "change",
                    "clsName": "List",
                    "uuid": w.root,
                    "properties": {"items": list(uuids)},
                }
            )
            reply = await w.sync(frags)
            assert all(r == {} for r in reply["fragmentReplies"]), reply["fragmentReplies"][:3]
        times = []
        cpu_start = cpu()
        for _ in range(args.state_repeats):
            r = RawSession(http, url)
            await r.open(f"warm-{run}")
            times.append(await r.fetch(scope))
            assert r.state_fragments == args.models + 1, r.state_fragments
            res["state_bytes"] = r.state_bytes
            await r.close()
        res["state_p50_ms"] = statistics.median(times) * 1e3
        res["cpu_s"] = cpu_used + cpu() - cpu_start
        await w.close()
        log(f"{label}: ScopeState of {args.models} models p50 {res['state_p50_ms']:.0f} ms")
    return res


ROWS = [
    ("rtt1_p50_ms", "ScopeSync round trip, 1 session, p50 (ms)"),
    ("rtt1_p99_ms", "ScopeSync round trip, 1 session, p99 (ms)"),
    ("rtt50_p50_ms", "ScopeSync round trip, 50 sessions, p50 (ms)"),
    ("rtt50_p99_ms", "ScopeSync round trip, 50 sessions, p99 (ms)"),
    ("rtt50_syncs_per_s", "syncs/s with 50 sessions (higher is better)"),
    ("fanout_p50_ms", "fan-out to 100 sessions, p50 (ms)"),
    ("fanout_p99_ms", "fan-out to 100 sessions, p99 (ms)"),
    ("fanout_last_p50_ms", "fan-out, last of 100 sessions, p50 (ms)"),
    ("state_p50_ms", "ScopeState of {models} models, p50 (ms)"),
    ("state_bytes", "ScopeState of {models} models, frame bytes"),
    ("cpu_s", "server CPU seconds, all scenarios (building the big scope excluded)"),
]


def medians(runs: list[dict]) -> dict:
    out = {}
    for key in runs[0]:
        values = [r[key] for r in runs if isinstance(r.get(key), int | float)]
        out[key] = statistics.median(values) if values else runs[-1][key]
    return out


def table(results: dict, models: int) -> str:
    lines = [
        "| figure | eventfleet | reference | ratio (ours / reference) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, label in ROWS:
        ours, ref = results["eventfleet"].get(key), results["reference"].get(key)
        ratio = f"{ours / ref:.2f}" if isinstance(ours, int | float) and ref else "-"
        label = label.format(models=f"{models:,}")
        lines.append(f"| {label} | {_fmt(ours)} | {_fmt(ref)} | {ratio} |")
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if v < 100 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


async def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--repeat", type=int, default=3, help="runs per server (medians shown)")
    p.add_argument("--ours-url", help="a running replica's ws://.../jetstream (no CPU figure)")
    args = p.parse_args(argv)
    args.syncs = 50 if args.quick else 500
    args.sessions = 50
    args.syncs_each = 4 if args.quick else 20
    args.subscribers = 100
    args.fanouts = 5 if args.quick else 40
    args.models = 1000 if args.quick else 10_000
    args.state_repeats = 2 if args.quick else 5
    ensure_tools()
    runs: dict[str, list[dict]] = {"eventfleet": [], "reference": []}
    with tempfile.TemporaryDirectory(prefix="js-bench-") as tmp:
        work = pathlib.Path(tmp)
        # Alternate the servers, each on a fresh store / fresh process per repetition, so
        # a change of machine load hits both; the table shows the medians.
        for rep in range(args.repeat):
            if args.ours_url:
                runs["eventfleet"].append(await run_server(args.ours_url, args, "eventfleet"))
            else:
                replica = ReplicaProc(
                    work,
                    f"r{rep}",
                    1,
                    free_block(1),
                    extra={"jetstream": {"admission": {"max_connections_per_address": 1000}}},
                )
                replica.start()
                try:
                    await replica.wait_ready()
                    url = f"ws://127.0.0.1:{replica.ports['http']}/jetstream"
                    pid = replica.proc.pid
                    runs["eventfleet"].append(
                        await run_server(
                            url, args, "eventfleet", lambda pid=pid: read_proc(pid).cpu_s
                        )
                    )
                finally:
                    replica.stop()
            ref = ReferenceServer(free_block(1), work / f"reference-{rep}.log").start()
            try:
                runs["reference"].append(
                    await run_server(
                        ref.url + "/", args, "reference", lambda p=ref.pid: read_proc(p).cpu_s
                    )
                )
            finally:
                ref.stop()
    results = {name: medians(rs) for name, rs in runs.items()}
    print(table(results, args.models))
    if args.json:
        args.json.write_text(json.dumps({"medians": results, "runs": runs}, indent=1))
    return results


if __name__ == "__main__":
    asyncio.run(main())
