"""The aggregation job with real Spark (local[2]) against real replicas.

The fleet: three in-process replicas (server ids 1-3) on their own event loop thread,
each holding every event, as the Syncer keeps a fleet. The seeded events are created
"elsewhere" (server ids 11-13, timestamps in the past, crossing midnight) and merged
into every replica with `Engine.merge`, the Syncer's own entry point, so the buckets,
servers and payload shapes are exactly known. Every result is compared with
`eventfleet_spark.reference`, the plain-Python computation over the same events.

One SparkSession for the module (starting one costs seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pathlib
import random
import sys
import threading

import pytest

from tests import parts

parts.require_module("spark", "pyspark")
pa_parquet = parts.require_module("spark", "pyarrow.parquet")

from eventfleet_server.client.eventer import connect  # noqa: E402
from eventfleet_server.common.jsonfmt import timestamp_from_iso  # noqa: E402
from eventfleet_server.common.model import (  # noqa: E402
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Order,
    OrderBy,
    QueryTimeseriesParams,
    natural_key,
    timestamp_from_us,
    timestamp_to_us,
)
from eventfleet_spark import job, reference  # noqa: E402
from eventfleet_spark.options import JobOptions  # noqa: E402
from eventfleet_spark.record import Aggregate  # noqa: E402
from eventfleet_spark.source import EventerDataSource  # noqa: E402

from tests.conftest import running_replica  # noqa: E402

US = 1_000_000
BUCKET = 60
PREFIX = ("eventfleet", "aggregate", str(BUCKET))


def us(iso: str) -> int:
    return timestamp_to_us(timestamp_from_iso(iso))


# Six one-minute buckets across midnight: two date partitions.
START, END = us("2024-03-01T23:57:00Z"), us("2024-03-02T00:03:00Z")
# A separate stretch for the late-event test, so it cannot disturb the others.
LATE_START, LATE_END = us("2024-03-05T10:00:00Z"), us("2024-03-05T10:03:00Z")

TYPES = [
    ("plant", "a", "temp"),
    ("plant", "a", "pressure"),
    ("plant", "b", "temp"),
    ("alarm",),
    ("blob", "x"),
]
BAD_PAYLOADS = [
    EventPayloadJson("{not json"),
    EventPayloadJson("NaN"),
    EventPayloadJson(""),
    EventPayloadBinary("raw", b"\x00\x01\x02"),
    None,
    EventPayloadJson('{"nested": {"v": 1}, "list": [1, 2], "s": "x", "b": true, "n": null}'),
    EventPayloadJson('"just a string"'),
    EventPayloadJson("[1, 2, 3]"),
    EventPayloadJson('{"inf": 1e400}'),
    EventPayloadJson("true"),
]


def _payload(rng: random.Random):
    r = rng.random()
    if r < 0.45:
        return EventPayloadJson(
            json.dumps({"value": rng.uniform(-50, 150), "count": rng.randint(0, 9), "unit": "C"})
        )
    if r < 0.6:
        return EventPayloadJson(json.dumps(round(rng.uniform(0, 10), 3)))
    if r < 0.7:
        return EventPayloadJson(json.dumps({"neg": -0.0, "big": 12345678901234567890, "x": 0.1}))
    if r < 0.75:
        # Field names whose orders differ: UTF-8 bytes (the Parquet map's key order) put
        # U+FFFF before U+1F600; UTF-16 code units would put it after.
        names = ("Z", "a", "é", "日本", "\uffff", "\U0001f600")
        return EventPayloadJson(json.dumps({n: rng.uniform(-1, 1) for n in names}))
    return rng.choice(BAD_PAYLOADS)


def make_events(
    start_us: int, end_us: int, per_server: int, seed: int, servers=(11, 12, 13)
) -> list[Event]:
    """Events of `servers` spread over [start, end): several types, payload shapes,
    buckets and sessions; timestamps non-decreasing per server, as engines make them.
    (A replica skips events whose id it holds, so each call needs its own servers.)"""
    rng = random.Random(seed)
    events = []
    for server in servers:
        stamps = sorted(rng.randrange(start_us, end_us) for _ in range(per_server))
        session, instance = 0, 0
        for i, ts in enumerate(stamps):
            if i % 7 == 0:
                session += 1
            instance += 1
            event_type = rng.choice(TYPES)
            if i % 50 == 0:
                event_type = (*PREFIX, "old")  # looks like an aggregate: must be excluded
            events.append(
                Event(
                    EventId(server, session, instance),
                    event_type,
                    timestamp_from_us(ts),
                    None,
                    _payload(rng),
                )
            )
    return events


def expected(events, start_us, end_us, prefix_depth=None) -> dict:
    """The plain-Python aggregates of `events` in [start, end)."""
    chosen = sorted(
        (
            e
            for e in events
            if start_us <= timestamp_to_us(e.timestamp) < end_us and e.type[:2] != PREFIX[:2]
        ),
        key=natural_key,
    )
    return reference.aggregate(map(reference.from_event, chosen), BUCKET, prefix_depth)


class Fleet:
    """Replicas on a private event loop thread, so blocking Spark calls in the test
    thread never stall them (the Spark workers connect to them over TCP)."""

    def __init__(self, base: pathlib.Path, size: int = 3, token: str | None = None, **overrides):
        # `overrides`: replica configuration for every replica (tls=... in the TLS tests).
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()
        self.replicas = [
            self.call(
                self.stack.enter_async_context(
                    running_replica(base / f"r{i}", server_id=i, token=token, **overrides)
                )
            )
            for i in range(1, size + 1)
        ]

    def call(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def eventer(self) -> str:
        return ",".join(f"127.0.0.1:{r.eventer.port}" for r in self.replicas)

    @property
    def http(self) -> str:
        return ",".join(f"127.0.0.1:{r.http.port}" for r in self.replicas)

    def merge(self, events) -> None:
        for r in self.replicas:
            self.call(r.engine.merge(events))

    def query_all(self, params, replica: int = 0, token: str | None = None) -> list[Event]:
        async def run():
            port = self.replicas[replica].eventer.port
            client = await connect("127.0.0.1", port, "test", client_token=token)
            out, p = [], params
            try:
                while True:
                    result = await client.query(p)
                    out += result.events
                    if not (result.more_follows and result.events):
                        return out
                    p = p._replace(last_event_id=result.events[-1].id)
            finally:
                await client.close()

        return self.call(run())

    def close(self) -> None:
        self.call(self.stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("eventfleet-aggregate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        yield f
    finally:
        f.close()


@pytest.fixture(scope="module")
def seeded(fleet):
    events = make_events(START, END, per_server=400, seed=7)
    fleet.merge(events)
    return events


def options(fleet, output, **kw) -> JobOptions:
    base = dict(
        eventer=fleet.eventer,
        bucket_seconds=BUCKET,
        output=str(output),
        start_us=START,
        end_us=END,
        window_seconds=3600,
        partitions=3,
    )
    base.update(kw)
    return JobOptions(**base)


def run_job(spark, opts):
    out = io.StringIO()
    summaries = job.run(opts, spark, out=out)
    return summaries, out.getvalue()


def read_parquet(root: pathlib.Path) -> dict:
    """Aggregates by key from the Parquet tree, read with pyarrow (not Spark)."""
    table = pa_parquet.read_table(root, partitioning="hive")
    out = {}
    for row in table.to_pylist():
        agg = Aggregate.from_parquet_row(row)
        assert agg.key not in out, f"duplicate Parquet row for {agg.key}"
        assert row["date"] == row["bucket_start"].date().isoformat()
        assert row["type_key"] == "/".join(agg.type)
        out[agg.key] = agg
    return out


def file_digests(root: pathlib.Path) -> dict[str, list[str]]:
    """Per partition directory, the sorted digests of its Parquet files' bytes."""
    out: dict[str, list[str]] = {}
    for f in root.rglob("*.parquet"):
        key = str(f.parent.relative_to(root))
        out.setdefault(key, []).append(hashlib.sha256(f.read_bytes()).hexdigest())
    return {k: sorted(v) for k, v in out.items()}


