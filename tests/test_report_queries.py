"""What ``gpu-exporter report`` asks Prometheus, judged without one: every query is PromQL that reads
only metrics gpu-exporter exports, each narrowed by the user's ``--selector``; the steps a range is
cut into hold at most 720 points, span at least three scrapes and tile exactly [start, end), whatever
the two times are; no query uses a construct the engines read differently.

(What the answers add up to is test_report_history's and test_report_engines', against a real
Prometheus and a real VictoriaMetrics.)"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import promql_parser as pp
import pytest

from gpu_exporter.metric_defs import METRICS
from gpu_exporter.report.queries import (
    EXPORTED,
    MAX_POINTS,
    MIN_STEP,
    OWN_JOB,
    PROBES,
    RangeError,
    SelectorError,
    Window,
    anywhere,
    exact_cost,
    hours,
    presence,
    probe,
    queries,
    scrape_interval,
    selector_matchers,
    timeline,
    window_for,
)
from tests import assert_mentions

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
    w = window_for(END - 7 * DAY - 17, END - 17, 15)  # not on a step boundary: every selector has an offset
    return [*(q.expr for q in queries(w, matchers)), exact_cost(w, matchers, ["GPU-1", "GPU-2"], "USD").expr,
            hours(w, matchers).expr, hours(w, matchers, 3, 200).expr, timeline(w, matchers).expr,
            # where some GPU was seen through two scrapers: each counted once
            exact_cost(w, matchers, ["GPU-1"], "USD", copies=True).expr, hours(w, matchers, copies=True).expr,
            timeline(w, matchers, copies=True).expr,
            *(probe(matchers, p) for p in PROBES), presence(matchers, w), anywhere(matchers)]  # fmt: skip


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
            assert {m[0] for m in matchers_of(v)} <= {"state", "uuid", "currency", "__name__", "job"}, expr
            # A job only to tell the exporter's own job's copies of a GPU from other jobs' (queries.foreign).
            assert {m for m in matchers_of(v) if m[0] == "job"} <= {("job", "Re", OWN_JOB), ("job", "NotRe", OWN_JOB)}


def test_the_report_reads_only_metrics_gpu_exporter_exports() -> None:
    """A misspelt metric would not fail: Prometheus answers nothing, and the report says 0 hours."""
    names = {v.name for expr in every_query('node="n2"') for v in selectors(pp.parse(expr))}
    assert names == {"gpu_state_seconds_total", "gpu_price_per_hour", "gpu_info", "gpu_memory_total_bytes",
                     "gpu_memory_used_max_bytes", "gpu_sm_active_ratio", "gpu_utilization_ratio",
                     "gpu_dram_active_ratio", "gpu_tensor_active_ratio", "gpu_fp64_active_ratio",
                     "gpu_fp32_active_ratio", "gpu_fp16_active_ratio", "gpu_nvlink_tx_bytes_total",
                     "gpu_nvlink_links", "gpu_pcie_link_generation", "gpu_pcie_link_max_generation",
                     "gpu_pcie_link_width", "gpu_pcie_link_max_width", "gpu_pcie_link_max_bytes_per_second",
                     "gpu_pcie_rx_bytes_per_second", "gpu_pcie_tx_bytes_per_second"}  # fmt: skip
    assert names <= set(METRICS)


def test_the_scrape_interval_probe_counts_one_state_series_per_gpu_over_the_window() -> None:
    """The probe counts the samples of one series per GPU (the "down" state, which every GPU exports)
    over an hour and a minute without the sample at their start (Prometheus 2 would count it, and
    VictoriaMetrics not: a step one scrape longer on one engine than on the other); the most of any
    GPU is the samples per hour or per minute."""
    assert PROBES == ("3599999ms", "59999ms")
    for window in PROBES:
        e = pp.parse(probe('node="n2"', window))
        (v,) = selectors(e)
        assert (v.name, matchers_of(v)) == ("gpu_state_seconds_total",
                                            {("node", "Equal", "n2"), ("state", "Equal", "down")})  # fmt: skip
        assert probe("", window) == f'max(count_over_time(gpu_state_seconds_total{{state="down"}}[{window}]))'


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


SPANS = [60, 3600, 3 * 3600, 7 * DAY, 720 * 900, 720 * 900 + 60, 720 * 3600, 721 * 3600, 90 * DAY, 181 * DAY,
         365 * DAY, 366 * DAY, 36500 * DAY]  # fmt: skip
SCRAPES = [0.0, 1.0, 5.0, 15.0, 60.0, 1200.0, 1200.2, 1500.0, 2400.0]  # as estimated: any float
ENDS = [END, END - 17, END + 1234]  # on a whole hour, and not


@pytest.mark.parametrize(("span", "scrape", "end"), list(itertools.product(SPANS, SCRAPES, ENDS)))
def test_the_steps_tile_the_range_exactly_wherever_it_starts_and_ends(span: float, scrape: float, end: float) -> None:
    """Whole steps from the range's start to its end, nothing before and nothing after: the step divides
    the range's length; at most 720 of them, each at least 5 s and three scrapes long (so that every
    step's increase() has samples), and the finest such step. The queries are evaluated at the first
    multiple of the step at or after the end, every selector looking back by the difference, as a
    subquery's points sit on multiples of its step."""
    if span < max(MIN_STEP, 3 * scrape):
        with pytest.raises(RangeError, match="make it longer"):
            window_for(end - span, end, scrape)
        return
    w = window_for(end - span, end, scrape)
    assert (w.start, w.end) == (end - span, end) and w.points * w.step == span
    assert w.step >= max(MIN_STEP, 3 * scrape) and w.points <= MAX_POINTS
    finer = [d for d in range(max(MIN_STEP, math.ceil(3 * scrape), math.ceil(span / MAX_POINTS)), w.step)
             if span % d == 0]  # fmt: skip
    assert not finer, f"{finer[:3]} would do"
    assert w.at % w.step == 0 and w.at - w.offset == w.end and 0 <= w.offset < w.step
    assert w.hours == span / 3600


