"""`eventfleet_spark.class_archive`: which archive a local run maps or writes.

The end-to-end behaviour (a first run writes the archive, the next maps it, the same
aggregates) is e2e/test_aggregate_cli.py; here the choice of file and JVM options.
"""

from __future__ import annotations

from tests import parts

parts.require_module("spark", "pyspark")

from eventfleet_spark import class_archive  # noqa: E402


def test_first_run_writes_a_partial_file_later_runs_map_the_archive(tmp_path):
    first = class_archive.plan(tmp_path / "classes")
    assert first.training
    options = first.java_options()
    # Written beside the archive under a name no other run maps, moved when complete.
    assert f"-XX:ArchiveClassesAtExit={first.partial}" in options
    assert first.partial.parent == first.path.parent and first.partial != first.path
    assert "SharedArchiveFile" not in options

    first.path.write_bytes(b"archive")
    later = class_archive.plan(tmp_path / "classes")
    assert later.path == first.path and not later.training
    assert f"-XX:SharedArchiveFile={later.path}" in later.java_options()
    assert "ArchiveClassesAtExit" not in later.java_options()


def test_jvm_warnings_go_to_stderr_not_the_summary_on_stdout(tmp_path):
    for plan in (
        class_archive.ArchivePlan(tmp_path / "a.jsa", training=True),
        class_archive.ArchivePlan(tmp_path / "a.jsa", training=False),
    ):
        assert "-Xlog:disable -Xlog:all=warning:stderr" in plan.java_options()


def test_archive_is_keyed_by_the_java_binary(tmp_path, monkeypatch):
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    one = class_archive.archive_key()
    assert class_archive.archive_key() == one
    java.write_text("#!/bin/sh\n# another JDK build\n")
    assert class_archive.archive_key() != one
