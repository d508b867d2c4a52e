"""The charges behind ``--format csv`` and ``focus`` (gpu_exporter/report/charges.py) where the answers
are not tidy: a GPU scraped twice under names no label tells apart (its hours scaled to the range), a
GPU without a node label or a uuid, float noise around zero, a GPU priced step by step whose cost has
no hours beside it, rows of a state the report does not know, and the roundings apportioned both
ways.  Each charge must name its GPU as the report does, in the report's order."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest

from gpu_exporter.report.charges import AVERAGE, PERIOD, Charge, _runs, apportion, charges
from gpu_exporter.report.cost import Part
from gpu_exporter.report.model import build
from gpu_exporter.report.queries import Window
from tests.test_report_model import CATALOGUE, H100, add_gpu, empty, steps

END = 1_796_000_400
W = Window(END - 100 * 3600, END, 3600)  # 100 steps of an hour
GPU_A = {"node": "n1", "instance": "n1:9445", "gpu": "2", "uuid": "GPU-a"}
GPU_B = {"node": "n1", "instance": "n1:9445", "gpu": "10", "uuid": "GPU-b"}


def _charges(r: dict[str, Any], w: Window = W) -> tuple[dict[str, Any], list[Charge]]:
    doc = build(w, r, CATALOGUE)
    return doc, charges([Part(w, r)], doc)


def _total(rows: list[Charge]) -> Decimal:
    return sum((c.cost for c in rows if c.cost is not None), Decimal(0))


def test_apportion_gives_the_units_left_to_the_largest_remainders_and_takes_from_the_smallest() -> None:
    assert apportion(2, [0.2, 0.7, 0.6]) == [0, 1, 1]  # two units left: to 0.7 and 0.6
    assert apportion(1, [1.1, 1.4]) == [0, 1]  # floors above the target: from the one nearest below
    assert apportion(0, [0.3, 0.2]) == [0, 0]
    assert apportion(5, [0.5, 0.5]) == [3, 2]  # more left than rows: round and round, first first
    assert apportion(-1, [0.0, 0.0, 0.0]) == [0, 0, -1]  # ties: the last first, going down
    assert apportion(3, []) == []
    assert apportion(3, [2.3, 0.6]) == [2, 1]  # by what is left of each past its floor, not its size
    assert apportion(1, [1.1, 1.2, 1.3]) == [0, 0, 1]  # two taken: from the two nearest below


def test_runs_are_consecutive_pieces_of_one_price() -> None:
    assert _runs([1.0, 1.0, 2.0, 2.0, 2.0, None, None, 1.0]) == [(0, 1, 1.0), (2, 4, 2.0), (5, 6, None), (7, 7, 1.0)]
    assert _runs([3.0]) == [(0, 0, 3.0)]


def test_charges_name_each_gpu_as_the_report_does_in_its_order() -> None:
    """GPU 10 after GPU 2 (the report orders indices as numbers), each with its gpu label, model and
    currency; the cost adds up to the report's."""
    r = empty()
    add_gpu(r, GPU_B, H100, {"idle": 100.0}, price=2.0, w=W)
    add_gpu(r, GPU_A, H100, {"busy": 60.0, "idle": 40.0}, price=3.0, holder={"user": "ann"}, w=W)
    doc, rows = _charges(r)
    assert [g["gpu"] for g in doc["gpus"]] == ["2", "10"]
    # Within a GPU: by period, then holder (nobody first), then state.
    assert [(c.gpu, c.state) for c in rows] == [("2", "idle"), ("2", "busy"), ("10", "idle")]
    assert {(c.model, c.currency, c.basis) for c in rows} == {(H100, "USD", PERIOD)}
    assert rows[1].holder.user == "ann" and rows[0].holder.kind == "" and rows[0].price_per_hour == 3.0
    assert _total(rows) == Decimal(str(doc["totals"]["cost"])) == Decimal("500")


def test_a_gpu_counted_twice_is_charged_the_range_at_most() -> None:
    """Its series add up to 200 h in a 100 h range (two names in one job): every charge is halved, as
    the report's figures are, hours and cost alike."""
    r = empty()
    add_gpu(r, GPU_A, H100, {"busy": 120.0, "idle": 80.0}, price=3.0, holder={"user": "ann"}, w=W)
    doc, rows = _charges(r)
    assert sum(c.hours for c in rows) == pytest.approx(100.0)
    assert [(c.state, c.hours, c.cost) for c in rows] == [("idle", 40.0, Decimal("120")),
                                                          ("busy", 60.0, Decimal("180"))]  # fmt: skip
    assert doc["gpus"][0]["cost"] == 300.0