def test_the_ranges_users_ask_for_are_cut_as_finely_as_they_allow() -> None:
    """Issue 25: --start 2026-01-01 --end 2026-07-01 covered 2025-12-31T17:00 to 2026-06-30T20:00, and a
    721-hour range lost its first hour. Now each is whole, in up to 720 steps of a length that divides it."""
    jan, jul = 1_767_225_600, 1_782_864_000  # 2026-01-01 and 2026-07-01, 00:00 UTC
    w = window_for(jan, jul, 15)
    assert (w.start, w.end, w.step, w.points) == (jan, jul, 6 * 3600 + 2 * 60, 720)  # 4,344 h / 720
    w = window_for(END - 721 * 3600, END, 15)
    assert (w.start, w.step, w.points) == (END - 721 * 3600, 3605, 720)
    assert window_for(END - 30 * DAY, END, 60).step == 3600
    assert window_for(END - 7 * DAY, END, 60).step == 840
    assert window_for(END - 3600, END, 60).step == 180  # three scrapes of a minute
    assert window_for(END - 36500 * DAY, END, 15).points == 720  # --since 36500d ends where it was asked to


@pytest.mark.parametrize(("start", "end", "message"), [
    (END, END, "the range is empty"), (END, END - 60, "the range is empty"),
    (END - 3600.5, END, "whole seconds"), (END - 1_000_003, END, "give a start and an end on whole minutes"),
])  # fmt: skip
def test_a_range_that_cannot_be_tiled_exactly_is_refused_with_what_to_give_instead(start: float, end: float,
                                                                                   message: str) -> None:  # fmt: skip
    """A range a prime number of seconds long divides into no steps of a useful length: refused, never
    rounded (the report would cover a range other than the one asked)."""
    with pytest.raises(RangeError, match=message):
        window_for(start, end, 15)


def test_a_series_younger_than_an_hour_is_judged_by_its_last_minute() -> None:
    """90 s of 30-second scrapes: 3 samples in the hour (1,200 s apart, if that were all) but 2 in the
    last minute, which says 30 s."""
    assert scrape_interval(3, 2) == 30
    assert scrape_interval(3, 1) == 1200  # one sample in the minute says nothing
    assert scrape_interval(240, 4) == 15 and scrape_interval(None, None) == 0.0


