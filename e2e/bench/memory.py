"""Memory benchmark: resident memory of eventfleet's replica and the reference hat-event
server, side by side, idle and under a steady load, and whether it grows (a soak).

Both servers run at once, each as its own process (`servers.py`, the same configurations
as the Eventer benchmark), each fed by its own client from this process with the same
paced load: `--rate` events/s as requests of `--batch` events with a response (at most
64 in flight), for `--seconds`. Every `--sample` seconds the harness reads each server's
VmRSS from /proc. Reported per server:

- idle RSS: after start-up and one registration, before the load;
- RSS after the load and at its peak (VmHWM);
- RSS per 10,000 stored events: (RSS after the load - idle RSS) / (events / 10,000);
- growth during the second half of the load: the least-squares slope of RSS over time
  (MiB per minute) and the RSS change it implies over that half. A server whose memory
  is bounded under a steady load shows a slope near 0 there; a leak shows a slope that
  does not fall.

    python -m e2e.bench.memory --seconds 600            # the 10-minute soak (docs/performance.md)
    python -m e2e.bench.memory --seconds 60 --no-plot   # a quick look

Not part of CI (it runs for minutes); the figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

from hat.event import common

from e2e.bench import servers
from e2e.bench.scenarios import connect

MIB = 1024.0
MAX_IN_FLIGHT = 64


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in KiB."""
    stat = servers.read_proc(pid)
    return stat.rss_kib, stat.hwm_kib


def slope_mib_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) samples, in MiB per minute."""
    n = len(samples)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in samples) / var * 60.0


async def load(server: servers.ServerProcess, rate: float, batch: int, seconds: float) -> int:
    """Register `rate` events/s in requests of `batch` for `seconds`; returns the count."""
    client = await connect(server, "bench-memory")
    sent = 0
    in_flight: set[asyncio.Task] = set()
    interval = batch / rate
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        i = 0
        while loop.time() - start < seconds:
            events = [
                common.RegisterEvent(
                    type=("bench", "mem", str((sent + k) % 100)),
                    source_timestamp=None,
                    payload=common.EventPayloadJson({"seq": sent + k, "value": (sent + k) * 0.5}),
                )
                for k in range(batch)
            ]
            if len(in_flight) >= MAX_IN_FLIGHT:
                _, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            in_flight.add(asyncio.ensure_future(client.register(events, with_response=True)))
            sent += batch
            i += 1
            delay = start + i * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        if in_flight:
            await asyncio.wait(in_flight)
    finally:
        with contextlib.suppress(Exception):
            await client.async_close()
    return sent


async def run(args) -> dict:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="eventfleet-bench-memory-"))
    kinds = [servers.KINDS[k] for k in args.servers.split(",")]
    procs = [servers.start_server(kind, workdir, kind.key) for kind in kinds]
    load_before = os.getloadavg()
    try:
        await asyncio.gather(*(servers.wait_operational(p) for p in procs))
        for p in procs:  # one registration each, so "idle" includes the first write
            client = await connect(p, "bench-memory-warm")
            await client.register(
                [common.RegisterEvent(("bench", "mem", "warm"), None, None)], with_response=True
            )
            await client.async_close()
        await asyncio.sleep(2.0)
        idle = {p.kind.key: rss_kib(p.pid)[0] for p in procs}
        samples: dict[str, list[tuple[float, float]]] = {p.kind.key: [] for p in procs}
        t0 = time.monotonic()

        async def sampler():
            while True:
                now = time.monotonic() - t0
                for p in procs:
                    samples[p.kind.key].append((now, rss_kib(p.pid)[0] / MIB))
                await asyncio.sleep(args.sample)

        sampling = asyncio.ensure_future(sampler())
        try:
            counts = await asyncio.gather(
                *(load(p, args.rate, args.batch, args.seconds) for p in procs)
            )
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
        await asyncio.sleep(2.0)
        result = {}
        for p, count in zip(procs, counts, strict=True):
            key = p.kind.key
            after, peak = rss_kib(p.pid)
            half = [s for s in samples[key] if s[0] >= args.seconds / 2]
            slope = slope_mib_per_min(half)
            result[key] = {
                "label": p.kind.label,
                "events": count,
                "idle_mib": round(idle[key] / MIB, 1),
                "after_mib": round(after / MIB, 1),
                "peak_mib": round(peak / MIB, 1),
                "per_10k_events_mib": round((after - idle[key]) / MIB / (count / 10_000), 2),
                "second_half_slope_mib_per_min": round(slope, 3),
                "second_half_growth_mib": round(slope * (args.seconds / 2) / 60.0, 1),
                "samples": samples[key],
            }
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": load_before,
        "rate": args.rate,
        "batch": args.batch,
        "seconds": args.seconds,
        "servers": result,
    }


def markdown(r: dict) -> str:
    rows = [
        f"{r['seconds']:g} s at {r['rate']:g} events/s (requests of {r['batch']}), both "
        f"servers at once, {r['when']}, load average before "
        f"{', '.join(f'{x:.1f}' for x in r['load_average'])}.",
        "",
        "| server | events | idle MiB | after MiB | peak MiB | MiB per 10k events | "
        "2nd-half slope MiB/min | 2nd-half growth MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in r["servers"].values():
        rows.append(
            f"| {s['label']} | {s['events']:,} | {s['idle_mib']} | {s['after_mib']} | "
            f"{s['peak_mib']} | {s['per_10k_events_mib']} | "
            f"{s['second_half_slope_mib_per_min']} | {s['second_half_growth_mib']} |"
        )
    return "\n".join(rows)


def plot(r: dict, path: pathlib.Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = {"eventfleet": "tab:blue", "eventfleet-full": "tab:green", "reference": "tab:red"}
    for key, s in r["servers"].items():
        ts = [t / 60 for t, _ in s["samples"]]
        vs = [v for _, v in s["samples"]]
        ax.plot(ts, vs, label=s["label"], color=colors.get(key))
    ax.set_xlabel("minutes under load")
    ax.set_ylabel("VmRSS (MiB)")
    ax.set_title(
        f"resident memory at {r['rate']:g} events/s (requests of {r['batch']}), {r['when']}"
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m e2e.bench.memory", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--servers", default="eventfleet,reference")
    p.add_argument("--rate", type=float, default=2000.0, help="events/s per server")
    p.add_argument("--batch", type=int, default=10, help="events per register request")
    p.add_argument("--seconds", type=float, default=600.0, help="length of the load")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--markdown", type=pathlib.Path)
    p.add_argument("--plot", type=pathlib.Path, default=pathlib.Path("docs/performance-memory.png"))
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    for key in args.servers.split(","):
        if key not in servers.KINDS:
            p.error(f"unknown server {key!r} (one of {', '.join(servers.KINDS)})")
    try:
        result = asyncio.run(run(args))
    finally:
        servers.stop_all()
    text = markdown(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if not args.no_plot:
        if plot(result, args.plot):
            print(f"plot: {args.plot}")
        else:
            print("plot: skipped (matplotlib is not installed; scripts/bench installs it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
