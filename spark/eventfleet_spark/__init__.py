"""eventfleet's PySpark job: aggregates of the fleet's events, to Parquet and back as events.

Modules (each usable on its own):

``timeplan``        bucket, window and slice arithmetic (pure)
``endpoints``       ``HOST:PORT`` lists, the token variable (no dependencies)
``eventer_io``      paged Eventer reads returning raw SBS records (executors)
``schema``          the source's row schema; raw pages as Arrow record batches
``source``          the ``eventfleet`` Spark Python data source
``record``          `Aggregate`, its canonical JSON payload
``payloads``        how a payload counts (class, numbers, skipped fields)
``reference``       the aggregation rules in plain Python (test oracle, baseline)
``partial``         partial aggregation inside the reading worker (the default path)
``driver_read``     the same read and fold in the driver process (``--read-in driver``)
``aggregation``     the aggregation as a Spark plan
``parquet_output``  window-replacing Parquet writes
``writeback``       idempotent registration of aggregates as events
``options``, ``job``  arguments and the job itself (``eventfleet aggregate``)

Nothing here imports pyspark at package import time, so the CLI can list and parse
the command without a JVM.
"""
