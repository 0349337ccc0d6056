"""The aggregation job against a real local fleet (`eventfleet fleet`, three replica
processes in Syncer full mesh): events registered on every replica (three server ids)
across several one-second buckets, read by the job from all three replicas, compared
with the plain-Python computation; a re-run registers nothing and rewrites identical
Parquet; the aggregates reach every replica through the Syncer.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import pathlib
import random
import subprocess
import sys
import time

import pytest

from e2e import ports
from tests import parts

parts.require_module("spark", "pyspark")
pa_parquet = parts.require_module("spark", "pyarrow.parquet")

from eventfleet_server.client.eventer import connect  # noqa: E402
from eventfleet_server.common.model import (  # noqa: E402
    EventPayloadBinary,
    EventPayloadJson,
    Order,
    OrderBy,
    QueryTimeseriesParams,
    RegisterEvent,
    natural_key,
    timestamp_from_us,
    timestamp_to_us,
)
from eventfleet_spark import job, reference, timeplan  # noqa: E402
from eventfleet_spark.options import JobOptions  # noqa: E402

US = 1_000_000
PAYLOADS = [
    lambda r: EventPayloadJson(json.dumps({"value": r.uniform(0, 100), "n": r.randint(0, 5)})),
    lambda r: EventPayloadJson(json.dumps(r.random())),
    lambda r: EventPayloadJson('{"nested": {"a": 1}, "s": "x"}'),
    # (JSON that does not parse is refused by the replicas since the hardening.)
    lambda r: EventPayloadJson('"text, no numbers"'),
    lambda r: EventPayloadBinary("raw", b"\x00\x01"),
    lambda r: None,
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """`eventfleet fleet --replicas 3`; yields (eventer endpoints, token)."""
    data = tmp_path_factory.mktemp("fleet")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventfleet_cli",
            "fleet",
            "--replicas",
            "3",
            "--base-port",
            # Below the ephemeral range: an outgoing connection cannot take one of
            # them between the check and the replica's bind.
            str(ports.free_block(30, align=10)),
            "--data-dir",
            str(data),
            "--json",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "EVENTFLEET_TOKEN"},
    )
    try:
        replicas: dict[int, str] = {}
        deadline = time.monotonic() + 60
        while len(replicas) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"eventfleet fleet exited with {proc.wait()}")
            info = json.loads(line)
            if info.get("up"):
                replicas[info["server_id"]] = info["eventer"]
        assert len(replicas) == 3, replicas
        yield [replicas[i] for i in (1, 2, 3)], (data / "token").read_text().strip()
    finally:
        proc.terminate()  # the supervisor stops its replicas gracefully
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _client(endpoint: str, token: str):
    host, port = endpoint.rsplit(":", 1)
    return await connect(host, int(port), "e2e-aggregate", client_token=token)


async def _query_all(endpoint: str, token: str, params) -> list:
    client = await _client(endpoint, token)
    out = []
    try:
        while True:
            result = await client.query(params)
            out += result.events
            if not (result.more_follows and result.events):
                return out
            params = params._replace(last_event_id=result.events[-1].id)
    finally:
        await client.close()


async def _seed(endpoints: list[str], token: str) -> int:
    """Three rounds, a second apart, of events registered on every replica."""
    rng = random.Random(9)
    clients = [await _client(e, token) for e in endpoints]
    count = 0
    try:
        for _ in range(3):
            for client in clients:
                events = [
                    RegisterEvent(
                        ("demo", rng.choice(["temp", "pressure", "door"])),
                        None,
                        rng.choice(PAYLOADS)(rng),
                    )
                    for _ in range(40)
                ]
                assert await client.register(events, with_response=True)
                count += len(events)
            await asyncio.sleep(1.0)
    finally:
        for client in clients:
            await client.close()
    return count


def _demo(start: int, end: int) -> QueryTimeseriesParams:
    return QueryTimeseriesParams(
        event_types=[("demo", "*")],
        t_from=timestamp_from_us(start),
        t_to=timestamp_from_us(end - 1),
        order=Order.ASCENDING,
    )


def _aggregates(endpoint: str, token: str, span) -> dict:
    events = asyncio.run(
        _query_all(
            endpoint,
            token,
            QueryTimeseriesParams(
                event_types=[("eventfleet", "aggregate", "1", "*")],
                source_t_from=timestamp_from_us(span.start),
                source_t_to=timestamp_from_us(span.end - 1),
                order=Order.ASCENDING,
                order_by=OrderBy.SOURCE_TIMESTAMP,
            ),
        )
    )
    out: dict = {}
    for e in events:
        out.setdefault((e.type[3:], timestamp_to_us(e.source_timestamp)), []).append(e)
    return out


def _until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def _digests(root: pathlib.Path) -> dict:
    return {
        str(f.relative_to(root).parent): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in root.rglob("*.parquet")
    }


@pytest.mark.timeout(240)
def test_job_on_a_real_fleet(fleet, tmp_path):
    from pyspark.sql import SparkSession

    endpoints, token = fleet
    t0 = time.time_ns() // 1000
    seeded = asyncio.run(_seed(endpoints, token))
    span = timeplan.aligned_range(t0, time.time_ns() // 1000, US)
    # Every replica holds every event once the Syncer has delivered them.
    _until(
        lambda: all(
            len(asyncio.run(_query_all(e, token, _demo(*span)))) == seeded for e in endpoints
        ),
        "the Syncer to deliver every event to every replica",
    )
    events = asyncio.run(_query_all(endpoints[2], token, _demo(*span)))
    assert {e.id.server for e in events} == {1, 2, 3}
    want = reference.aggregate(
        map(reference.from_event, sorted(events, key=natural_key)), bucket_seconds=1
    )
    assert len({k[1] for k in want}) >= 3  # several buckets

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        opts = JobOptions(
            eventer=",".join(endpoints),
            bucket_seconds=1,
            output=str(tmp_path / "out"),
            start_us=span.start,
            end_us=span.end,
            types=(("demo", "*"),),
            token=token,
        )
        (first,) = job.run(opts, spark, out=io.StringIO())
        assert first.events == seeded and first.write_back.registered == len(want)
        digests = _digests(tmp_path / "out")
        (second,) = job.run(opts, spark, out=io.StringIO())
        assert (second.write_back.registered, second.write_back.unchanged) == (0, len(want))
        assert _digests(tmp_path / "out") == digests
    finally:
        spark.stop()

    rows = pa_parquet.read_table(tmp_path / "out", partitioning="hive").to_pylist()
    got = {(tuple(r["type"]), r["count"], r["invalid_json_payloads"]) for r in rows}
    assert got == {(a.type, a.count, a.invalid_json_payloads) for a in want.values()}
    # Written back through replica 1, synced to the others: once per (type, bucket).
    for endpoint in endpoints:
        _until(
            lambda e=endpoint: set(_aggregates(e, token, span)) == set(want),
            f"the aggregates on {endpoint}",
        )
        found = _aggregates(endpoint, token, span)
        assert all(len(v) == 1 for v in found.values())
        assert {k: v[0].payload.data for k, v in found.items()} == {
            k: a.payload_json() for k, a in want.items()
        }
