"""The aggregation job: read a range of events, aggregate, write Parquet, write back.

Entry points: `main` (argv, used by ``eventfleet aggregate`` and by the spark-submit
file ``spark/aggregate.py``) and `run` (options and an optional SparkSession, used by
tests and the benchmark). A range is processed window by window (`timeplan`); each
window ends with one summary line on stdout, next to Spark's own progress bar on
stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from eventfleet_server.common.jsonfmt import timestamp_to_iso
from eventfleet_server.common.model import timestamp_from_us

from eventfleet_spark import class_archive, image_archive, timeplan
from eventfleet_spark import options as job_options
from eventfleet_spark.class_archive import ArchivePlan as ClassArchive
from eventfleet_spark.endpoints import parse_endpoints
from eventfleet_spark.options import JobOptions
from eventfleet_spark.parquet_output import ParquetResult
from eventfleet_spark.payloads import PAYLOAD_CLASSES
from eventfleet_spark.record import exclusion_prefix, expand_prefix
from eventfleet_spark.writeback import WriteBackResult

APP_NAME = "eventfleet-aggregate"


@dataclasses.dataclass(frozen=True)
class WindowSummary:
    """What one window did; `line` is the progress line, `to_json` the ``--json`` one."""

    start_us: int
    end_us: int
    bucket_seconds: int
    events: int
    payloads: dict[str, int]
    aggregates: int
    types: int
    read_seconds: float
    parquet_seconds: float
    write_back_seconds: float
    parquet: ParquetResult
    write_back: WriteBackResult | None
    seconds: float

    def to_json(self) -> dict:
        return {
            "window": [_iso(self.start_us), _iso(self.end_us)],
            "bucket_seconds": self.bucket_seconds,
            "events": self.events,
            "payloads": self.payloads,
            "aggregates": self.aggregates,
            "types": self.types,
            "read_aggregate_seconds": round(self.read_seconds, 3),
            "parquet_seconds": round(self.parquet_seconds, 3),
            "write_back_seconds": round(self.write_back_seconds, 3),
            "parquet": dataclasses.asdict(self.parquet),
            "write_back": dataclasses.asdict(self.write_back) if self.write_back else None,
            "seconds": round(self.seconds, 3),
        }

    def line(self) -> str:
        p = self.payloads
        wb = (
            f"registered={self.write_back.registered} unchanged={self.write_back.unchanged}"
            if self.write_back
            else "off"
        )
        rate = self.events / self.read_seconds if self.read_seconds > 0 else 0.0
        return (
            f"aggregate {_iso(self.start_us)}..{_iso(self.end_us)} bucket={self.bucket_seconds}s:"
            f" events={self.events} ("
            + " ".join(f"{name}={p[name]}" for name in PAYLOAD_CLASSES)
            + f") aggregates={self.aggregates} types={self.types}"
            f" parquet_dates={','.join(self.parquet.dates) or '-'} write_back: {wb}"
            f" | read+aggregate {self.read_seconds:.1f} s ({rate:,.0f} events/s),"
            f" parquet {self.parquet_seconds:.1f} s, write-back {self.write_back_seconds:.1f} s,"
            f" window {self.seconds:.1f} s"
        )


def _iso(us: int) -> str:
    return timestamp_to_iso(timestamp_from_us(us))


# Kubernetes keeps at most 4096 bytes of a termination message; the result stays below.
RESULT_LIMIT = 4096


@dataclasses.dataclass
class RunProgress:
    """What a run planned and what it finished so far (kept when a window fails)."""

    planned: list[timeplan.Span] = dataclasses.field(default_factory=list)
    done: list[WindowSummary] = dataclasses.field(default_factory=list)


def run_result(progress: RunProgress, error: str | None = None) -> dict:
    """The run's outcome as one JSON object (``--result-file``): the result, the whole
    window planned, how many windows finished and their counts summed."""
    done = progress.done
    result: dict = {"result": "Failed" if error is not None else "Succeeded"}
    if progress.planned:
        result["window"] = [_iso(progress.planned[0].start), _iso(progress.planned[-1].end)]
    result.update(
        windows=len(done),
        events=sum(s.events for s in done),
        aggregates=sum(s.aggregates for s in done),
        parquetRows=sum(s.parquet.rows for s in done),
        registered=sum(s.write_back.registered for s in done if s.write_back),
        seconds=round(sum(s.seconds for s in done), 3),
    )
    if error is not None:
        # Bounded: the whole object must fit a termination message.
        result["error"] = error[:1000]
    return result


def write_result(path: pathlib.Path, result: dict) -> None:
    """``result`` as compact JSON into ``path`` (a termination message: small, one write)."""
    path.write_text(json.dumps(result, separators=(",", ":")))


def plan_windows(opts: JobOptions, now_us: int) -> list[timeplan.Span]:
    """The windows of this invocation (see `timeplan`)."""
    bucket_us = opts.bucket_seconds * timeplan.US
    window_us = opts.window_seconds * timeplan.US
    default = timeplan.default_range(now_us, bucket_us, window_us)
    if opts.start_us is None and opts.end_us is None:
        return [default]
    end = opts.end_us if opts.end_us is not None else default.end
    start = opts.start_us if opts.start_us is not None else end - window_us
    span = timeplan.aligned_range(start, end, bucket_us)
    return timeplan.windows(span, window_us, bucket_us)


LOCAL_SESSION_CONF = {
    # A run is short and, locally, shares its cores with the replicas it reads: the JVM
    # holds only partial aggregates (the reading Python workers fold the events), so
    # C2's compilations cost more CPU than they save, and one serial collector is enough.
    # Measured on 1M events (2 cores): JVM CPU of the first run 22.4 -> 11.2 s, of a
    # warm run 3.7-4.7 -> 2.2 s (docs/performance.md, Aggregation).
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    # A batch job: nobody looks at the web UI of a local run, and it costs start-up time.
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
}
"""Session settings when the job starts its own JVM (not under spark-submit, whose
master and configuration the operator sets)."""


def starts_own_jvm(master: str | None) -> bool:
    """Whether the job starts the JVM itself (a local run), not spark-submit."""
    return bool(master) or "PYSPARK_GATEWAY_PORT" not in os.environ


def spark_session(master: str | None, archive: ClassArchive | None = None):
    """The job's session: `master`, else spark-submit's, else ``local[*]``.

    When the job starts the JVM itself (a local run), `LOCAL_SESSION_CONF` applies,
    `archive` adds its JVM options, and shuffles use one partition per core instead of
    Spark's 200 (the aggregates of a window are a few thousand rows).
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(APP_NAME)
    if starts_own_jvm(master):
        builder = builder.master(master or "local[*]")
        # Local workers must run this interpreter (the one with eventfleet installed),
        # not whatever `python3` is on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf = dict(LOCAL_SESSION_CONF)
        if archive is not None:
            key = "spark.driver.extraJavaOptions"
            conf[key] = f"{conf[key]} {archive.java_options()}"
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
        return spark
    return builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()


