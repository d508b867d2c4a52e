"""What ``gpu-exporter report`` asks Prometheus, judged without one: every query is PromQL that reads
only metrics gpu-exporter exports, each narrowed by the user's ``--selector``; the steps a range is
cut into hold at most 720 points, span at least three scrapes and tile the range up to its end.

(What the answers add up to is test_report_history's, against a real Prometheus.)"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import promql_parser as pp
import pytest

from gpu_exporter.report.queries import (
    MAX_POINTS,
    STEPS,
    SelectorError,
    exact_cost,
    probe,
    queries,
    scrape_interval,
    selector_matchers,
    window_for,
)
from gpu_exporter.serving.metrics import METRICS

END = 1_796_000_400.0  # a whole hour
DAY = 86400.0


def selectors(e: Any) -> Iterator[pp.VectorSelector]:
    """Every metric selector in a parsed query, however deep (subqueries, ranges, binary operations)."""
    if isinstance(e, pp.VectorSelector):
        yield e
    for attr in ("lhs", "rhs", "expr", "vector_selector"):
        if (child := getattr(e, attr, None)) is not None:
            yield from selectors(child)
    for child in getattr(e, "args", None) or ():
        yield from selectors(child)


def matchers_of(v: pp.VectorSelector) -> set[tuple[str, str, str]]:
    return {(m.name, str(m.op).rsplit(".", 1)[-1], m.value) for m in v.matchers.matchers}


def every_query(matchers: str) -> list[str]:
    w = window_for(END - 7 * DAY, END, 15)
    return [*(q.expr for q in queries(w, matchers)), exact_cost(w, matchers, ["GPU-1", "GPU-2"]).expr,
            probe(matchers, "1h"), probe(matchers, "1m")]  # fmt: skip


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ('{node="n2"}', {("node", "Equal", "n2")}),
        ('  { node="n2" , team!="ci", }  ', {("node", "Equal", "n2"), ("team", "NotEqual", "ci")}),
        ('{cluster=~"eu-.*",}', {("cluster", "Re", "eu-.*")}),
        ('{job!~"x|y"}', {("job", "NotRe", "x|y")}),
    ],
    ids=["one", "spaces-and-trailing-comma", "regex-trailing-comma", "negative-regex"],
)
def test_the_selector_narrows_every_series_the_report_reads(selector: str, expected: set[Any]) -> None:
    """--selector as PromQL writes it (spaces, a trailing comma): each of the report's queries, and the
    probe for the scrape interval, reads every metric with the selector's matchers and no others lost."""
    for expr in every_query(selector_matchers(selector)):
        found = list(selectors(pp.parse(expr)))
        assert found, expr
        for v in found:
            assert expected <= matchers_of(v), (v.name, expr)


@pytest.mark.parametrize("selector", [None, "", "{}", " { } "])
def test_no_selector_reads_the_whole_fleet(selector: str | None) -> None:
    """An empty selector, with or without spaces inside its braces, is no selector."""
    assert selector_matchers(selector) == ""
    for expr in every_query(selector_matchers(selector)):
        for v in selectors(pp.parse(expr)):
            assert {m[0] for m in matchers_of(v)} <= {"state", "uuid", "__name__"}, expr


def test_the_report_reads_only_metrics_gpu_exporter_exports() -> None:
    """A misspelt metric would not fail: Prometheus answers nothing, and the report says 0 hours."""
    names = {v.name for expr in every_query('node="n2"') for v in selectors(pp.parse(expr))}
    assert names == {"gpu_state_seconds_total", "gpu_price_per_hour", "gpu_info", "gpu_memory_total_bytes",
                     "gpu_memory_used_max_bytes", "gpu_sm_active_ratio", "gpu_utilization_ratio"}  # fmt: skip
    assert names <= set(METRICS)


def test_the_scrape_interval_probe_counts_one_state_series_per_gpu_over_the_window() -> None:
    """The probe counts the samples of one series per GPU (the "down" state, which every GPU exports)
    over the window asked: their average over the GPUs is the samples per hour or per minute."""
    for window in ("1h", "1m"):
        e = pp.parse(probe('node="n2"', window))
        (v,) = selectors(e)
        assert (v.name, matchers_of(v)) == ("gpu_state_seconds_total",
                                            {("node", "Equal", "n2"), ("state", "Equal", "down")})  # fmt: skip
        assert f"[{window}]" in probe('node="n2"', window) and "count_over_time" in probe("", window)


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("cluster=eu", "--selector 'cluster=eu' is not a label selector; write it as PromQL does, e.g. "
                       "'{cluster=\"eu\"}' or '{node=~\"gpu-.*\", team!=\"ci\"}'"),
        ('{__name__="gpu_info"}', "--selector may not name metrics (__name__): the report chooses them"),
        ('{__name__=~".+", node="a"}', "--selector may not name metrics (__name__): the report chooses them"),
    ],
    ids=["not-a-selector", "names-a-metric", "names-metrics"],
)  # fmt: skip
def test_a_bad_selector_is_refused_with_what_to_write_instead(selector: str, message: str) -> None:
    with pytest.raises(SelectorError) as e:
        selector_matchers(selector)
    assert str(e.value) == message


