"""POST /backup and the start-up restore against a real S3 server (moto in server mode,
tests/s3server.py) and real replicas in this process."""

from __future__ import annotations

import asyncio
import hashlib
import pathlib
import sqlite3

import aiohttp
import pytest
from eventfleet_server import config
from eventfleet_server.backup import BackupError
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import EventPayloadBinary, EventPayloadJson, RegisterEvent
from eventfleet_server.main import Replica, run
from eventfleet_server.storage.snapshot import events_digest

from tests.conftest import running_replica
from tests.s3server import ACCESS_KEY, SECRET_KEY, running_s3

TOKEN = "backup-test-token"


@pytest.fixture(scope="module")
def s3():
    with running_s3() as server:
        yield server


@pytest.fixture
def creds(tmp_path) -> dict:
    key_file, secret_file = tmp_path / "access-key", tmp_path / "secret-key"
    key_file.write_text(ACCESS_KEY + "\n")
    secret_file.write_text(SECRET_KEY + "\n")
    return {"access_key_id_file": str(key_file), "secret_access_key_file": str(secret_file)}


def location(s3, creds, **extra) -> dict:
    return {"endpoint_url": s3.endpoint_url, "bucket": s3.bucket, **creds, **extra}


def digest_of(db_path: pathlib.Path) -> str:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return events_digest(conn)
    finally:
        conn.close()


async def register_some(replica: Replica, n: int = 50) -> None:
    client = await connect("127.0.0.1", replica.eventer.port, "test/backup", client_token=TOKEN)
    try:
        events = [
            RegisterEvent(("backup", "json", str(i)), None, EventPayloadJson(f'{{"i": {i}}}'))
            for i in range(n)
        ] + [RegisterEvent(("backup", "bin"), None, EventPayloadBinary("t", b"\x00\xff" * 8))]
        assert await client.register(events, with_response=True)
    finally:
        await client.close()


