"""A class-data-sharing (CDS) archive of the Spark JVM's classes, for local runs.

A cold local run spends most of its JVM CPU loading, parsing and verifying Spark's
classes (measured on 1M events, 2 cores: JVM CPU 16.4 s without an archive, 8.9 s with
one; docs/performance.md, Aggregation). The JDK can map the classes a previous run
loaded from an archive file instead (``-XX:SharedArchiveFile``); JDK 17 writes that
archive at the end of a run started with ``-XX:ArchiveClassesAtExit``.

`plan` picks the archive for this Java and this Spark installation in a directory
(``--class-archive DIR``): if it exists the run maps it; if not, this run is the
training run and writes it. `finish` then waits for the JVM to exit (it dumps the
archive while exiting) and only then moves the file into place, so a run never maps a
half-written archive. The archive is keyed by the Java binary and the Spark jars: a
JDK or Spark upgrade builds a new one rather than silently running unshared.

Local runs only: under spark-submit (the operator's image) the JVM is started before
this code runs, so the option has no effect there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil

# The JVM's own warnings (CDS prints some while dumping) go to stderr: stdout carries
# the job's summary lines, which ``--json`` callers parse.
_LOG_TO_STDERR = "-Xlog:disable -Xlog:all=warning:stderr:uptime,level,tags"

# The JVM dumps the archive while exiting; 187 MB took ~5 s on the benchmark machine.
EXIT_TIMEOUT = 300.0


@dataclasses.dataclass(frozen=True)
class ArchivePlan:
    """Where this run's archive is and whether this run writes it."""

    path: pathlib.Path
    training: bool  # no archive yet: this run writes `partial` and `finish` moves it

    @property
    def partial(self) -> pathlib.Path:
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")

    def java_options(self) -> str:
        if self.training:
            return f"-XX:ArchiveClassesAtExit={self.partial} {_LOG_TO_STDERR}"
        return f"-XX:SharedArchiveFile={self.path} {_LOG_TO_STDERR}"


def _java_binary() -> str:
    """The java that spark-submit starts (``$JAVA_HOME/bin/java``, else PATH's)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise ValueError("no java on PATH and JAVA_HOME is not set: Spark cannot start")
    return found


def archive_key() -> str:
    """A digest of what the archive depends on: the Java binary and Spark's jars."""
    from pyspark.find_spark_home import _find_spark_home

    java = os.path.realpath(_java_binary())
    st = os.stat(java)
    digest = hashlib.sha256(f"{java} {st.st_size} {st.st_mtime_ns}".encode())
    jars = pathlib.Path(_find_spark_home()) / "jars"
    for jar in sorted(jars.iterdir()):
        js = jar.stat()
        digest.update(f"\n{jar.name} {js.st_size} {js.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def plan(directory: pathlib.Path) -> ArchivePlan:
    """This installation's archive in `directory` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"spark-classes-{archive_key()}.jsa"
    return ArchivePlan(path, training=not path.exists())


def finish(spark, archive: ArchivePlan) -> None:
    """End the session; after a training run, wait for the JVM to write the archive and
    move it into place (nothing to do when the run mapped an existing archive)."""
    from pyspark import SparkContext

    proc = SparkContext._gateway.proc
    spark.stop()
    if not archive.training:
        return
    # The JVM exits when its stdin closes (PySpark's gateway contract).
    proc.stdin.close()
    proc.wait(timeout=EXIT_TIMEOUT)
    if archive.partial.exists():
        os.replace(archive.partial, archive.path)
