"""The aggregation job's pure parts (no Spark, no server): time plan, payload rules,
write-back rule, options, Arrow conversion, and the operator's argument contract."""

from __future__ import annotations

import argparse
import itertools
import json

import pytest
from eventfleet_server.common import codec
from eventfleet_server.common.jsonfmt import timestamp_from_iso
from eventfleet_server.common.model import (
    Event,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Timestamp,
    timestamp_to_us,
)
from eventfleet_spark import options, payloads, reference, timeplan, writeback
from eventfleet_spark.job import plan_windows
from eventfleet_spark.record import Aggregate, FieldStats, exclusion_prefix, expand_prefix
from eventfleet_spark.timeplan import Span

from tests import parts

US = 1_000_000


def us(iso: str) -> int:
    return timestamp_to_us(timestamp_from_iso(iso))


# -- time plan ----------------------------------------------------------------------------


def test_default_range_is_the_last_window_up_to_the_last_bucket_boundary():
    now = us("2025-01-01T10:07:30.5Z")
    assert timeplan.default_range(now, 60 * US, 3600 * US) == Span(
        us("2025-01-01T09:07:00Z"), us("2025-01-01T10:07:00Z")
    )
    # A window that is not a multiple of the bucket grows to whole buckets.
    assert timeplan.default_range(now, 600 * US, 900 * US) == Span(
        us("2025-01-01T09:40:00Z"), us("2025-01-01T10:00:00Z")
    )


def test_explicit_ranges_widen_to_buckets_and_cut_into_windows():
    opts = options.JobOptions(
        eventer="h:1",
        bucket_seconds=60,
        output="o",
        window_seconds=3600,
        start_us=us("2025-01-01T00:00:30Z"),
        end_us=us("2025-01-01T02:30:10Z"),
    )
    assert plan_windows(opts, now_us=0) == [
        Span(us("2025-01-01T00:00:00Z"), us("2025-01-01T01:00:00Z")),
        Span(us("2025-01-01T01:00:00Z"), us("2025-01-01T02:00:00Z")),
        Span(us("2025-01-01T02:00:00Z"), us("2025-01-01T02:31:00Z")),
    ]
    only_end = options.JobOptions(
        eventer="h:1", bucket_seconds=60, output="o", end_us=us("2025-01-01T05:00:00Z")
    )
    assert plan_windows(only_end, now_us=0) == [
        Span(us("2025-01-01T04:00:00Z"), us("2025-01-01T05:00:00Z"))
    ]


@pytest.mark.parametrize(
    ("span", "count", "align", "want"),
    [
        (Span(0, 600), 3, 60, [(0, 180), (180, 360), (360, 600)]),
        (Span(0, 120), 8, 60, [(0, 60), (60, 120)]),  # never more slices than buckets
        (Span(30, 100), 4, 60, [(30, 100)]),  # no aligned inner boundary
        (Span(0, 10), 3, 1, [(0, 3), (3, 6), (6, 10)]),
    ],
)
def test_slices_are_contiguous_and_aligned(span, count, align, want):
    got = timeplan.slices(span, count, align)
    assert [tuple(s) for s in got] == want
    for a, b in itertools.pairwise(got):
        assert a.end == b.start and b.start % align == 0


def test_bad_time_values_are_named():
    with pytest.raises(ValueError, match="end 5 us is not after start 5 us"):
        timeplan.aligned_range(5, 5, 1)
    with pytest.raises(ValueError, match="slice count 0"):
        timeplan.slices(Span(0, 1), 0)


