"""The cached exposition: rendered at most once per poll, and the same series as prometheus_client's."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpu_exporter.serving.exposition import Exposition, render_text


class CountingCollector(Collector):
    def __init__(self) -> None:
        self.collects = 0

    def collect(self) -> Iterator[Metric]:
        self.collects += 1
        fam = GaugeMetricFamily("gpu_up", "help", labels=["gpu"])
        fam.add_metric(["0"], 1)
        yield fam


def test_rendered_at_most_once_per_poll_whatever_the_scrape_rate() -> None:
    registry = CollectorRegistry()
    counter = CountingCollector()
    registry.register(counter)
    expo = Exposition(registry)
    base = counter.collects  # registering may collect once to learn the names
    expo.invalidate()  # a poll
    for _ in range(100):  # many scrapes, plain and gzip
        assert b"gpu_up" in expo.body()
        assert b"gpu_up" in gzip.decompress(expo.body(gzipped=True))
    assert counter.collects == base + 1
    for _ in range(5):  # polls nobody scrapes cost nothing
        expo.invalidate()
    assert counter.collects == base + 1
    expo.body()
    assert counter.collects == base + 2


def test_render_text_matches_prometheus_client() -> None:
    registry = CollectorRegistry()
    g = Gauge("a_ratio", 'odd "help" \\ with\nnewline', ["l"], registry=registry)
    g.labels('quote " backslash \\ newline \n').set(0.25)
    g.labels("inf").set(float("inf"))
    g.labels("big").set(1.7960190143812425e9)
    Counter("events", "c", registry=registry).inc(3)
    Histogram("poll_seconds", "h", registry=registry, buckets=(0.1, 1)).observe(0.5)

    def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip

    ours, theirs = render_text(registry).decode(), generate_latest(registry).decode()
    assert parsed(ours) == parsed(theirs)
    assert [line for line in ours.splitlines() if line.startswith("#")] == [
        line for line in theirs.splitlines() if line.startswith("#")
    ]
