"""Parquet output: ``OUTPUT/bucket_seconds=B/date=YYYY-MM-DD/part-*.parquet``.

A window's buckets are replaced, nothing else: the job rewrites every date partition
the window touches with (rows of that date outside the window, kept from the existing
files) + (the window's new aggregates), using Spark's *dynamic* partition overwrite so
other dates are not touched. Each date is written by one task as one file, rows sorted
by (type, bucket start), so re-running a window over unchanged events writes the same
rows in the same order (the file *names* differ: Spark puts a job id in them).

A date of the window that ends up with no rows at all is deleted, so stale buckets
cannot survive a re-run.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from eventfleet_spark import timeplan
from eventfleet_spark.record import COUNT_COLUMNS, Aggregate

PARQUET_COLUMNS = (
    ("type", "ARRAY<STRING>"),
    ("type_key", "STRING"),
    ("bucket_start", "TIMESTAMP"),
    ("bucket_end", "TIMESTAMP"),
    ("count", "BIGINT"),
    ("first_timestamp", "TIMESTAMP"),
    ("last_timestamp", "TIMESTAMP"),
    ("numeric_payloads", "BIGINT"),
    ("non_numeric_payloads", "BIGINT"),
    ("invalid_json_payloads", "BIGINT"),
    ("binary_payloads", "BIGINT"),
    ("empty_payloads", "BIGINT"),
    ("skipped_fields", "BIGINT"),
    (
        "fields",
        "MAP<STRING, STRUCT<count: BIGINT, min: DOUBLE, max: DOUBLE, sum: DOUBLE, mean: DOUBLE>>",
    ),
    ("date", "STRING"),
)
"""The Parquet columns, (name, Spark SQL type), every one nullable."""
PARQUET_SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in PARQUET_COLUMNS)

_DAY_US = 86_400 * timeplan.US


@dataclasses.dataclass(frozen=True)
class ParquetResult:
    dates: tuple[str, ...]  # date partitions rewritten
    rows: int  # rows written (new + kept)
    kept: int  # rows of other buckets kept from the existing files
    deleted: tuple[str, ...]  # date partitions removed because nothing was left in them


def bucket_root(output: str, bucket_seconds: int) -> str:
    return f"{output.rstrip('/')}/bucket_seconds={bucket_seconds}"


def window_dates(span: timeplan.Span, bucket_seconds: int) -> list[str]:
    """UTC dates of the bucket starts in `span` (each date partition the window owns a
    part of)."""
    last_bucket = span.end - bucket_seconds * timeplan.US
    out = []
    day = timeplan.floor_to(span.start, _DAY_US)
    while day <= last_bucket:
        out.append(date_of(day))
        day += _DAY_US
    return out


def date_of(bucket_start_us: int) -> str:
    """The ``date`` partition of a bucket (UTC date of its start)."""
    day = timeplan.floor_to(bucket_start_us, _DAY_US) // _DAY_US
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day)).isoformat()


def empty_frame(spark: SparkSession) -> DataFrame:
    """No rows, `PARQUET_COLUMNS` as the schema (all nullable), planned in the JVM alone."""
    return spark.range(0).selectExpr(
        *[f"CAST(NULL AS {kind}) AS {name}" for name, kind in PARQUET_COLUMNS]
    )


_TS = pa.timestamp("us", tz="UTC")
_ARROW_SCHEMA = pa.schema(
    [
        ("type", pa.list_(pa.string())),
        ("type_key", pa.string()),
        ("bucket_start", _TS),
        ("bucket_end", _TS),
        ("count", pa.int64()),
        ("first_timestamp", _TS),
        ("last_timestamp", _TS),
        *[(name, pa.int64()) for name in COUNT_COLUMNS if name != "count"],
        (
            "fields",
            pa.map_(
                pa.string(),
                pa.struct(
                    [("count", pa.int64())]
                    + [(s, pa.float64()) for s in ("min", "max", "sum", "mean")]
                ),
            ),
        ),
        ("date", pa.string()),
    ]
)


def aggregates_frame(
    spark: SparkSession, aggregates: Sequence[Aggregate], bucket_seconds: int
) -> DataFrame:
    """`aggregation.parquet_frame`'s rows built from aggregates the driver holds (no
    Spark stage computes them: one Arrow table handed to the JVM)."""
    bucket_us = bucket_seconds * timeplan.US
    rows = [
        {
            "type": list(a.type),
            "type_key": "/".join(a.type),
            "bucket_start": a.bucket_start_us,
            "bucket_end": a.bucket_start_us + bucket_us,
            "first_timestamp": a.first_us,
            "last_timestamp": a.last_us,
            **{name: getattr(a, name) for name in COUNT_COLUMNS},
            # A dict per field by hand: dataclasses.asdict deep-copies, ~0.1 ms each.
            "fields": [
                (k, {"count": v.count, "min": v.min, "max": v.max, "sum": v.sum, "mean": v.mean})
                for k, v in a.fields.items()
            ],
            "date": date_of(a.bucket_start_us),
        }
        for a in aggregates
    ]
    table = pa.Table.from_pylist(rows, schema=_ARROW_SCHEMA)
    return spark.createDataFrame(table, schema=PARQUET_SCHEMA_DDL)


def write_window(
    spark: SparkSession,
    frame: DataFrame,
    new_dates: dict[str, int],
    output: str,
    bucket_seconds: int,
    span: timeplan.Span,
) -> ParquetResult:
    """Replace the buckets of `span` under `output` with `frame`.

    `frame` holds `aggregation.parquet_frame` rows, all inside `span`; `new_dates` maps
    each of their dates to its row count (the caller has the aggregates in hand, so no
    Spark job is spent on finding them).
    """
    root = bucket_root(output, bucket_seconds)
    jvm = spark.sparkContext._jvm
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.Path(root).getFileSystem(hadoop_conf)

    def path(date: str):
        return jvm.org.apache.hadoop.fs.Path(f"{root}/date={date}")

    present = [d for d in window_dates(span, bucket_seconds) if fs.exists(path(d))]
    kept_dates: dict[str, int] = {}
    # Always a union with the declared (all-nullable) schema: a first run would
    # otherwise write some columns as `required` and the next run as `optional`, and
    # the files of two runs over the same events would differ.
    # Built in the JVM: ``createDataFrame([], ...)`` would start a Python worker daemon
    # and two workers just to convert an empty list (1.5 s of CPU in a cold run).
    kept = empty_frame(spark)
    if present:
        kept = (
            spark.read.schema(PARQUET_SCHEMA_DDL)
            .option("basePath", root)
            .parquet(*[f"{root}/date={d}" for d in present])
            .where(
                f"unix_micros(bucket_start) < {span.start}L"
                f" OR unix_micros(bucket_start) >= {span.end}L"
            )
        )
        # Materialized before the overwrite below deletes the files it comes from.
        kept = kept.localCheckpoint(eager=True)
        kept_dates = {r[0]: r[1] for r in kept.groupBy("date").count().collect()}
    written = {**new_dates}
    for date, n in kept_dates.items():
        written[date] = written.get(date, 0) + n
    if written:
        (
            frame.unionByName(kept)
            .repartition("date")
            .sortWithinPartitions("date", "type", "bucket_start")
            .write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy("date")
            .parquet(root)
        )
    deleted = tuple(d for d in present if d not in written)
    for d in deleted:
        fs.delete(path(d), True)
    return ParquetResult(
        tuple(sorted(written)), sum(written.values()), sum(kept_dates.values()), deleted
    )
