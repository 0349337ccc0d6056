"""Aggregation benchmark: the Spark job vs a single-process Python baseline, same data.

Run from the repository root (needs the ``spark`` and ``test`` extras)::

    .venv/bin/python -m e2e.bench.aggregate                      # 200,000 events
    .venv/bin/python -m e2e.bench.aggregate --events 1000000     # the documented figure
    .venv/bin/python -m e2e.bench.aggregate --events 3000 --json /tmp/a.json   # smoke

One replica process (``eventfleet server``) is seeded with N events of `--types` types
(JSON objects with numeric fields, bare numbers, and a few invalid/binary/empty
payloads) over the Eventer client. Then, on the same stored events and in this order:

1. baseline read: this process reads the range over Eventer (`eventer_io.read_span`,
   the same paged reads the Spark source does, one connection);
2. baseline job: read again and aggregate with `eventfleet_spark.reference` (plain
   Python, one process);
3. Spark job, cold: ``eventfleet aggregate`` as a subprocess (JVM start-up, Spark
   session, read, aggregate, Parquet, write-back: what a scheduled run costs);
4. Spark read: a fresh in-process session counts the source's event rows (read path
   only);
5. Spark job, warm: the same job again in that session (its write-back finds every
   aggregate already registered and registers nothing);
6. the same with ``--partial-aggregation spark`` (event rows aggregated by Spark instead
   of in the reading workers), without write-back.

Then the same through the Arrow read path (``GET /export`` on the replica's HTTP port,
the job's ``--http``):

7. export read: this process reads the range from ``/export`` (`export_io`, one stream);
8. Spark job, cold, with ``--http`` (a subprocess, as 3; ``--cold-repeat N`` runs it N
   times; ``--class-archive`` adds a run writing a JVM class-data-sharing archive and N
   runs mapping it, `eventfleet_spark.class_archive`);
9. Spark read with ``http`` (rows counted) and 10. Spark job, warm, with ``--http``, in
   the warm session.

With ``--image REF`` (the job image, images/spark.Dockerfile, run with podman), the cold
job also runs inside the image as the driver pod runs it (``spark-submit`` of the
image's main file, the command e2e/cluster/spark.py makes of the operator's
ScheduledSparkApplication): ``--cold-repeat`` pairs, alternating without and with the
image's class-data-sharing archive (the operator's driver settings,
`builders.driver_class_archive_conf`). Wall time and CPU are taken inside the container
(a PID-1 wrapper that reaps every process: container creation is not counted).
``--image-only`` runs only those (and the baseline they are checked against).

``--read-in driver,executors`` runs every cold job (8, and those in the image) once with
each reader, alternating: the job's ``--read-in``, whose ``auto`` (the default) reads in
the driver under a local master, which is what every run here has.

The Parquet written through ``/export`` must be byte-identical to the Eventer path's.
``--skip-eventer-spark`` leaves out 3-6 (the Eventer Spark phases) for a shorter run.

The Spark Parquet output is checked against the baseline's aggregates, and the
registered aggregate events against the Parquet rows (no duplicates after two runs).
Replica CPU seconds are read from /proc for each phase: the server side of the read;
and the reading side's (this process, the Spark JVM and its Python workers, a cold job's
subprocess): on a shared machine CPU per event moves far less with the load than wall
time does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import itertools
import json
import os
import pathlib
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time

from e2e.bench import servers


def _payload(rng: random.Random, i: int):
    from eventfleet_server.common.model import EventPayloadBinary, EventPayloadJson

    r = i % 100
    if r < 80:
        return EventPayloadJson(
            json.dumps({"value": round(rng.uniform(-20, 120), 3), "count": i % 17, "state": "ok"})
        )
    if r < 92:
        return EventPayloadJson(json.dumps(rng.random()))
    if r < 95:
        return EventPayloadJson('{"nested": {"v": 1}, "label": "x"}')
    if r < 97:
        # Replicas refuse JSON text that does not parse (docs/security.md): a JSON
        # string stands in for a payload without numbers.
        return EventPayloadJson('"no numbers here"')
    if r < 99:
        return EventPayloadBinary("raw", b"\x00\x01\x02\x03")
    return None


async def seed(endpoint: str, events: int, types: int, batch: int, in_flight: int) -> float:
    """Register `events` events, `in_flight` batches at a time; returns the seconds."""
    from eventfleet_server.client.eventer import connect
    from eventfleet_server.common.model import RegisterEvent

    host, port = endpoint.rsplit(":", 1)
    client = await connect(host, int(port), "bench-seed")
    rng = random.Random(1)
    type_list = [("bench", f"site{i % 5}", f"dev{i}", "value") for i in range(types)]
    pending: set[asyncio.Future] = set()
    t0 = time.perf_counter()
    try:
        for start in range(0, events, batch):
            chunk = [
                RegisterEvent(type_list[i % types], None, _payload(rng, i))
                for i in range(start, min(start + batch, events))
            ]
            if len(pending) >= in_flight:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                _check_registered(done)
            pending.add(asyncio.ensure_future(client.register(chunk, with_response=True)))
        if pending:
            _check_registered((await asyncio.wait(pending))[0])
    finally:
        await client.close()
    return time.perf_counter() - t0


def _check_registered(done) -> None:
    for fut in done:
        if fut.result() is None:
            raise RuntimeError("the replica refused a seed batch")


async def stored_range(endpoint: str) -> tuple[int, int]:
    """First and last stored timestamp (us): two one-event queries."""
    from eventfleet_server.client.eventer import connect
    from eventfleet_server.common.model import Order, QueryTimeseriesParams, timestamp_to_us

    host, port = endpoint.rsplit(":", 1)
    client = await connect(host, int(port), "bench-range")
    try:
        first = await client.query(QueryTimeseriesParams(order=Order.ASCENDING, max_results=1))
        last = await client.query(QueryTimeseriesParams(order=Order.DESCENDING, max_results=1))
    finally:
        await client.close()
    return timestamp_to_us(first.events[0].timestamp), timestamp_to_us(last.events[0].timestamp)


def reader_cpu_s(replica_pid: int) -> float:
    """CPU seconds of this process and every process under it except the replica: the
    reading side (this process's reads, the Spark JVM, its Python workers, a cold
    job's subprocess once it has exited and been waited for), children that ended
    included (their time is in their parent's cutime/cstime)."""
    children: dict[int, list[tuple[int, float]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                raw = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        cpu = sum(int(x) for x in fields[11:15]) / servers.CLK_TCK
        children.setdefault(int(fields[1]), []).append((int(entry), cpu))
    with open(f"/proc/{os.getpid()}/stat") as f:
        raw = f.read()
    # This process: its own time and its waited-for children's, less the replica's if
    # it was waited for (it is not during the run).
    total = sum(int(x) for x in raw[raw.rindex(")") + 2 :].split()[11:15]) / servers.CLK_TCK
    stack = [os.getpid()]
    while stack:
        for pid, cpu in children.get(stack.pop(), ()):
            if pid != replica_pid:
                total += cpu
                stack.append(pid)
    return total


def _tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds of `root` and each live process under it, by pid."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        parent[int(entry)] = int(fields[1])
        # utime + stime only: a waited-for child's time is counted as that child's.
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / servers.CLK_TCK
    out, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in cpu:
            out[pid] = cpu[pid]
        stack += [c for c, pp in parent.items() if pp == pid]
    return out


def _run_sampled(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run `argv` to its end; returns the result and its process tree's CPU seconds.

    Sampled every 0.2 s while it runs (each process's own time, last sample): the JVM a
    cold job starts is not waited for by the job's interpreter, so its time never
    reaches this process's children's counters. Whatever a process spends in its last
    0.2 s is missed (shutdown)."""
    seen: dict[int, float] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        while proc.poll() is None:
            seen.update(_tree_cpu(proc.pid))
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())
    return result, sum(seen.values())


class Phase:
    """Wall time, replica CPU and reading-side CPU (`reader_cpu_s`) of one phase."""

    def __init__(self, name: str, server, events: int):
        self.name, self.server, self.events = name, server, events
        self.seconds = self.cpu = self.reader_cpu = 0.0
        self.reader_sampled: float | None = None  # a subprocess's tree, sampled
        self.note = ""

    def __enter__(self):
        self._cpu0 = self.server.stat().cpu_s
        self._reader0 = reader_cpu_s(self.server.pid)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        self.cpu = self.server.stat().cpu_s - self._cpu0
        self.reader_cpu = reader_cpu_s(self.server.pid) - self._reader0

    @property
    def reader_total(self) -> float:
        # For a subprocess phase the sample (this process only waits meanwhile; its
        # counters would count the subprocess's interpreter a second time).
        return self.reader_cpu if self.reader_sampled is None else self.reader_sampled

    def row(self) -> dict:
        return {
            "phase": self.name,
            "seconds": round(self.seconds, 2),
            "events_per_s": round(self.events / self.seconds) if self.seconds else None,
            "replica_cpu_s": round(self.cpu, 2),
            "replica_cpu_us_per_event": round(self.cpu / self.events * 1e6, 1)
            if self.events
            else None,
            "reader_cpu_s": round(self.reader_total, 2),
            "reader_cpu_us_per_event": round(self.reader_total / self.events * 1e6, 1)
            if self.events
            else None,
            "note": self.note,
        }


def run(args) -> dict:
    from eventfleet_server.common.jsonfmt import timestamp_to_iso
    from eventfleet_server.common.model import timestamp_from_us
    from eventfleet_spark import job, reference, timeplan
    from eventfleet_spark.eventer_io import read_span
    from eventfleet_spark.export_io import read_span_arrow
    from eventfleet_spark.options import JobOptions

    load_start = os.getloadavg()[0]
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="eventfleet-bench-aggregate-"))
    server = servers.start_server(servers.KINDS["eventfleet"], workdir, "replica")
    try:
        asyncio.run(servers.wait_operational(server))
        endpoint = f"127.0.0.1:{server.port}"
        conf = json.loads((server.workdir / "eventfleet.yaml").read_text())
        http = f"127.0.0.1:{conf['http']['port']}"
        print(f"seeding {args.events:,} events ({args.types} types) ...", file=sys.stderr)
        seed_s = asyncio.run(seed(endpoint, args.events, args.types, 1000, 4))
        first, last = asyncio.run(stored_range(endpoint))
        bucket_us = args.bucket * timeplan.US
        span = timeplan.aligned_range(first, last + 1, bucket_us)
        n = args.events
        iso = [timestamp_to_iso(timestamp_from_us(t)) for t in span]
        phases = []

        for _ in range(args.repeat_reads):
            print("baseline: read ...", file=sys.stderr)
            with Phase("baseline read (1 process)", server, n) as p:
                got = sum(len(page) for page in read_span(_ep(endpoint), span.start, span.end))
            assert got == n, f"baseline read {got} events, stored {n}"
            phases.append(p)
            print("export read (GET /export, Arrow) ...", file=sys.stderr)
            with Phase("export read: GET /export, Arrow (1 process, 1 stream)", server, n) as p:
                got = sum(len(pg) for pg in read_span_arrow(_ep(http), span.start, span.end))
            assert got == n, f"export read {got} events, stored {n}"
            phases.append(p)
        if args.reads_only:
            return _result(args, n, seed_s, None, None, phases, {}, load_start)

        print("baseline: read + aggregate ...", file=sys.stderr)
        with Phase("baseline job: read + aggregate (1 process)", server, n) as p:
            pages = read_span(_ep(endpoint), span.start, span.end)
            expected = reference.aggregate(
                reference.from_raw(itertools.chain.from_iterable(pages)), args.bucket
            )
        phases.append(p)

        if args.image:
            phases += image_cold_runs(args, server, n, http, endpoint, span, iso, workdir)
            if args.image_only:
                parquet = _read_parquet(workdir / "parquet-image")
                checks = {
                    "parquet_equals_baseline": parquet
                    == {k: v.payload_json() for k, v in expected.items()},
                    "export_parquet_byte_identical": None,
                    "spark_side_parquet_equal": None,
                    "aggregates": len(expected),
                    "registered_once_each": asyncio.run(_registered(endpoint, span))
                    == {k: 1 for k in expected},
                    "warm_run_registered": None,
                }
                return _result(args, n, seed_s, None, None, phases, checks, load_start)

        output = workdir / "parquet"
        output_http = workdir / "parquet-http"
        cli = [
            sys.executable,
            "-m",
            "eventfleet_cli",
            "aggregate",
            "--eventer",
            endpoint,
            "--bucket",
            str(args.bucket),
            "--output",
            str(output),
            "--start",
            iso[0],
            "--end",
            iso[1],
            "--window",
            str((span.end - span.start) // timeplan.US),
            "--master",
            args.master,
            "--json",
        ]
        if args.partitions:
            cli += ["--partitions", str(args.partitions)]
        cold_runs = [("Spark job, cold, over Eventer (JVM start included)", cli)]
        if args.skip_eventer_spark:
            cold_runs = []
        http_cli = [*cli, "--http", http]
        http_cli[http_cli.index(str(output))] = str(output_http)
        for i in range(args.cold_repeat):
            run = f", run {i + 1}" if args.cold_repeat > 1 else ""
            for read_in in args.read_in:
                cold_runs.append(
                    (
                        f"Spark job, cold, --http: /export{_read_in_label(read_in)}"
                        f" (JVM start included){run}",
                        [*http_cli, "--read-in", read_in],
                    )
                )
        if args.class_archive:
            # The first run with an empty directory writes the archive (a training run);
            # the runs after it map it. Every one is a fresh process and a fresh JVM.
            archived = [*http_cli, "--class-archive", str(workdir / "class-archive")]
            cold_runs.append(("Spark job, cold, --http, writes the class archive", archived))
            for i in range(args.cold_repeat):
                run = f", run {i + 1}" if args.cold_repeat > 1 else ""
                cold_runs.append((f"Spark job, cold, --http, class archive mapped{run}", archived))
        for name, argv in cold_runs:
            print(f"{name} ...", file=sys.stderr)
            with Phase(name, server, n) as p:
                proc, p.reader_sampled = _run_sampled(argv)
            if proc.returncode != 0:
                raise RuntimeError(f"eventfleet aggregate failed:\n{proc.stderr[-4000:]}")
            summary = json.loads(proc.stdout.strip().splitlines()[-1])
            # Start-up: everything outside the window's own work (interpreter and JVM
            # start, Spark session; a training run's archive dump at exit too).
            p.note = (
                f"start-up {p.seconds - summary['seconds']:.1f} s, read+aggregate"
                f" {summary['read_aggregate_seconds']} s, Parquet {summary['parquet_seconds']} s,"
                f" write-back {summary['write_back_seconds']} s"
            )
            phases.append(p)

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        t0 = time.perf_counter()
        # The job's own session (what `eventfleet aggregate` runs with locally).
        spark = job.spark_session(args.master)
        spark.sparkContext.setLogLevel("ERROR")
        startup = time.perf_counter() - t0
        try:
            opts = JobOptions(
                eventer=endpoint,
                bucket_seconds=args.bucket,
                output=str(output),
                start_us=span.start,
                end_us=span.end,
                window_seconds=(span.end - span.start) // timeplan.US,
                partitions=args.partitions,
                read_in=args.read_in[0],
            )
            from eventfleet_spark.source import EventerDataSource

            spark.dataSource.register(EventerDataSource)
            # The first query of a session starts the Python workers (imports of
            # pyarrow, pandas, eventfleet): counted as start-up, not as read time.
            t0 = time.perf_counter()
            job.read_events(spark, opts, timeplan.Span(0, timeplan.US)).count()
            warmup = time.perf_counter() - t0
            http_opts = dataclasses.replace(opts, http=http, output=str(output_http))
            warm = None
            for label, o in (("over Eventer", opts), ("--http: /export", http_opts)):
                if args.skip_eventer_spark and o is opts:
                    continue
                print(f"spark read {label} ...", file=sys.stderr)
                with Phase(f"Spark read {label}: source rows counted (warm)", server, n) as p:
                    counted = job.read_events(spark, o, span).count()
                assert counted == n, f"Spark read {counted} events, stored {n}"
                parts = job.read_events(spark, o, span).rdd.getNumPartitions()
                p.note = f"{parts} partitions"
                phases.append(p)
                print(f"spark job (warm) {label} ...", file=sys.stderr)
                with Phase(f"Spark job, warm, {label} (write-back finds all)", server, n) as p:
                    (run_summary,) = job.run(o, spark, out=None)
                p.note = f"read+aggregate {run_summary.read_seconds:.1f} s inside"
                phases.append(p)
                warm = warm or run_summary
            if not args.skip_eventer_spark:
                print("spark job (warm, --partial-aggregation spark) ...", file=sys.stderr)
                sql_opts = dataclasses.replace(
                    opts,
                    partial_aggregation="spark",
                    output=str(workdir / "parquet-sql"),
                    write_back=False,
                )
                with Phase("Spark job, warm, --partial-aggregation spark", server, n) as p:
                    (sql,) = job.run(sql_opts, spark, out=None)
                p.note = f"read+aggregate {sql.read_seconds:.1f} s inside; no write-back"
                phases.append(p)
        finally:
            spark.stop()

        if args.skip_eventer_spark:
            output = output_http
        parquet = _read_parquet(output)
        registered = asyncio.run(_registered(endpoint, span))
        checks = {
            "parquet_equals_baseline": parquet
            == {k: v.payload_json() for k, v in expected.items()},
            "export_parquet_byte_identical": None
            if args.skip_eventer_spark
            else _digests(output_http) == _digests(output),
            "spark_side_parquet_equal": args.skip_eventer_spark
            or _read_parquet(workdir / "parquet-sql") == parquet,
            "aggregates": len(expected),
            "registered_once_each": registered == {k: 1 for k in expected},
            "warm_run_registered": warm.write_back.registered,
        }
        return _result(args, n, seed_s, startup, warmup, phases, checks, load_start)
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


# PID 1 of a benchmark container: runs the command, reaps every process (orphans are
# re-parented to PID 1), then prints the wall time and the CPU time of the whole tree
# (a reaped process's time, with its own reaped children's, is added to its reaper's).
_CONTAINER_WRAPPER = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
main = subprocess.Popen(sys.argv[1:])
rc = None
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    if pid == main.pid:
        rc = os.waitstatus_to_exitcode(status)
t = os.times()
cpu = t.children_user + t.children_system
wall = time.perf_counter() - t0
print("BENCH-CONTAINER " + json.dumps({"wall": wall, "cpu": cpu, "rc": rc}), file=sys.stderr)
sys.exit(rc)
"""


def image_cold_runs(args, server, n, http, endpoint, span, iso, workdir) -> list:
    """Cold runs of the job inside the image: pairs without / with the class archive."""
    from eventfleet_operator import builders, naming
    from eventfleet_spark import timeplan

    from e2e.cluster.spark import submit_command

    podman = str(pathlib.Path(__file__).resolve().parents[2] / ".tools" / "bin" / "efpodman")
    out = workdir / "parquet-image"
    out.mkdir(mode=0o777)
    out.chmod(0o777)  # the image's user (185) writes it
    arguments = [
        *("--eventer", endpoint, "--http", http, "--bucket", str(args.bucket)),
        *("--output", "/out", "--start", iso[0], "--end", iso[1]),
        *("--window", str((span.end - span.start) // timeplan.US), "--json"),
    ]
    if args.partitions:
        arguments += ["--partitions", str(args.partitions)]
    threads = int(args.master.removeprefix("local[").removesuffix("]"))

    def command(conf: dict, read_in: str) -> list[str]:
        template = {
            "type": "Python",
            "mode": "cluster",
            "mainApplicationFile": naming.SPARK_MAIN,
            "driver": {"memory": "1g"},
            "executor": {"instances": 1, "cores": threads},
            "sparkConf": conf,
            "arguments": [*arguments, "--read-in", read_in],
        }
        return submit_command(template)

    variants = []
    for read_in in args.read_in:
        label = _read_in_label(read_in)
        variants += [
            (f"in the image, no class archive{label}", command({}, read_in)),
            (
                f"in the image, class archive mapped{label}",
                command(builders.driver_class_archive_conf({}), read_in),
            ),
        ]
    phases = []
    for i in range(args.cold_repeat):
        for label, argv in variants:
            name = f"Spark job, cold, --http, {label}, run {i + 1}"
            print(f"{name} ...", file=sys.stderr)
            container = [
                *(podman, "run", "--rm", "--network", "host"),
                *(a for v in args.image_volume for a in ("-v", v)),
                *("-v", f"{out}:/out", "--entrypoint", "/opt/eventfleet/venv/bin/python"),
                *(args.image, "-c", _CONTAINER_WRAPPER, *argv),
            ]
            with Phase(name, server, n) as p:
                proc = subprocess.run(container, capture_output=True, text=True)
            marker = [ln for ln in proc.stderr.splitlines() if ln.startswith("BENCH-CONTAINER ")]
            if proc.returncode != 0 or not marker:
                raise RuntimeError(f"the job in {args.image} failed:\n{proc.stderr[-4000:]}")
            inside = json.loads(marker[-1].removeprefix("BENCH-CONTAINER "))
            summary = json.loads(proc.stdout.strip().splitlines()[-1])
            p.seconds, p.reader_sampled = inside["wall"], inside["cpu"]
            cds = [ln for ln in proc.stderr.splitlines() if "[cds" in ln]
            p.note = (
                f"start-up {p.seconds - summary['seconds']:.1f} s, read+aggregate"
                f" {summary['read_aggregate_seconds']} s, Parquet {summary['parquet_seconds']} s,"
                f" write-back {summary['write_back_seconds']} s"
                + (f"; JVM: {cds[0].strip()[:120]}" if cds else "")
            )
            phases.append(p)
    return phases


def _read_in_label(read_in: str) -> str:
    return "" if read_in == "auto" else f", read in the {read_in}"


def _read_in_list(text: str) -> list[str]:
    from eventfleet_spark.options import READ_IN

    values = text.split(",")
    bad = [v for v in values if v not in READ_IN]
    if bad:
        raise argparse.ArgumentTypeError(f"{text!r}: each of {', '.join(READ_IN)}")
    return values


def _result(args, n, seed_s, startup, warmup, phases, checks, load_start) -> dict:
    return {
        "events": n,
        "types": args.types,
        "bucket_seconds": args.bucket,
        "seed_seconds": round(seed_s, 1),
        "spark_session_startup_seconds": None if startup is None else round(startup, 1),
        "spark_first_query_seconds": None if warmup is None else round(warmup, 1),
        "phases": [ph.row() for ph in phases],
        "checks": checks,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "master": args.master,
            "loadavg_at_start": load_start,
            "loadavg_at_end": os.getloadavg()[0],
            "date": datetime.date.today().isoformat(),
        },
    }


def _digests(root: pathlib.Path) -> dict:
    """Per date partition, the sorted SHA-256 of its Parquet files (names differ by job)."""
    import hashlib

    out: dict = {}
    for f in root.rglob("*.parquet"):
        out.setdefault(str(f.parent.relative_to(root)), []).append(
            hashlib.sha256(f.read_bytes()).hexdigest()
        )
    return {k: sorted(v) for k, v in out.items()}


def _ep(endpoint: str):
    from eventfleet_spark.endpoints import parse_endpoints

    return parse_endpoints(endpoint)[0]


def _read_parquet(root: pathlib.Path) -> dict:
    """Parquet rows as {(type, bucket us): payload JSON} (the canonical comparison)."""
    import pyarrow.parquet as pq
    from eventfleet_spark.record import Aggregate

    out = {}
    for row in pq.read_table(root, partitioning="hive").to_pylist():
        agg = Aggregate.from_parquet_row(row)
        out[agg.key] = agg.payload_json()
    return out


async def _registered(endpoint: str, span) -> dict:
    """How many aggregate events each (type, bucket) has in the fleet (counted here
    with a plain query, not with the job's own write-back code)."""
    from eventfleet_server.client.eventer import connect
    from eventfleet_server.common.model import (
        Order,
        OrderBy,
        QueryTimeseriesParams,
        timestamp_from_us,
        timestamp_to_us,
    )

    host, port = endpoint.rsplit(":", 1)
    client = await connect(host, int(port), "bench-check")
    params = QueryTimeseriesParams(
        event_types=[("eventfleet", "aggregate", "*")],
        source_t_from=timestamp_from_us(span.start),
        source_t_to=timestamp_from_us(span.end - 1),
        order=Order.ASCENDING,
        order_by=OrderBy.SOURCE_TIMESTAMP,
    )
    counts: dict = {}
    try:
        while True:
            result = await client.query(params)
            for e in result.events:
                key = (tuple(e.type[3:]), timestamp_to_us(e.source_timestamp))
                counts[key] = counts.get(key, 0) + 1
            if not (result.more_follows and result.events):
                return counts
            params = params._replace(last_event_id=result.events[-1].id)
    finally:
        await client.close()


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"{result['events']:,} events, {result['types']} types, "
        f"{result['bucket_seconds']} s buckets, Spark `{result['machine']['master']}`, "
        f"{m['cpus']} CPUs (load average {m['loadavg_at_start']:.1f} at the start,"
        f" {m['loadavg_at_end']:.1f} at the end); seeding took {result['seed_seconds']} s"
        + (
            f"; a Spark session starts in {result['spark_session_startup_seconds']} s and its"
            f" first (empty) query takes {result['spark_first_query_seconds']} s (Python"
            " workers start)."
            if result["spark_session_startup_seconds"] is not None
            else "."
        ),
        "",
        "| phase | seconds | events/s | replica CPU µs/event | reader CPU µs/event | note |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for p in result["phases"]:
        lines.append(
            f"| {p['phase']} | {p['seconds']:.1f} | {p['events_per_s']:,} | "
            f"{p['replica_cpu_us_per_event']} | {p['reader_cpu_us_per_event']} | {p['note']} |"
        )
    c = result["checks"]
    if not c:  # --reads-only
        return "\n".join(lines)
    lines += [
        "",
        f"Checks: Parquet equals the baseline: {c['parquet_equals_baseline']}; "
        f"{c['aggregates']:,} aggregates, each registered exactly once after two runs: "
        f"{c['registered_once_each']}; the warm run registered {c['warm_run_registered']}; "
        f"Spark-side aggregation wrote the same Parquet: {c['spark_side_parquet_equal']}; "
        f"the job through /export wrote byte-identical Parquet: "
        f"{c['export_parquet_byte_identical']}.",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.aggregate", description=__doc__)
    p.add_argument("--events", type=int, default=200_000, help="events to seed (default 200000)")
    p.add_argument("--types", type=int, default=50, help="distinct event types (default 50)")
    p.add_argument("--bucket", type=int, default=1, help="bucket seconds (default 1)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--partitions", type=int, help="read partitions (default: the job's)")
    p.add_argument("--json", type=pathlib.Path, help="write the result as JSON here")
    p.add_argument("--markdown", type=pathlib.Path, help="write the table here")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--reads-only",
        action="store_true",
        help="only the read phases: Eventer read and /export read of the same events",
    )
    p.add_argument(
        "--repeat-reads",
        type=int,
        default=1,
        help="run the two read phases this many times, alternating (default 1)",
    )
    p.add_argument(
        "--skip-eventer-spark",
        action="store_true",
        help="leave out the Spark phases over Eventer (the /export ones and the baselines run)",
    )
    p.add_argument(
        "--cold-repeat",
        type=int,
        default=1,
        help="run each cold Spark job over /export this many times (default 1)",
    )
    p.add_argument(
        "--class-archive",
        action="store_true",
        help="also run the cold job with --class-archive: one run writing the JVM class"
        " archive, then --cold-repeat runs mapping it",
    )
    p.add_argument(
        "--read-in",
        type=_read_in_list,
        default=["auto"],
        metavar="WHO[,WHO...]",
        help="the job's --read-in (auto, driver, executors); several: each cold run is"
        " repeated with each, alternating, and the warm runs use the first (default auto)",
    )
    p.add_argument(
        "--image",
        help="also run the cold job inside this job image (podman), --cold-repeat pairs"
        " alternating without and with its class archive (e.g. localhost/eventfleet/spark:test)",
    )
    p.add_argument(
        "--image-volume",
        action="append",
        default=[],
        metavar="SRC:DST[:ro]",
        help="with --image: also mount this into the containers (podman -v), e.g. an"
        " archive directory written by a training run outside the image build",
    )
    p.add_argument(
        "--image-only",
        action="store_true",
        help="with --image: only the baselines and the runs in the image",
    )
    args = p.parse_args(argv)
    if args.image_only and not args.image:
        p.error("--image-only needs --image")
    try:
        result = run(args)
    finally:
        with contextlib.suppress(Exception):
            servers.stop_all()
    table = markdown(result)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table + "\n")
    c = result["checks"]
    if not c:  # --reads-only: the read counts were asserted
        return 0
    return (
        0 if c["parquet_equals_baseline"] and c["export_parquet_byte_identical"] is not False else 1
    )


if __name__ == "__main__":
    sys.exit(main())