# -- payload rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "text", "want"),
    [
        ("json", '{"a": 1, "b": 2.5, "c": "x"}', ("numeric", {"a": 1.0, "b": 2.5}, 1)),
        ("json", "3.25", ("numeric", {"$": 3.25}, 0)),
        ("json", "-0.0", ("numeric", {"$": 0.0}, 0)),
        ("json", '{"n": {"v": 1}, "l": [1], "t": true, "z": null}', ("non_numeric", {}, 4)),
        ("json", '{"inf": 1e400, "ok": 1}', ("numeric", {"ok": 1.0}, 1)),
        ("json", '{"a": 1, "a": 2}', ("numeric", {"a": 2.0}, 0)),  # last key wins
        ("json", "true", ("non_numeric", {}, 0)),
        ("json", '"1.5"', ("non_numeric", {}, 0)),
        ("json", "[1, 2]", ("non_numeric", {}, 0)),
        ("json", "{}", ("non_numeric", {}, 0)),
        ("json", "NaN", ("invalid_json", {}, 0)),
        ("json", '{"x": Infinity}', ("invalid_json", {}, 0)),
        ("json", "{not json", ("invalid_json", {}, 0)),
        ("json", "", ("invalid_json", {}, 0)),
        ("json", "[" * 100_000, ("invalid_json", {}, 0)),
        ("json", "1" + "0" * 400, ("non_numeric", {}, 0)),  # beyond the double range
        ("binary", None, ("binary", {}, 0)),
        ("none", None, ("empty", {}, 0)),
    ],
)
@pytest.mark.parametrize("classify", [payloads.classify, payloads.classify_fast])
def test_payload_classes(classify, kind, text, want):
    assert classify(kind, text) == want


def test_fast_classification_equals_the_definition():
    """`classify_fast` (msgspec first) decides exactly as `classify` (the standard
    library's parser): edge cases of JSON syntax and numbers, and random doubles in
    every notation (bit for bit: the sums in the Parquet depend on it)."""
    import random
    import struct

    texts = [
        "01",
        "-",
        "1.",
        ".5",
        "+1",
        "1e",
        '"\x01"',
        '{"a" 1}',
        "{a:1}",
        "[1 2]",
        "tru",
        "true ",
        " 1 ",
        "\ufeff1",
        "\t1\n",
        "1 2",
        "{}x",
        '{"a":1,}',
        '"\\ud800"',
        '{"\\ud83d\\ude00": 1}',
        '{"\ud83d": 2}',
        "-0",
        "-0.0",
        "1E+2",
        "0e0",
        "-01",
        "12345678901234567890",
        "-9223372036854775809",
        "1" + "0" * 308,
        "1" + "0" * 309,
        "1.7976931348623157e308",
        "1.7976931348623159e308",
        "4.9e-324",
        "2e-324",
        "1e-400",
        '{"a": 1, "a": "x"}',
        '{"a": "x", "a": 1}',
        '{"a": 1e999, "b": -1e999, "c": 5}',
        '{"a": NaN}',
        "-Infinity",
        '{"a": true, "b": null, "c": [1], "d": {"e": 1}}',
    ]
    rng = random.Random(7)
    for _ in range(20_000):
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if x == x and abs(x) != float("inf"):
            texts += [
                repr(x),
                f"{x:.17g}",
                f'{{"v": {x:.6e}, "n": {rng.randint(-(10**20), 10**20)}}}',
            ]
    for text in texts:
        assert payloads.classify_fast("json", text) == payloads.classify("json", text), text


def test_reference_aggregates_in_order_per_bucket_and_prefix():
    def ev(t, ts, text):
        return reference.RefEvent(t, ts, "json" if text is not None else "none", text)

    events = [
        ev(("a", "x"), 10 * US, '{"v": 1}'),
        ev(("a", "y"), 59 * US, '{"v": 3, "s": "-"}'),
        ev(("a", "x"), 60 * US, "2"),
        ev(("b",), 61 * US, None),
    ]
    got = reference.aggregate(events, 60, prefix_depth=1)
    assert got[(("a",), 0)] == Aggregate(
        type=("a",),
        bucket_start_us=0,
        bucket_seconds=60,
        count=2,
        first_us=10 * US,
        last_us=59 * US,
        numeric_payloads=2,
        skipped_fields=1,
        fields={"v": FieldStats(2, 1.0, 3.0, 4.0, 2.0)},
    )
    assert got[(("a",), 60 * US)].fields == {"$": FieldStats(1, 2.0, 2.0, 2.0, 2.0)}
    assert got[(("b",), 60 * US)].empty_payloads == 1