def registered(fleet, start_us, end_us) -> dict:
    """Aggregate events in the fleet by (type, source timestamp): lists, to see duplicates."""
    events = fleet.query_all(
        QueryTimeseriesParams(
            event_types=[(*PREFIX, "*")],
            source_t_from=timestamp_from_us(start_us),
            source_t_to=timestamp_from_us(end_us - 1),
            order=Order.ASCENDING,
            order_by=OrderBy.SOURCE_TIMESTAMP,
        )
    )
    out: dict = {}
    for e in events:
        key = (e.type[len(PREFIX) :], timestamp_to_us(e.source_timestamp))
        out.setdefault(key, []).append(e)
    return out


# -- the source -------------------------------------------------------------------------


def test_source_reads_each_event_once_from_every_replica(spark, fleet, seeded):
    spark.dataSource.register(EventerDataSource)
    df = (
        spark.read.format("eventfleet")
        .option("eventer", fleet.eventer)
        .option("start", "2024-03-01T23:57:00Z")
        .option("end", "2024-03-02T00:03:00Z")
        .option("partitions", "5")
        .option("page_size", "97")  # many pages per slice: paging is exercised
        .load()
    )
    assert df.rdd.getNumPartitions() == 5
    rows = df.collect()
    want = {e.id: e for e in seeded}
    got = {(r.server, r.session, r.instance): r for r in rows}
    assert len(rows) == len(got) == len(want)
    for event_id, e in want.items():
        r = got[tuple(event_id)]
        assert tuple(r.type) == e.type and r.type_key == "/".join(e.type)
        if isinstance(e.payload, EventPayloadJson):
            assert (r.payload_kind, r.payload_json) == ("json", e.payload.data)
        elif isinstance(e.payload, EventPayloadBinary):
            assert r.payload_kind == "binary"
            assert (r.payload_binary_type, bytes(r.payload_binary)) == (
                e.payload.type,
                e.payload.data,
            )
        else:
            assert (r.payload_kind, r.payload_json, r.payload_binary) == ("none", None, None)
        assert r.source_timestamp is None


