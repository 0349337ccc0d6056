"""Event BUS benchmark: PUB -> BROADCAST throughput and latency, across replicas, the
snapshot time, and the reference BUS side by side with the same clients and load.

Run from the repository root::

    .venv/bin/python -m e2e.bench.bus                        # ~2-3 min on 2 cores
    .venv/bin/python -m e2e.bench.bus --reference /tmp/ebz   # + the reference column
    .venv/bin/python -m e2e.bench.bus --repeat 3 --sweep --plot docs/bus-rates.png
    .venv/bin/python -m e2e.bench.bus --quick                # small counts (smoke; fleet only
                                                             # unless a reference is given)

Servers, fresh for every repeat:

- **fleet**: two replica processes, A (server id 1) and B (server id 2), Syncer-connected,
  fresh SQLite stores (synchronous NORMAL, pinned: the replica's default is FULL;
  ``--synchronous FULL`` measures that), no token: the issue's figures.
- **single**: one replica alone, and **reference**: the reference BUS
  (micro-toolkit/event-bus-zeromq 3.0.4, Node, its in-memory event store; path from
  ``--reference`` or ``$EVENTFLEET_BUS_REFERENCE``, see `e2e.bench.bus_reference`). The
  same clients and load for both; ratios are eventfleet / reference. Without a usable
  reference the output says why and has no reference column.

The clients are `e2e.bench.bus_load` processes (plain synchronous pyzmq), so that their
cost is small and the same for every server:

- **throughput**: a publisher sends N PUBs as fast as it can (UUIDs made beforehand); a
  subscriber counts BROADCASTs. Rate = received / (last BROADCAST received - first PUB
  sent). On eventfleet every event is committed before it is broadcast. Server CPU per
  event from /proc.
- **latency**: a publisher at a steady rate (default 2,000 events/s, each PUB carries its
  send time), subscribers on A and on B (B gets the event through the Syncer and its own
  commit); p50/p99 of receive - send after the first second.
- **snapshot**: the server is filled to `--snapshot` events; a client times SYNCSTART
  "" 0 to SYNCEND (every event streamed).
- **sweep** (``--sweep``): offered rates from 1,000/s up to "as fast as possible" against
  single and reference: achieved rate and latency per offered rate (``--plot`` draws it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from e2e.bench import bus_reference
from e2e.bench.servers import read_proc
from e2e.fleet_helpers import ReplicaProc, free_block, mesh_peers

TARGETS = {
    "throughput_events_per_s": 20_000,
    "local_p50_ms": 5.0,
    "cross_p50_ms": 10.0,
    "snapshot_100k_s": 2.0,
}
HOST = "127.0.0.1"
ROOT = pathlib.Path(__file__).resolve().parents[2]
SWEEP_RATES = [1_000, 2_000, 5_000, 10_000, 15_000, 20_000, 30_000, 0]  # 0: flat out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the load clients ----------------------------------------------------------------------


def _client(*args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "e2e.bench.bus_load", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def _line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        raise RuntimeError(f"load client {proc.args[3:]} exited {proc.returncode} without output")
    return json.loads(line)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


class Target:
    """A server under load: its SNAPSHOT port and its process id (for CPU)."""

    def __init__(self, name: str, port: int, pid: int):
        self.name, self.port, self.pid = name, port, pid


def run_load(pub_to: Target, subs: dict[str, Target], n: int, rate: float, prefix: str) -> dict:
    """One publisher on `pub_to` at `rate` (0: flat out) and a subscriber per `subs`."""
    warmup = int(rate) if rate else 0
    listeners = {key: _client("sub", HOST, t.port, n, prefix, warmup) for key, t in subs.items()}
    for proc in listeners.values():
        _line(proc)  # subscribed
    before = read_proc(pub_to.pid)
    publisher = _client("pub", HOST, pub_to.port, n, rate, prefix)
    start = _line(publisher)["start"]
    sent = _finish(publisher)
    got = {key: _finish(proc) for key, proc in listeners.items()}
    after = read_proc(pub_to.pid)
    out: dict = {"events": n, "offered_per_s": rate or None}
    for key, r in got.items():
        seconds = (r["last"] - start) if r["last"] else float("nan")
        out[key] = {
            "received": r["received"],
            "seconds": round(seconds, 3),
            "events_per_s": round(r["received"] / seconds) if r["received"] else 0,
            "out_of_order": r["out_of_order"],
            **{k: r[k] for k in ("p50_ms", "p99_ms", "max_ms") if k in r},
        }
    out["publisher_seconds"] = round(sent["sent"] - start, 3)
    received = max(r["received"] for r in got.values())
    out["server_cpu_us_per_event"] = round((after.cpu_s - before.cpu_s) / max(received, 1) * 1e6, 1)
    # The load's own share of the two shared cores (publisher and subscribers, start-up
    # included): what it takes is not there for the servers.
    clients_cpu = sent.get("cpu_s", 0) + sum(r.get("cpu_s", 0) for r in got.values())
    out["clients_cpu_us_per_event"] = round(clients_cpu / max(received, 1) * 1e6, 1)
    return out


def head(target: Target) -> int:
    probe = _client("snap", HOST, target.port, "/none/")
    return _finish(probe, 60)["head"] or 0


def snapshot(target: Target, size: int) -> dict:
    have = head(target)
    if have < size:
        filler = _client("pub", HOST, target.port, size - have, 0, "/bench/fill/")
        _line(filler)
        _finish(filler, 600)
        deadline = time.monotonic() + 120
        while (have := head(target)) < size and time.monotonic() < deadline:
            time.sleep(0.5)
    before = read_proc(target.pid)
    result = _finish(_client("snap", HOST, target.port, ""), 600)
    after = read_proc(target.pid)
    result["rate_per_s"] = round(result["events"] / result["seconds"]) if result["seconds"] else 0
    result["server_cpu_s"] = round(after.cpu_s - before.cpu_s, 2)
    return result


# -- the servers ---------------------------------------------------------------------------


@contextlib.contextmanager
def fleet(workdir: pathlib.Path, replicas: int, synchronous: str = "NORMAL"):
    base = free_block(replicas)
    # Pinned: the replica's default is FULL (an fsync per commit); the figures are NORMAL's
    # unless --synchronous says otherwise (both keep "committed before broadcast").
    extra = {
        "log": {"level": "WARNING"},
        "bus": {"enabled": True},
        "storage": {"synchronous": synchronous},
    }
    procs = [
        ReplicaProc(workdir, f"r{i}", i, base + 10 * (i - 1), extra=extra)
        for i in range(1, replicas + 1)
    ]
    try:
        for p in procs:
            p.write_config(mesh_peers(procs) if replicas > 1 else [])
            p.start()

        async def ready() -> None:
            await asyncio.gather(*(p.wait_ready() for p in procs))

        asyncio.run(ready())
        time.sleep(1)
        yield [Target(p.name, p.ports["bus"], p.proc.pid) for p in procs]
    finally:
        for p in procs:
            p.stop()


@contextlib.contextmanager
def reference(workdir: pathlib.Path, root: pathlib.Path):
    port = free_block(1) + 2
    ref = bus_reference.ReferenceBus(root, port, workdir / "reference.log")
    ref.start()
    try:
        yield Target("reference", port, ref.proc.pid)
    finally:
        ref.stop()


# -- the phases ----------------------------------------------------------------------------


def fleet_round(workdir: pathlib.Path, args) -> dict:
    with fleet(workdir, 2, args.synchronous) as (a, b):
        log("fleet: throughput")
        thr = run_load(a, {"local": a}, args.events, 0, "/bench/t/")
        log(f"  {thr}")
        log(f"fleet: latency at {args.rate:g}/s for {args.seconds:g} s")
        lat = run_load(
            a, {"local": a, "cross": b}, int(args.rate * args.seconds), args.rate, "/bench/lat/"
        )
        log(f"  {lat}")
        log(f"fleet: snapshot of {args.snapshot}")
        snap = snapshot(a, args.snapshot)
        log(f"  {snap}")
    return {"throughput": thr, "latency": lat, "snapshot": snap}


def single_round(workdir: pathlib.Path, args, target_cm) -> dict:
    with target_cm as target:
        name = target[0].name if isinstance(target, list) else target.name
        t = target[0] if isinstance(target, list) else target
        log(f"{name}: throughput")
        thr = run_load(t, {"local": t}, args.events, 0, "/bench/t/")
        log(f"  {thr}")
        lat = run_load(t, {"local": t}, int(args.rate * args.seconds), args.rate, "/bench/lat/")
        log(f"  latency {lat}")
        snap = snapshot(t, args.snapshot)
        log(f"  snapshot {snap}")
    return {"throughput": thr, "latency": lat, "snapshot": snap}


def sweep(target_cm, seconds: float, flat_out_events: int) -> list[dict]:
    points = []
    with target_cm as target:
        t = target[0] if isinstance(target, list) else target
        for rate in SWEEP_RATES:
            n = int(rate * seconds) if rate else flat_out_events
            r = run_load(t, {"local": t}, n, rate, f"/bench/s{rate}/")
            log(f"  sweep {t.name} {rate or 'flat out'}: {r['local']}")
            points.append({"offered_per_s": rate or None, **r["local"]})
    return points


# -- medians and the report ----------------------------------------------------------------

FIGURES = {
    "throughput (events/s)": ("throughput", "local", "events_per_s"),
    "server CPU per event (µs)": ("throughput", "server_cpu_us_per_event"),
    "latency p50 local (ms)": ("latency", "local", "p50_ms"),
    "latency p99 local (ms)": ("latency", "local", "p99_ms"),
    "latency p50 other replica (ms)": ("latency", "cross", "p50_ms"),
    "latency p99 other replica (ms)": ("latency", "cross", "p99_ms"),
    "snapshot (s)": ("snapshot", "seconds"),
    "snapshot (events/s)": ("snapshot", "rate_per_s"),
    "snapshot server CPU (s)": ("snapshot", "server_cpu_s"),
    "load clients' CPU per event, throughput (µs)": ("throughput", "clients_cpu_us_per_event"),
    "snapshot client CPU (s)": ("snapshot", "cpu_s"),
}


def _get(run: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(run, dict) or key not in run:
            return None
        run = run[key]
    return run


def medians(runs: list[dict]) -> dict[str, float | None]:
    out = {}
    for name, path in FIGURES.items():
        values = [v for r in runs if (v := _get(r, path)) is not None]
        out[name] = statistics.median(values) if values else None
    return out


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def report(result: dict) -> str:
    cols = [c for c in ("fleet", "single", "reference") if result["medians"].get(c)]
    lines = [
        f"Event BUS benchmark, {result['when']}, {result['machine']}, "
        f"load average {result['load_average'][0]:.2f} -> {result['load_average_after'][0]:.2f}, "
        f"SQLite synchronous {result['synchronous']}, "
        f"median of {result['repeat']} run(s)",
        "",
        "| figure | "
        + " | ".join(cols)
        + (" | single / reference |" if "reference" in cols else " |"),
        "|---|" + "---:|" * (len(cols) + ("reference" in cols)),
    ]
    for name in FIGURES:
        row = [_fmt(result["medians"][c][name]) for c in cols]
        if "reference" in cols:
            s, r = result["medians"]["single"][name], result["medians"]["reference"][name]
            row.append(f"{s / r:.2f}" if s is not None and r else "-")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    if result.get("reference_missing"):
        lines += ["", f"reference BUS: not run ({result['reference_missing']})"]
    lines += ["", "targets (fleet): " + ", ".join(f"{k} {v:,}" for k, v in TARGETS.items())]
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, points in result["sweep"].items():
        flat = [p for p in points if p["offered_per_s"] is None]
        paced = [p for p in points if p["offered_per_s"]]
        xs = [p["offered_per_s"] for p in paced]
        line = ax1.plot(xs, [p["events_per_s"] for p in paced], marker="o", label=name)[0]
        if flat:
            ax1.axhline(flat[0]["events_per_s"], ls=":", color=line.get_color(),
                        label=f"{name}, flat out")  # fmt: skip
        ax2.plot(xs, [p.get("p50_ms") for p in paced], marker="o", label=f"{name} p50")
        ax2.plot(xs, [p.get("p99_ms") for p in paced], marker="x", ls="--", label=f"{name} p99")
    top = max(SWEEP_RATES)
    ax1.plot([0, top], [0, top], color="grey", lw=0.8, label="offered")
    ax1.set(xlabel="offered PUBs/s", ylabel="BROADCASTs received/s", title="throughput")
    ax2.set(xlabel="offered PUBs/s", ylabel="PUB -> BROADCAST latency (ms)", yscale="log",
            title="latency (one replica / the reference)")  # fmt: skip
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Event BUS, {result['when']}, load {result['load_average'][0]:.1f}, 2 shared cores",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args) -> dict:
    load_before = os.getloadavg()
    ref_root, missing = bus_reference.locate(args.reference)
    if ref_root is None:
        log(f"reference BUS: not run ({missing})")
    runs: dict[str, list[dict]] = {"fleet": [], "single": [], "reference": []}
    sweeps: dict[str, list[dict]] = {}
    for i in range(args.repeat):
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="eventfleet-bench-bus-"))
        log(f"-- run {i + 1} of {args.repeat} (load {os.getloadavg()[0]:.2f})")
        try:
            runs["fleet"].append(fleet_round(workdir / "fleet", args))
            if not args.fleet_only:
                single = fleet(workdir / "single", 1, args.synchronous)
                runs["single"].append(single_round(workdir, args, single))
                if ref_root is not None:
                    ref = reference(workdir, ref_root)
                    runs["reference"].append(single_round(workdir, args, ref))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.sweep:
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="eventfleet-bench-bus-sweep-"))
        try:
            sweeps["eventfleet (one replica)"] = sweep(
                fleet(workdir / "single", 1, args.synchronous), args.sweep_seconds, args.events
            )
            if ref_root is not None:
                sweeps["reference"] = sweep(
                    reference(workdir, ref_root), args.sweep_seconds, args.events
                )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), "
        f"Python {platform.python_version()}",
        "load_average": load_before,
        "load_average_after": os.getloadavg(),
        "repeat": args.repeat,
        "synchronous": args.synchronous,
        "reference": str(ref_root) if ref_root else None,
        "reference_missing": missing or None,
        "medians": {k: medians(v) for k, v in runs.items() if v},
        "runs": runs,
        "sweep": sweeps,
        "targets": TARGETS,
        # The single-run figures at the top level, as before (the smoke test reads them).
        "throughput": runs["fleet"][-1]["throughput"]["local"]
        | {"events": runs["fleet"][-1]["throughput"]["events"]},
        "latency": {
            "local_received": runs["fleet"][-1]["latency"]["local"]["received"],
            "cross_received": runs["fleet"][-1]["latency"]["cross"]["received"],
        },
        "snapshot": runs["fleet"][-1]["snapshot"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.bus", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=50_000, help="throughput: PUBs sent")
    p.add_argument("--rate", type=float, default=2000.0, help="latency: PUBs/s")
    p.add_argument("--seconds", type=float, default=10.0, help="latency: duration")
    p.add_argument("--snapshot", type=int, default=100_000, help="events in the snapshot")
    p.add_argument("--repeat", type=int, default=1, help="runs; figures are their medians")
    p.add_argument(
        "--reference",
        help=f"directory of the built reference BUS (default ${bus_reference.ENV})",
    )
    p.add_argument("--fleet-only", action="store_true", help="no single/reference servers")
    p.add_argument(
        "--synchronous",
        choices=["NORMAL", "FULL"],
        default="NORMAL",
        help="the replicas' storage.synchronous (their default is FULL: an fsync per commit)",
    )
    p.add_argument("--sweep", action="store_true", help="latency/throughput per offered rate")
    p.add_argument("--sweep-seconds", type=float, default=3.0)
    p.add_argument("--plot", type=pathlib.Path, help="PNG of the sweep (needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="small counts (smoke run)")
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        # Said before minutes of measuring, not as a traceback after them.
        p.error(
            f"--plot {args.plot}: matplotlib is not installed "
            "(`.venv/bin/python -m pip install matplotlib`, or scripts/bench installs it)"
        )
    if args.quick:
        args.events, args.seconds, args.snapshot = 2_000, 2.0, 5_000
        # The smoke run checks the harness, not the figures: the fleet column only,
        # unless a reference was asked for (then single and reference too).
        args.fleet_only = args.fleet_only or bus_reference.locate(args.reference)[0] is None
    result = run(args)
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text)
    if args.plot and result["sweep"]:
        plot(result, args.plot)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