# -- aggregate record and write-back rule -------------------------------------------------


def agg(count=3, **kw):
    base = dict(
        type=("plant", "t"),
        bucket_start_us=us("2025-01-01T00:01:00Z"),
        bucket_seconds=60,
        count=count,
        first_us=us("2025-01-01T00:01:00.25Z"),
        last_us=us("2025-01-01T00:01:59Z"),
        numeric_payloads=count,
        fields={"v": FieldStats(count, 0.1, 0.30000000000000004, 0.6, 0.2)},
    )
    base.update(kw)
    return Aggregate(**base)


def test_payload_json_is_canonical_and_round_trips():
    text = agg().payload_json()
    assert text == agg().payload_json()
    assert " " not in text and text.index('"bucket_seconds"') < text.index('"count"')
    value = json.loads(text)
    assert value["bucket_start"] == "2025-01-01T00:01:00Z"
    assert value["first_timestamp"] == "2025-01-01T00:01:00.250000Z"
    assert value["fields"]["v"]["max"] == 0.30000000000000004  # exact float round trip
    assert value["payloads"] == {
        "numeric": 3,
        "non_numeric": 0,
        "invalid_json": 0,
        "binary": 0,
        "empty": 0,
    }


def test_write_back_registers_only_missing_or_changed():
    prefix = expand_prefix(options.DEFAULT_PREFIX, 60)
    assert prefix == ("eventfleet", "aggregate", "60")
    same, changed, new = agg(), agg(type=("plant", "u")), agg(type=("plant", "w"))
    existing = {
        (prefix + same.type, same.bucket_start_us): same.payload_json(),
        (prefix + changed.type, changed.bucket_start_us): agg(count=2).payload_json(),
    }
    todo, unchanged = writeback.plan([new, same, changed], prefix, existing)
    assert unchanged == 1
    assert [e.type for e in todo] == [prefix + changed.type, prefix + new.type]
    assert todo[0].source_timestamp == Timestamp(*divmod(same.bucket_start_us, US))
    assert todo[0].payload == EventPayloadJson(changed.payload_json())


def test_own_prefix_is_excluded_for_every_bucket_size():
    assert exclusion_prefix(options.DEFAULT_PREFIX) == ("eventfleet", "aggregate", "?")


# -- options ------------------------------------------------------------------------------


def parse(argv):
    p = argparse.ArgumentParser()
    options.add_arguments(p)
    return options.from_args(p.parse_args(argv))


def test_operator_arguments_are_accepted():
    """The ScheduledSparkApplication's arguments, as the operator renders them."""
    from eventfleet_operator import builders, model

    spec = model.parse(
        "demo", "events", {"aggregation": {"enabled": True, "bucketSeconds": 60}}, uid="u"
    )
    args = builders.scheduled_spark_application(spec)["spec"]["template"]["arguments"]
    opts = parse(args)
    assert (opts.bucket_seconds, opts.window_seconds, opts.write_back) == (60, 3600, True)
    assert opts.eventer == args[args.index("--eventer") + 1]
    assert opts.eventer.endswith(".events.svc:23012")
    assert opts.master is None  # spark-submit's


