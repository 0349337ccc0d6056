"""SlicedFanout: committed sessions reach `deliver` in order; a large one in slices with
the loop free between them; a small one behind a large one waits its turn."""

from __future__ import annotations

import asyncio

from eventfleet_server.engine.fanout import SlicedFanout


async def test_order_slices_and_yields():
    delivered: list[tuple[list[int], str]] = []
    tasks: list[asyncio.Task] = []

    def spawn(name, coro):
        task = asyncio.get_running_loop().create_task(coro, name=name)
        tasks.append(task)
        return task

    fan = SlicedFanout(lambda ev, sbs, tag: delivered.append((ev, tag)), 3, spawn)
    fan.push([1, 2], [b"1", b"2"], "a")  # small, nothing queued: at once
    assert delivered == [([1, 2], "a")] and tasks == []
    fan.push(list(range(10, 17)), [b""] * 7, "b")  # large: queued, a task slices it
    fan.push([20], [b""], "c")  # small but behind a large one: waits its turn
    assert delivered == [([1, 2], "a")] and len(tasks) == 1
    seen_between: list[int] = []

    async def observer():  # runs between slices: the loop is not held
        for _ in range(3):
            seen_between.append(len(delivered))
            await asyncio.sleep(0)

    await asyncio.gather(tasks[0], observer())
    assert delivered == [
        ([1, 2], "a"),
        ([10, 11, 12], "b"),
        ([13, 14, 15], "b"),
        ([16], "b"),
        ([20], "c"),
    ]
    assert any(1 < n < 5 for n in seen_between)
    # Drained: the next small session goes out at once again, with no new task.
    fan.push([30], [b""], "d")
    assert delivered[-1] == ([30], "d") and len(tasks) == 1


async def test_a_refused_spawn_leaves_the_fanout_usable():
    calls = []

    def refuse(name, coro):
        coro.close()
        raise RuntimeError("stopping")

    fan = SlicedFanout(lambda ev, sbs: calls.append(ev), 1, refuse)
    try:
        fan.push([1, 2], [b"", b""])
    except RuntimeError:
        pass
    else:
        raise AssertionError("spawn refusal not raised")
    assert calls == []