def test_source_type_filter_and_exclusion(spark, fleet, seeded):
    spark.dataSource.register(EventerDataSource)
    df = (
        spark.read.format("eventfleet")
        .option("eventer", fleet.eventer)
        .option("start", str(START / US))
        .option("end", str(END / US))
        .option("types", json.dumps([["plant", "*"], ["eventfleet", "*"]]))
        .option("exclude", json.dumps([["eventfleet", "aggregate", "?"]]))
        .load()
    )
    got = sorted(tuple(r.type) for r in df.select("type").collect())
    assert got == sorted(e.type for e in seeded if e.type[0] == "plant")


def test_source_rejects_bad_options_by_name(spark, fleet):
    from pyspark.errors import PySparkException

    spark.dataSource.register(EventerDataSource)
    with pytest.raises(PySparkException, match="eventer address 'nohost' is not HOST:PORT"):
        spark.read.format("eventfleet").option("eventer", "nohost").option("start", "0").option(
            "end", "1"
        ).load().collect()


# -- the job ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def first_run(spark, fleet, seeded, tmp_path_factory):
    output = tmp_path_factory.mktemp("agg") / "out"
    summaries, printed = run_job(spark, options(fleet, output))
    return output, summaries, printed


def test_parquet_equals_plain_python(first_run, seeded):
    output, _, _ = first_run
    want = expected(seeded, START, END)
    assert read_parquet(output) == want
    dates = sorted(p.name for p in (output / f"bucket_seconds={BUCKET}").iterdir() if p.is_dir())
    assert dates == ["date=2024-03-01", "date=2024-03-02"]
    # One file per date partition, rows sorted: what makes re-runs byte-identical.
    assert all(len(v) == 1 for v in file_digests(output).values())


def test_registered_aggregates_equal_plain_python(first_run, fleet, seeded):
    want = expected(seeded, START, END)
    found = registered(fleet, START, END)
    assert set(found) == set(want)
    for key, events in found.items():
        assert len(events) == 1, f"{key}: {len(events)} aggregate events"
        (e,) = events
        assert e.type == PREFIX + key[0]
        assert e.payload.data == want[key].payload_json()
        payload = json.loads(e.payload.data)
        assert payload["count"] == want[key].count


