"""The aggregation job as it is really launched, against a replica process.

* ``spark-submit spark/aggregate.py`` with exactly the arguments the operator renders
  into the ScheduledSparkApplication (no ``--start``/``--end``: the default window), so
  the spark-submit path (master from spark-submit, not the job) is covered;
* the benchmark (`e2e.bench.aggregate`) with a few thousand events, which runs
  ``eventfleet aggregate`` as a subprocess and checks the Spark result against the
  plain-Python baseline.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from tests import parts

parts.require_module("spark", "pyspark")
pa_parquet = parts.require_module("spark", "pyarrow.parquet")

from eventfleet_operator import builders, model  # noqa: E402

from e2e.bench import servers  # noqa: E402
from e2e.fleet_helpers import ports_of  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent


async def _register_and_count_aggregates(port: int, n: int) -> None:
    from eventfleet_server.client.eventer import connect
    from eventfleet_server.common.model import EventPayloadJson, RegisterEvent

    client = await connect("127.0.0.1", port, "e2e-seed")
    try:
        events = [
            RegisterEvent(("e2e", f"t{i % 3}"), None, EventPayloadJson(json.dumps({"v": i})))
            for i in range(n)
        ]
        assert await client.register(events, with_response=True)
    finally:
        await client.close()


async def _aggregate_events(port: int) -> list:
    from eventfleet_server.client.eventer import connect
    from eventfleet_server.common.model import Order, QueryTimeseriesParams

    client = await connect("127.0.0.1", port, "e2e-check")
    try:
        result = await client.query(
            QueryTimeseriesParams(
                event_types=[("eventfleet", "aggregate", "*")], order=Order.ASCENDING
            )
        )
    finally:
        await client.close()
    return result.events


def operator_arguments(
    aggregation: dict, *, eventer: str, http: str, result_file: pathlib.Path
) -> list[str]:
    """The job's arguments from the operator's own builder, with the in-cluster Service
    addresses swapped for the test replica's loopback endpoints and the driver's
    termination message (/dev/termination-log) for a file of the test's."""
    spec = model.parse("demo", "ns", {"aggregation": aggregation}, uid="u1")
    args = list(builders.scheduled_spark_application(spec)["spec"]["template"]["arguments"])
    swaps = (("--eventer", eventer), ("--http", http), ("--result-file", str(result_file)))
    for flag, value in swaps:
        args[args.index(flag) + 1] = value
    return args


@pytest.fixture
def seeded_replica(tmp_path):
    """A replica holding 30 events in 3 types, the last complete 1 s bucket closed."""
    server = servers.start_server(servers.KINDS["eventfleet"], tmp_path, "replica")
    try:
        asyncio.run(servers.wait_operational(server))
        asyncio.run(_register_and_count_aggregates(server.port, 30))
        time.sleep(1.1)  # the default range ends at the last complete bucket
        yield server
    finally:
        server.stop()


def _run_job(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a Spark job command as a user would (no token in the environment); it must
    exit 0."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("EVENTFLEET_TOKEN", None)
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.timeout(240)
def test_spark_submit_with_the_operator_arguments(tmp_path, seeded_replica):
    server = seeded_replica
    output = tmp_path / "out"
    args = operator_arguments(
        {"enabled": True, "bucketSeconds": 1, "windowSeconds": 120, "output": str(output)},
        eventer=f"127.0.0.1:{server.port}",
        http=f"127.0.0.1:{ports_of(server.port, 1)['http']}",
        result_file=tmp_path / "termination-log",
    )
    proc = _run_job(
        [str(BIN / "spark-submit"), "--master", "local[2]", str(ROOT / "spark" / "aggregate.py"),
         *args],
        timeout=200,
    )  # fmt: skip
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("aggregate ")]
    assert "events=30 " in line and "bucket=1s" in line, line
    rows = pa_parquet.read_table(output, partitioning="hive").to_pylist()
    assert sum(r["count"] for r in rows) == 30
    assert {tuple(r["type"]) for r in rows} == {("e2e", "t0"), ("e2e", "t1"), ("e2e", "t2")}
    registered = asyncio.run(_aggregate_events(server.port))
    assert len(registered) == len(rows)
    assert all(e.type[:3] == ("eventfleet", "aggregate", "1") for e in registered)
    # What the operator reads into status.aggregation.lastResult.
    result = json.loads((tmp_path / "termination-log").read_text())
    assert result["result"] == "Succeeded" and result["events"] == 30, result
    assert result["parquetRows"] == len(rows) and result["registered"] == len(registered)


@pytest.mark.timeout(300)
def test_benchmark_smoke(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "e2e.bench.aggregate",
            "--events",
            "3000",
            "--types",
            "7",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["checks"]["parquet_equals_baseline"] is True
    assert result["checks"]["registered_once_each"] is True
    assert result["checks"]["warm_run_registered"] == 0
    assert result["checks"]["spark_side_parquet_equal"] is True
    assert result["checks"]["export_parquet_byte_identical"] is True
    names = [p["phase"] for p in result["phases"]]
    # both read paths: the Eventer one and the Arrow export (GET /export)
    assert len(names) == 10, names
    assert any("GET /export" in n for n in names) and any("Eventer" in n for n in names)
    assert "| Spark job, cold" in proc.stdout


@pytest.mark.timeout(300)
def test_class_archive_written_by_the_first_run_and_mapped_by_the_next(tmp_path, seeded_replica):
    """``--class-archive``: the first local run writes the JVM's class archive (moved into
    place only once the JVM has exited), the next run maps it and leaves it alone, and
    both write the same aggregates; the JVM's warnings stay off stdout (``--json``)."""
    archive_dir = tmp_path / "classes"

    def run(output: pathlib.Path) -> list[dict]:
        proc = _run_job(
            [
                *[str(BIN / "eventfleet"), "aggregate", "--json", "--master", "local[2]"],
                *["--eventer", f"127.0.0.1:{seeded_replica.port}", "--bucket", "1"],
                *["--window", "120", "--output", str(output)],
                *["--class-archive", str(archive_dir)],
            ],
            timeout=240,
        )
        return [json.loads(line) for line in proc.stdout.splitlines()]

    (first,) = run(tmp_path / "out1")
    (archive,) = archive_dir.iterdir()
    assert archive.suffix == ".jsa" and archive.stat().st_size > 1_000_000, archive
    written = archive.stat()
    (second,) = run(tmp_path / "out2")
    assert list(archive_dir.iterdir()) == [archive]
    assert (archive.stat().st_ino, archive.stat().st_mtime_ns) == (
        written.st_ino,
        written.st_mtime_ns,
    )
    assert first["events"] == second["events"] == 30
    assert second["write_back"]["registered"] == 0
    rows = [
        pa_parquet.read_table(tmp_path / d, partitioning="hive").to_pylist()
        for d in ("out1", "out2")
    ]
    assert rows[0] == rows[1] and sum(r["count"] for r in rows[0]) == 30
