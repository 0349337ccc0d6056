"""Group commit: registrations that arrive in the same loop iteration, or while a
commit is in flight, share one transaction; each one's `done` (what sends an Eventer
`MsgRegisterRes`) runs only after that transaction committed, and a failed commit
fails every registration of its group and stores none of them, while everything
acknowledged before stays."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading

import pytest
from eventfleet_server.common.aiotasks import Tasks
from eventfleet_server.common.model import EventPayloadJson, RegisterEvent
from eventfleet_server.engine import Engine, EngineError
from eventfleet_server.storage import Storage


def event(name: str, payload: str = "1") -> RegisterEvent:
    return RegisterEvent(("gc", name), None, EventPayloadJson(payload))


def stored_names(path) -> set[str]:
    """The ``gc`` events in the store as another process sees it (committed only)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT t.type FROM events JOIN types t USING (type_id)")
        return {json.loads(text)[1] for (text,) in rows}


@contextlib.asynccontextmanager
async def running(path, **storage_kwargs):
    tasks = Tasks("test", lambda reason: None)
    storage = await Storage.open(path, **storage_kwargs)
    engine = Engine(storage, 1, tasks=tasks)
    await engine.start()
    engine.set_operational()
    try:
        yield engine, storage
    finally:
        await engine.stop()
        await tasks.close()
        await storage.close()


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_registrations_of_one_iteration_share_a_commit_and_reply_after_it(
    tmp_path, synchronous
):
    path = tmp_path / "e.sqlite"
    async with running(path, synchronous=synchronous) as (engine, _):
        commits: list[int] = []
        engine.add_commit_listener(lambda count, seconds: commits.append(count))
        seen_at_done: dict[str, set[str]] = {}
        futures = []
        for name in ("a", "b", "c", "d"):
            # As four connections' requests handled in one iteration: nothing awaited.
            _, fut = engine.register(
                [event(name)],
                done=lambda ok, name=name: seen_at_done.setdefault(
                    name, stored_names(path) if ok else set()
                ),
            )
            futures.append(fut)
        await asyncio.gather(*futures)
    assert commits == [4]
    # Each reply was sent with every event of the group already durable.
    assert seen_at_done == {name: {"a", "b", "c", "d"} for name in "abcd"}


async def test_registrations_during_a_commit_share_the_next_one(tmp_path):
    """FULL: the writer thread commits (fsync) while the loop takes more requests;
    those go into the next commit together, each answered after it."""
    path = tmp_path / "e.sqlite"
    async with running(path, synchronous="FULL") as (engine, storage):
        commits: list[int] = []
        engine.add_commit_listener(lambda count, seconds: commits.append(count))
        inside, release = threading.Event(), threading.Event()
        write = storage._write

        def held_write(*args):
            # The first commit waits on the writer thread until the others registered.
            if not inside.is_set():
                inside.set()
                release.wait(10)
            return write(*args)

        storage._write = held_write
        done: list[tuple[str, bool, set[str]]] = []

        def on_done(name):
            return lambda ok: done.append((name, ok, stored_names(path)))

        _, first = engine.register([event("first")], done=on_done("first"))
        assert await asyncio.to_thread(inside.wait, 10)
        later = [engine.register([event(n)], done=on_done(n))[1] for n in ("x", "y", "z")]
        assert done == []  # nothing answered while its commit has not happened
        release.set()
        await asyncio.gather(first, *later)
    assert commits == [1, 3]
    assert done[0] == ("first", True, {"first"})
    assert [(n, ok) for n, ok, _ in done[1:]] == [("x", True), ("y", True), ("z", True)]
    assert all(names == {"first", "x", "y", "z"} for _, _, names in done[1:])


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_a_failed_group_commit_fails_every_request_and_keeps_the_acknowledged(
    tmp_path, synchronous
):
    path = tmp_path / "e.sqlite"
    big = '"' + "x" * 60_000 + '"'
    async with running(path, synchronous=synchronous, max_db_bytes=256 * 1024) as (engine, _):
        acknowledged = await engine.register_wait([event("kept")])
        outcomes: dict[str, bool] = {}
        futures = [
            engine.register(
                [event(name, big)], done=lambda ok, name=name: outcomes.setdefault(name, ok)
            )[1]
            for name in ("p", "q", "r", "s", "t")
        ]
        results = await asyncio.gather(*futures, return_exceptions=True)
        # One group, one failed commit: every request of it fails, naming the cause.
        assert outcomes == dict.fromkeys("pqrst", False)
        for result in results:
            assert isinstance(result, EngineError)
            assert "commit failed" in str(result) and "size cap" in str(result), result
        assert "storage failing" in (engine.health() or "")
    assert [e.id.instance for e in acknowledged] == [1]
    # Nothing of the failed group is stored, the acknowledged event is.
    assert stored_names(path) == {"kept"}


async def test_text_no_utf8_can_carry_is_refused_whole_and_gives_its_ids_back(tmp_path):
    """A lone surrogate (what a JSON "\\ud800" escape decodes to, e.g. in a Replication
    row made into a payload here) cannot be encoded for storage: the request is refused
    with a RegisterError naming it, nothing of it is stored, and the next registration
    gets the ids it would have got (no gap in the server's instance ids)."""
    path = tmp_path / "e.sqlite"
    async with running(path) as (engine, _):
        (first,), fut = engine.register([event("before")])
        await fut
        with pytest.raises(EngineError, match=r"not valid Unicode.*\\ud800"):
            engine.register([event("fine"), event("bad", '{"\ud800":1}')], validated=True)
        (after,), fut = engine.register([event("after")])
        await fut
    assert stored_names(path) == {"before", "after"}
    assert after.id.instance == first.id.instance + 1
    assert after.id.session == first.id.session + 1