def test_token_from_environment_or_file(monkeypatch, tmp_path):
    monkeypatch.setenv("EVENTFLEET_TOKEN", "s3cr3t")
    opts = parse(["--eventer", "h:1", "--bucket", "1", "--output", "o"])
    # Not copied into the options (they become Spark data source options).
    assert opts.token is None and options.effective_token(opts) == "s3cr3t"
    (tmp_path / "t").write_text("fromfile\n")
    opts = parse(
        ["--eventer", "h:1", "--bucket", "1", "--output", "o", "--token-file", str(tmp_path / "t")]
    )
    assert options.effective_token(opts) == "fromfile" and "fromfile" not in repr(opts)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eventer", "nohost"], "eventer address 'nohost' is not HOST:PORT"),
        (["--eventer", "h:1", "--http", "h:1,web"], "http address 'web' is not HOST:PORT"),
        (["--eventer", "h:1", "--prefix", "a/*"], "may not contain"),
        (["--eventer", "h:1", "--prefix-depth", "-1"], "prefix depth -1"),
        (
            ["--eventer", "h:1", "--start", "2025-01-02", "--end", "2025-01-01"],
            "is not after start",
        ),
    ],
)
def test_bad_options_name_the_value(argv, message):
    with pytest.raises(ValueError, match=message):
        parse([*argv, "--bucket", "60", "--output", "o"])


def test_http_option_means_the_same_to_the_job_and_the_data_source():
    # One parser (endpoints.http_endpoints) behind --http and the source's `http` option.
    from eventfleet_spark.endpoints import Endpoint

    source = parts.require_module("spark", "eventfleet_spark.source")
    opts = parse(["--eventer", "h:1", "--http", "a:80, :81", "--bucket", "1", "--output", "o"])
    base = {"eventer": "h:1", "start": "0", "end": "10"}
    read = source.ReadOptions.from_options({**base, "http": opts.http})
    assert read.http == (Endpoint("a", 80), Endpoint("127.0.0.1", 81))
    assert source.ReadOptions.from_options({**base, "http": ""}).http == ()
    assert source.ReadOptions.from_options(base).http == ()
    with pytest.raises(ValueError, match="http address 'a:0' is not HOST:PORT"):
        source.ReadOptions.from_options({**base, "http": "a:0"})


def test_cli_has_the_aggregate_command():
    from eventfleet_cli import build_parser

    args = build_parser().parse_args(
        ["aggregate", "--eventer", "h:1", "--bucket", "60", "--output", "o", "--no-write-back"]
    )
    assert args.command == "aggregate" and args.write_back is False


# -- Arrow conversion ---------------------------------------------------------------------


def test_pages_become_arrow_batches_with_numbers():
    from eventfleet_spark.schema import PageConverter, TypeFilter

    events = [
        Event(EventId(1, 1, 1), ("a", "b"), Timestamp(10, 5), None, EventPayloadJson('{"v": 2}')),
        Event(EventId(1, 1, 2), ("x",), Timestamp(10, 6), Timestamp(9, 1), None),
        Event(
            EventId(2, 3, 4), ("a", "c"), Timestamp(11, 0), None, EventPayloadBinary("t", b"\x01")
        ),
        Event(EventId(2, 3, 5), ("agg", "60", "a"), Timestamp(11, 1), None, None),
    ]
    raw = [
        codec.repo.decode(
            "HatEventer.Event", codec.repo.encode("HatEventer.Event", codec.event_to_sbs(e))
        )
        for e in events
    ]
    batch = PageConverter(TypeFilter([("agg", "?")]), numbers=True).convert(raw)
    rows = batch.to_pylist()
    assert [r["type_key"] for r in rows] == ["a/b", "x", "a/c"]
    assert [r["payload_kind"] for r in rows] == ["json", "none", "binary"]
    assert [r["payload_class"] for r in rows] == ["numeric", "empty", "binary"]
    assert rows[0]["json_numbers"] == [("v", 2.0)] and rows[1]["json_numbers"] == []
    assert rows[1]["source_timestamp"].timestamp() == 9.000001
    assert rows[2]["payload_binary"] == b"\x01" and rows[2]["server"] == 2


def test_window_dates_cover_each_bucket_start():
    from eventfleet_spark.parquet_output import date_of, window_dates

    span = Span(us("2024-02-28T23:00:00Z"), us("2024-03-01T00:00:00Z"))
    assert window_dates(span, 3600) == ["2024-02-28", "2024-02-29"]
    assert window_dates(Span(span.start, span.end + US), 1) == [
        "2024-02-28",
        "2024-02-29",
        "2024-03-01",
    ]
    assert date_of(us("1969-12-31T23:59:59Z")) == "1969-12-31"


