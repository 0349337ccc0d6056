"""Counters and histograms for the register hot path, rendered by a collector.

prometheus-client's `Counter.inc` and `Histogram.observe` take a mutex per value (and a
histogram observe walks its buckets in Python and takes two): the engine's hooks, run
twice per registration (not persisted, persisted) and once per commit, paid ~25 µs of
each batch-1 request for them. The hooks all run on the event loop's thread, so plain
integers do; `HotCollector` turns them into the same exposition (`_total`, `_bucket`
with ``le``, `_count`, `_sum`) when Prometheus scrapes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


class HotCounter:
    """A counter child: `value` is read at scrape time."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class HotHistogram:
    """A histogram child with fixed upper bounds (``le``: a value equal to a bound
    falls into that bound's bucket, as in Prometheus)."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last."""
        out, total = [], 0
        for bound, n in zip((*self._bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((floatToGoString(bound), total))
        return out


class HotCollector:
    """Renders registered hot counters and histograms (one family per name)."""

    def __init__(self) -> None:
        self._counters: list[tuple[str, str, list[str], dict[tuple[str, ...], HotCounter]]] = []
        self._histograms: list[tuple[str, str, list[str], dict[tuple[str, ...], HotHistogram]]] = []

    def counter(
        self, name: str, doc: str, labels: Sequence[str] = (), values: Sequence[tuple] = ((),)
    ) -> dict[tuple[str, ...], HotCounter]:
        """A counter family `name` (without ``_total``) with one child per label tuple."""
        children = {tuple(v): HotCounter() for v in values}
        self._counters.append((name, doc, list(labels), children))
        return children

    def histogram(
        self,
        name: str,
        doc: str,
        bounds: Sequence[float],
        labels: Sequence[str] = (),
        values: Sequence[tuple] = ((),),
    ) -> dict[tuple[str, ...], HotHistogram]:
        """A histogram family `name` with one child per label tuple."""
        children = {tuple(v): HotHistogram(bounds) for v in values}
        self._histograms.append((name, doc, list(labels), children))
        return children

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        for name, doc, labels, counters in self._counters:
            family = CounterMetricFamily(name, doc, labels=labels)
            for values, counter in counters.items():
                family.add_metric(list(values), counter.value)
            yield family
        for name, doc, labels, histograms in self._histograms:
            family = HistogramMetricFamily(name, doc, labels=labels)
            for values, histogram in histograms.items():
                family.add_metric(list(values), histogram.buckets(), histogram.sum)
            yield family