SPANS = [1, 4, 60, 3600, 3 * 3600, 7 * DAY, 720 * 900, 720 * 900 + 1, 720 * 3600, 720 * 3600 + 1, 90 * DAY, 400 * DAY]
SCRAPES = [0.0, 1.0, 5.0, 15.0, 60.0, 1200.0, 1200.2, 1500.0, 2400.0]  # as estimated: any float


@pytest.mark.parametrize(("span", "scrape"), list(itertools.product(SPANS, SCRAPES)))
def test_a_range_is_cut_into_the_finest_steps_of_720_points_at_most_and_3_scrapes(span: float, scrape: float) -> None:
    """The finest step of the list that keeps to 720 points and spans three scrapes (so each step's
    increase() sees samples); past them, whole hours.  The steps end at the last step boundary before
    the range's end and cover its span to within a step."""
    end = END - 7  # not on a boundary
    w = window_for(end - span, end, scrape)
    allowed = [s for s in STEPS if span / s <= MAX_POINTS and s >= 3 * scrape]
    if allowed:
        assert w.step == allowed[0]
    else:
        assert w.step % 3600 == 0 and w.step > STEPS[-1] - 1
        assert w.step - 3600 < max(span / MAX_POINTS, 3 * scrape), "no whole hour less would do"
    assert w.step >= 3 * scrape and span / w.step <= MAX_POINTS and w.points <= MAX_POINTS
    assert w.points == max(1, round(span / w.step)) and w.end - w.start == w.points * w.step
    assert w.end % w.step == 0 and end - w.step < w.end <= end
    assert w.hours == (w.end - w.start) / 3600


def test_long_ranges_and_slow_scrapes_are_cut_into_whole_hours() -> None:
    assert window_for(END - 90 * DAY, END, 15).step == 3 * 3600  # 2,160 h / 720
    assert window_for(END - 400 * DAY, END, 15).step == 14 * 3600  # 9,600 h / 720 = 13.3
    assert window_for(END - DAY, END, 1200).step == 3600  # three 20-minute scrapes
    assert window_for(END - DAY, END, 1500).step == 2 * 3600  # three 25-minute scrapes: 75 min, in whole hours
    assert window_for(END - DAY, END, 2400).step == 2 * 3600  # three 40-minute scrapes: exactly 2 h
    assert window_for(END - 720 * 3600 - 1, END, 15).step == 2 * 3600  # a second over 720 h of 1 h steps
    assert window_for(END - 720 * 900, END, 5).step == 900  # exactly 720 points of 15 min
    assert window_for(END - 3600, END, 5).step == 15  # exactly three scrapes


def test_a_series_younger_than_an_hour_is_judged_by_its_last_minute() -> None:
    """90 s of 30-second scrapes: 3 samples in the hour (1,200 s apart, if that were all) but 2 in the
    last minute, which says at most 60 s."""
    assert scrape_interval(3, 2) == 60
    assert scrape_interval(3, 1) == 1200  # one sample in the minute says nothing


def test_each_query_is_named_in_the_progress_lines() -> None:
    """A long report says on stderr which query it waits on ("[3/7] GPU models: 2.1 s"): each has a name."""
    names = [q.what for q in queries(window_for(END - 7 * DAY, END, 15), "")]
    names.append(exact_cost(window_for(END - 7 * DAY, END, 15), "", ["GPU-1"]).what)
    assert all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names), names


def uuid_filter(expr: str) -> set[str | None]:
    """The uuid regex each selector of the query applies (None where it reads every GPU)."""
    return {next((m.value for m in v.matchers.matchers if m.name == "uuid"), None) for v in selectors(pp.parse(expr))}


@pytest.mark.parametrize("n", [1, 2, 200])
def test_the_step_by_step_cost_reads_only_the_gpus_whose_price_changed(n: int) -> None:
    """Their hours and prices, and no other GPU's (up to 200 of them, named in the query)."""
    uuids = [f"GPU-{i:04d}-aa" for i in range(n)]
    w = window_for(END - 7 * DAY, END, 15)
    (pattern,) = uuid_filter(exact_cost(w, 'node="n2"', uuids).expr)
    assert pattern is not None
    assert all(re.fullmatch(pattern, u) for u in uuids)
    assert not any(re.fullmatch(pattern, u) for u in ("GPU-9999-aa", "GPU-0001", "GPU", ""))
    assert {v.name for v in selectors(pp.parse(exact_cost(w, "", uuids).expr))} == {"gpu_state_seconds_total",
                                                                                    "gpu_price_per_hour"}  # fmt: skip


@pytest.mark.parametrize(
    "uuids",
    [[f"GPU-{i:04d}" for i in range(201)], ["GPU-1", 'GPU-2"} or vector(1) or {x="'], ["GPU-1", "GPU.*"]],
    ids=["more-than-200", "a-quote", "a-regex"],
)
def test_a_long_or_odd_list_of_gpus_is_read_whole_not_written_into_the_query(uuids: list[str]) -> None:
    """More than 200 GPUs, or a uuid label that is not letters, digits and dashes (a hostile or broken
    exporter): the query reads every GPU of the selector, still valid PromQL, and the report keeps those
    it asked for (model.cost_rows)."""
    expr = exact_cost(window_for(END - 7 * DAY, END, 15), 'node="n2"', uuids).expr
    assert uuid_filter(expr) == {None}
    for v in selectors(pp.parse(expr)):
        assert matchers_of(v) == {("node", "Equal", "n2")}, expr
