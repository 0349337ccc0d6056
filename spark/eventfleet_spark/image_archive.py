"""The job image's class-data-sharing (CDS) archive of the Spark driver JVM's classes.

A cold run of the job spends about half of its JVM CPU loading, parsing and verifying
Spark's classes (docs/performance.md, Aggregation). `class_archive` lets a local run map
an archive a previous run wrote; in the job image (images/spark.Dockerfile) the archive
is written once at build time, by a training run of the job itself
(``spark/train_class_archive.py``), and every driver the operator starts maps it with
``-XX:SharedArchiveFile`` (the operator's ScheduledSparkApplication,
``spark.driver.extraJavaOptions``).

A dynamic CDS archive is only valid for the class path it was written with (JDK 17
compares every class-path entry up to the last one an archived class came from, names
in order, and each jar's size and mtime). spark-submit's class path ends with
``/opt/spark/jars/*``, which the java launcher expands in directory order: the order
``readdir`` returns, which is not sorted and differs between filesystems (the image's
layer on the build machine vs on a node). So the driver's class path starts with
`CLASSPATH_JAR` (``spark.driver.extraClassPath``), an empty jar whose manifest lists
Spark's jars in sorted order: every Spark class is then found first through that fixed
list, and the wildcard's entries, later on the class path, are never compared.

When the JVM cannot use the archive (another JDK, changed jars, a class path that does
not start with `CLASSPATH_JAR`), ``-Xshare:auto`` (the default) makes it print a
``[warning][cds]`` line and run without it: slower, never failed.
"""

from __future__ import annotations

import os
import pathlib
import zipfile

# Fixed paths in the job image; the operator names the same ones
# (eventfleet_operator.naming.SPARK_CLASS_ARCHIVE / SPARK_CLASSPATH_JAR, checked by the
# unit tests).
ARCHIVE = "/opt/eventfleet/cds/spark-driver.jsa"
CLASSPATH_JAR = "/opt/eventfleet/cds/spark-classpath.jar"
SPARK_JARS = "/opt/spark/jars"
# The classpath jar's mtime: 1980-01-01T00:00:00Z (the zip epoch), whole seconds.
JAR_MTIME_NS = 315_532_800 * 1_000_000_000

# The JVM's own log lines go to stderr (stdout carries the job's summary lines); the
# archive's one-line "mapped" / "mismatch" verdicts are what the driver log shows.
LOG_OPTIONS = "-Xlog:disable -Xlog:all=warning:stderr:uptime,level,tags"

# Manifest lines are at most 72 bytes; continuation lines start with one space.
_MANIFEST_LINE = 72


def jar_names(jars_dir: pathlib.Path) -> list[str]:
    """Spark's jars in `jars_dir`, sorted by name (bytes order: locale-independent).

    Only regular ``*.jar`` files: Spark 4 ships directories there too
    (``connect-repl``), and a non-empty directory on the class path before the last
    archived class's jar makes the JVM refuse to write the archive.
    """
    names = sorted(
        (p.name for p in jars_dir.iterdir() if p.suffix == ".jar" and p.is_file()),
        key=lambda n: n.encode(),
    )
    if not names:
        raise ValueError(f"no jars in {jars_dir}: not a Spark installation")
    return names


def manifest(class_path: list[str]) -> bytes:
    """A jar manifest whose ``Class-Path`` lists `class_path` (relative URLs), wrapped."""
    if any(" " in entry for entry in class_path):
        raise ValueError(f"a class-path entry contains a space: {class_path!r}")
    lines = ["Manifest-Version: 1.0", "Created-By: eventfleet image_archive"]
    text = "Class-Path: " + " ".join(class_path)
    data = text.encode()
    first, rest = data[:_MANIFEST_LINE], data[_MANIFEST_LINE:]
    wrapped = [first] + [
        b" " + rest[i : i + _MANIFEST_LINE - 1] for i in range(0, len(rest), _MANIFEST_LINE - 1)
    ]
    return ("\r\n".join(lines) + "\r\n").encode() + b"\r\n".join(wrapped) + b"\r\n\r\n"


def write_classpath_jar(jar: pathlib.Path, jars_dir: pathlib.Path) -> list[str]:
    """Write `jar`: no classes, a manifest listing every jar of `jars_dir` in sorted
    order (relative to `jar`'s directory, as the JVM resolves them). Returns the names.

    Written with a fixed timestamp so that two builds of the same Spark write the same
    bytes, and with a fixed mtime of a whole second (`JAR_MTIME`): the JVM checks a
    class-path jar's size and mtime against the archive's record, and an image layer
    keeps mtimes to the second only — a jar written at 14:22:06.9 in the build stage
    is 14:22:06.0 in the image, and the JVM (17.0.19) refused the archive for it.
    """
    names = jar_names(jars_dir)
    rel = pathlib.Path(_relative(jars_dir, jar.parent))
    entries = [(rel / name).as_posix() for name in names]
    jar.parent.mkdir(parents=True, exist_ok=True)
    info = zipfile.ZipInfo("META-INF/MANIFEST.MF", date_time=(1980, 1, 1, 0, 0, 0))
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(info, manifest(entries))
    os.utime(jar, ns=(JAR_MTIME_NS, JAR_MTIME_NS))
    return names


def _relative(target: pathlib.Path, start: pathlib.Path) -> str:
    return os.path.relpath(target.resolve(), start.resolve())


def java_options(archive: str = ARCHIVE) -> str:
    """The driver's JVM options that map `archive` (spark.driver.extraJavaOptions)."""
    return f"-XX:SharedArchiveFile={archive} {LOG_OPTIONS}"


def archive_option(java_options: str) -> str | None:
    """The archive named by ``-XX:SharedArchiveFile=`` in `java_options` (the last one)."""
    found = None
    for option in java_options.split():
        if option.startswith("-XX:SharedArchiveFile="):
            found = option.removeprefix("-XX:SharedArchiveFile=")
    return found


def mapped_by(pid: int, archive: str) -> bool:
    """Whether process `pid` (a JVM) has `archive` mapped: the JVM maps a CDS archive's
    regions from the file and unmaps it again when it cannot use it."""
    with open(f"/proc/{pid}/maps") as f:
        return any(line.rstrip("\n").endswith(" " + archive) for line in f)


def driver_verdict(java_options: str, jvm_pid: int) -> str | None:
    """One log line on the driver JVM's use of the archive its options name (None when
    they name none). Under spark-submit the driver JVM is the job's parent process."""
    archive = archive_option(java_options)
    if archive is None:
        return None
    try:
        mapped = mapped_by(jvm_pid, archive)
    except OSError as e:  # no /proc (not Linux) or the JVM is gone: say so, run on
        return f"class archive {archive}: cannot tell whether the JVM maps it ({e})"
    if mapped:
        return f"class archive {archive}: mapped by the driver JVM (pid {jvm_pid})"
    return (
        f"class archive {archive}: NOT mapped by the driver JVM (pid {jvm_pid}): missing, or"
        " written by another JDK or for another class path (see the JVM's [warning][cds]"
        " lines); the job runs without it, its start-up slower"
    )