@pytest.mark.parametrize("answer", ["hours", "info", "memory_total", "memory_peak", "activity", "cost"])
def test_a_gpu_without_a_node_label_is_named_by_the_first_target_that_saw_it(answer: str) -> None:
    """As the report names it: by the first of every target that saw it, in any of its answers."""
    gpu = {"instance": "10.0.0.9:9445", "gpu": "0", "uuid": "GPU-n"}
    r = empty()
    add_gpu(r, gpu, H100, {"busy": 100.0}, holder={"user": "ann"}, w=W)
    r["prices"] = [({**gpu, "currency": "USD"}, steps(W, [None] + [3.0] * 99))]  # priced step by step
    r["cost"] = [({**gpu, "user": "ann", "state": "busy", "currency": "USD"}, 297.0)]
    early = {**gpu, "instance": "10.0.0.1:9445"}
    row = {"hours": ({**early, "user": "ann", "state": "busy"}, 0.0),
           "cost": ({**early, "user": "ann", "state": "busy", "currency": "USD"}, 0.0),
           "activity": ({**early, "signal": "utilization"}, 0.5)}  # fmt: skip
    r[answer].append(row.get(answer, (early, 1.0)))
    doc, rows = _charges(r)
    assert doc["gpus"][0]["node"] == "10.0.0.1:9445"
    assert {c.node for c in rows} == {"10.0.0.1:9445"} and {c.gpu for c in rows} == {"0"}
    assert rows[0].basis == AVERAGE and _total(rows) == Decimal("297")


def test_a_gpu_without_a_gpu_label_is_charged_with_none() -> None:
    r = empty()
    add_gpu(r, {"node": "n5", "uuid": "GPU-z"}, H100, {"idle": 100.0}, price=1.5, w=W)
    _, rows = _charges(r)
    assert [(c.node, c.gpu, c.uuid, c.model) for c in rows] == [("n5", "", "GPU-z", H100)]


def test_a_gpu_without_a_uuid_nor_node_nor_target_is_still_charged() -> None:
    bare = {"gpu": "4"}
    r = empty()
    add_gpu(r, bare, H100, {"idle": 100.0}, price=1.5, w=W)
    doc, rows = _charges(r)
    assert [(c.node, c.gpu, c.uuid, c.cost) for c in rows] == [("", "4", "", Decimal("150"))]
    assert doc["gpus"][0]["node"] == ""


def test_float_noise_is_no_charge_but_a_cost_without_hours_is_one() -> None:
    """A row of 1e-9 h and no cost is noise; one of 0.4 h without a price, or of no hours but a cost
    of at least half the report's last digit (a GPU priced step by step), is a charge."""
    r = empty()
    add_gpu(r, GPU_A, H100, {"idle": 99.6, "busy": 0.4}, holder={"user": "ann"}, w=W)  # no price
    r["hours"].append(({**GPU_A, "user": "bob", "state": "busy"}, 1e-9))
    stepped = {**GPU_B, "gpu": "3"}
    add_gpu(r, stepped, H100, {"idle": 100.0}, w=W)
    r["prices"].append(({**stepped, "currency": "USD"}, steps(W, [None] + [3.0] * 99)))
    r["cost"] = [({**stepped, "state": "idle", "currency": "USD"}, 297.0),
                 ({**stepped, "user": "eve", "state": "busy", "currency": "USD"}, 0.00005),  # kept: half a unit
                 ({**stepped, "user": "mel", "state": "busy", "currency": "USD"}, 0.00004),  # noise
                 ({**stepped, "user": "ivy", "state": "busy", "currency": "USD"}, 0.00006)]  # fmt: skip
    doc, rows = _charges(r)
    kept = {(c.gpu, c.holder.user, c.state): c for c in rows}
    assert ("2", "bob", "busy") not in kept and ("3", "mel", "busy") not in kept
    assert kept[("2", "ann", "busy")].hours == 0.4 and kept[("2", "ann", "busy")].cost is None
    eve, ivy = kept[("3", "eve", "busy")], kept[("3", "ivy", "busy")]
    # A cost without hours: priced step by step, over the range, with no price per hour to show.
    assert (eve.basis, eve.hours, eve.price_per_hour, eve.start, eve.end) == (AVERAGE, 0.0, None, W.start, W.end)
    assert ivy.cost is not None and eve.cost is not None
    assert _total(rows) == Decimal(str(doc["totals"]["cost"]))


