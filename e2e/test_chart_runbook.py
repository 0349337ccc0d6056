"""The runbook's backup and restore procedure, on real replicas.

docs/runbook.md tells operators to back up a live replica with SQLite's `VACUUM INTO`
and to restore a lost fleet by putting that file in place of the first replica's
`events.sqlite`. This runs exactly that against real replicas (in this process, on
127.0.0.1): the copy is taken while the replica serves, and a replica started on it
holds every event and continues its server id above the restored ids, never reusing one.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3

from eventfleet_server.client import eventer as client
from eventfleet_server.common.model import EventPayloadJson, QueryServerParams, RegisterEvent

from tests.conftest import running_replica
from tests.unit.chart.chartlib import REPO

RUNBOOK = REPO / "docs" / "runbook.md"
BACKUP_SQL = "VACUUM INTO '/var/lib/eventfleet/backup.sqlite'"


def test_runbook_uses_the_statement_tested_here():
    assert BACKUP_SQL in RUNBOOK.read_text()
    assert "/var/lib/eventfleet/events.sqlite" in RUNBOOK.read_text()


async def _register(port: int, values: list[int]):
    conn = await client.connect("127.0.0.1", port, "runbook-test")
    try:
        events = [RegisterEvent(("runbook", "x"), None, EventPayloadJson(str(v))) for v in values]
        return await conn.register(events, with_response=True)
    finally:
        await conn.close()


async def _own_events(port: int, server_id: int):
    conn = await client.connect("127.0.0.1", port, "runbook-test")
    try:
        result = await conn.query(QueryServerParams(server_id, persisted=True))
        return result.events
    finally:
        await conn.close()


async def test_backup_of_a_live_replica_restores_a_replica_that_continues_its_ids(tmp_path):
    backup = tmp_path / "backup.sqlite"
    async with running_replica(tmp_path / "r1", server_id=1) as replica:
        created = await _register(replica.eventer.port, [1, 2, 3])
        assert created and len(created) == 3
        # The runbook's statement, with the paths of this test, while the replica runs.
        live = tmp_path / "r1" / "events.sqlite"
        statement = BACKUP_SQL.replace("/var/lib/eventfleet/backup.sqlite", str(backup))

        def vacuum_into() -> None:
            with sqlite3.connect(live) as conn:
                conn.execute(statement)

        await asyncio.to_thread(vacuum_into)
        # The replica keeps serving; what it registers now is after the backup.
        await _register(replica.eventer.port, [4])

    restored = tmp_path / "r1-restored"
    restored.mkdir()
    shutil.copy(backup, restored / "events.sqlite")
    async with running_replica(restored, server_id=1) as replica:
        events = await _own_events(replica.eventer.port, 1)
        assert [e.id for e in events] == [e.id for e in created]
        (new,) = await _register(replica.eventer.port, [5])
        newest = max(e.id for e in created)
        assert (new.id.session, new.id.instance) > (newest.session, newest.instance)
