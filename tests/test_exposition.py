"""The cached exposition: rendered at most once per poll, and the same series as prometheus_client's."""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics_core import METRIC_TYPES
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpu_exporter.serving.exposition import Exposition, render_text
from tests.hypothesis_budget import examples


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


# -- any value a label or sample can hold -------------------------------------------------------------
class Samples(Collector):
    """Whatever samples a test hands it, as prometheus_client's own collectors would yield them."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def parsed_samples(body: bytes) -> list[tuple[str, dict[str, str], float, float | None]]:
    return [(s.name, s.labels, s.value, None if s.timestamp is None else float(s.timestamp))
            for f in text_string_to_metric_families(body.decode()) for s in f.samples]  # fmt: skip


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


# Label values as they come from processes, pods and NVML: anything, with the characters the format
# escapes made likely (a value of nothing but one of them included).
ESCAPED = st.sampled_from(['"', "\\", "\n"])
SPECIAL = st.sampled_from(["a", " ", "é", "{", "}", "=", ",", "n"])
LABEL_VALUES = st.one_of(st.text(), st.text(st.one_of(ESCAPED, SPECIAL)), st.lists(ESCAPED, min_size=1).map("".join))
EDGES = [0.0, -0.0, 1e15, -1e15, 1e15 - 1, 1e15 + 2, 0.1, 1.7960190143812425e9]
VALUES = st.one_of(st.floats(), st.integers(-(2**63), 2**63 - 1).map(float), st.sampled_from(EDGES))


@settings(max_examples=examples(300), deadline=None)
@given(labels=st.lists(LABEL_VALUES, min_size=1, max_size=3), value=VALUES)
def test_any_label_value_and_any_sample_value_reads_back_as_written(labels: list[str], value: float) -> None:
    fam = GaugeMetricFamily("gpu_x", "help", labels=[f"l{i}" for i in range(len(labels))])
    fam.add_metric(labels, value)
    registry = CollectorRegistry()
    registry.register(Samples(fam))
    ((name, got_labels, got, ts),) = parsed_samples(render_text(registry))
    assert (name, got_labels, ts) == ("gpu_x", {f"l{i}": v for i, v in enumerate(labels)}, None)
    assert same(got, value)
    assert got_labels == parsed_samples(generate_latest(registry))[0][1]


@settings(deadline=None)
@example(value=float("-inf"), timestamp=67108864.336)  # 67108864.336 * 1000 is 67108864335.99999: truncated, .335
@given(value=st.sampled_from([float("-inf"), float("inf"), float("nan"), -1.5, -3.0]),
       timestamp=st.one_of(st.none(), st.floats(0, 4e9).map(lambda t: round(t, 3))))  # fmt: skip
def test_negative_infinite_and_timestamped_samples_keep_their_name_value_and_time(
    value: float, timestamp: float | None
) -> None:
    fam = GaugeMetricFamily("gpu_y", "help", labels=["gpu"])
    fam.add_metric(["0"], value, timestamp=timestamp)
    bare = GaugeMetricFamily("gpu_z", "help")
    bare.add_metric([], value, timestamp=timestamp)
    registry = CollectorRegistry()
    registry.register(Samples(fam, bare))
    got = parsed_samples(render_text(registry))
    assert [(n, lab) for n, lab, _, _ in got] == [("gpu_y", {"gpu": "0"}), ("gpu_z", {})]
    for _, _, v, ts in got:
        assert same(v, value)
        assert ts == (None if timestamp is None else pytest.approx(timestamp, abs=1e-3))


def test_integers_are_written_without_a_fraction_and_large_values_exactly() -> None:
    fam = GaugeMetricFamily("gpu_bytes", "help", labels=["k"])
    for k, v in (("int", 3), ("whole", 81559.0 * 2**20), ("big", 2.0**60), ("neg", -7.0), ("frac", 0.25)):
        fam.add_metric([k], v)
    registry = CollectorRegistry()
    registry.register(Samples(fam))
    lines = dict(line.rsplit(" ", 1) for line in render_text(registry).decode().splitlines() if line[0] != "#")
    assert lines == {'gpu_bytes{k="int"}': "3", 'gpu_bytes{k="whole"}': "85520809984", 'gpu_bytes{k="big"}':
                     "1.152921504606847e+18", 'gpu_bytes{k="neg"}': "-7", 'gpu_bytes{k="frac"}': "0.25"}  # fmt: skip


def test_special_values_are_spelled_as_the_text_format_spells_them() -> None:
    fam = GaugeMetricFamily("gpu_s", "help", labels=["k"])
    for k, v in (("nan", math.nan), ("pos", math.inf), ("neg", -math.inf)):
        fam.add_metric([k], v)
    registry = CollectorRegistry()
    registry.register(Samples(fam))
    body = render_text(registry).decode()
    assert 'gpu_s{k="nan"} NaN\n' in body and 'gpu_s{k="pos"} +Inf\n' in body and 'gpu_s{k="neg"} -Inf\n' in body


def test_help_text_escapes_backslashes_and_newlines() -> None:
    registry = CollectorRegistry()
    Gauge("gpu_h", "a \\ b\nc", registry=registry)
    ours = render_text(registry).decode()
    assert "# HELP gpu_h a \\\\ b\\nc\n" in ours
    (family,) = text_string_to_metric_families(ours)
    assert family.documentation == "a \\ b\nc"


# -- when the page is rendered ----------------------------------------------------------------------------
def test_a_scrape_before_the_first_poll_gets_the_metrics_not_an_empty_page() -> None:
    registry = CollectorRegistry()
    Gauge("gpu_exporter_up", "up", registry=registry).set(1)
    expo = Exposition(registry)  # no poll has marked it stale or rendered it yet
    assert b"gpu_exporter_up 1\n" in expo.body()
    assert b"gpu_exporter_up 1\n" in gzip.decompress(Exposition(registry).body(gzipped=True))


def test_a_page_rendered_at_a_poll_is_served_without_collecting_again() -> None:
    registry = CollectorRegistry()
    counter = CountingCollector()
    registry.register(counter)
    expo = Exposition(registry)
    base = counter.collects
    expo.render()  # the poll renders ahead of the scrapes
    assert counter.collects == base + 1, "the poll did the rendering: the next scrape waits on nothing"
    for _ in range(3):
        assert b"gpu_up" in expo.body() and b"gpu_up" in gzip.decompress(expo.body(gzipped=True))
    assert counter.collects == base + 1


def test_a_render_after_a_poll_replaces_both_the_plain_and_the_gzipped_page() -> None:
    registry = CollectorRegistry()
    g = Gauge("gpu_v", "v", registry=registry)
    expo = Exposition(registry)
    g.set(1)
    expo.render()
    assert b"gpu_v 1\n" in expo.body() and b"gpu_v 1\n" in gzip.decompress(expo.body(gzipped=True))
    g.set(2)
    assert b"gpu_v 1\n" in expo.body()  # nothing new until the next poll renders
    expo.render()
    assert b"gpu_v 2\n" in gzip.decompress(expo.body(gzipped=True))
    assert b"gpu_v 2\n" in expo.body()
    g.set(3)
    expo.invalidate()
    assert b"gpu_v 3\n" in gzip.decompress(expo.body(gzipped=True))  # a gzip scrape first after a poll
    assert b"gpu_v 3\n" in expo.body()


SAMPLES_OF_A_TYPE: dict[
    str, list[tuple[str, dict[str, str]]]
] = {  # the samples each type has, as prometheus_client's own metrics write them
    "counter": [("_total", {})],
    "histogram": [("_bucket", {"le": "+Inf"}), ("_count", {}), ("_sum", {})],
    "gaugehistogram": [("_bucket", {"le": "+Inf"}), ("_gcount", {}), ("_gsum", {})],
    "summary": [("_count", {}), ("_sum", {})],
    "info": [("_info", {"version": "1"})],
    "stateset": [("", {"gpu_stateset": "on"})],
}


@pytest.mark.parametrize("typ", METRIC_TYPES)
def test_a_metric_of_any_type_prometheus_client_knows_is_on_the_page_with_a_type_prometheus_reads(typ: str) -> None:
    """A collector may yield any type prometheus_client accepts; none may break the page or lose its
    TYPE line (the text format has no info or stateset: they are gauges, as prometheus_client writes them)."""
    fam = Metric(f"gpu_{typ}", "help", typ)
    for suffix, labels in SAMPLES_OF_A_TYPE.get(typ, [("", {})]):
        fam.add_sample(f"gpu_{typ}{suffix}", labels, 1.0)
    registry = CollectorRegistry()
    registry.register(Samples(fam))
    ours = render_text(registry).decode()

    def samples(text: str) -> list[tuple[str, list[tuple[str, str]], float]]:
        return sorted((s.name, sorted(s.labels.items()), s.value) for f in text_string_to_metric_families(text)
                      for s in f.samples)  # fmt: skip

    def types(text: str) -> set[tuple[str, str]]:  # of the families the page gives a TYPE line
        return {(f.name, f.type) for f in text_string_to_metric_families(text) if f"# TYPE {f.name}" in text}

    theirs = generate_latest(registry).decode()
    assert samples(ours) == samples(theirs)
    assert types(ours) and types(ours) <= types(theirs)
