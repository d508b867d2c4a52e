"""``report --format csv``: the cost per GPU, holder, price period and state, built in-process from
canned query answers (tests/test_report_model.py's helpers) for a week with a price change in the
middle, a GPU shared by two pods, a GPU priced step by step and one without a price."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_exporter.report import command
from gpu_exporter.report.charges import apportion
from gpu_exporter.report.command import build_parser, main
from gpu_exporter.report.cost import Part
from gpu_exporter.report.csv_export import as_csv
from gpu_exporter.report.model import build, iso
from gpu_exporter.report.queries import window_for
from tests.test_report_model import CATALOGUE, H100, L4, add_gpu, empty, steps

END = 1_796_000_400
START = END - 168 * 3600
W = window_for(START, END)  # 720 steps of 840 s
CHANGE = 361  # the L4's price is 1.0 from this step on (0.8 before)
HALF = (CHANGE - 1) * W.step / 3600  # hours before the change
# A price and hours whose rows, each rounded to the fourth digit, add up to a unit more than the GPU's cost
# rounded: only apportioning the roundings makes the rows add up.
H100_PRICE = 2.9973
SHARED = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-shared"}
L4_GPU = {"node": "n2", "instance": "n2:9445", "gpu": "1", "uuid": "GPU-l4"}
STEPPED = {"node": "n3", "instance": "n3:9445", "gpu": "0", "uuid": "GPU-stepped"}
UNPRICED = {"node": "n4", "instance": "n4:9445", "gpu": "0", "uuid": "GPU-unpriced"}
POD_A = {"namespace": "ml", "pod": "train-a"}
POD_B = {"namespace": "ml", "pod": "serve-b"}


def week(pods: tuple[dict[str, str], dict[str, str]] = (POD_A, POD_B)) -> dict[str, Any]:
    """The week's answers, as the report asks them once the L4's price change cut the range in two."""
    r = empty()
    first, second = f"hours:1:{CHANGE - 1}", f"hours:{CHANGE}:{W.points}"
    r[first], r[second] = [], []
    for key, model in ((SHARED, H100), (L4_GPU, L4), (STEPPED, H100), (UNPRICED, L4)):
        add_gpu(r, key, model, {}, w=W)
    r["prices"] = [
        ({**SHARED, "currency": "USD"}, steps(W, H100_PRICE)),
        ({**L4_GPU, "currency": "USD"}, steps(W, [0.8] * (CHANGE - 1) + [1.0] * (W.points - CHANGE + 1))),
        # no price for its first 10 steps: priced step by step, by the cost query
        ({**STEPPED, "currency": "USD"}, steps(W, [None] * 10 + [3.0] * (W.points - 10))),
    ]
    a, b = pods
    for piece, scale in ((first, HALF / 168), (second, 1 - HALF / 168)):
        r[piece] += [
            ({**SHARED, **a, "state": "busy"}, 61.234567 * scale),
            ({**SHARED, **b, "state": "busy"}, 40.11113 * scale),
            ({**SHARED, **b, "state": "allocated_idle"}, 33.33336 * scale),
            ({**SHARED, "state": "idle"}, (168 - 61.234567 - 40.11113 - 33.33336) * scale),
            ({**STEPPED, "user": "eve", "state": "busy"}, 168 * scale),
            ({**UNPRICED, "state": "idle"}, 168 * scale),
        ]
    r[first].append(({**L4_GPU, "user": "bob", "state": "busy"}, HALF))
    r[second].append(({**L4_GPU, "user": "carol", "state": "allocated_idle"}, 168 - HALF))
    r["cost"] = [({**STEPPED, "user": "eve", "state": "busy", "currency": "USD"}, 3.0 * (168 - 10 * W.step / 3600))]
    return r


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def report(r: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, str]]]:
    doc = build(W, r, CATALOGUE)
    return doc, rows(as_csv([Part(W, r)], doc))


def test_the_rows_add_up_to_the_reports_total_to_the_last_digit() -> None:
    doc, out = report(week())
    total = sum(Decimal(x["cost"]) for x in out if x["cost"])
    assert total == Decimal(str(doc["totals"]["cost"]))
    for g in doc["gpus"]:
        mine = [x for x in out if x["uuid"] == g["uuid"]]
        assert sum(float(x["hours"]) for x in mine) == pytest.approx(g["gpu_hours"], abs=1e-5)
        if g["cost"] is None:
            assert all(x["cost"] == "" for x in mine), mine
        else:  # each GPU's rows within one unit of the report's fourth digit of its cost
            assert abs(sum(Decimal(x["cost"]) for x in mine) - Decimal(str(g["cost"]))) <= Decimal("0.0001")


def test_a_price_change_cuts_a_gpu_into_two_periods_each_at_its_price() -> None:
    _, out = report(week())
    l4 = [(x["holder"], x["period_start"], x["period_end"], x["price_per_hour"], x["price_basis"]) for x in out
          if x["uuid"] == "GPU-l4"]  # fmt: skip
    cut = iso(W.start + (CHANGE - 1) * W.step)
    assert l4 == [("user bob", iso(W.start), cut, "0.8", "period"), ("user carol", cut, iso(W.end), "1.0", "period")]
    for x in out:
        if x["price_basis"] == "period":  # hours x the period's price is the row's cost, but for the rounding
            assert abs(float(x["hours"]) * float(x["price_per_hour"]) - float(x["cost"])) < 2e-4, x


def test_a_gpu_whose_price_never_changed_is_one_period_and_a_shared_gpu_a_row_per_holder_and_state() -> None:
    _, out = report(week())
    shared = [(x["holder_kind"], x["holder"], x["namespace"], x["pod"], x["state"], x["period_start"],
               x["period_end"]) for x in out if x["uuid"] == "GPU-shared"]  # fmt: skip
    whole = (iso(W.start), iso(W.end))
    assert sorted(shared) == sorted([("", "", "", "", "idle", *whole), ("pod", "pod ml/train-a", "ml", "train-a",
                                     "busy", *whole), ("pod", "pod ml/serve-b", "ml", "serve-b", "busy", *whole),
                                    ("pod", "pod ml/serve-b", "ml", "serve-b", "allocated_idle", *whole)])  # fmt: skip


def test_a_gpu_priced_step_by_step_is_at_its_average_price_and_one_without_a_price_has_no_figure() -> None:
    _, out = report(week())
    (stepped,) = [x for x in out if x["uuid"] == "GPU-stepped"]
    assert stepped["price_basis"] == "average" and stepped["user"] == "eve"
    assert float(stepped["price_per_hour"]) == pytest.approx(3.0 * (168 - 10 * W.step / 3600) / 168, abs=1e-6)
    (unpriced,) = [x for x in out if x["uuid"] == "GPU-unpriced"]
    figures = (unpriced["hours"], unpriced["price_per_hour"], unpriced["cost"], unpriced["currency"])
    assert figures == ("168.0", "", "", "")  # no price: empty, never 0


def test_names_that_tenants_choose_never_run_as_formulas_and_survive_quotes_and_line_breaks() -> None:
    """OWASP's CSV injection advice: a cell that starts with = + - @ (or a tab, a carriage return) gets a
    leading quote; the csv module quotes quotes, commas and line breaks, so the name reads back whole."""
    hostile_a = {"namespace": "-2+3", "pod": '=HYPERLINK("http://evil","x")'}
    hostile_b = {"namespace": "@SUM(A1)", "pod": 'a "quoted",\r\nname'}
    _, out = report(week((hostile_a, hostile_b)))
    pods = {(x["namespace"], x["pod"]) for x in out if x["pod"]}
    assert pods == {("'-2+3", "'" + hostile_a["pod"]), ("'@SUM(A1)", hostile_b["pod"])}
    text_columns = ("node", "gpu", "uuid", "model", "holder_kind", "holder", "namespace", "pod", "hpc_job",
                    "container", "container_engine", "user")  # fmt: skip
    assert not [x for x in out for c in text_columns if x[c][:1] in ("=", "+", "-", "@", "\t", "\r")]


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40))
def test_apportioned_units_add_up_and_each_is_within_one_of_its_share(raws: list[float]) -> None:
    target = round(sum(raws))
    units = apportion(target, raws)
    assert sum(units) == target
    assert all(abs(u - r) < 1 + 1e-6 for u, r in zip(units, raws, strict=True))


class _Store:
    """Just enough of a client for ``main``: the probes find nothing (no scrape interval to guess from)."""

    shown = "a canned store"
    impossible = 0  # values it left out
    largest = (0, "")  # its largest answer, and what it answered
    bad_currencies: tuple[str, ...] = ()  # series it left out for their currency label

    def __init__(self, *_: object) -> None:
        pass

    def instant(self, *_: object) -> list[Any]:
        return []

    def range(self, *_: object) -> list[Any]:  # the scrape gaps: none
        return []


@pytest.mark.parametrize("fmt", ["csv", "focus"])
def test_the_command_writes_the_format_asked_for(fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "PromClient", _Store)
    monkeypatch.setattr(command, "run_queries", lambda *_: week())
    out = tmp_path / f"week.{fmt}"
    argv = ["--prometheus.url", "http://store", "--start", str(START), "--end", str(END), "--quiet"]
    assert main([*argv, "--format", fmt, "--output", str(out)]) == 0
    written = rows(out.read_text())
    cost = "cost" if fmt == "csv" else "BilledCost"
    assert sum(Decimal(x[cost]) for x in written if x[cost]) == Decimal(str(build(W, week(), CATALOGUE)["totals"]
                                                                             ["cost"]))  # fmt: skip


def test_the_help_names_both_formats() -> None:
    text = build_parser().format_help()
    assert "csv" in text and "focus" in text and "FOCUS 1.2" in " ".join(text.split())