def test_the_queries_avoid_what_the_engines_read_differently() -> None:
    """Issue 25: an ``or on (...)`` filled SM activity's gaps with GPU-Util on VictoriaMetrics and not on
    Prometheus. Every ``or`` now joins expressions that label_replace tells apart by a label of their
    own, or (``queries.once``) aggregations of series with a uuid and of series without one; ranges
    other than a counter's for increase() leave out the sample at their start; a step's price is the
    last the step saw, never an instant selector's (stale at the end of an outage)."""
    for expr in every_query(""):
        tree = pp.parse(expr)
        for node in walk(tree):
            if isinstance(node, pp.BinaryExpr) and str(node.op).endswith("or") and _one_series(node):
                # A counter's increase read one of several ways (queries.counted): alternatives for each
                # series at a step, whose labels are all the series' own, so both engines take the first
                # that has a value there.
                assert node.modifier is None or not getattr(node.modifier, "labels", None), expr
            elif (isinstance(node, pp.BinaryExpr) and str(node.op).endswith("or")
                  and (_split_by_uuid(node) or _split_by_job(node))):  # fmt: skip
                assert node.modifier is None or not getattr(node.modifier, "labels", None), expr
            elif isinstance(node, pp.BinaryExpr) and str(node.op).endswith("or"):
                for side in (node.lhs, node.rhs):
                    inner = side
                    while isinstance(inner, pp.BinaryExpr) and str(inner.op).endswith("or"):
                        inner = inner.rhs
                    assert isinstance(inner, pp.Call) and inner.func.name == "label_replace", expr
                assert node.modifier is None or not getattr(node.modifier, "labels", None), expr
            if isinstance(node, pp.MatrixSelector) and node.vector_selector.name == "gpu_price_per_hour":
                pass
        for v in selectors(tree):
            if v.name == "gpu_price_per_hour":
                assert "last_over_time(gpu_price_per_hour" in expr or "max_over_time(gpu_price_per_hour" in expr \
                    or "min_over_time(gpu_price_per_hour" in expr, expr  # fmt: skip
    w = window_for(END - 7 * DAY - 17, END - 17, 15)
    for q in queries(w, ""):
        ranges = re.findall(r"\[(\d+m?s)\]", q.expr)
        if q.kind == "instant":
            assert ranges and all(r in ("839999ms", "840s") for r in ranges), q.expr
            assert set(re.findall(r"offset \d+s", q.expr)) == {f"offset {w.offset}s"}, q.expr
        assert "increase(" not in q.expr or re.search(r"increase\([^)]*\[840s\]", q.expr), q.expr


def _one_series(node: Any) -> bool:
    """An ``or`` whose every selector is the one counter's (the same name and matchers): each side's
    labels are that series' own.  A figure matched to each series by ``group_left`` (the reading a
    step counts from, ``queries.counted_until``) gives none of its labels, and is not read here."""
    own = list(walk_own(node))
    found = {(v.name, tuple(sorted(map(str, matchers_of(v))))) for v in own if isinstance(v, pp.VectorSelector)}
    # No aggregation but the larger of two figures of each series, told apart by a label of their own.
    return len(found) == 1 and all(
        str(x.modifier) == "without (counted_as)" for x in own if isinstance(x, pp.AggregateExpr)
    )


def walk_own(e: Any) -> Iterator[Any]:
    """``walk``, without the right-hand side of a ``group_left``: the side whose labels are not kept."""
    yield e
    if isinstance(e, pp.BinaryExpr) and getattr(e.modifier, "card", None) == pp.VectorMatchCardinality.ManyToOne:
        yield from walk_own(e.lhs)
        return
    for attr in ("lhs", "rhs", "expr", "vector_selector"):
        if (child := getattr(e, attr, None)) is not None:
            yield from walk_own(child)
    for child in getattr(e, "args", None) or ():
        yield from walk_own(child)


def _split_by_uuid(node: Any) -> bool:
    """An ``or`` of two aggregations whose every selector reads series with a uuid (left) and without
    one (right): their label sets never match."""
    return (
        all(isinstance(side, pp.AggregateExpr) for side in (node.lhs, node.rhs))
        and all(("uuid", "NotEqual", "") in matchers_of(v) for v in selectors(node.lhs))
        and all(("uuid", "Equal", "") in matchers_of(v) for v in selectors(node.rhs))
    )


def _split_by_job(node: Any) -> bool:
    """An ``or`` of the exporter's own job's series (left) and other jobs' (right, ``queries.foreign``):
    every selector on the left reads ``job=~OWN_JOB``, every one on the right that is not the presence
    test of ``unless`` reads ``job!~OWN_JOB``: their label sets never match.  (Each side's figure
    matched by ``group_left``, which reads both jobs, gives none of its labels.)"""
    right = node.rhs
    while isinstance(right, pp.ParenExpr):
        right = right.expr

    def read(e: Any) -> list[pp.VectorSelector]:
        return [v for v in walk_own(e) if isinstance(v, pp.VectorSelector)]

    return (
        all(("job", "Re", OWN_JOB) in matchers_of(v) for v in read(node.lhs))
        and isinstance(right, pp.BinaryExpr) and str(right.op).endswith("unless")
        and all(("job", "NotRe", OWN_JOB) in matchers_of(v) for v in read(right.lhs))
    )  # fmt: skip


