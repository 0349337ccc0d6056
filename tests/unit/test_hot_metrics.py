"""The register path's plain-number instruments render what prometheus-client would."""

from __future__ import annotations

from eventfleet_server.http.hot import HotCollector
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest


def test_hot_instruments_render_like_prometheus_client():
    values = [0, 0.0009, 0.001, 0.4, 0.5, 1.0, 2, 2.0000001, 5, 6, 1e9] + [
        i / 97 for i in range(700)
    ]
    bounds = (0.001, 0.5, 2, 5)

    reference = CollectorRegistry(auto_describe=False)
    histogram = Histogram("h", "doc", ["kind"], buckets=bounds, registry=reference)
    counter = Counter("c_total", "doc", ["origin"], registry=reference)
    ours = CollectorRegistry(auto_describe=False)
    hot = HotCollector()
    hot_histogram = hot.histogram("h", "doc", bounds, ["kind"], [("a",)])[("a",)]
    hot_counter = hot.counter("c", "doc", ["origin"], [("client",)])[("client",)]
    ours.register(hot)
    for v in values:
        histogram.labels(kind="a").observe(v)
        hot_histogram.observe(v)
        counter.labels(origin="client").inc(3)
        hot_counter.inc(3)

    def samples(registry):
        return sorted(
            line
            for line in generate_latest(registry).decode().splitlines()
            if not line.startswith("#") and "_created" not in line
        )

    assert samples(ours) == samples(reference)
