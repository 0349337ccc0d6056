"""The aggregation as a Spark plan (the result is defined by `reference`).

Two inputs, one result: event rows of the ``eventfleet`` source with
``json_numbers=true`` (`aggregate` = `combine` ∘ `partials`: Spark computes everything),
or the source's ``aggregate`` mode, whose rows are already the partials (`combine`
only; see `partial` for why that is the job's default).

Determinism: the source cuts a window into slices at bucket boundaries, so all events
of one (type, bucket) are read by one task in ascending natural order; explode and
partial aggregation keep that order. Each sum is therefore added in the same order on
every run (and in the same order as `reference`), so the float results, and the
Parquet files, are bit-for-bit repeatable; the final merge only ever sees one partial
value per key.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from eventfleet_spark.payloads import PAYLOAD_CLASSES
from eventfleet_spark.record import COUNT_COLUMNS, Aggregate, FieldStats

_US = 1_000_000
_DAY_US = 86_400 * _US


def aggregate(events: DataFrame, bucket_seconds: int, prefix_depth: int | None = None) -> DataFrame:
    """Aggregates of event rows: `combine` (`partials`)."""
    return combine(partials(events, bucket_seconds, prefix_depth))


def partials(events: DataFrame, bucket_seconds: int, prefix_depth: int | None = None) -> DataFrame:
    """Event rows → one row per (type, bucket, field), `partial.PARTIAL_SCHEMA_DDL`.

    This is what the source computes itself in its ``aggregate`` mode; here Spark does it.
    """
    if not isinstance(bucket_seconds, int) or bucket_seconds < 1:
        raise ValueError(f"bucket_seconds {bucket_seconds!r} must be an integer >= 1")
    if prefix_depth is not None and (not isinstance(prefix_depth, int) or prefix_depth < 0):
        raise ValueError(f"prefix_depth {prefix_depth!r} must be an integer >= 0")
    bucket_us = bucket_seconds * _US
    group_type = "type" if prefix_depth is None else f"slice(type, 1, {prefix_depth})"
    # One pass, two levels: each event becomes one header row (field NULL) carrying its
    # class, plus one row per number. Two aggregations over the source would read the
    # whole window from the fleet twice.
    exploded = events.selectExpr(
        f"{group_type} AS group_type",
        "unix_micros(timestamp) AS ts",
        f"unix_micros(timestamp) - pmod(unix_micros(timestamp), {bucket_us}L) AS bucket_us",
        "explode(concat("
        "  array(named_struct('field', CAST(NULL AS STRING), 'value', CAST(NULL AS DOUBLE),"
        "    'cls', payload_class, 'skipped', json_skipped)),"
        "  transform(map_entries(json_numbers), e -> named_struct('field', e.key,"
        "    'value', e.value, 'cls', CAST(NULL AS STRING), 'skipped', CAST(NULL AS INT)))"
        ")) AS r",
    )
    header = F.col("r.field").isNull()
    return exploded.groupBy(
        F.col("group_type").alias("type"), "bucket_us", F.col("r.field").alias("field")
    ).agg(
        F.count(F.lit(1)).alias("n"),
        F.min(F.when(header, F.col("ts"))).alias("first_us"),
        F.max(F.when(header, F.col("ts"))).alias("last_us"),
        *[
            F.sum(F.when(header, (F.col("r.cls") == name).cast("bigint"))).alias(f"{name}_payloads")
            for name in PAYLOAD_CLASSES
        ],
        F.sum(F.col("r.skipped").cast("bigint")).alias("skipped_fields"),
        F.min("r.value").alias("vmin"),
        F.max("r.value").alias("vmax"),
        F.sum("r.value").alias("vsum"),
    )


def combine(partial_rows: DataFrame) -> DataFrame:
    """Partial rows (`partials`, or the source's ``aggregate`` mode) → one row per
    (type, bucket).

    Columns: ``type`` array<string>, ``bucket_us`` bigint, ``count``, ``first_us``,
    ``last_us``, one ``<class>_payloads`` count per payload class, ``skipped_fields``,
    and ``fields`` map<string, struct<count, min, max, sum, mean>> with sorted keys.
    """
    # Partial rows of one key come from one task (bucket-aligned slices), so this merge
    # sees a single row per key and the sums stay exactly as the task added them.
    merged = partial_rows.groupBy("type", "bucket_us", "field").agg(
        F.sum("n").alias("n"),
        F.min("first_us").alias("first_us"),
        F.max("last_us").alias("last_us"),
        *[F.sum(f"{name}_payloads").alias(f"{name}_payloads") for name in PAYLOAD_CLASSES],
        F.sum("skipped_fields").alias("skipped_fields"),
        F.min("vmin").alias("vmin"),
        F.max("vmax").alias("vmax"),
        F.sum("vsum").alias("vsum"),
    )

    def header(column: str):
        return F.max(F.expr(f"CASE WHEN field IS NULL THEN {column} END"))

    return merged.groupBy("type", "bucket_us").agg(
        header("n").alias("count"),
        header("first_us").alias("first_us"),
        header("last_us").alias("last_us"),
        *[header(f"{name}_payloads").alias(f"{name}_payloads") for name in PAYLOAD_CLASSES],
        header("coalesce(skipped_fields, 0)").alias("skipped_fields"),
        F.expr(
            "map_from_entries(array_sort(collect_list(CASE WHEN field IS NOT NULL THEN"
            " struct(field, named_struct('count', n, 'min', vmin, 'max', vmax,"
            " 'sum', vsum, 'mean', vsum / n)) END)))"
        ).alias("fields"),
    )


def to_aggregate(row: Row, bucket_seconds: int) -> Aggregate:
    return Aggregate(
        type=tuple(row["type"]),
        bucket_start_us=row["bucket_us"],
        bucket_seconds=bucket_seconds,
        first_us=row["first_us"],
        last_us=row["last_us"],
        fields={
            name: FieldStats(s["count"], s["min"], s["max"], s["sum"], s["mean"])
            for name, s in sorted((row["fields"] or {}).items())
        },
        **{name: row[name] for name in COUNT_COLUMNS},
    )


def parquet_frame(aggregates: DataFrame, bucket_seconds: int) -> DataFrame:
    """The Parquet rows: readable timestamps and the ``date`` partition column.

    ``date`` is the UTC date of the bucket start, computed from microseconds so that
    it does not depend on the session time zone.
    """
    return aggregates.selectExpr(
        "type",
        "array_join(type, '/') AS type_key",
        "timestamp_micros(bucket_us) AS bucket_start",
        f"timestamp_micros(bucket_us + {bucket_seconds * _US}L) AS bucket_end",
        "count",
        "timestamp_micros(first_us) AS first_timestamp",
        "timestamp_micros(last_us) AS last_timestamp",
        *[f"{name}_payloads" for name in PAYLOAD_CLASSES],
        "skipped_fields",
        "fields",
        "CAST(date_add(DATE'1970-01-01',"
        f" CAST((bucket_us - pmod(bucket_us, {_DAY_US}L)) div {_DAY_US}L AS INT)) AS STRING)"
        " AS date",
    )