def test_a_gpu_priced_step_by_step_shows_its_average_price_for_less_than_an_hour_too() -> None:
    r = empty()
    add_gpu(r, GPU_A, H100, {"busy": 0.5, "idle": 99.5}, holder={"user": "ann"}, w=W)
    r["prices"] = [({**GPU_A, "currency": "USD"}, steps(W, [None] + [3.0] * 99))]
    r["cost"] = [({**GPU_A, "user": "ann", "state": "busy", "currency": "USD"}, 1.2),
                 ({**GPU_A, "state": "idle", "currency": "USD"}, 295.5),
                 ({**GPU_A, "state": "idle", "currency": "EUR"}, 999.0),  # another currency: not this report's
                 ({**GPU_B, "state": "idle", "currency": "USD"}, 999.0)]  # a GPU not priced step by step  # fmt: skip
    doc, rows = _charges(r)
    busy = next(c for c in rows if c.state == "busy")
    assert (busy.basis, busy.price_per_hour, busy.cost) == (AVERAGE, 2.4, Decimal("1.2"))
    assert _total(rows) == Decimal("296.7") == Decimal(str(doc["totals"]["cost"]))
    assert all(c.uuid == "GPU-a" for c in rows)


def test_rows_of_a_state_the_report_does_not_know_are_passed_over_not_the_rest() -> None:
    r = empty()
    add_gpu(r, GPU_A, H100, {}, price=2.0, w=W)
    r["hours"] = [({**GPU_A, "state": "sleeping"}, 5.0), ({**GPU_A, "state": "idle"}, 100.0)]
    _, rows = _charges(r)
    assert [(c.state, c.hours) for c in rows] == [("idle", 100.0)]
    r["prices"] = [({**GPU_A, "currency": "USD"}, steps(W, [None] + [2.0] * 99))]
    r["cost"] = [({**GPU_A, "state": "sleeping", "currency": "USD"}, 7.0),
                 ({**GPU_A, "state": "idle", "currency": "USD"}, 198.0)]  # fmt: skip
    _, rows = _charges(r)
    assert [(c.state, c.cost) for c in rows] == [("idle", Decimal("198"))]


def test_an_idle_row_is_nobodys_whatever_labels_it_carries() -> None:
    r = empty()
    add_gpu(r, GPU_A, H100, {}, price=2.0, w=W)
    r["hours"] = [({**GPU_A, "user": "mallory", "state": "idle"}, 100.0)]
    _, rows = _charges(r)
    assert [(c.holder.kind, c.holder.name) for c in rows] == [("", rows[0].holder.name)]
    assert "mallory" not in rows[0].holder.name


def test_a_mig_slice_held_with_its_activity_unknown_is_charged_to_its_holder() -> None:
    """An A100's slice (no GPM) is allocated_unknown: held, so its holder's, never nobody's; the rows of one
    holder and state on two slices of a card are one charge, their hours added."""
    r = empty()
    add_gpu(r, GPU_A, H100, {}, price=2.0, w=W)
    r["hours"] = [({**GPU_A, "user": "alice", "gpu_instance_id": "1", "state": "allocated_unknown"}, 30.0),
                  ({**GPU_A, "user": "alice", "gpu_instance_id": "2", "state": "allocated_unknown"}, 20.0),
                  ({**GPU_A, "gpu_instance_id": "", "state": "idle"}, 50.0)]  # fmt: skip
    _, rows = _charges(r)
    assert sorted((c.state, c.holder.name, c.hours) for c in rows) == [("allocated_unknown", "user alice", 50.0),
                                                                       ("idle", "", 50.0)]  # fmt: skip


def test_in_parts_each_gpu_is_named_and_its_targets_put_together_from_every_part() -> None:
    """A GPU seen only in the first part keeps its gpu label; one without a node label is named by the
    first target of any part."""
    head, tail = Window(END - 200 * 3600, END - 100 * 3600, 3600), W
    gone = {"node": "n9", "instance": "n9:9445", "gpu": "7", "uuid": "GPU-gone"}
    nameless = {"instance": "10.0.0.5:9445", "gpu": "1", "uuid": "GPU-x"}
    parts = []
    for w, instance, with_gone in ((head, "10.0.0.5:9445", True), (tail, "10.0.0.9:9445", False)):
        r = empty()
        add_gpu(r, {**nameless, "instance": instance}, H100, {"idle": 100.0}, price=1.0, w=w)
        if with_gone:
            add_gpu(r, gone, H100, {"idle": 100.0}, price=1.0, w=w)
        r["holders_now"] = []
        r["timeline"] = []
        parts.append(Part(w, r))
    from gpu_exporter.report.paths import together

    doc = build(Window(head.start, tail.end, 3600), together(parts), CATALOGUE, parts=parts)
    rows = charges(parts, doc)
    assert {(c.node, c.gpu) for c in rows} == {("10.0.0.5:9445", "1"), ("n9", "7")}
    x = next(c for c in rows if c.uuid == "GPU-x")
    assert (x.start, x.end, x.hours) == (head.start, tail.end, 200.0)  # one period across both parts
    assert (x.cost, next(c.cost for c in rows if c.uuid == "GPU-gone")) == (Decimal("200"), Decimal("100"))


