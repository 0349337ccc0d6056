"""What a restarted engine continues from: commits no longer write the own last id to
`meta` (it is in `last_ids`, and the newest own event holds its timestamp), so a restart
after a crash finds both in the store; a clean stop still writes the key once."""

from __future__ import annotations

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import EventPayloadJson, RegisterEvent, timestamp_to_us
from eventfleet_server.engine import Engine
from eventfleet_server.storage import Storage


def event(i: int) -> RegisterEvent:
    return RegisterEvent(("restart", str(i)), None, EventPayloadJson(str(i)))


async def started(path, max_uncommitted=10) -> tuple[Storage, Engine, Tasks]:
    storage = await Storage.open(path, synchronous="NORMAL")
    tasks = Tasks("test")
    engine = Engine(storage, 1, tasks=tasks, max_uncommitted=max_uncommitted)
    await engine.start()
    engine.set_operational()
    return storage, engine, tasks


async def test_restart_after_a_crash_continues_above_the_newest_own_event(tmp_path):
    path = tmp_path / "e.sqlite"
    storage, engine, tasks = await started(path)
    created = await engine.register_wait([event(1), event(2)])
    assert await storage.get_meta("own_last") is None  # not written per commit
    # A crash: no engine.stop (nothing written at stop), the store just closes.
    await tasks.close()
    await storage.close()

    storage, engine, tasks = await started(path)
    try:
        last = created[-1]
        assert engine._last_ts_us == timestamp_to_us(last.timestamp)
        [after] = await engine.register_wait([event(3)])
        # The restart gap (max_uncommitted + 1 = 11), then the next id.
        assert after.id.session == last.id.session + 11 + 1
        assert after.id.instance == last.id.instance + 11 + 1
        assert timestamp_to_us(after.timestamp) >= timestamp_to_us(last.timestamp)
    finally:
        await engine.stop()
        await storage.close()
    storage = await Storage.open(path)
    try:
        # The clean stop wrote the own last id and timestamp once.
        assert await storage.get_meta("own_last") == [
            after.id.session,
            after.id.instance,
            timestamp_to_us(after.timestamp),
        ]
    finally:
        await storage.close()