def test_summary_counts_bad_payloads(first_run, seeded):
    _, summaries, printed = first_run
    (summary,) = summaries
    want = expected(seeded, START, END)
    assert summary.events == sum(a.count for a in want.values())
    assert summary.payloads["invalid_json"] == sum(a.invalid_json_payloads for a in want.values())
    assert summary.payloads["binary"] > 0 and summary.payloads["empty"] > 0
    assert summary.payloads["invalid_json"] > 0 and summary.payloads["non_numeric"] > 0
    assert summary.aggregates == len(want)
    assert summary.write_back.registered == len(want)
    assert printed.startswith("aggregate 2024-03-01T23:57:00Z..2024-03-02T00:03:00Z bucket=60s:")
    assert f"events={summary.events} " in printed and "registered=" in printed


def test_rerun_registers_nothing_and_rewrites_identical_parquet(first_run, spark, fleet, seeded):
    output, _, _ = first_run
    before = file_digests(output)
    summaries, _ = run_job(spark, options(fleet, output, json_summary=True))
    (summary,) = summaries
    want = expected(seeded, START, END)
    assert (summary.write_back.registered, summary.write_back.unchanged) == (0, len(want))
    assert file_digests(output) == before
    assert all(len(events) == 1 for events in registered(fleet, START, END).values())


def test_smaller_windows_give_the_same_parquet(first_run, spark, fleet, tmp_path):
    """Cut into 2-minute windows (one summary each), the same rows come out: each
    window replaces only its own buckets inside the shared date partitions."""
    output, _, _ = first_run
    summaries, printed = run_job(
        spark, options(fleet, tmp_path, window_seconds=120, write_back=False, json_summary=True)
    )
    assert len(summaries) == 3 and len(printed.splitlines()) == 3
    assert json.loads(printed.splitlines()[0])["window"] == [
        "2024-03-01T23:57:00Z",
        "2024-03-01T23:59:00Z",
    ]
    assert read_parquet(tmp_path) == read_parquet(output)


def test_spark_side_aggregation_gives_identical_parquet(first_run, spark, fleet, seeded, tmp_path):
    """--partial-aggregation spark: event rows into the Spark plan (`aggregation.partials`)
    instead of the reader's partial aggregates: an independent path, the same bytes."""
    output, _, _ = first_run
    run_job(spark, options(fleet, tmp_path, partial_aggregation="spark", write_back=False))
    assert read_parquet(tmp_path) == expected(seeded, START, END)
    assert file_digests(tmp_path) == file_digests(output)


def test_driver_and_executors_write_identical_parquet(first_run, spark, fleet, seeded, tmp_path):
    """Under a local master the job reads in the driver (`first_run`); read by the
    executors through the source instead, the window gives the same bytes."""
    output, (summary,), _ = first_run
    assert job.reads_in_driver(spark, options(fleet, output))
    (again,), _ = run_job(spark, options(fleet, tmp_path, read_in="executors", write_back=False))
    assert again.events == summary.events
    assert file_digests(tmp_path) == file_digests(output)


def test_driver_read_says_each_slice(spark, fleet, seeded, tmp_path, capfd):
    """The driver's read prints one line per slice: where from, how many events; they
    add up to the window's events."""
    opts = options(fleet, tmp_path, http=fleet.http, write_back=False, read_in="driver")
    (summary,), _ = run_job(spark, opts)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if " read slice " in ln]
    assert [ln.split(" read slice ")[1].split(" ")[0] for ln in lines] == ["1/3", "2/3", "3/3"]
    counts = [int(ln.split(": ")[2].split(" events")[0].replace(",", "")) for ln in lines]
    assert sum(counts) == summary.events > 0
    http = fleet.http.split(",")
    for i, ln in enumerate(lines):
        assert f"from http://{http[i % len(http)]}/export:" in ln, ln


@pytest.mark.parametrize("where", ["reader", "spark"])
def test_prefix_depth_groups_by_type_prefix(spark, fleet, seeded, tmp_path, where):
    opts = options(fleet, tmp_path, prefix_depth=1, write_back=False, partial_aggregation=where)
    run_job(spark, opts)
    assert read_parquet(tmp_path) == expected(seeded, START, END, prefix_depth=1)