def test_reader_partial_aggregates_equal_the_reference():
    """The source's partial aggregation (`partial`) and `reference` are independent
    implementations of the same rules; their rows must agree exactly."""
    import random

    from eventfleet_spark.partial import PartialAggregator
    from eventfleet_spark.schema import TypeFilter

    rng = random.Random(3)
    texts = ['{"a": 1.5, "b": "x"}', "2", "{bad", '{"a": -0.0, "c": 1e400}', "[1]", "null"]
    events = []
    for i in range(3000):
        payload = rng.choice(
            [
                EventPayloadJson(rng.choice(texts)),
                EventPayloadJson(str(rng.random())),
                EventPayloadBinary("b", b"x"),
                None,
            ]
        )
        event_type = rng.choice([("a", "x"), ("a", "y"), ("b",), ("agg", "1", "q")])
        events.append(
            Event(EventId(1, 1, i + 1), event_type, Timestamp(100 + i // 400, i), None, payload)
        )
    raw = [
        codec.repo.decode(
            "HatEventer.Event", codec.repo.encode("HatEventer.Event", codec.event_to_sbs(e))
        )
        for e in events
    ]
    partial = PartialAggregator(2, 1, TypeFilter([("agg",)]))
    rows = []
    for page in (raw[:1000], raw[1000:2500], raw[2500:]):
        partial.add(page)
        rows += [r for b in partial.finished() for r in b.to_pylist()]
    rows += [r for b in partial.rest() for r in b.to_pylist()]

    got: dict = {}
    for r in rows:
        key = (tuple(r["type"]), r["bucket_us"])
        assert r["field"] is not None or key not in got, f"{key} emitted twice"
        if r["field"] is None:
            got[key] = Aggregate(
                type=key[0],
                bucket_start_us=key[1],
                bucket_seconds=2,
                count=r["n"],
                first_us=r["first_us"],
                last_us=r["last_us"],
                **{f"{c}_payloads": r[f"{c}_payloads"] for c in payloads.PAYLOAD_CLASSES},
                skipped_fields=r["skipped_fields"],
                fields={},
            )
    for r in rows:
        if r["field"] is not None:
            key = (tuple(r["type"]), r["bucket_us"])
            got[key].fields[r["field"]] = FieldStats(
                r["n"], r["vmin"], r["vmax"], r["vsum"], r["vsum"] / r["n"]
            )
    kept = [reference.from_event(e) for e in events if e.type[0] != "agg"]
    assert got == reference.aggregate(kept, 2, prefix_depth=1)


def test_partial_aggregation_choice_is_checked():
    with pytest.raises(ValueError, match="partial aggregation 'gpu' is not one of reader, spark"):
        options.JobOptions(eventer="h:1", bucket_seconds=1, output="o", partial_aggregation="gpu")


def test_read_in_choice_is_checked():
    with pytest.raises(ValueError, match="read in 'gpu' is not one of auto, driver, executors"):
        options.JobOptions(eventer="h:1", bucket_seconds=1, output="o", read_in="gpu")
    # Spark's own partial aggregation needs event rows from the source's executors.
    with pytest.raises(ValueError, match="read in driver needs partial aggregation reader"):
        options.JobOptions(
            eventer="h:1", bucket_seconds=1, output="o", read_in="driver",
            partial_aggregation="spark",
        )  # fmt: skip


class _Session:
    """What `job.reads_in_driver` looks at: the session's master."""

    def __init__(self, master: str):
        self.sparkContext = argparse.Namespace(master=master)


@pytest.mark.parametrize(
    ("master", "read_in", "partial", "driver"),
    [
        ("local[2]", "auto", "reader", True),
        ("local[*]", "auto", "reader", True),
        ("k8s://https://10.0.0.1:443", "auto", "reader", False),
        ("spark://m:7077", "auto", "reader", False),
        ("k8s://https://10.0.0.1:443", "driver", "reader", True),
        ("local[2]", "executors", "reader", False),
        ("local[2]", "auto", "spark", False),
    ],
)
def test_who_reads_the_window(master, read_in, partial, driver):
    from eventfleet_spark.job import reads_in_driver

    opts = options.JobOptions(
        eventer="h:1", bucket_seconds=1, output="o", read_in=read_in, partial_aggregation=partial
    )
    assert reads_in_driver(_Session(master), opts) is driver


def _partial_table(rows: list[dict]):
    from eventfleet_spark.partial import PARTIAL_ARROW_SCHEMA

    pa = parts.require_module("spark", "pyarrow")
    empty = {f.name: None for f in PARTIAL_ARROW_SCHEMA}
    return pa.Table.from_pylist([{**empty, **r} for r in rows], schema=PARTIAL_ARROW_SCHEMA)


def _header(t, bucket, n):
    """A header row (field NULL) as the fold writes it: every class counted, maybe 0."""
    classes = {f"{name}_payloads": 0 for name in payloads.PAYLOAD_CLASSES}
    row = {"type": t, "bucket_us": bucket, "n": n, "first_us": bucket, "last_us": bucket + 5}
    return {**row, **classes, "skipped_fields": 0}


def test_driver_combine_regroups_partial_rows():
    """The driver's merge of partial rows (one header and its field rows per key) gives
    the aggregates `aggregation.combine` defines: counts from the header, a field's mean
    its sum over its count, fields in UTF-8 order, keys sorted."""
    driver_read = parts.require_module("spark", "eventfleet_spark.driver_read")
    table = _partial_table(
        [
            {**_header(["b"], 2_000_000, 3), "numeric_payloads": 2, "empty_payloads": 1},
            {"type": ["b"], "bucket_us": 2_000_000, "field": "\U0001f600", "n": 1,
             "vmin": 1.0, "vmax": 1.0, "vsum": 1.0},
            {"type": ["b"], "bucket_us": 2_000_000, "field": "\uffff", "n": 2,
             "vmin": 0.5, "vmax": 2.0, "vsum": 2.5},
            {**_header(["a", "x"], 0, 1), "skipped_fields": 4, "binary_payloads": 1},
        ]
    )  # fmt: skip
    first, second = driver_read.combine(table, 2)
    assert first == Aggregate(("a", "x"), 0, 2, 1, 0, 5, binary_payloads=1, skipped_fields=4)
    assert second.key == (("b",), 2_000_000) and second.count == 3
    assert (second.numeric_payloads, second.empty_payloads, second.skipped_fields) == (2, 1, 0)
    assert list(second.fields) == ["\uffff", "\U0001f600"]
    assert second.fields["\uffff"] == FieldStats(2, 0.5, 2.0, 2.5, 1.25)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [_header(["a"], 0, 1), _header(["a"], 0, 2)],
            r"partial header of \(\('a',\), 0\) read twice",
        ),
        (
            [_header(["a"], 0, 1)]
            + 2 * [{"type": ["a"], "bucket_us": 0, "field": "v", "n": 1, "vsum": 1.0}],
            "partial field 'v' of .* read twice",
        ),
        (
            [{"type": ["a"], "bucket_us": 0, "field": "v", "n": 1, "vsum": 1.0}],
            "without a header row",
        ),
    ],
)
def test_driver_combine_refuses_rows_that_are_not_final(rows, message):
    """A key read twice (slices not bucket-aligned, a read out of order) would make Spark's
    merge add two partial sums; the driver's merge stops instead."""
    driver_read = parts.require_module("spark", "eventfleet_spark.driver_read")
    with pytest.raises(ValueError, match=message):
        driver_read.combine(_partial_table(rows), 1)