def run(
    opts: JobOptions,
    spark=None,
    *,
    now_us: int | None = None,
    out: TextIO | None = sys.stdout,
    progress: RunProgress | None = None,
) -> list[WindowSummary]:
    """Process every window of `opts`; returns their summaries (also printed to `out`).

    `progress`, when given, records the planned windows and each finished one as it
    goes, so that a failed run can still say how far it got. A session it starts itself
    with ``opts.class_archive`` is stopped at the end (a training run's JVM must exit to
    write the archive); a session passed in is left running.
    """
    archive = None
    if spark is None:
        if opts.class_archive and starts_own_jvm(opts.master):
            archive = class_archive.plan(pathlib.Path(opts.class_archive))
        elif opts.class_archive:
            print(
                "eventfleet aggregate: --class-archive ignored: spark-submit started the JVM",
                file=sys.stderr,
            )
        spark = spark_session(opts.master, archive)
        if not starts_own_jvm(opts.master):
            # spark-submit started the JVM (the operator's driver pod): say whether it
            # maps the image's class archive (eventfleet_spark.image_archive).
            verdict = image_archive.driver_verdict(
                spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", ""),
                os.getppid(),
            )
            if verdict:
                print(f"eventfleet aggregate: {verdict}", file=sys.stderr, flush=True)
    try:
        return _run_windows(opts, spark, now_us, out, progress)
    finally:
        if archive is not None:
            class_archive.finish(spark, archive)


