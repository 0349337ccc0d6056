# syntax=docker/dockerfile:1.7
# The aggregation job run by spark-operator's ScheduledSparkApplication.
#
#   docker build -f images/spark.Dockerfile -t eventfleet/spark:0.1.0 .
#
# Base: the official Apache Spark image, Python line, for the Spark release the operator
# schedules by default (EventServer spec.aggregation.sparkVersion, 4.0.1), Scala 2.13 on
# Java 17 (the Java the project's local Spark tests use). The job's PySpark code runs
# against this image's own Spark distribution, so the Python API and the JVM side are the
# same release by construction.
#
# That image's Python is Ubuntu 22.04's 3.10, older than the 3.11 eventfleet requires.
# The build stage therefore adds a standalone CPython 3.11 (python-build-standalone, via
# uv) under /opt/eventfleet, and PYSPARK_PYTHON points the driver and executors at it.
ARG SPARK_IMAGE=spark:4.0.1-scala2.13-java17-python3-ubuntu
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.8.22

FROM ${UV_IMAGE} AS uv

FROM ${SPARK_IMAGE} AS build
USER root
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON_INSTALL_DIR=/opt/eventfleet/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_NO_CACHE=1
RUN uv venv --python 3.11 /opt/eventfleet/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server/ server/
COPY operator/ operator/
COPY spark/ spark/
# The `[spark]` extra pulls pyspark from PyPI; it is removed again so that only the
# base image's pyspark (matching its JVM exactly) can ever be imported.
RUN uv pip install --python /opt/eventfleet/venv/bin/python --compile-bytecode ".[spark]" \
 && uv pip uninstall --python /opt/eventfleet/venv/bin/python pyspark
# spark-operator submits this file (mainApplicationFile local:///opt/eventfleet/aggregate.py);
# it only hands over to the job's main, the same code as `eventfleet aggregate`.
COPY spark/aggregate.py /opt/eventfleet/aggregate.py
# The driver's class-data-sharing archive (eventfleet_spark.image_archive,
# docs/aggregation.md): a training run of the job itself, as a driver pod runs it,
# against a real replica on loopback, with -XX:ArchiveClassesAtExit. The archive holds
# this stage's JDK and /opt/spark/jars, which the final stage has unchanged (same base
# image). The replica's `[server]` extra lives in a throwaway venv deleted right after.
RUN uv venv --quiet --python 3.11 /tmp/train \
 && uv pip install --quiet --python /tmp/train/bin/python ".[server]" \
 && /tmp/train/bin/python spark/train_class_archive.py --job-python /opt/eventfleet/venv/bin/python \
 && rm -rf /tmp/train

FROM ${SPARK_IMAGE}
LABEL org.opencontainers.image.title="eventfleet spark job" \
      org.opencontainers.image.description="PySpark aggregation of an eventfleet fleet's events" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/eventfleet /opt/eventfleet
ENV PYSPARK_PYTHON=/opt/eventfleet/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/eventfleet/venv/bin/python \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Spark writes shuffle and spill files to spark.local.dir (/tmp by default; spark-operator
# mounts an emptyDir there) and nothing else, so the root filesystem can stay read-only
# when /tmp and /opt/spark/work-dir are volumes.
WORKDIR /opt/spark/work-dir
# The base image's unprivileged `spark` user (uid 185), which spark-operator expects.
USER 185
# A batch job has no endpoint to probe: spark-operator follows the driver pod's phase and
# the Spark UI instead. Stated explicitly so no base-image check is inherited.
HEALTHCHECK NONE
# The base image's ENTRYPOINT (/opt/entrypoint.sh, driver/executor dispatch) is kept.