def walk(e: Any) -> Iterator[Any]:
    yield e
    for attr in ("lhs", "rhs", "expr", "vector_selector"):
        if (child := getattr(e, attr, None)) is not None:
            yield from walk(child)
    for child in getattr(e, "args", None) or ():
        yield from walk(child)


def test_each_query_is_named_in_the_progress_lines() -> None:
    """A long report says on stderr which query it waits on ("[3/7] GPU models: 2.1 s"): each has a name."""
    names = [q.what for q in queries(window_for(END - 7 * DAY, END, 15), "")]
    names.append(exact_cost(window_for(END - 7 * DAY, END, 15), "", ["GPU-1"], "USD").what)
    names.append(timeline(window_for(END - 7 * DAY, END, 15), "").what)
    assert all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names), names


def uuid_filter(expr: str) -> set[str | None]:
    """The uuid regex each selector of the query applies (None where it reads every GPU)."""
    return {next((m.value for m in v.matchers.matchers if m.name == "uuid" and str(m.op).endswith(".Re")), None)
            for v in selectors(pp.parse(expr))}  # fmt: skip


@pytest.mark.parametrize("n", [1, 2, 200])
def test_the_step_by_step_cost_reads_only_the_gpus_whose_price_changed(n: int) -> None:
    """Their hours and prices, and no other GPU's (up to 200 of them, named in the query)."""
    uuids = [f"GPU-{i:04d}-aa" for i in range(n)]
    w = window_for(END - 7 * DAY, END, 15)
    (pattern,) = uuid_filter(exact_cost(w, 'node="n2"', uuids, "USD").expr)
    assert pattern is not None
    assert all(re.fullmatch(pattern, u) for u in uuids)
    assert not any(re.fullmatch(pattern, u) for u in ("GPU-9999-aa", "GPU-0001", "GPU", ""))
    assert {v.name for v in selectors(pp.parse(exact_cost(w, "", uuids, "USD").expr))} == {
        "gpu_state_seconds_total", "gpu_price_per_hour"}  # fmt: skip


@pytest.mark.parametrize(
    "uuids",
    [[f"GPU-{i:04d}" for i in range(201)], ["GPU-1", 'GPU-2"} or vector(1) or {x="'], ["GPU-1", "GPU.*"]],
    ids=["more-than-200", "a-quote", "a-regex"],
)
def test_a_long_or_odd_list_of_gpus_is_read_whole_not_written_into_the_query(uuids: list[str]) -> None:
    """More than 200 GPUs, or a uuid label that is not letters, digits and dashes (a hostile or broken
    exporter): the query reads every GPU of the selector, still valid PromQL, and the report keeps those
    it asked for (model.cost_rows)."""
    expr = exact_cost(window_for(END - 7 * DAY, END, 15), 'node="n2"', uuids, "USD").expr
    assert uuid_filter(expr) == {None}
    for v in selectors(pp.parse(expr)):
        assert matchers_of(v) - {("currency", "Equal", "USD")} == {("node", "Equal", "n2")}, expr


@pytest.mark.parametrize("currency", ["USD", 'E"UR\\'])
def test_the_step_by_step_cost_reads_the_prices_of_the_reports_currency_only(currency: str) -> None:
    """A GPU priced in two currencies at once would match two price series in one step, and the
    multiplication would fail the whole query: only the report's currency is read, quoted safely."""
    expr = exact_cost(window_for(END - 7 * DAY, END, 15), "", ["GPU-1"], currency).expr
    (price,) = [v for v in selectors(pp.parse(expr)) if v.name == "gpu_price_per_hour"]
    assert ("currency", "Equal", currency) in matchers_of(price)


