"""spark-submit main file of the aggregation job (``mainApplicationFile``).

The operator's ScheduledSparkApplication runs ``local:///opt/eventfleet/aggregate.py``
with ``--eventer SERVICE:PORT --bucket S --output PATH --window S``; this file is that
path in the job image and only hands over to `eventfleet_spark.job.main`, the same code
as ``eventfleet aggregate``.
"""

import sys

from eventfleet_spark.job import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