def test_a_gpu_priced_step_by_step_in_every_part_is_one_charge_of_both_parts_costs() -> None:
    """Its busy hours in the first part have no cost (the cost query saw none), the second's have: one
    charge at the average price of both, beside a steady GPU whose money must stay its own."""
    head, tail = Window(END - 200 * 3600, END - 100 * 3600, 3600), W
    parts = []
    for w, cost in ((head, None), (tail, 150.0)):
        r = empty()
        add_gpu(r, GPU_A, H100, {"busy": 100.0}, holder={"user": "ann"}, w=w)
        r["prices"] = [({**GPU_A, "currency": "USD"}, steps(w, [None] + [1.5] * 99))]
        r["cost"] = [] if cost is None else [({**GPU_A, "user": "ann", "state": "busy", "currency": "USD"}, cost)]
        add_gpu(r, GPU_B, H100, {"idle": 100.0}, price=2.0, w=w)
        r["holders_now"], r["timeline"] = [], []
        parts.append(Part(w, r))
    from gpu_exporter.report.paths import together

    doc = build(Window(head.start, tail.end, 3600), together(parts), CATALOGUE, parts=parts)
    rows = charges(parts, doc)
    a = [c for c in rows if c.uuid == "GPU-a"]
    assert [(c.start, c.end, c.hours, c.basis, c.price_per_hour, c.cost) for c in a] == [
        (head.start, tail.end, 200.0, AVERAGE, 0.75, Decimal("150"))
    ]
    assert [c.cost for c in rows if c.uuid == "GPU-b"] == [Decimal("400")]


def test_a_cost_without_hours_in_a_range_cut_in_pieces_is_charged_over_the_whole_range() -> None:
    """Another GPU's price change cuts the range in two: a GPU priced step by step still has one period,
    the range, for its cost without hours (ivy) as for its hours; and float noise below zero is shown
    as 0 h, not -0 h (eve)."""
    cut = 50
    first, second = f"hours:1:{cut - 1}", f"hours:{cut}:{W.points}"
    r = empty()
    add_gpu(r, GPU_B, H100, {}, w=W)
    add_gpu(r, GPU_A, H100, {}, w=W)
    r["prices"] = [({**GPU_B, "currency": "USD"}, steps(W, [2.0] * (cut - 1) + [2.5] * (W.points - cut + 1))),
                   ({**GPU_A, "currency": "USD"}, steps(W, [None] + [3.0] * 99))]  # fmt: skip
    r[first] = [({**GPU_B, "state": "idle"}, 49.0), ({**GPU_A, "state": "idle"}, 49.0)]
    r[second] = [({**GPU_B, "state": "idle"}, 51.0), ({**GPU_A, "state": "idle"}, 51.0),
                 ({**GPU_A, "user": "eve", "state": "busy"}, -1e-12)]  # fmt: skip
    r["cost"] = [({**GPU_A, "state": "idle", "currency": "USD"}, 297.0),
                 ({**GPU_A, "user": "eve", "state": "busy", "currency": "USD"}, 0.001),
                 ({**GPU_A, "user": "ivy", "state": "busy", "currency": "USD"}, 0.002)]  # fmt: skip
    doc, rows = _charges(r)
    b = [(c.start, c.end, c.price_per_hour) for c in rows if c.uuid == "GPU-b"]
    assert b == [(W.start, W.start + 49 * 3600, 2.0), (W.start + 49 * 3600, W.end, 2.5)]
    a = {c.holder.user: c for c in rows if c.uuid == "GPU-a"}
    assert {(c.start, c.end, c.basis) for c in a.values()} == {(W.start, W.end, AVERAGE)}
    assert a["eve"].hours == 0.0 and math.copysign(1.0, a["eve"].hours) == 1.0
    assert (a["ivy"].cost, a["eve"].cost) == (Decimal("0.002"), Decimal("0.001"))
    assert _total(rows) == Decimal(str(doc["totals"]["cost"]))