def test_late_event_updates_its_bucket_once(spark, fleet, tmp_path):
    events = make_events(LATE_START, LATE_END, per_server=60, seed=11, servers=(21, 22, 23))
    fleet.merge(events)
    opts = options(fleet, tmp_path, start_us=LATE_START, end_us=LATE_END)
    (first,), _ = run_job(spark, opts)
    # A late event for the middle bucket arrives (as if synced from a peer that was cut
    # off): a new server's event with an old timestamp.
    late = Event(
        EventId(24, 1, 1),
        ("plant", "a", "temp"),
        timestamp_from_us(LATE_START + 90 * US),
        None,
        EventPayloadJson('{"value": 1000.5}'),
    )
    fleet.merge([late])
    (second,), _ = run_job(spark, opts)
    assert second.write_back.registered == 1
    assert second.write_back.unchanged == first.write_back.registered - 1
    want = expected([*events, late], LATE_START, LATE_END)
    assert read_parquet(tmp_path) == want
    key = (late.type, LATE_START + 60 * US)
    history = registered(fleet, LATE_START, LATE_END)[key]
    assert len(history) == 2  # the old aggregate stays; the latest is the new one
    assert max(history, key=natural_key).payload.data == want[key].payload_json()
    assert want[key].fields["value"].max == 1000.5


# -- the Arrow read path (GET /export) ---------------------------------------------------


def _source_rows(spark, fleet, **extra) -> list:
    reader = (
        spark.read.format("eventfleet")
        .option("eventer", fleet.eventer)
        .option("start", "2024-03-01T23:57:00Z")
        .option("end", "2024-03-02T00:03:00Z")
        .option("partitions", "4")
        .option("json_numbers", "true")
        .option("exclude", json.dumps([["eventfleet", "aggregate", "?"]]))
    )
    for k, v in extra.items():
        reader = reader.option(k, v)
    return sorted(reader.load().collect(), key=lambda r: (r.server, r.instance))


def test_arrow_source_rows_equal_eventer_rows(spark, fleet, seeded):
    """Every column of every row, including the derived payload columns, is the same
    read through /export (Arrow) as over Eventer."""
    spark.dataSource.register(EventerDataSource)
    over_eventer = _source_rows(spark, fleet)
    over_http = _source_rows(spark, fleet, http=fleet.http)
    assert len(over_http) == len([e for e in seeded if e.type[:2] != PREFIX[:2]])
    assert over_http == over_eventer
    types = json.dumps([["plant", "*"], ["alarm"]])
    filtered = _source_rows(spark, fleet, http=fleet.http, types=types)
    assert filtered == _source_rows(spark, fleet, types=types)
    assert {r.type[0] for r in filtered} == {"plant", "alarm"}


@pytest.mark.parametrize(
    ("where", "read_in"), [("reader", "driver"), ("reader", "executors"), ("spark", "auto")]
)
def test_arrow_path_writes_byte_identical_parquet(
    first_run, spark, fleet, seeded, tmp_path, where, read_in
):
    """The job through /export writes the same Parquet bytes as the job over Eventer
    (`first_run`), with either aggregation path and either reader."""
    output, _, _ = first_run
    opts = options(
        fleet, tmp_path, http=fleet.http, write_back=False, partial_aggregation=where,
        read_in=read_in,
    )  # fmt: skip
    (summary,), _ = run_job(spark, opts)
    assert summary.events == sum(a.count for a in expected(seeded, START, END).values())
    assert read_parquet(tmp_path) == expected(seeded, START, END)
    assert file_digests(tmp_path) == file_digests(output)


@pytest.mark.parametrize("read_in", ["driver", "executors"])
def test_replica_without_export_is_read_over_eventer(first_run, spark, fleet, tmp_path, read_in):
    """An older replica (no /export: its HTTP answers 404) is read over Eventer for the
    slices that would have gone to it; the result does not change."""
    output, _, _ = first_run
    replica = fleet.replicas[1]
    replica.http.unmount_export()
    try:
        opts = options(fleet, tmp_path, http=fleet.http, write_back=False, read_in=read_in)
        run_job(spark, opts)
    finally:
        replica.http.unmount_export = replica.http.mount("/export", replica.http.export)
    assert file_digests(tmp_path) == file_digests(output)