def test_the_hours_of_a_piece_of_the_range_end_where_the_piece_does() -> None:
    """Where prices changed, the hours are asked piece by piece: steps 3 to 200 of a week cut into 720
    steps of 840 s are the subquery of 198 steps evaluated 520 steps before the window's time, each step
    at its own end, the same steps as the whole range's, so that the pieces add up to it."""
    w = window_for(END - 7 * DAY - 17, END - 17, 15)
    whole, piece = hours(w, ""), hours(w, "", 3, 200)
    assert (whole.key, whole.at, whole.what) == ("hours", w.at, "GPU-hours by state and holder")
    assert (piece.key, piece.at, piece.what) == ("hours:3:200", w.at - 520 * 840,
                                                 "GPU-hours by state and holder (steps 3 to 200)")  # fmt: skip
    assert f"[{198 * 840 * 1000 - 1}ms:840s]" in piece.expr and f"[{720 * 840 * 1000 - 1}ms:840s]" in whole.expr
    assert piece.expr.replace(f"{198 * 840 * 1000 - 1}ms", "") == whole.expr.replace(f"{720 * 840 * 1000 - 1}ms", "")
    assert hours(w, "", 720, 720).at == w.at and hours(w, "", 1, 1).at == w.at - 719 * 840
    for first, last in ((0, 5), (5, 4), (1, 721)):
        with pytest.raises(ValueError, match="not within the window's 1 to 720"):
            hours(w, "", first, last)


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (Window(-100, 1000, 50), Window(150, 1000, 50)),  # before 1970: from the third step after it
        (Window(-90, 1010, 50), Window(160, 1010, 50)),
        (Window(10, 1000, 10), Window(30, 1000, 10)),
        (Window(150, 1000, 50), Window(150, 1000, 50)),  # three steps after 1970: as asked
        (Window(int(END - DAY), int(END), 120), Window(int(END - DAY), int(END), 120)),
    ],
)  # fmt: skip
def test_a_range_from_before_1970_starts_where_a_store_answers(window: Window, expected: Window) -> None:
    """Issue 25: --since 36500d reaches back to 1926. No store holds samples before 1970, and
    VictoriaMetrics answers nothing for a subquery that reaches back near it: the range starts at the
    first step three steps after it, on the same grid of steps."""
    moved = window.from_epoch()
    assert moved == expected and (moved.end - moved.start) % moved.step == 0 and moved.start >= 3 * moved.step


