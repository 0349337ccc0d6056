"""The leak check the C extensions' tests share: run a workload many times and assert
that neither memory nor the reference counts of given objects grew."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable, Sequence


def assert_no_leak(
    run: Callable[[int], None], watched: Sequence[object], what: str, times: int = 500
) -> None:
    """`run(n)` does the workload n times. After a warm-up (every cache of the
    interpreter filled), `times` more may leave less than 10,000 bytes behind once
    collected, and must leave the reference count of each of `watched` (classes the
    results are made of, strings the code keeps) as it was."""
    run(50)
    gc.collect()  # earlier tests' garbage holds references too
    counts = [sys.getrefcount(obj) for obj in watched]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(times)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 10_000, f"{grown} bytes more after {times} rounds of {what}"
    assert [sys.getrefcount(obj) for obj in watched] == counts
