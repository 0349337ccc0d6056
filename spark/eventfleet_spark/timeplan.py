"""Time arithmetic of the job: buckets, windows and read slices, in integer microseconds.

Everything here is pure (no Spark, no I/O) so the rules can be tested on their own.

Buckets are aligned to the Unix epoch: the bucket of a timestamp ``t`` starts at
``t - t mod bucket``. A *range* ``[start, end)`` is what one invocation covers; it is
cut into *windows* of ``window`` microseconds, processed one after another (each gets its
own summary line, Parquet merge and write-back). A window is read in *slices*, one Spark
partition each; slice boundaries are bucket boundaries so that every (type, bucket)
aggregate is computed inside one partition, in query order (see `aggregation`).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

US = 1_000_000


class Span(NamedTuple):
    """A half-open interval ``[start, end)`` of microseconds since the epoch."""

    start: int
    end: int


def floor_to(t_us: int, step_us: int) -> int:
    return t_us - t_us % step_us


def ceil_to(t_us: int, step_us: int) -> int:
    return -floor_to(-t_us, step_us)


def default_range(now_us: int, bucket_us: int, window_us: int) -> Span:
    """The last complete window before `now_us`: it ends at the last bucket boundary.

    Ending at a bucket boundary (not a window boundary) means a job scheduled more
    often than its window re-aggregates the recent buckets on every run, which is how
    late events (synced from a peer after a run) get counted: every bucket stays *open*
    for ``window - schedule period``.
    """
    end = floor_to(now_us, bucket_us)
    return Span(end - ceil_to(window_us, bucket_us), end)


def aligned_range(start_us: int, end_us: int, bucket_us: int) -> Span:
    """`[start, end)` widened to whole buckets (a partial bucket would be overwritten
    with a partial count)."""
    if end_us <= start_us:
        raise ValueError(f"end {end_us} us is not after start {start_us} us")
    return Span(floor_to(start_us, bucket_us), ceil_to(end_us, bucket_us))


def windows(span: Span, window_us: int, bucket_us: int) -> list[Span]:
    """Cut `span` (bucket-aligned) into windows of whole buckets, the last one shorter."""
    step = ceil_to(window_us, bucket_us)
    out = []
    t = span.start
    while t < span.end:
        out.append(Span(t, min(t + step, span.end)))
        t += step
    return out


def slices(span: Span, count: int, align_us: int = 1) -> list[Span]:
    """Split `span` into at most `count` contiguous slices with `align_us`-aligned inner
    boundaries, sizes as equal as the alignment allows (never an empty slice)."""
    if count < 1:
        raise ValueError(f"slice count {count!r} must be >= 1")
    if align_us < 1:
        raise ValueError(f"slice alignment {align_us!r} us must be >= 1")
    first = ceil_to(span.start, align_us)
    units = max(0, (span.end - first) // align_us)  # whole aligned units inside the span
    count = max(1, min(count, units))
    bounds = [span.start]
    for i in range(1, count):
        b = first + (units * i // count) * align_us
        if bounds[-1] < b < span.end:
            bounds.append(b)
    bounds.append(span.end)
    return [Span(a, b) for a, b in itertools.pairwise(bounds)]
