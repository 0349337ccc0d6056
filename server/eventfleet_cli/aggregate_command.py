"""``eventfleet aggregate``: the PySpark aggregation job (see docs/aggregation.md).

The job lives in `eventfleet_spark`; this module only adds its arguments to the CLI.
`eventfleet_spark.options` has no third-party imports, so building the parser never
needs pyspark; the job itself is imported when the command runs.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    from eventfleet_spark import options

    p = sub.add_parser(
        "aggregate",
        help="aggregate events per type and time bucket (PySpark) into Parquet and events",
        description="Read a time range of events from the fleet over Eventer, aggregate them "
        "per type and bucket with Spark, write Parquet (partitioned by date) and register "
        "the aggregates back as events. Default range: the last --window seconds up to the "
        "last complete bucket. Needs the [spark] extra.",
    )
    options.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from eventfleet_spark.job import run_args

    return run_args(args)
