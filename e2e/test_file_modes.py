"""File modes of what real processes write: the store (``events.sqlite``, ``-wal``,
``-shm``), the fleet's configs, tokens and logs, and a restored store are their user's
only (files 0600, directories 0700), whatever the umask of whoever started them
(here the test's 022): the replica and the fleet set umask 077 at start, as PostgreSQL
does. A store an older version left 0644 is tightened at start (docs/security.md).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat

import aiohttp
import pytest
from eventfleet_server.client.eventer import connect
from eventfleet_server.common.model import RegisterEvent

from e2e.fleet_helpers import FleetProc, ReplicaProc, free_block
from tests.s3server import ACCESS_KEY, SECRET_KEY, running_s3

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STORE = ("events.sqlite", "events.sqlite-wal", "events.sqlite-shm")


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: pathlib.Path) -> dict[str, str]:
    """Relative path -> octal permission bits of every file and directory under root."""
    out = {}
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            out[str(path.relative_to(root))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return out


def eventer_of(line: dict) -> tuple[str, int]:
    host, port = line["eventer"].rsplit(":", 1)
    return host, int(port)


def loose(found: dict[str, str]) -> dict[str, str]:
    return {p: m for p, m in found.items() if int(m, 8) & 0o077}


async def register(eventer: tuple[str, int], token: str | None, n: int = 5) -> None:
    client = await connect(*eventer, "modes", client_token=token)
    try:
        events = [RegisterEvent(("modes", str(i)), None, None) for i in range(n)]
        assert await client.register(events, with_response=True)
    finally:
        await client.close()


async def test_replica_store_files_are_private_and_old_ones_are_tightened(tmp_path):
    with umask(0o022):
        replica = ReplicaProc(tmp_path, "r1", 1, free_block(1)).start()
        try:
            await replica.wait_ready()
            await register(replica.eventer, None)
            found = modes(replica.data_dir)
            assert set(STORE) <= set(found), found
            assert loose(found) == {}, found
            assert found["."] == "0o700"
            assert {found[f] for f in STORE} == {"0o600"}
        finally:
            replica.stop()
        # A store an older version created world-readable: tightened at the next start.
        for name in STORE:
            path = replica.data_dir / name
            if path.exists():
                path.chmod(0o644)
        replica.start()
        try:
            await replica.wait_ready()
            found = modes(replica.data_dir)
            assert loose(found) == {}, found
            assert "made" in replica.log() and "private (600)" in replica.log()
        finally:
            replica.stop()


async def test_fleet_configs_tokens_logs_and_store_are_private(tmp_path):
    data = tmp_path / "fleet"
    with umask(0o022):
        fleet = FleetProc(data, 1, base_port=free_block(1)).start()
        try:
            lines = await fleet.wait_up()
            await register(eventer_of(lines["replica-1"]), None)
            found = modes(data)
        finally:
            fleet.stop()
    files = {p for p in found if (data / p).is_file()}
    assert any(p.endswith(".yaml") for p in files), found  # configs
    assert any(p.endswith(".log") for p in files), found  # logs
    assert any(p.endswith("events.sqlite") for p in files), found
    assert loose(found) == {}, found


async def test_restored_store_is_private(tmp_path):
    key_file, secret_file = tmp_path / "access-key", tmp_path / "secret-key"
    key_file.write_text(ACCESS_KEY + "\n")
    secret_file.write_text(SECRET_KEY + "\n")
    token_file = tmp_path / "token"
    token_file.write_text("modes-token\n")
    creds = {"access_key_id_file": str(key_file), "secret_access_key_file": str(secret_file)}
    with running_s3() as s3, umask(0o022):
        where = {"endpoint_url": s3.endpoint_url, "bucket": s3.bucket, **creds}
        source = ReplicaProc(
            tmp_path,
            "a",
            1,
            free_block(1),
            token_file=token_file,
            extra={"backup": {"target": where}},
        ).start()
        try:
            await source.wait_ready()
            await register(source.eventer, "modes-token")
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    source.http + "/backup?name=modes",
                    headers={"Authorization": "Bearer modes-token"},
                ) as resp,
            ):
                body = await resp.json()
                assert resp.status == 200, body
            assert loose(modes(source.data_dir)) == {}
        finally:
            source.stop()
        restored = ReplicaProc(
            tmp_path,
            "b",
            1,
            free_block(1),
            token_file=token_file,
            extra={"backup": {"restore_from": {**where, "key": body["key"]}}},
        ).start()
        try:
            await restored.wait_ready()
            assert "restored" in restored.log()
            found = modes(restored.data_dir)
            assert found.get("events.sqlite") == "0o600", found
            assert loose(found) == {}, found
        finally:
            restored.stop()