def test_the_queries_word_for_word() -> None:
    """What the report asks, for a week ending 17 s after a step boundary (so that every selector reads
    257 s back from the query's time, a multiple of the 840 s step) and --selector '{node="n2"}': the
    engines' answers to these are checked on real stores by test_report_history; this pins the text."""
    w = window_for(END - 7 * DAY - 17, END - 17, 15)
    assert (w.step, w.offset, w.at) == (840, 257, END - 17 + 257)
    n2 = 'node="n2"'
    tile = "[839999ms] offset 257s)"
    sub = "[604799999ms:840s]"

    capacity = f"avg_over_time(gpu_pcie_link_max_bytes_per_second{{{n2}}}{tile}"
    shares = " or ".join(f'label_replace(avg_over_time(gpu_pcie_{way}_bytes_per_second{{{n2}}}{tile} / {capacity}, '
                         f'"what", "{way}", "", "")' for way in ("rx", "tx"))  # fmt: skip
    held_states = 'state=~"busy|allocated_idle|allocated_unknown"'  # every held state, as the report reads it
    held = f"stddev_over_time(gpu_state_seconds_total{{{n2}, {held_states}}}{tile} > 0"

    def price(offset: str) -> str:
        selector = f"gpu_price_per_hour{{{n2}}}[839999ms]{offset}"
        return f"max by (node, instance, gpu, uuid, currency) (last_over_time({selector})) >= 0"

    assert w.start + w.step == 1_795_396_423
    expected = {
        # Each GPU's price where it is new: the first step (840 s after the start, 1,795,396,423), a step
        # after one with another price or none; and on how many steps it had one.
        "prices": ("prices", "range", f"({price('')}) unless ((({price('')}) == ({price(' offset 840s')})) and on () "
                                      f"(vector(time()) > {w.start + w.step}))"),
        # (on how many steps any of its series had one: the exporter writes the GPU's holders on its price)
        "priced_steps": ("steps priced", "instant", "count_over_time((max by (node, instance, gpu, uuid, currency) ("
                                                    f"last_over_time(gpu_price_per_hour{{{n2}}}{tile} >= 0)){sub})"),
        # One row per GPU and target (every label but the exporter's): the targets the report names.
        "seen": ("GPUs seen, by target", "instant", f"max without ({EXPORTED}) (count_over_time(max_over_time("
                                                    f'gpu_state_seconds_total{{{n2}, state="down"}}{tile}{sub}))'),
        "info": ("GPU models", "instant", f"max by (node, instance, gpu, uuid, name, mig_mode) (max_over_time("
                                          f"max_over_time(gpu_info{{{n2}}}{tile}{sub}))"),
        "memory_total": ("memory sizes", "instant", f"max by (node, instance, gpu, uuid) (max_over_time(max_over_time("
                                                    f"gpu_memory_total_bytes{{{n2}}}{tile}{sub}))"),
        "memory_peak": ("memory peaks (highest)", "instant", f"max by (node, instance, gpu, uuid) (max_over_time("
                                                             f"max_over_time(gpu_memory_used_max_bytes{{{n2}}}{tile}"
                                                             f"{sub}))"),
        # Each step's highest poll (bursts), of each signal: SM, GPU-Util, DRAM, the four pipes, NVLink.
        "activity": ("activity while held (p95 of bursts)", "instant",
                     "max by (node, instance, gpu, uuid, signal) (quantile_over_time(0.95, (("
                     + " or ".join(f'label_replace(max_over_time(gpu_{m}_ratio{{{n2}}}{tile}, "signal", "{m}", "", "")'
                                   for m in ("sm_active", "utilization", "dram_active", "tensor_active", "fp64_active",
                                             "fp32_active", "fp16_active"))
                     + f' or label_replace(sum without (link) (rate(gpu_nvlink_tx_bytes_total{{{n2}}}{tile}), '
                     '"signal", "nvlink_tx", "", "")) and on (job, instance, gpu, uuid) (stddev_over_time('
                     f"gpu_state_seconds_total{{{n2}, {held_states}}}{tile} > 0)){sub}))"),
        "holders_now": ("holders now", "instant",
                        "max by (node, instance, gpu, uuid, namespace, pod, hpc_job, container_engine, container_id, "
                        "container_name, user, gpu_instance_id) (stddev_over_time("
                        f"gpu_state_seconds_total{{{n2}, {held_states}}}{tile} > bool 0)"),
        # Issue 48: the links, each fact the highest it reached; the PCIe traffic while held as a share of
        # the link, each step's mean; and the held steps with either way 90% full or more, in seconds.
        "links": ("links (NVLink, PCIe)", "instant", "max by (node, instance, gpu, uuid, what) (max_over_time(("
                  + " or ".join(f'label_replace(max_over_time(gpu_{m}{{{n2}}}{tile}, "what", "{w_}", "", "")'
                                for w_, m in (("nvlink_links", "nvlink_links"), ("pcie_gen", "pcie_link_generation"),
                                              ("pcie_max_gen", "pcie_link_max_generation"),
                                              ("pcie_width", "pcie_link_width"),
                                              ("pcie_max_width", "pcie_link_max_width"),
                                              ("pcie_capacity", "pcie_link_max_bytes_per_second")))
                  + f"){sub}))"),
        "pcie_load": ("PCIe load while held", "instant",
                      f"max by (node, instance, gpu, uuid, what) (quantile_over_time(0.95, (({shares}) and on (job, "
                      f"instance, gpu, uuid) ({held})){sub}))"),
        "pcie_bound": ("PCIe-bound time", "instant",
                       f"max by (node, instance, gpu, uuid) (count_over_time(((max without (what) ({shares}) >= 0.9) "
                       f"and on (job, instance, gpu, uuid) ({held})){sub})) * 840"),
    }  # fmt: skip
    got = {q.key: (q.what, q.kind, q.expr) for q in queries(w, n2)}
    assert got == expected
    assert all(q.at is None for q in queries(w, n2))

    def counted(sel: str, off: str = " offset 257s", before: str = "1097s", floor: str = "") -> str:
        """A step's increase across a scrape gap (queries.counted): the last sample less the last one
        before the step (up to 900 s back) where the counter never went down in it; else the larger of
        increase() and, on a restart, the new process's last sample.  Where copies are counted once, from
        the last reading counted before the step (``floor``), if there is one in 900 s."""
        window = f"{sel}[840s]{off}"
        last, prior = f"last_over_time({sel}[839999ms]{off})", f"last_over_time({sel}[900s] offset {before})"
        since = f"{last} - {prior}"
        if floor:
            since = f"(({last} - on (node, gpu, uuid, {EXPORTED}) group_left {floor}) or ({since}))"
        return (
            f"(({since} >= 0 unless resets({window}) > 0) or max without (counted_as) (label_replace("
            f'increase({window}), "counted_as", "increase", "", "") or label_replace({last} + 0 < {prior}, '
            '"counted_as", "restart", "", "")))'
        )

    assert hours(w, n2).expr == (
        "sum by (node, instance, gpu, uuid, namespace, pod, hpc_job, container_engine, container_id, container_name, "
        "user, gpu_instance_id, state) "
        "(sum_over_time(("
        f"{counted(f'gpu_state_seconds_total{{{n2}}}')}){sub})) / 3600"
    )
    cost = exact_cost(w, n2, ["GPU-1", "GPU-2"], "USD")
    only = f'gpu_state_seconds_total{{{n2}, uuid=~"GPU-1|GPU-2"}}'
    assert (cost.key, cost.what, cost.kind, cost.at) == ("cost", "cost of GPUs whose price changed", "instant", None)
    assert cost.expr == (
        "sum by (node, instance, gpu, uuid, namespace, pod, hpc_job, container_engine, container_id, container_name, "
        "user, gpu_instance_id, state, currency) (sum_over_time(("
        f"{counted(only)} * on (job, instance, gpu, uuid) "
        "group_left (currency) max by (job, instance, gpu, uuid, currency) (last_over_time(gpu_price_per_hour"
        f'{{{n2}, uuid=~"GPU-1|GPU-2", currency="USD"}}{tile})){sub})) / 3600'
    )
    line = timeline(w, n2)
    # Asked 257 s late, at multiples of the step as the hours' subquery is, and moved back.
    assert (line.key, line.what, line.kind, line.at, line.shift) == ("timeline", "hours over time", "range", None, 257)
    assert line.expr == f"sum by (state) ({counted(f'gpu_state_seconds_total{{{n2}}}')}) / 3600"
    # Where some GPU was seen through two scrapers (cost.seen_twice), each step's increase is counted once
    # (queries.once): the instances one scraper saw a GPU at added up, the copies of other scrapers (job,
    # a replica label) the largest; a GPU without a uuid once per target.  Other jobs' copies of a GPU count
    # only at steps where the exporter's own job did not see it (its "down" series had no sample).
    assert EXPORTED == ("namespace, pod, container, hpc_job, user, slurm_account, slurm_partition, container_engine, "
                        "container_id, container_name, gpu_instance_id, state")  # fmt: skip

    own, other = f'uuid!="", job=~"{OWN_JOB}"', f'uuid!="", job!~"{OWN_JOB}"'

    def until(sel: str, off: str = " offset 257s", before: str = "1097s") -> str:
        """The last reading counted before a step (queries.counted_until): the own job's last in 900 s,
        or another job's at the steps in those (two of 840 s) where the own job did not see the GPU."""
        mine = f"last_over_time({sel.format(u=own)}[900s] offset {before})"
        down = own + ', state="down"'
        saw = f"last_over_time({sel.format(u=down)}[840s]{off})"
        theirs = f"last_over_time({sel.format(u=other)}[839999ms]{off}) unless on (node, gpu, uuid) {saw}"
        by = f"node, gpu, uuid, {EXPORTED}"
        return (f'max by ({by}) (label_replace(max by ({by}) ({mine}), "counted_as", "own", "", "") or '
                f'label_replace(max by ({by}) (last_over_time(({theirs})[1679999ms:840s] offset 840s)), '
                '"counted_as", "copy", "", ""))')  # fmt: skip

    def once(each: Callable[[str, str], str], keep: str = "", off: str = " offset 257s") -> str:
        mine, theirs, without = each(own, "f"), each(other, "f"), each('uuid=""', "")
        saw = f'last_over_time(gpu_state_seconds_total{{{n2}, {own}, state="down"}}[840s]{off})'
        return (f"max by (node, gpu, uuid, {EXPORTED}{keep}) (sum without (instance) ({mine}) or (sum without "
                f"(instance) ({theirs}) unless on (node, gpu, uuid) {saw})) or max by "
                f"(node, instance, gpu, {EXPORTED}{keep}) ({without})")  # fmt: skip

    state_of = f"gpu_state_seconds_total{{{{{n2}, {{u}}}}}}"

    def step_of(u: str, f: str) -> str:
        return counted(state_of.format(u=u), floor=f and until(state_of))

    assert timeline(w, n2, copies=True).expr == f"sum by (state) ({once(step_of)}) / 3600"

    assert hours(w, n2, copies=True).expr == (
        "sum by (node, instance, gpu, uuid, namespace, pod, hpc_job, container_engine, container_id, container_name, "
        "user, gpu_instance_id, state) "
        f"(sum_over_time(({once(step_of)}){sub})) "
        "/ 3600"
    )
    only_each = f'gpu_state_seconds_total{{{{{n2}, uuid=~"GPU-1|GPU-2", {{u}}}}}}'

    def priced(u: str, f: str) -> str:
        return (
            f"{counted(only_each.format(u=u), floor=f and until(only_each))} * on "
            "(job, instance, gpu, uuid) group_left (currency) max by (job, instance, gpu, uuid, currency) "
            f'(last_over_time(gpu_price_per_hour{{{n2}, uuid=~"GPU-1|GPU-2", {u}, currency="USD"}}{tile})'
        )

    assert exact_cost(w, n2, ["GPU-1", "GPU-2"], "USD", copies=True).expr == (
        "sum by (node, instance, gpu, uuid, namespace, pod, hpc_job, container_engine, container_id, container_name, "
        f"user, gpu_instance_id, state, currency) (sum_over_time(({once(priced, ', currency')}){sub})) / 3600"
    )
    # Each GPU once, however many targets saw it: a GPU with a uuid once on its node, one without per target.
    down = 'count(max by (node, instance, gpu, uuid) (label_replace({}, "instance", "", "uuid", ".+")))'
    assert presence(n2, w) == down.format(f'max_over_time(max_over_time(gpu_state_seconds_total{{{n2}, '
                                          f'state="down"}}{tile}{sub})')  # fmt: skip
    assert anywhere(n2) == down.format(f'gpu_state_seconds_total{{{n2}, state="down"}}')
    assert anywhere("") == down.format('gpu_state_seconds_total{state="down"}')
    # On a step boundary, no offset; without a selector, bare metric names.
    aligned = window_for(END - DAY, END, 15)
    assert aligned.offset == 0 and "offset" not in " ".join(q.expr for q in queries(aligned, "") if q.key != "prices")
    # The prices' only offset is the step before each step, to tell a new price from one that held.
    assert re.findall(r"offset \d+s", {q.key: q.expr for q in queries(aligned, "")}["prices"]) == ["offset 120s"]
    assert {q.key: q.expr for q in queries(aligned, "")}["info"] == (
        "max by (node, instance, gpu, uuid, name, mig_mode) (max_over_time(max_over_time(gpu_info[119999ms])"
        "[86399999ms:120s]))"
    )