def _run_windows(opts, spark, now_us, out, progress) -> list[WindowSummary]:
    # INT96 (Spark's default) is a legacy encoding; micros read everywhere.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    if now_us is None:
        now_us = time.time_ns() // 1000
    progress = progress if progress is not None else RunProgress()
    progress.planned = plan_windows(opts, now_us)
    summaries = progress.done
    for span in progress.planned:
        summary = run_window(spark, opts, span)
        summaries.append(summary)
        if out is not None:
            text = json.dumps(summary.to_json()) if opts.json_summary else summary.line()
            print(text, file=out, flush=True)
    return summaries


def source_options(
    opts: JobOptions, span: timeplan.Span, partitions: int, partials: bool = False
) -> dict[str, str]:
    """The ``eventfleet`` source's options for one window (bucket-aligned slices, own
    prefix excluded): event rows with the ``json_numbers`` columns, or with `partials` the
    reader's partial aggregates. One set for both readers (executors and driver)."""
    options = {
        "eventer": opts.eventer,
        "start": _iso(span.start),
        "end": _iso(span.end),
        "partitions": str(partitions),
        "align_seconds": str(opts.bucket_seconds),
        "page_size": str(opts.page_size),
        "client_name": opts.client_name,
        "exclude": json.dumps([list(exclusion_prefix(opts.prefix))]),
        "json_numbers": "true",
    }
    if partials:
        options["aggregate_bucket_seconds"] = str(opts.bucket_seconds)
        if opts.prefix_depth is not None:
            options["aggregate_prefix_depth"] = str(opts.prefix_depth)
    if opts.http:
        options["http"] = opts.http
    if opts.types is not None:
        options["types"] = job_options.types_option(opts.types)
    if opts.token:  # from --token-file; else each reading process reads $EVENTFLEET_TOKEN
        options["token"] = opts.token
    if opts.tls_ca:  # a path, the same on the driver and every executor
        options["tls_ca"] = opts.tls_ca
        if opts.tls_server_name:
            options["tls_server_name"] = opts.tls_server_name
    return options


def _partitions(spark, opts: JobOptions) -> int:
    return opts.partitions or 2 * spark.sparkContext.defaultParallelism


def read_events(
    spark,
    opts: JobOptions,
    span: timeplan.Span,
    partitions: int | None = None,
    partials: bool = False,
):
    """The source DataFrame of one window, read by the executors (`source_options`)."""
    from eventfleet_spark.source import FORMAT, EventerDataSource

    # Registered only where it is read (idempotent): a driver-read run never loads it.
    spark.dataSource.register(EventerDataSource)
    if partitions is None:
        partitions = _partitions(spark, opts)
    options = source_options(opts, span, partitions, partials)
    return spark.read.format(FORMAT).options(**options).load()


def reads_in_driver(spark, opts: JobOptions) -> bool:
    """Whether the driver reads the window itself (`driver_read`), not the executors.

    ``auto``: when the master is ``local[...]`` -- the executors are threads of this
    machine and add no CPU, while the source's executor path adds fixed start-up costs
    (docs/aggregation.md, "Where the window is read"). Under a cluster master (the
    operator's ``k8s://``) the executors read, spread over their nodes.
    """
    if opts.partial_aggregation == "spark":
        return False  # Spark aggregates event rows: they must come from the source
    if opts.read_in != "auto":
        return opts.read_in == "driver"
    return spark.sparkContext.master.startswith("local")


