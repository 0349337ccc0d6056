"""`eventfleet_spark.image_archive`: the classpath jar that fixes the class path the job
image's CDS archive is written and mapped with.

That the JVM writes and maps the archive with it is checked where the JVM runs: the
image build's training run (spark/train_class_archive.py) and the cluster test's
driver log (e2e/test_aggregate_fleet.py).
"""

from __future__ import annotations

import os
import pathlib
import zipfile

import pytest
from eventfleet_spark import image_archive


def _class_path(jar: pathlib.Path) -> list[str]:
    """The Class-Path attribute as a JAR reader sees it (CRLF lines, continuations)."""
    with zipfile.ZipFile(jar) as z:
        raw = z.read("META-INF/MANIFEST.MF")
    lines = raw.split(b"\r\n")
    assert all(len(line) <= 72 for line in lines), "manifest lines are at most 72 bytes"
    text = raw.decode().replace("\r\n ", "")
    (attr,) = [line for line in text.split("\r\n") if line.startswith("Class-Path: ")]
    return attr.removeprefix("Class-Path: ").split(" ")


def _spark_jars(root: pathlib.Path) -> pathlib.Path:
    jars = root / "spark" / "jars"
    jars.mkdir(parents=True)
    # Unsorted on purpose, a long name that wraps, a directory and a non-jar.
    for name in ("spark-core_2.13-4.0.1.jar", "HikariCP-2.5.1.jar", "a" * 90 + ".jar"):
        (jars / name).write_bytes(b"PK")
    (jars / "connect-repl").mkdir()
    (jars / "connect-repl" / "x.jar").write_bytes(b"PK")
    (jars / "README").write_text("not a jar")
    return jars


def test_classpath_jar_lists_spark_jars_sorted_relative_to_itself(tmp_path):
    jars = _spark_jars(tmp_path)
    jar = tmp_path / "eventfleet" / "cds" / "classpath.jar"
    names = image_archive.write_classpath_jar(jar, jars)
    # Bytes order (upper case first), only regular *.jar files: a non-empty directory
    # on the class path would make the JVM refuse to write the archive.
    assert names == ["HikariCP-2.5.1.jar", "a" * 90 + ".jar", "spark-core_2.13-4.0.1.jar"]
    entries = _class_path(jar)
    assert entries == [f"../../spark/jars/{n}" for n in names]
    # The JVM resolves each entry against the jar's directory.
    for entry in entries:
        assert (jar.parent / entry).resolve() == (jars / pathlib.Path(entry).name).resolve()


def test_classpath_jar_bytes_do_not_depend_on_the_build(tmp_path):
    jars = _spark_jars(tmp_path)
    one, two = tmp_path / "one" / "cp.jar", tmp_path / "two" / "cp.jar"
    image_archive.write_classpath_jar(one, jars)
    os.utime(jars / "HikariCP-2.5.1.jar", (0, 0))
    image_archive.write_classpath_jar(two, jars)
    assert one.read_bytes() == two.read_bytes()
    # A whole second: an image layer keeps no more, and the JVM compares it exactly.
    assert one.stat().st_mtime_ns == two.stat().st_mtime_ns == image_archive.JAR_MTIME_NS
    assert image_archive.JAR_MTIME_NS % 1_000_000_000 == 0


def test_a_directory_without_jars_is_not_a_spark_installation(tmp_path):
    with pytest.raises(ValueError, match="no jars in"):
        image_archive.write_classpath_jar(tmp_path / "cp.jar", tmp_path)


def test_manifest_refuses_an_entry_with_a_space():
    with pytest.raises(ValueError, match="contains a space"):
        image_archive.manifest(["a b.jar"])


def test_driver_options_map_the_archive_and_log_to_stderr():
    options = image_archive.java_options().split()
    assert options[0] == f"-XX:SharedArchiveFile={image_archive.ARCHIVE}"
    # -Xshare:auto (the default) is what makes a mismatch a warning, not a failure.
    assert not any(o.startswith("-Xshare") for o in options)
    assert "-Xlog:all=warning:stderr:uptime,level,tags" in options


def test_archive_option_is_the_last_shared_archive_file():
    assert image_archive.archive_option("-Xmx1g") is None
    assert image_archive.archive_option(image_archive.java_options()) == image_archive.ARCHIVE
    assert image_archive.archive_option("-XX:SharedArchiveFile=/a -XX:SharedArchiveFile=/b") == "/b"


def test_driver_verdict_reads_the_jvms_mappings(tmp_path):
    """A file this process has mapped is reported mapped; another is not (the JVM maps
    an archive it uses and unmaps one it cannot use)."""
    import mmap

    archive = tmp_path / "spark-driver.jsa"
    archive.write_bytes(b"\0" * mmap.PAGESIZE)
    other = tmp_path / "other.jsa"
    other.write_bytes(b"\0")
    with open(archive, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ):
        yes = image_archive.driver_verdict(f"-XX:SharedArchiveFile={archive}", os.getpid())
        no = image_archive.driver_verdict(f"-XX:SharedArchiveFile={other}", os.getpid())
    assert yes == f"class archive {archive}: mapped by the driver JVM (pid {os.getpid()})"
    assert no.startswith(f"class archive {other}: NOT mapped by the driver JVM")
    assert image_archive.driver_verdict("-Xmx1g", os.getpid()) is None
