"""Storage faults: a damaged store stops the start with one line naming the file and
what to do; a store at its size cap (storage.max_db_bytes: SQLite's max_page_count,
the same SQLITE_FULL a full disk gives) makes the replica not ready and refuse
registrations, naming the cap. Real file-system faults (ENOSPC, EIO, read-only) and the
recovery without a restart: e2e/test_storage_faults_real.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import EventPayloadJson, RegisterEvent
from eventfleet_server.storage import CorruptStoreError, Storage

from tests.conftest import running_replica
from tests.unit.test_storage import make_events


async def damaged_store(path):
    s = await Storage.open(path)
    await s.write(make_events(2000))
    await s.close()
    data = bytearray(path.read_bytes())
    page = 4096
    # Keep the header page (a valid SQLite file), scribble over table pages.
    for offset in range(3 * page, min(len(data), 12 * page), page):
        data[offset : offset + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))


async def test_quick_check_names_the_damaged_file(tmp_path):
    path = tmp_path / "events.sqlite"
    await damaged_store(path)
    with pytest.raises(CorruptStoreError) as err:
        await Storage.open(path, quick_check_timeout=10)
    text = str(err.value)
    assert "\n" not in text and str(path) in text and "restore the replica from a peer" in text


def test_replica_with_damaged_store_exits_with_one_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    asyncio.run(damaged_store(data / "events.sqlite"))
    conf = write_ports_config(tmp_path)
    cli = [sys.executable, "-m", "eventfleet_cli", "server", "--data-dir", str(data)]
    result = subprocess.run(
        [*cli, "--eventer-port", "0", "--config", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "is damaged" in line]
    assert len(lines) == 1 and str(data / "events.sqlite") in lines[0]


def write_ports_config(tmp_path):
    conf = tmp_path / "conf.yaml"
    conf.write_text("syncer: {port: 0}\nhttp: {port: 0}\nstorage: {quick_check_timeout: 10}\n")
    return conf


async def test_store_at_its_size_cap_makes_the_replica_not_ready_naming_the_cap(tmp_path):
    async with running_replica(tmp_path / "r", storage={"max_db_bytes": 256 * 1024}) as replica:
        client = await connect("127.0.0.1", replica.eventer.port, "filler")
        http = aiohttp.ClientSession()
        readyz = f"http://127.0.0.1:{replica.http.port}/readyz"
        try:
            blob = EventPayloadJson('"' + "x" * 4000 + '"')
            stored = 0
            for _ in range(200):
                created = await client.register(
                    [RegisterEvent(("fill", str(i)), None, blob) for i in range(10)], True
                )
                if created is None:
                    break
                stored += len(created)
            else:
                pytest.fail("the store never filled up")
            assert stored > 0
            async with http.get(readyz) as res:
                body = await res.json()
            assert res.status == 503 and "storage failing" in body["reason"], body
            assert "full" in body["reason"]
            # The disk has room: the cause is the configured cap, not ENOSPC.
            assert "size cap (storage.max_db_bytes)" in body["reason"], body
            # Refused at once, clearly (counted), while the store is failing.
            assert await client.register([RegisterEvent(("later",), None, None)], True) is None
            assert replica.eventer.rejected.get("register_failed", 0) >= 1
            # Recovery without a restart once space returns: e2e/test_storage_faults_real.py
            # (a real full, grown or cleaned-up file system, and a real I/O error).
        finally:
            await http.close()
            await client.close()


def test_replica_on_a_newer_schema_store_refuses_to_start_with_one_line(tmp_path):
    """A store written by a newer eventfleet (higher PRAGMA user_version): the older
    replica exits 1 with one line naming the file and both versions, and changes
    nothing in the file."""
    import sqlite3

    from eventfleet_server.storage.schema import SCHEMA_VERSION

    data = tmp_path / "data"
    data.mkdir()
    path = data / "events.sqlite"

    async def create():
        s = await Storage.open(path)
        await s.write(make_events(10))
        await s.close()

    asyncio.run(create())
    newer = SCHEMA_VERSION + 1
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {newer}")
    conn.close()  # the last connection: the WAL is checkpointed into the file
    before = path.read_bytes()
    conf = write_ports_config(tmp_path)
    conf.write_text(conf.read_text() + "log: {format: json}\n")  # as on Kubernetes
    cli = [sys.executable, "-m", "eventfleet_cli", "server", "--data-dir", str(data)]
    result = subprocess.run(
        [*cli, "--eventer-port", "0", "--config", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "storage schema version" in line]
    assert len(lines) == 1, result.stderr[-2000:]
    assert str(path) in lines[0]
    assert f"version {newer} is newer than this replica's {SCHEMA_VERSION}" in lines[0]
    assert path.read_bytes() == before
    # On Kubernetes the log's tail is the termination message (FallbackToLogsOnError,
    # at most 2048 bytes): the operator reads the versions from it.
    from eventfleet_operator import schema

    pod = {"status": {"containerStatuses": [{"lastState": {"terminated": {
        "exitCode": 1, "message": result.stderr[-2048:]}}}]}}  # fmt: skip
    assert schema.refusal(pod) == (str(path), newer, SCHEMA_VERSION)


async def test_status_reports_the_storage_schema_version(tmp_path):
    from eventfleet_server.storage.schema import SCHEMA_VERSION

    async with running_replica(tmp_path) as replica:
        url = f"http://127.0.0.1:{replica.http.port}/status"
        async with aiohttp.ClientSession() as http, http.get(url) as res:
            doc = await res.json()
    assert doc["storage"]["schema_version"] == SCHEMA_VERSION == 5
