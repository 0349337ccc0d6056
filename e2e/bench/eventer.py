"""Eventer benchmark: eventfleet's replica vs the reference hat-event 0.9.44 server.

Run from the repository root (``scripts/bench`` installs what it needs first)::

    .venv/bin/python -m e2e.bench.eventer            # full run, ~10 min on 2 cores
    .venv/bin/python -m e2e.bench.eventer --quick    # < 1 min
    .venv/bin/python -m e2e.bench.eventer --stored 300000 --markdown /tmp/t.md

Both servers run as separate processes on 127.0.0.1, each on a fresh data directory,
and are driven by the same real ``hat.event.eventer.client``. Scenarios run round-robin
over the servers (one server busy at a time) so that a drift in machine load hits every
server alike. See docs/performance.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter

from e2e.bench import report, scenarios, servers
from e2e.bench.servers import KINDS, ServerProcess

DEFAULT_PLOT = servers.REPO_ROOT / "docs" / "performance.png"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Eventer benchmark: eventfleet vs reference hat-event 0.9.44, side by side.",
    )
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument(
        "--servers",
        default="eventfleet,eventfleet-full,reference",
        help="comma list of: " + ", ".join(KINDS) + " (default: all)",
    )
    p.add_argument("--events", type=int, help="events per register scenario (default 20000)")
    p.add_argument("--batches", type=ints, default=[1, 10, 100, 1000])
    p.add_argument("--clients", type=ints, default=[1, 4])
    p.add_argument("--inflight", type=ints, default=[1, 16], help="requests in flight per client")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per register scenario and server; the table shows the median (default 1)",
    )
    p.add_argument("--latency-events", type=int, help="notifications per latency run (1000)")
    p.add_argument(
        "--latency-interval",
        type=float,
        default=0.002,
        help="pause between the single-event registrations of the latency runs (s)",
    )
    p.add_argument("--stored", type=int, help="events stored before the queries (50000)")
    p.add_argument(
        "--register-stored",
        type=int,
        default=0,
        help="events stored before the register scenarios (default 0: an empty store)",
    )
    p.add_argument("--query-reps", type=int, help="timed runs per query (30)")
    p.add_argument("--query-budget", type=float, help="max seconds per query scenario (10)")
    p.add_argument(
        "--phases",
        default="register,query",
        help="register (throughput, CPU/event, notify latency) and/or query (default both)",
    )
    p.add_argument("--quick", action="store_true", help="small counts, < 1 min")
    p.add_argument("--json", type=pathlib.Path, help="write the raw results here")
    p.add_argument("--markdown", type=pathlib.Path, help="write the Markdown table here")
    p.add_argument(
        "--plot",
        type=pathlib.Path,
        help=f"PNG path (default {DEFAULT_PLOT.relative_to(servers.REPO_ROOT)}; --quick: none)",
    )
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--profile",
        action="store_true",
        help="sample the eventfleet server(s) with py-spy during each phase and print the "
        "hot spots (py-spy must be installed: scripts/bench installs it for this flag)",
    )
    p.add_argument("--workdir", type=pathlib.Path, help="data/log directory (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args(argv)
    quick = a.quick
    a.events = a.events or (1000 if quick else 20000)
    a.latency_events = a.latency_events or (100 if quick else 1000)
    a.stored = a.stored if a.stored is not None else (3000 if quick else 50000)
    a.query_reps = a.query_reps or (5 if quick else 30)
    a.query_budget = a.query_budget or (1.0 if quick else 10.0)
    if a.no_plot:
        a.plot = None
    elif a.plot is None and not quick:
        a.plot = DEFAULT_PLOT
    a.phases = {x.strip() for x in a.phases.split(",") if x.strip()}
    if not a.phases or a.phases - {"register", "query"}:
        p.error("--phases: register and/or query")
    a.server_keys = [k.strip() for k in a.servers.split(",") if k.strip()]
    bad = [k for k in a.server_keys if k not in KINDS]
    if bad or not a.server_keys:
        p.error(f"unknown server(s) {bad}; choose from {list(KINDS)}")
    if a.stored < 1000:
        p.error("--stored must be >= 1000 (the queries read 1000 events)")
    return a


def machine_meta(args: argparse.Namespace) -> dict:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])

    def ver(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=servers.REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "mem_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hat_event": ver("hat-event"),
        "hat_drivers": ver("hat-drivers"),
        "eventfleet_commit": commit,
        "loadavg_start": os.getloadavg(),
        "events": args.events,
        "latency_events": args.latency_events,
        "latency_interval_s": args.latency_interval,
        "stored": args.stored,
        "register_stored": args.register_stored,
        "repeat": args.repeat,
        "phases": sorted(args.phases),
        "query_reps": args.query_reps,
        "query_budget_s": args.query_budget,
        "quick": args.quick,
        "argv": sys.argv[1:],
    }


class Profiler:
    """py-spy sampling of eventfleet server processes during a phase (--profile)."""

    def __init__(self, enabled: bool, outdir: pathlib.Path):
        self.enabled = enabled
        self.outdir = outdir
        self.procs: list[tuple[str, subprocess.Popen, pathlib.Path]] = []
        self.exe = shutil.which("py-spy", path=str(servers.VENV_BIN)) or shutil.which("py-spy")
        if enabled and not self.exe:
            raise SystemExit("--profile needs py-spy (scripts/bench --profile installs it)")

    def start(self, phase: str, procs: dict[str, ServerProcess]) -> None:
        if not self.enabled:
            return
        self.outdir.mkdir(parents=True, exist_ok=True)
        for key, sp in procs.items():
            if sp.kind.family != "eventfleet":
                continue
            out = self.outdir / f"{phase}-{key}.txt"
            proc = subprocess.Popen(
                [self.exe, "record", "--pid", str(sp.pid), "--format", "raw", "--rate", "250",
                 "--output", str(out), "--nonblocking", "--threads",
                 *(["--gil"] if os.environ.get("EVENTFLEET_BENCH_PYSPY_GIL") else [])],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )  # fmt: skip
            servers._live[proc.pid] = proc
            self.procs.append((f"{phase} / {key}", proc, out))

    def stop(self) -> list[str]:
        lines: list[str] = []
        for name, proc, out in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                servers.stop_process_group(proc)
                err = b""
            servers._live.pop(proc.pid, None)
            if not out.exists():
                lines.append(f"profile {name}: no output ({err.decode(errors='replace')[-300:]})")
                continue
            lines += hot_spots(name, out)
        self.procs = []
        return lines


def _source_line(frame: str) -> str:
    """The source text of a py-spy frame "func (pkg/mod.py:N)", when it can be found."""
    try:
        loc = frame[frame.rindex("(") + 1 : -1]
        rel, line = loc.rsplit(":", 1)
        for base in (*sys.path, str(servers.REPO_ROOT / "server")):
            f = pathlib.Path(base or ".") / rel
            if f.is_file():
                return f.read_text(errors="replace").splitlines()[int(line) - 1].strip()[:70]
    except (ValueError, IndexError, OSError):
        pass
    return ""


# Leaves where a thread waits rather than computes; py-spy's idle detection misses some.
_WAIT_HINTS = ("EpollSelector.select", ".get()", "tx.get(", "Condition.wait")


def hot_spots(name: str, path: pathlib.Path, top: int = 12) -> list[str]:
    """Per-thread and line-level sample shares from py-spy's collapsed stacks
    (``--threads``), plus function-level inclusive shares."""
    leaf: Counter[tuple[str, str]] = Counter()
    incl: Counter[str] = Counter()
    per_thread: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f]
        thread = "?"
        if frames and frames[0].startswith("thread ("):
            thread = frames.pop(0).split(": ", 1)[-1]
            thread = "MainThread" if thread == "MainThread" else thread.split(" ")[0] + "*"
        if not frames:
            continue
        total += n
        per_thread[thread] += n
        leaf[(thread, frames[-1])] += n
        for f in {fr.rsplit(":", 1)[0] + ")" if ":" in fr else fr for fr in frames}:
            incl[f] += n
    if not total:
        return [f"profile {name}: no samples"]
    pct = lambda n: f"{100 * n / total:5.1f}"  # noqa: E731
    out = [
        f"profile {name}: {total} samples ({path})",
        "  samples by thread: "
        + ", ".join(f"{t} {pct(n).strip()}%" for t, n in per_thread.most_common()),
        "  self% (of all samples)  thread  leaf line  [source]  (wait = the thread is blocked)",
    ]
    for (thread, f), n in leaf.most_common(top):
        src = _source_line(f)
        wait = " (wait)" if any(h in f or h in src for h in _WAIT_HINTS) else ""
        out.append(f"  {pct(n)}  {thread:<12} {f}{wait}  [{src}]")
    out.append("  inclusive% by function (event-loop plumbing left out):")
    skip = (
        "run_forever",
        "_run_once",
        "_run (asyncio",
        "<module>",
        "run (asyncio",
        "main (",
        "Thread.",
        "_bootstrap",
        "run_until_complete",
        "Runner.run",
        "run (eventfleet_cli",
    )
    shown = 0
    for f, n in incl.most_common():
        if any(s in f for s in skip):
            continue
        out.append(f"  {pct(n)}  {f}")
        shown += 1
        if shown >= top:
            break
    return out


async def start_all(keys: list[str], workdir: pathlib.Path, phase: str) -> dict[str, ServerProcess]:
    procs: dict[str, ServerProcess] = {}
    for key in keys:
        procs[key] = servers.start_server(KINDS[key], workdir, f"{phase}-{key}")
    for key, sp in procs.items():
        t0 = time.perf_counter()
        await servers.wait_operational(sp)
        log(
            f"[{key}] {phase} server pid {sp.pid} operational on 127.0.0.1:{sp.port} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    return procs


def stop_all(procs: dict[str, ServerProcess]) -> None:
    for sp in procs.values():
        sp.stop()


async def guarded(sp: ServerProcess, coro, timeout: float):
    """Run one scenario with a bound; a dead server fails fast with its log tail."""
    sp.check_alive()
    task = asyncio.ensure_future(coro)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            if sp.proc.poll() is not None:
                sp.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"scenario exceeded {timeout:.0f} s")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def err_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


async def run(args: argparse.Namespace, workdir: pathlib.Path) -> dict:
    keys = args.server_keys
    meta = machine_meta(args)
    reg_scen = [
        (report.reg_key(b, q, c), b, q, c)
        for b in args.batches
        for c in args.clients
        for q in args.inflight
    ]
    meta["register_scenarios"] = reg_scen
    res: dict = {
        "meta": meta,
        "servers": {
            k: {
                "label": KINDS[k].label,
                "family": KINDS[k].family,
                "register": {},
                "notify": {},
                "query": {},
                "rss": {},
            }
            for k in keys
        },
    }
    R = res["servers"]
    prof = Profiler(args.profile, workdir / "profile")
    profile_lines: list[str] = []
    scen_timeout = max(120.0, args.events / 100)
    rot = 0

    def order() -> list[str]:
        nonlocal rot
        rot += 1
        return keys[rot % len(keys) :] + keys[: rot % len(keys)]

    # --- phase 1: register throughput / CPU per event, then notify latency ------------
    if "register" in args.phases:
        procs = await start_all(keys, workdir, "register")
        markers: dict[str, scenarios.PersistMarker] = {}
        try:
            for k, sp in procs.items():
                markers[k] = scenarios.PersistMarker(sp)
                await markers[k].open()
            if args.register_stored:
                for k, sp in procs.items():
                    pre = await guarded(
                        sp,
                        scenarios.prefill(sp, markers[k], stored=args.register_stored),
                        max(300.0, args.register_stored / 200),
                    )
                    log(f"[{k}] register store pre-filled with {args.register_stored:,} events "
                        f"({pre.seconds:.1f} s)")  # fmt: skip
            prof.start("register", procs)
            for skey, b, q, c in reg_scen:
                runs: dict[str, list[dict]] = {k: [] for k in keys}
                for rep in range(args.repeat):
                    for k in order():
                        sp = procs[k]
                        if R[k]["register"].get(skey, {}).get("error"):
                            continue
                        rep_txt = f" [run {rep + 1}/{args.repeat}]" if args.repeat > 1 else ""
                        try:
                            r = await guarded(
                                sp,
                                scenarios.run_register(
                                    sp,
                                    markers[k],
                                    batch=b,
                                    inflight=q,
                                    clients=c,
                                    events=args.events,
                                ),
                                scen_timeout,
                            )
                            runs[k].append(r.to_json())
                            log(
                                f"[{k}] register {report.reg_label(b, q, c)}{rep_txt}: "
                                f"{r.events_per_s:,.0f} ev/s, {r.cpu_us_per_event:,.1f} µs CPU/ev "
                                f"(loop thread {r.main_thread_cpu_us_per_event:,.1f}, "
                                f"kernel {r.sys_cpu_us_per_event:,.1f}) "
                                f"({r.seconds:.2f} s, persisted +{r.persist_wait_s * 1e3:.0f} ms)"
                            )
                        except Exception as e:
                            R[k]["register"][skey] = {"error": err_text(e)}
                            log(f"[{k}] register {report.reg_label(b, q, c)}: ERROR {err_text(e)}")
                for k in keys:
                    if runs[k] and not R[k]["register"].get(skey, {}).get("error"):
                        R[k]["register"][skey] = scenarios.median_register(runs[k])
            profile_lines += prof.stop()
            for persisted in (False, True):
                for k in order():
                    sp = procs[k]
                    name = f"persisted={str(persisted).lower()}"
                    try:
                        r = await guarded(
                            sp,
                            scenarios.run_notify(
                                sp,
                                persisted=persisted,
                                count=args.latency_events,
                                interval=args.latency_interval,
                            ),
                            scen_timeout,
                        )
                        R[k]["notify"][str(persisted).lower()] = r.to_json()
                        log(
                            f"[{k}] notify latency {name}: p50 {r.p50_ms:.2f} ms, "
                            f"p99 {r.p99_ms:.2f} ms ({r.samples} events)"
                        )
                    except Exception as e:
                        R[k]["notify"][str(persisted).lower()] = {"error": err_text(e)}
                        log(f"[{k}] notify latency {name}: ERROR {err_text(e)}")
            for k, sp in procs.items():
                with contextlib.suppress(OSError):
                    R[k]["rss"]["after_register_kib"] = sp.stat().rss_kib
        finally:
            profile_lines += prof.stop()
            for m in markers.values():
                await m.close()
            stop_all(procs)

    # --- phase 2: queries on a store pre-filled with --stored events --------------------
    if "query" in args.phases:
        procs = await start_all(keys, workdir, "query")
        markers = {}
        pre: dict[str, scenarios.Prefill] = {}
        try:
            for k in keys:
                sp = procs[k]
                markers[k] = scenarios.PersistMarker(sp)
                await markers[k].open()
                try:
                    pre[k] = await guarded(
                        sp,
                        scenarios.prefill(sp, markers[k], stored=args.stored),
                        max(300.0, args.stored / 200),
                    )
                    log(
                        f"[{k}] prefill {args.stored:,} events over 1000 types: "
                        f"{pre[k].seconds:.1f} s ({args.stored / pre[k].seconds:,.0f} ev/s)"
                    )
                except Exception as e:
                    log(f"[{k}] prefill: ERROR {err_text(e)}")
            conns = {}
            for k in pre:
                conns[k] = await scenarios.connect(procs[k], "bench-query")
            prof.start("query", {k: procs[k] for k in pre})
            for name, label in scenarios.QUERY_NAMES:
                for k in order():
                    sp = procs[k]
                    if k not in pre:
                        R[k]["query"][name] = {"error": "prefill failed"}
                        continue
                    if not conns[k].is_open:  # a failed query may have closed it
                        with contextlib.suppress(Exception):
                            conns[k] = await scenarios.connect(sp, "bench-query")
                    fn = scenarios.query_fns(conns[k], pre[k])[name]
                    try:
                        r = await guarded(
                            sp,
                            scenarios.measure_query(
                                sp, name, fn, reps=args.query_reps, budget=args.query_budget
                            ),
                            max(scen_timeout, 20 * args.query_budget),
                        )
                        R[k]["query"][name] = r.to_json()
                        log(
                            f"[{k}] query {label}: p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, "
                            f"server CPU {r.server_cpu_ms:.1f} ms/run "
                            f"({r.samples} runs, {r.returned} events)"
                        )
                    except Exception as e:
                        R[k]["query"][name] = {"error": err_text(e)}
                        log(f"[{k}] query {label}: ERROR {err_text(e)}")
            profile_lines += prof.stop()
            await scenarios.close_all(list(conns.values()))
            for k, sp in procs.items():
                with contextlib.suppress(OSError):
                    st = sp.stat()
                    R[k]["rss"]["after_query_kib"] = st.rss_kib
                    R[k]["rss"]["hwm_kib"] = st.hwm_kib
        finally:
            profile_lines += prof.stop()
            for m in markers.values():
                await m.close()
            stop_all(procs)

    meta["loadavg_end"] = os.getloadavg()
    res["profile"] = profile_lines
    return res


def errors(res: dict) -> list[str]:
    out = []
    for k, s in res["servers"].items():
        for section in ("register", "notify", "query"):
            for name, r in s[section].items():
                if "error" in r:
                    out.append(f"{k} {section} {name}: {r['error']}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    atexit.register(servers.stop_all)
    if args.workdir:
        workdir = args.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        own_workdir = False
    else:
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="eventfleet-bench-"))
        own_workdir = True

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    log(
        f"bench: servers {args.server_keys}, {args.events:,} events/scenario, "
        f"{args.stored:,} stored for queries, work dir {workdir}"
    )
    t0 = time.perf_counter()
    ok = False
    try:
        res = asyncio.run(run(args, workdir))
        ok = True
    except KeyboardInterrupt:
        log("bench: interrupted")
        return 130
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        servers.stop_all()
        if own_workdir and not args.keep and not args.profile and ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"bench: work dir kept: {workdir}")
    res["meta"]["wall_s"] = round(time.perf_counter() - t0, 1)

    print(report.table(res))
    print()
    for line in report.summary(res):
        print(line)
    for line in res.get("profile", []):
        print(line)
    m = res["meta"]
    print(
        f"\nmachine: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, "
        f"hat-event {m['hat_event']}, {m['date']}, load {m['loadavg_start'][0]:.2f}"
        f"->{m['loadavg_end'][0]:.2f}, wall {m['wall_s']:.0f} s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
        print(f"results: {args.json}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(report.table(res, markdown=True) + "\n")
        print(f"markdown table: {args.markdown}")
    if args.plot:
        if report.plot(res, args.plot):
            print(f"plot: {args.plot}")
        else:
            print("plot: skipped (matplotlib is not installed; scripts/bench installs it)")
    errs = errors(res)
    if errs:
        print(f"\n{len(errs)} scenario(s) failed:", *errs, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