@pytest.mark.parametrize("n", [1, 2, 3, 4, 12, 25, 36, 49, 97, 360, 1024, 3600, 2 * 3 * 5 * 7 * 11 * 13])
def test_every_divisor_of_a_length_is_a_step_it_may_be_cut_into(n: int) -> None:
    from gpu_exporter.report.queries import _divisors

    assert _divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize(
    ("span", "refused"),
    [(21810, False), (121, True), (1, True)],
    ids=["half-the-steps-wanted", "fewer-than-half", "one-second"],
)  # fmt: skip
def test_a_range_is_refused_only_below_half_the_steps_it_wants(span: int, refused: bool) -> None:
    """21,810 s (2 x 3 x 5 x 727) wants 60 steps of at least 31 s and divides into 30 of 727 s: half of
    60, taken. 121 s (11 x 11) wants 24 steps of 5 s and divides into 11 of 11 s: fewer than half, refused.
    A second is shorter than any step."""
    if not refused:
        w = window_for(END - span, END)
        assert (w.step, w.points) == (727, 30)
        return
    with pytest.raises(RangeError) as e:
        window_for(END - span, END)
    assert str(e.value) == {
        121: "a range of 121 s cannot be cut into equal steps of 5 s or more (11 would be all): give a start and an "
             "end on whole minutes",
        1: "the range is 1 s long, less than a step can be (5 s: three scrape intervals, at least 5 s), so no step in "
           "it could count anything: make it longer",
    }[span]  # fmt: skip


def test_an_empty_or_fractional_range_is_refused_in_words() -> None:
    with pytest.raises(RangeError) as e:
        window_for(END, END)
    assert_mentions(str(e.value), "empty", "the start must be before the end")
    with pytest.raises(RangeError) as e:
        window_for(END - 0.5, END)
    assert_mentions(str(e.value), "start and end", "whole seconds")