def run_window(spark, opts: JobOptions, span: timeplan.Span) -> WindowSummary:
    import asyncio

    from eventfleet_spark import aggregation, parquet_output, writeback

    t0 = time.perf_counter()
    spark.sparkContext.setJobDescription(f"eventfleet aggregate {_iso(span.start)}")
    if reads_in_driver(spark, opts):
        from eventfleet_spark import driver_read

        partials = driver_read.read_partials(
            source_options(opts, span, _partitions(spark, opts), partials=True)
        )
        aggregates = driver_read.combine(partials, opts.bucket_seconds)
        frame = parquet_output.aggregates_frame(spark, aggregates, opts.bucket_seconds)
    else:
        if opts.partial_aggregation == "reader":
            agg = aggregation.combine(read_events(spark, opts, span, partials=True))
        else:
            events = read_events(spark, opts, span)
            agg = aggregation.aggregate(events, opts.bucket_seconds, opts.prefix_depth)
        # Checkpointed so that Parquet and the write-back see one result and the window
        # is read from the fleet exactly once.
        agg = agg.localCheckpoint(eager=True)
        aggregates = [aggregation.to_aggregate(r, opts.bucket_seconds) for r in agg.collect()]
        frame = aggregation.parquet_frame(agg, opts.bucket_seconds)
    t1 = time.perf_counter()

    new_dates: dict[str, int] = {}
    for a in aggregates:
        date = parquet_output.date_of(a.bucket_start_us)
        new_dates[date] = new_dates.get(date, 0) + 1
    parquet = parquet_output.write_window(
        spark,
        frame,
        new_dates,
        opts.output,
        opts.bucket_seconds,
        span,
    )
    t2 = time.perf_counter()
    wb = None
    if opts.write_back:
        wb = asyncio.run(
            writeback.write_back(
                parse_endpoints(opts.eventer)[0],
                aggregates,
                expand_prefix(opts.prefix, opts.bucket_seconds),
                span,
                client_name=opts.client_name,
                token=job_options.effective_token(opts),
                tls=opts.tls,
            )
        )
    t3 = time.perf_counter()
    payloads = {name: 0 for name in PAYLOAD_CLASSES}
    for a in aggregates:
        for name in PAYLOAD_CLASSES:
            payloads[name] += getattr(a, f"{name}_payloads")
    return WindowSummary(
        start_us=span.start,
        end_us=span.end,
        bucket_seconds=opts.bucket_seconds,
        events=sum(a.count for a in aggregates),
        payloads=payloads,
        aggregates=len(aggregates),
        types=len({a.type for a in aggregates}),
        read_seconds=t1 - t0,
        parquet_seconds=t2 - t1,
        write_back_seconds=t3 - t2,
        parquet=parquet,
        write_back=wb,
        seconds=time.perf_counter() - t0,
    )


def build_parser(prog: str = "eventfleet aggregate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    job_options.add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit / CLI entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    return run_args(args)


def run_args(args: argparse.Namespace) -> int:
    try:
        opts = job_options.from_args(args)
    except (ValueError, OSError) as e:
        print(f"eventfleet aggregate: {e}", file=sys.stderr)
        if args.result_file:
            write_result(args.result_file, run_result(RunProgress(), f"bad options: {e}"))
        return 2
    progress = RunProgress()
    try:
        # sys.stdout as it is now (not as it was at import): redirections are honoured.
        run(opts, progress=progress, out=sys.stdout)
    except Exception as e:  # Spark wraps executor errors; show the cause, not a JVM trace
        lines = str(e).strip().splitlines()
        print(f"eventfleet aggregate: failed: {type(e).__name__}", file=sys.stderr)
        for line in lines[:20]:
            print(f"  {line}", file=sys.stderr)
        if args.result_file:
            first = lines[0] if lines else ""
            write_result(args.result_file, run_result(progress, f"{type(e).__name__}: {first}"))
        return 1
    if args.result_file:
        write_result(args.result_file, run_result(progress))
    return 0