async def post_backup(replica: Replica, query: str = "", token: str | None = TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"http://127.0.0.1:{replica.http.port}/backup{query}"
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(url, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


async def test_backup_then_restore_gives_identical_events(tmp_path, s3, creds):
    target = location(s3, creds, prefix="fleet-a")
    async with running_replica(tmp_path / "a", token=TOKEN, backup={"target": target}) as source:
        await register_some(source)
        status, body = await post_backup(source, token=None)
        assert status == 401, body
        status, body = await post_backup(source, "?name=nightly")
        assert status == 200, body
        assert body["backed_up"] is True and body["key"] == "fleet-a/nightly.sqlite"
        assert body["events"] == 51
        assert body["last_ids"]["1"]["instance"] >= 51
        source_digest = digest_of(source.storage.path)
        assert body["events_sha256"] == source_digest

    head = s3.client().head_object(Bucket=s3.bucket, Key="fleet-a/nightly.sqlite")
    assert head["Metadata"]["sha256"] == body["sha256"]
    assert head["Metadata"]["events"] == "51"
    assert head["ContentLength"] == body["size"]

    # A new replica, empty data directory, same server id: starts from the copy.
    restore_from = location(s3, creds, key=body["key"])
    async with running_replica(
        tmp_path / "b", token=TOKEN, backup={"restore_from": restore_from}
    ) as restored:
        assert digest_of(restored.storage.path) == source_digest
        assert restored.storage.last_ids[1].instance == body["last_ids"]["1"]["instance"]
        # Identity: its new events continue above the restored ones.
        await register_some(restored, 1)
        assert restored.storage.last_ids[1].instance > body["last_ids"]["1"]["instance"]

    # A restart does not restore again: the store is there (the new events stay).
    async with running_replica(
        tmp_path / "b", token=TOKEN, backup={"restore_from": restore_from}
    ) as again:
        assert again.storage.last_ids[1].instance > body["last_ids"]["1"]["instance"]


async def test_backup_is_refused_while_a_peer_is_not_synced(tmp_path, s3, creds):
    peers = [{"name": "gone", "host": "127.0.0.1", "port": 1, "server_id": 2}]
    async with running_replica(
        tmp_path / "a",
        token=TOKEN,
        peers=peers,
        syncer={"bootstrap_timeout": 0.5},
        backup={"target": location(s3, creds, prefix="unsynced")},
    ) as replica:
        status, body = await post_backup(replica)
        assert status == 409 and "gone" in body["error"], body
        assert s3.keys("unsynced/") == []
        status, body = await post_backup(replica, "?allow_unsynced=true&name=forced")
        assert status == 200, body
        assert s3.keys("unsynced/") == ["unsynced/forced.sqlite"]
        status, body = await post_backup(replica, "?name=../escape")
        assert status == 400, body
        # Pruning: DELETE removes the object of that name, admin only.
        url = f"http://127.0.0.1:{replica.http.port}/backup?name=forced"
        async with aiohttp.ClientSession() as session:
            async with session.delete(url) as resp:
                assert resp.status == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with session.delete(url, headers=auth) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["key"] == "unsynced/forced.sqlite"
        assert s3.keys("unsynced/") == []


async def test_backup_without_a_target_is_501(tmp_path):
    async with running_replica(tmp_path / "a", token=TOKEN) as replica:
        status, body = await post_backup(replica)
        assert status == 501 and "backup.target" in body["error"], body


def _conf(data_dir: pathlib.Path, restore_from: dict) -> dict:
    return config.load(
        None,
        environ={},
        overrides={
            "server_id": 1,
            "data_dir": str(data_dir),
            "eventer": {"port": 0},
            "syncer": {"port": 0},
            "http": {"port": 0},
            "bus": {"enabled": False},
            "backup": {"restore_from": restore_from},
        },
    )


async def test_restore_refuses_a_missing_object_and_exits_non_zero(tmp_path, s3, creds, caplog):
    data_dir = tmp_path / "r"
    code = await run(_conf(data_dir, location(s3, creds, key="no/such.sqlite")), TOKEN)
    assert code == 1
    assert any("no/such.sqlite" in r.getMessage() for r in caplog.records)
    assert not (data_dir / "events.sqlite").exists()
    assert [p.name for p in data_dir.iterdir()] == []


@pytest.mark.parametrize("problem", ["not-a-database", "digest-mismatch"])
async def test_restore_refuses_a_bad_object_and_writes_nothing(tmp_path, s3, creds, problem):
    body = b"this is not an sqlite file" * 100
    digest = hashlib.sha256(body).hexdigest()
    metadata = {"sha256": digest if problem == "not-a-database" else "0" * 64}
    key = f"bad/{problem}.sqlite"
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=body, Metadata=metadata)
    data_dir = tmp_path / "r"
    replica = Replica(_conf(data_dir, location(s3, creds, key=key)), TOKEN)
    try:
        with pytest.raises(BackupError) as err:
            await asyncio.wait_for(replica.start(), 30)
    finally:
        await replica.stop()
    assert key in str(err.value)
    assert ("SHA-256" in str(err.value)) == (problem == "digest-mismatch")
    assert list(data_dir.iterdir()) == []


async def test_restore_is_ignored_once_the_fleet_may_not_start_empty(tmp_path, s3, creds, caplog):
    """Identity safety: a replica of an initialized fleet (allow_empty_start false) that
    lost its volume re-syncs from its peers; it never starts behind its own history from
    an old copy."""
    async with running_replica(
        tmp_path / "old", server_id=2, token=TOKEN, backup={"target": location(s3, creds)}
    ) as old:
        await register_some(old, 5)
        status, body = await post_backup(old, "?name=old-server2")
        assert status == 200, body
    async with running_replica(tmp_path / "r1", server_id=1, token=TOKEN) as r1:
        peer = {
            "name": "r1",
            "host": "127.0.0.1",
            "port": r1.syncer.describe()["port"],
            "server_id": 1,
        }
        async with running_replica(
            tmp_path / "r2",
            server_id=2,
            token=TOKEN,
            allow_empty_start=False,
            peers=[peer],
            backup={"restore_from": location(s3, creds, key=body["key"])},
        ) as r2:
            assert r2.storage.last_ids.get(2) is None  # nothing of the copy
    assert any("backup.restore_from ignored" in r.getMessage() for r in caplog.records)
