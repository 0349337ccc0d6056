"""Engine callbacks are guarded: one that raises is logged with its name and counted, and
the writer keeps committing (a broken metrics hook must never stop the replica's writes)."""

from __future__ import annotations

import logging

from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import (
    EventPayloadJson,
    QueryLatestParams,
    RegisterEvent,
    Status,
)
from eventfleet_server.engine import Engine
from eventfleet_server.storage import Storage


def event(i: int) -> RegisterEvent:
    return RegisterEvent(("cb", str(i)), None, EventPayloadJson(str(i)))


async def test_failing_callbacks_do_not_stop_commits(tmp_path, caplog):
    fatal: list[str] = []
    tasks = Tasks("test", fatal.append)
    storage = await Storage.open(tmp_path / "e.sqlite")
    engine = Engine(storage, 1, tasks=tasks)
    seen: list[int] = []

    def broken_commit_hook(count: int, seconds: float) -> None:
        raise RuntimeError("metrics hook bug")

    def broken_query_hook(params, seconds: float) -> None:
        raise RuntimeError("metrics hook bug")

    def broken_status_hook(status: Status) -> None:
        raise RuntimeError("status hook bug")

    engine.add_commit_listener(broken_commit_hook)
    engine.add_commit_listener(lambda count, seconds: seen.append(count))  # still called
    engine.add_query_listener(broken_query_hook)
    engine.add_status_listener(broken_status_hook)
    try:
        with caplog.at_level(logging.ERROR, logger="eventfleet_server.engine.engine"):
            await engine.start()
            engine.set_operational()
            first = await engine.register_wait([event(1)])
            second = await engine.register_wait([event(2), event(3)])
            result = await engine.query(QueryLatestParams(event_types=[("cb", "*")]))

        assert [e.id.instance for e in first + second] == [1, 2, 3]
        assert sorted(e.payload.data for e in result.events) == ["1", "2", "3"]
        assert sum(seen) == 3  # the listener after the broken one ran on every commit
        assert engine.callback_failures["commit"] == 2
        assert engine.callback_failures["query"] == 1
        assert engine.callback_failures["status"] >= 1
        assert fatal == []  # the writer task is alive: nothing reported as fatal
        assert engine.status == Status.OPERATIONAL
        named = [r.getMessage() for r in caplog.records]
        assert any("commit callback" in m and "broken_commit_hook" in m for m in named), named
        assert any("query callback" in m and "broken_query_hook" in m for m in named), named
    finally:
        await engine.stop()
        await tasks.close()
        await storage.close()