@pytest.mark.parametrize("read_in", ["executors", "driver"])
def test_token_reaches_readers_and_write_back(spark, tmp_path, read_in):
    """The token (--token-file) reaches the readers (a source option on the executors,
    the driver's own reader) and the write-back client: a wrong one is refused, and the
    job says so."""
    from eventfleet_spark.eventer_io import EventerReadError
    from eventfleet_spark.export_io import ExportReadError
    from pyspark.errors import PySparkException

    # On the executors the reader's error reaches the driver wrapped by Spark.
    eventer_error = PySparkException if read_in == "executors" else EventerReadError
    export_error = PySparkException if read_in == "executors" else ExportReadError
    secured = Fleet(tmp_path / "fleet", size=1, token="s3cr3t")
    try:
        events = make_events(LATE_START, LATE_END, per_server=20, seed=5, servers=(31,))
        secured.merge(events)
        opts = options(
            secured, tmp_path / "out", start_us=LATE_START, end_us=LATE_END, read_in=read_in
        )
        with pytest.raises(eventer_error, match="refused the connection: invalid client token"):
            run_job(spark, dataclasses.replace(opts, token="wrong"))
        # The Arrow path presents the same token as a bearer token.
        with pytest.raises(export_error, match=r"401 .*invalid client token"):
            run_job(spark, dataclasses.replace(opts, token="wrong", http=secured.http))
        (summary,), _ = run_job(spark, dataclasses.replace(opts, token="s3cr3t"))
        want = expected(events, LATE_START, LATE_END)
        assert summary.events == sum(a.count for a in want.values())
        assert summary.write_back.registered == summary.aggregates == len(want)
        (again,), _ = run_job(
            spark, dataclasses.replace(opts, token="s3cr3t", http=secured.http, write_back=False)
        )
        assert again.events == summary.events
    finally:
        secured.close()


def test_result_file_says_what_the_run_did(spark, fleet, seeded, tmp_path, capsys):
    """``--result-file`` (the driver's termination message on Kubernetes): the window, the
    events read, aggregates and Parquet rows of the run (the windows' own ``--json``
    summary lines summed), through the CLI entry point."""
    output, result_file = tmp_path / "out", tmp_path / "result.json"
    argv = ["--eventer", fleet.eventer, "--bucket", str(BUCKET), "--output", str(output)]
    argv += ["--start", "2024-03-01T23:57:00Z", "--end", "2024-03-02T00:03:00Z"]
    argv += ["--window", "180", "--partitions", "3", "--no-write-back", "--json"]
    assert job.main([*argv, "--result-file", str(result_file)]) == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln[:1] == "{"]
    result = json.loads(result_file.read_text())
    assert len(lines) == 2
    assert result == {
        "result": "Succeeded",
        "window": ["2024-03-01T23:57:00Z", "2024-03-02T00:03:00Z"],
        "windows": 2,
        "events": sum(w["events"] for w in lines),
        "aggregates": sum(w["aggregates"] for w in lines),
        "parquetRows": sum(w["parquet"]["rows"] for w in lines),
        "registered": 0,
        "seconds": result["seconds"],
    }
    assert 0 < result["events"] <= len(seeded) and result["parquetRows"] > 0
    assert result["parquetRows"] == len(
        pa_parquet.read_table(output, partitioning="hive").to_pylist()
    )


def test_result_file_of_a_failed_run_names_the_error(tmp_path):
    result_file = tmp_path / "result.json"
    argv = ["--eventer", "127.0.0.1:1", "--bucket", "60", "--output", str(tmp_path / "out")]
    argv += ["--token-file", str(tmp_path / "missing"), "--result-file", str(result_file)]
    assert job.main(argv) == 2
    result = json.loads(result_file.read_text())
    assert result["result"] == "Failed" and result["error"].startswith("bad options:"), result
    assert result["events"] == 0 and result["windows"] == 0
    assert len(result_file.read_bytes()) < job.RESULT_LIMIT  # a termination message's bound
