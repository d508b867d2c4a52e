"""The report's figures from what Prometheus answers (``report.model.build``), where the answers are
not the tidy week of test_report_history: a GPU replaced during the range, series without a uuid or
node label (another exporter, an older gpu-exporter), an exporter that restarted on a new address,
GPUs in MIG mode, indices past 9, float noise around zero.

Each test gives ``build`` the query results as the client returns them: (labels, value) pairs, with
the labels Prometheus keeps (an empty label is no label)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pytest

from gpu_exporter.accounting.settings import PricingSettings
from gpu_exporter.report.catalogue import load_catalogue
from gpu_exporter.report.model import Options, build
from gpu_exporter.report.queries import Window, window_for
from tests import assert_mentions

GIB = 1024**3
END = 1_796_000_400.0  # a whole hour
START = END - 100 * 3600  # 100 h
W = window_for(START, END)
W200 = window_for(END - 200 * 3600, END)
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
CATALOGUE = load_catalogue()


def empty() -> dict[str, Any]:
    return {k: [] for k in ("hours", "prices", "seen", "info", "memory_total", "memory_peak", "activity", "timeline")}


def steps(w: Window, price: float | Sequence[float | None], currency: str = "USD") -> list[tuple[float, float]]:
    """A GPU's price at the end of each step, as the prices range query answers: one price throughout,
    or one per step (None: no price at that step)."""
    each = [price] * w.points if isinstance(price, float | int) else price
    return [(w.start + (k + 1) * w.step, v) for k, v in enumerate(each) if v is not None]


def add_gpu(r: dict[str, Any], key: dict[str, str], model: str, hours: dict[str, float], *, price: float | None = None,
            holder: dict[str, str] | None = None, peak: float | None = None, total: float = 80 * GIB,
            activity: float | None = None, mig_mode: str = "disabled", w: Window = W) -> None:  # fmt: skip
    """One GPU's answers: its hours by state (held ones by ``holder``), one price all range long."""
    for state, h in hours.items():
        held = holder if holder and state in ("busy", "allocated_idle") else {}
        r["hours"].append(({**key, **held, "state": state}, h))
    if price is not None:
        r["prices"].append(({**key, "currency": "USD"}, steps(w, price)))
    r["seen"].append((key, float(w.points)))
    r["info"].append(({**key, "name": model, "mig_mode": mig_mode}, 1.0))
    r["memory_total"].append((key, total))
    if peak is not None:
        r["memory_peak"].append((key, peak))
    if activity is not None:
        # A GPU with GPM: its SM activity, and pipes, DRAM and NVLink it barely used.
        for signal, v in (("sm_active", activity), ("dram_active", 0.0), ("tensor_active", 0.0), ("fp64_active", 0.0),
                          ("fp32_active", 0.0), ("fp16_active", 0.0), ("nvlink_tx", 0.0)):  # fmt: skip
            r["activity"].append(({**key, "signal": signal}, v))


def rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str | None, float]]:
    return [(g["node"], g["gpu"], g["uuid"], g["model"], g["gpu_hours"]) for g in doc["gpus"]]


def test_a_gpu_replaced_during_the_range_is_two_gpus() -> None:
    """Node n1's GPU 0 was an H100 for 60 h, then a new card (a new UUID) at the same index: each is a
    GPU of its own, with its own model, hours and cost, not one GPU with the hours of both."""
    r = empty()
    pod = {"namespace": "ml", "pod": "a"}
    old = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-old"}
    add_gpu(r, old, H100, {"busy": 50.0, "allocated_idle": 10.0}, price=3.0, holder=pod)
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-new"}, L4, {"allocated_idle": 40.0},
            price=0.8, holder=pod)  # fmt: skip
    doc = build(W, r, CATALOGUE)
    assert rows(doc) == [("n1", "0", "GPU-new", L4, 40.0), ("n1", "0", "GPU-old", H100, 60.0)]
    assert [g["cost"] for g in doc["gpus"]] == [32.0, 180.0]
    assert doc["totals"]["gpus"] == 2 and doc["totals"]["cost"] == 212.0
    (holder,) = doc["holders"]
    assert (holder["gpus"], holder["gpu_hours"], holder["cost"], holder["wasted_cost"]) == (2, 100.0, 212.0, 62.0)


def test_series_without_a_uuid_are_one_gpu_per_node_and_index_whatever_the_instance() -> None:
    """Without a uuid label, a GPU is its node and index: n1's GPU 0, whose exporter restarted on a new
    address half-way (a new ``instance``), is still one GPU with 100 h; n1's GPU 1 and n2's GPU 0 are others."""
    r = empty()
    add_gpu(r, {"node": "n1", "instance": "10.0.0.1:9445", "gpu": "0"}, H100, {"busy": 50.0}, price=3.0)
    r["hours"].append(({"node": "n1", "instance": "10.0.0.7:9445", "gpu": "0", "state": "busy"}, 50.0))
    add_gpu(r, {"node": "n1", "instance": "10.0.0.7:9445", "gpu": "1"}, H100, {"idle": 100.0})
    add_gpu(r, {"node": "n2", "instance": "10.0.0.2:9445", "gpu": "0"}, L4, {"down": 100.0})
    doc = build(W, r, CATALOGUE)
    assert rows(doc) == [("n1", "0", "", H100, 100.0), ("n1", "1", "", H100, 100.0), ("n2", "0", "", L4, 100.0)]
    assert doc["totals"]["gpus"] == 3


def test_series_without_a_node_label_are_told_apart_by_instance() -> None:
    """Scraped without the node label (no relabelling), GPUs are their exporter's address and index,
    and the report names the node by that address."""
    r = empty()
    add_gpu(r, {"instance": "a:9445", "gpu": "0"}, H100, {"busy": 100.0})
    add_gpu(r, {"instance": "b:9445", "gpu": "0"}, H100, {"allocated_idle": 100.0})
    add_gpu(r, {"instance": "b:9445", "gpu": "1"}, L4, {"idle": 100.0})
    doc = build(W, r, CATALOGUE)
    assert rows(doc) == [("a:9445", "0", "", H100, 100.0), ("b:9445", "0", "", H100, 100.0),
                         ("b:9445", "1", "", L4, 100.0)]  # fmt: skip
    assert [(g["busy_hours"], g["allocated_idle_hours"], g["idle_hours"], g["down_hours"]) for g in doc["gpus"]] == [
        (100.0, 0.0, 0.0, 0.0), (0.0, 100.0, 0.0, 0.0), (0.0, 0.0, 100.0, 0.0)]  # fmt: skip


def test_gpus_are_listed_by_node_then_index_in_numbers() -> None:
    """GPU 2 before GPU 10 (not as text), and an index that is no number (a MIG device "0/1") after them."""
    r = empty()
    for gpu in ("10", "2", "0/1", "0"):
        add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": gpu, "uuid": f"GPU-{gpu}"}, H100, {"idle": 100.0})
    add_gpu(r, {"node": "n0", "instance": "n0:9445", "gpu": "3", "uuid": "GPU-n0"}, H100, {"idle": 100.0})
    doc = build(W, r, CATALOGUE)
    assert [(g["node"], g["gpu"]) for g in doc["gpus"]] == [("n0", "3"), ("n1", "0"), ("n1", "2"), ("n1", "10"),
                                                            ("n1", "0/1")]  # fmt: skip


def test_a_gpu_in_mig_mode_at_any_point_of_the_range_gets_no_card() -> None:
    """A light job on an H100 is told of a smaller card; the same GPU, in MIG mode for part of the range
    (two info series), is not: its slices were sized by someone, and the report cannot see each one's use."""

    def light(mig: list[str]) -> dict[str, Any]:
        r = empty()
        key = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}
        add_gpu(r, key, H100, {"busy": 100.0}, price=3.0, holder={"namespace": "ml", "pod": "a"}, peak=6 * GIB,
                activity=0.05, mig_mode=mig[0])  # fmt: skip
        r["info"] += [({**key, "name": H100, "mig_mode": m}, 1.0) for m in mig[1:]]
        return r

    advised = build(W, light(["disabled"]), CATALOGUE)["recommendations"]
    assert [x["suggested"] for x in advised] == ["H100 80GB MIG 1g.10gb"]
    for mig in (["enabled"], ["enabled", "disabled"], ["disabled", "enabled"]):
        assert build(W, light(mig), CATALOGUE)["recommendations"] == [], mig


def test_float_noise_below_zero_is_reported_as_zero_not_minus_zero() -> None:
    """increase() and sums of products can land a hair below zero; the report says 0.0, never -0.0."""
    r = empty()
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}, H100,
            {"busy": 100.0, "allocated_idle": -1e-12}, price=3.0, holder={"namespace": "ml", "pod": "a"})  # fmt: skip
    r["timeline"] = [({"state": "busy"}, [(END, 1.0)]), ({"state": "allocated_idle"}, [(END, -1e-12)])]
    doc = build(W, r, CATALOGUE)
    (g,) = doc["gpus"]
    assert (g["allocated_idle_hours"], g["wasted_cost"]) == (0.0, 0.0)
    assert "-0.0" not in json.dumps(doc), json.dumps(doc)


def test_a_state_this_report_does_not_know_is_left_out_and_the_rest_kept() -> None:
    """A newer exporter with a state this report does not know ("maintenance"): its hours are left out
    of every figure, wherever its series comes in the answer, and the known states are all kept."""
    r = empty()
    key = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}
    r["hours"].append(({**key, "state": "maintenance"}, 5.0))
    add_gpu(r, key, H100, {"busy": 60.0, "idle": 35.0}, price=3.0)
    r["timeline"] = [({"state": "maintenance"}, [(END - 3600, 0.1)]), ({"state": "busy"}, [(END - 3600, 0.6)]),
                     ({"state": "idle"}, [(END - 3600, 0.3)])]  # fmt: skip
    doc = build(W, r, CATALOGUE)
    (g,) = doc["gpus"]
    assert (g["gpu_hours"], g["busy_hours"], g["idle_hours"], g["cost"]) == (95.0, 60.0, 35.0, 285.0)
    (point,) = doc["timeline"]
    assert (point["busy_hours"], point["idle_hours"], point["down_hours"]) == (0.6, 0.3, 0.0)
    assert "maintenance_hours" not in point


def test_what_nobody_is_known_to_hold_has_no_holder() -> None:
    """Busy with no pod and no user known (an unattributed process), idle or down: the GPU's hours and
    cost, but no holder row and no main holder."""
    r = empty()
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}, H100,
            {"busy": 50.0, "idle": 40.0, "down": 10.0}, price=3.0)  # fmt: skip
    doc = build(W, r, CATALOGUE)
    (g,) = doc["gpus"]
    assert (g["holder"], g["busy_hours"], g["cost"]) == ("", 50.0, 300.0)
    assert doc["holders"] == []


def shared() -> dict[str, Any]:
    """Two H100s: GPU-0 held by pod ml/z (40 h busy) then pod ml/a (30 h busy, 20 h idle-held), priced
    3.00; GPU-1, with no price, held by pod ml/a (100 h allocated but idle) and listed first."""
    r = empty()
    k0 = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}
    k1 = {"node": "n1", "instance": "n1:9445", "gpu": "1", "uuid": "GPU-1"}
    add_gpu(r, k1, H100, {"allocated_idle": 100.0}, holder={"namespace": "ml", "pod": "a"})
    add_gpu(r, k0, H100, {"busy": 40.0}, price=3.0, holder={"namespace": "ml", "pod": "z"})
    r["hours"] += [({**k0, "namespace": "ml", "pod": "a", "state": "busy"}, 30.0),
                   ({**k0, "namespace": "ml", "pod": "a", "state": "allocated_idle"}, 20.0)]  # fmt: skip
    return r


def test_a_gpu_held_by_several_is_the_main_holders_who_held_it_longest_and_each_pays_its_share() -> None:
    doc = build(W, shared(), CATALOGUE)
    g1, g0 = doc["gpus"][1], doc["gpus"][0]
    assert (g0["uuid"], g0["holder"]) == ("GPU-0", "pod ml/a")  # 30 + 20 h against pod ml/z's 40, listed first
    assert (g0["cost"], g0["wasted_cost"], g0["price_per_hour"]) == (270.0, 60.0, 3.0)
    # No price: no cost, no waste, no price, for the GPU and for whoever held only it.
    assert (g1["uuid"], g1["holder"], g1["cost"], g1["wasted_cost"], g1["price_per_hour"]) == \
        ("GPU-1", "pod ml/a", None, None, None)  # fmt: skip
    a, z = doc["holders"]
    assert (a["holder"], a["gpus"], a["gpu_hours"], a["busy_hours"], a["allocated_idle_hours"]) == \
        ("pod ml/a", 2, 150.0, 30.0, 120.0)  # fmt: skip
    assert (a["cost"], a["wasted_cost"]) == (150.0, 60.0)  # what it held on the priced GPU: 30 + 20 h x 3.00
    assert (z["holder"], z["gpus"], z["gpu_hours"], z["cost"], z["wasted_cost"]) == ("pod ml/z", 1, 40.0, 120.0, 0.0)
    unpriced = shared()
    unpriced["prices"] = []
    doc = build(W, unpriced, CATALOGUE)
    assert [(h["holder"], h["cost"], h["wasted_cost"]) for h in doc["holders"]] == [
        ("pod ml/a", None, None), ("pod ml/z", None, None)]  # fmt: skip
    assert (doc["totals"]["cost"], doc["totals"]["wasted_cost"], doc["totals"]["unpriced_gpus"]) == (None, None, 2)


def test_a_priced_gpu_seen_for_no_time_has_no_price_per_hour() -> None:
    """A GPU that appeared at the very end of the range: 0 hours, so 0 cost, and no price per hour
    to divide out of them (not a division by zero)."""
    r = empty()
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}, H100, {"idle": 0.0}, price=3.0)
    (g,) = build(W, r, CATALOGUE)["gpus"]
    assert (g["gpu_hours"], g["cost"], g["price_per_hour"]) == (0.0, 0.0, None)


def test_holders_with_as_many_idle_hours_are_listed_by_name() -> None:
    r = empty()
    for i, pod in enumerate(("c", "a", "b")):
        add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": str(i), "uuid": f"GPU-{i}"}, H100,
                {"allocated_idle": 10.0, "busy": 90.0}, holder={"namespace": "ml", "pod": pod})  # fmt: skip
    assert [h["holder"] for h in build(W, r, CATALOGUE)["holders"]] == ["pod ml/a", "pod ml/b", "pod ml/c"]


def light_h100s(prices: tuple[float | None, ...], w: Window = W) -> dict[str, Any]:
    """H100s each held all the range by a light job (6 GiB, 4% SM activity: any slice or small card
    holds it at full speed), at these prices (None: none)."""
    r = empty()
    for i, price in enumerate(prices):
        key = {"node": "n1", "instance": "n1:9445", "gpu": str(i), "uuid": f"GPU-{i}"}
        add_gpu(r, key, H100, {"busy": w.hours}, price=price, holder={"namespace": "ml", "pod": f"job-{i}"},
                peak=6 * GIB, activity=0.04, w=w)  # fmt: skip
    return r


@pytest.mark.parametrize("hours", [100.0, 0.5])
def test_a_gpu_without_a_price_is_not_advised_at_anyone_elses(hours: float) -> None:
    """Issue 25: an unpriced node's GPU was told "saves $146/month". Two H100s bill 3.00 and 2.60 an hour
    and are told of a slice of themselves; the third, with no price, is told nothing about money: no
    card (there is no price to compare with), no saving. Over 100 h a month's figure; over the last half
    hour none (less than the 24 h a monthly figure needs)."""
    w = window_for(END - hours * 3600, END)
    doc = build(w, light_h100s((3.0, 2.6, None), w), CATALOGUE)
    assert [g["price_per_hour"] for g in doc["gpus"]] == [3.0, 2.6, None]
    recs = {r["gpu"]: r for r in doc["recommendations"]}
    assert set(recs) == {"0", "1"}
    for gpu, price_now in (("0", 3.0), ("1", 2.6)):
        rec = recs[gpu]
        assert rec["suggested"] == "H100 80GB MIG 1g.10gb" and rec["suggested_price_per_hour"] == round(
            price_now / 7, 4
        )
        if hours >= 24:
            assert rec["saving_per_month"] == pytest.approx(price_now * 6 / 7 * 730, abs=0.01)
            assert rec["no_saving_figure"] is None
        else:
            assert rec["saving_per_month"] is None and rec["no_saving_figure"] == "too little history"
    assert [r["gpu"] for r in doc["recommendations"]] == ["0", "1"]  # the largest saving first, then by GPU


def test_the_saving_thresholds_reach_the_advice() -> None:
    r = light_h100s((3.0,))
    assert build(W, r, CATALOGUE)["recommendations"]
    assert build(W, r, CATALOGUE, Options(min_saving=1e6))["recommendations"] == []
    assert build(W, r, CATALOGUE, Options(min_saving_ratio=0.99))["recommendations"] == []
    assert build(W, r, CATALOGUE, Options(min_history_hours=101))["recommendations"][0]["saving_per_month"] is None


def test_the_report_is_in_the_currency_of_its_prices_and_without_one_when_nothing_is_priced() -> None:
    busy = empty()  # a busy, heavy H100: nothing to advise
    add_gpu(busy, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}, H100, {"busy": 100.0},
            price=3.0, holder={"namespace": "ml", "pod": "big"}, peak=70 * GIB, activity=0.9)  # fmt: skip
    doc = build(W, busy, CATALOGUE)
    assert (doc["currency"], doc["recommendations"], doc["status"]) == ("USD", [], "ok")
    busy["prices"] = []
    doc = build(W, busy, CATALOGUE)
    assert (doc["currency"], doc["status"]) == (None, "no_prices")  # no price: no money at all
    assert_mentions(doc["status_reason"], "no prices", "gpu_price_per_hour")
    # Issue 25: a light job on an unpriced H100 was advised at the catalogue's example prices.
    doc = build(W, light_h100s((None,)), CATALOGUE)
    assert doc["currency"] is None and doc["totals"]["cost"] is None and doc["recommendations"] == []


def test_a_fleet_priced_in_another_currency_is_advised_in_it() -> None:
    """Priced in EUR, an H100 is told of its own MIG slices (its EUR price x the share)."""
    r = light_h100s((2.80,))
    for labels, _ in r["prices"]:
        labels["currency"] = "EUR"
    doc = build(W, r, CATALOGUE)
    (rec,) = doc["recommendations"]
    assert doc["currency"] == "EUR"
    assert rec["suggested"] == "H100 80GB MIG 1g.10gb" and rec["suggested_price_per_hour"] == 0.4
    assert "€1,752/month" in rec["reason"]
    doc = build(W, r, CATALOGUE, Options(currency="USD"))
    assert (doc["status"], doc["currency"], doc["totals"]["cost"]) == ("no_currency", None, None)
    assert_mentions(doc["status_reason"], "no prices in USD", "EUR", "leave out --currency")


def test_where_prices_changed_the_hours_are_asked_in_pieces_of_one_price_each() -> None:
    """Issue 25: step-by-step pricing was slow (one more pass over every counter) and dropped steps
    whose price was stale. GPU-1's price went from 3.00 to 4.00 at step 61, GPU-2's from 1.00 to 1.50 at
    step 31: the range is cut at steps 31 and 61, and each piece priced by its one price per GPU.
    GPU-0's one price all range long costs its hours x that price."""
    from gpu_exporter.report.cost import plan

    w = window_for(START, END, 1200)  # hour-long steps: 100 of them
    assert w.points == 100
    r = empty()
    key = {"node": "n1", "instance": "n1:9445"}
    add_gpu(r, {**key, "gpu": "0", "uuid": "GPU-0"}, H100, {"busy": 100.0}, price=3.0, w=w)
    r["hours"] = []
    for gpu, prices in (("1", [3.0] * 60 + [4.0] * 40), ("2", [1.0] * 30 + [1.5] * 70)):
        add_gpu(r, {**key, "gpu": gpu, "uuid": f"GPU-{gpu}"}, H100, {}, w=w)
        r["prices"].append(({**key, "gpu": gpu, "uuid": f"GPU-{gpu}", "currency": "USD"}, steps(w, prices)))
    p = plan(w, r, "USD")
    assert p.pieces == [(1, 30), (31, 60), (61, 100)] and p.steady == {gk("GPU-0"): 3.0} and p.exact == {}
    assert p.by_piece == {gk("GPU-1"): [3.0, 3.0, 4.0], gk("GPU-2"): [1.0, 1.5, 1.5]}
    assert p.last == {gk("GPU-0"): 3.0, gk("GPU-1"): 4.0, gk("GPU-2"): 1.5}
    for (a, b), share in zip(p.pieces, (0.3, 0.3, 0.4), strict=True):  # each GPU busy throughout
        r[f"hours:{a}:{b}"] = [({**key, "gpu": g, "uuid": f"GPU-{g}", "state": "busy"}, 100 * share)
                               for g in ("0", "1", "2")]  # fmt: skip
    doc = build(w, r, CATALOGUE)
    costs = {g["gpu"]: (g["busy_hours"], g["cost"], g["price_now_per_hour"]) for g in doc["gpus"]}
    assert costs == {"0": (100.0, 300.0, 3.0), "1": (100.0, 60 * 3.0 + 40 * 4.0, 4.0),
                     "2": (100.0, 30 * 1.0 + 70 * 1.5, 1.5)}  # fmt: skip


def test_a_price_missing_at_a_step_the_gpu_was_seen_is_priced_by_the_step_by_step_query() -> None:
    """Pricing turned on half-way: hours x price would charge the first half too. Only the step-by-step
    query prices it right, and only that GPU is asked for, by its uuid; a GPU without a uuid (an older
    exporter) makes the query read every GPU, and the report keeps the one it asked for."""
    from gpu_exporter.report.cost import plan
    from gpu_exporter.report.queries import exact_cost

    r = empty()
    key = {"node": "n1", "instance": "n1:9445"}
    add_gpu(r, {**key, "gpu": "0", "uuid": "GPU-0"}, H100, {"busy": 100.0})
    r["prices"].append(({**key, "gpu": "0", "uuid": "GPU-0", "currency": "USD"}, steps(W, [None] * 50 + [3.0] * 50)))
    add_gpu(r, {**key, "gpu": "1"}, H100, {"busy": 100.0})
    r["prices"].append(({**key, "gpu": "1", "currency": "USD"}, steps(W, [None] * 50 + [2.0] * 50)))
    # A third seen only in the second half, priced all that time: steady.
    add_gpu(r, {**key, "gpu": "2", "uuid": "GPU-2"}, H100, {"busy": 50.0})
    r["prices"].append(({**key, "gpu": "2", "uuid": "GPU-2", "currency": "USD"}, steps(W, [None] * 50 + [3.0] * 50)))
    r["seen"] = [(k, 50.0 if k.get("uuid") == "GPU-2" else v) for k, v in r["seen"]]
    p = plan(W, r, "USD")
    assert p.exact == {gk("GPU-0"): "GPU-0", ("n1", "", "1"): ""} and p.steady == {gk("GPU-2"): 3.0}
    assert "uuid=~" not in exact_cost(W, "", sorted(p.exact.values()), "USD").expr
    r["cost"] = [({**key, "gpu": "0", "uuid": "GPU-0", "state": "busy", "currency": "USD"}, 150.0),
                 ({**key, "gpu": "1", "state": "busy", "currency": "USD"}, 100.0),
                 ({**key, "gpu": "2", "uuid": "GPU-2", "state": "busy", "currency": "USD"}, 999.0)]  # fmt: skip
    doc = build(W, r, CATALOGUE)
    assert [(g["gpu"], g["cost"]) for g in doc["gpus"]] == [("0", 150.0), ("1", 100.0), ("2", 150.0)]


def test_a_range_cut_into_too_many_pieces_is_priced_step_by_step_instead() -> None:
    from gpu_exporter.report.cost import MAX_PIECES, plan

    r = empty()
    prices = [1.0 + (k // 10) * 0.1 for k in range(W.points)]  # a new price every 10 steps: 10 pieces
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}, H100, {"busy": 100.0})
    r["prices"] = [({"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0", "currency": "USD"},
                    steps(W, prices))]  # fmt: skip
    assert MAX_PIECES < 10
    p = plan(W, r, "USD")
    assert p.pieces == [(1, W.points)] and p.exact == {gk("GPU-0"): "GPU-0"} and p.by_piece == {}


def test_each_part_of_the_report_has_the_fields_docs_cost_md_lists() -> None:
    doc = build(W, shared(), CATALOGUE)
    hours = {"gpu_hours", "busy_hours", "allocated_idle_hours", "allocated_unknown_hours", "idle_hours", "down_hours"}
    assert set(doc) == {"schema", "range", "status", "status_reason", "currency", "advice_settings", "totals", "gpus",
                        "holders", "recommendations", "timeline"}  # fmt: skip
    assert set(doc["range"]) == {"start", "end", "hours", "step_seconds", "requested_start", "requested_end"}
    assert set(doc["advice_settings"]) == {"min_history_hours", "allow_slower", "allow_consumer_cards", "min_saving",
                                           "min_saving_ratio"}  # fmt: skip
    assert set(doc["totals"]) == hours | {"cost", "wasted_cost", "gpus", "unpriced_gpus", "unpriced_hours",
                                          "merged_gpus", "advised_saving_per_month", "link_bound_hours",
                                          "link_bound_cost"}  # fmt: skip
    for g in doc["gpus"]:
        assert set(g) == {"node", "shown_as", "gpu", "uuid", "model", *hours, "cost", "wasted_cost", "price_per_hour",
                          "price_now_per_hour", "memory_total_bytes", "memory_peak_bytes", "activity_p95",
                          "activity_signal", "dram_active_p95", "holder", "targets", "left_out_targets",
                          "link_bound_hours", "link_bound_cost", "notes", "slices"}  # fmt: skip
        assert g["memory_total_bytes"] == 80 * GIB
    for h in doc["holders"]:
        assert set(h) == {"kind", "holder", "namespace", "pod", "hpc_job", "container", "container_engine", "user",
                          "gpus", "gpu_hours", "busy_hours", "allocated_idle_hours", "allocated_unknown_hours",
                          "cost", "wasted_cost",
                          "unpriced_hours"}  # fmt: skip
    (rec,) = build(W, light_h100s((3.0,)), CATALOGUE)["recommendations"]
    assert set(rec) == {"node", "shown_as", "gpu", "uuid", "holder", "current_model", "gpus", "kind", "suggested",
                        "reason", "saving_per_month", "suggested_price_per_hour", "slowdown", "price_source",
                        "seen_hours", "no_saving_figure", "gpu_instance_id"}  # fmt: skip


def test_a_currency_picked_among_several_counts_every_gpu_priced_in_it() -> None:
    """GPUs priced in EUR and in USD, listed EUR first: --currency USD counts every USD one."""
    r = empty()
    for i, cur in enumerate(("EUR", "USD", "USD")):
        key = {"node": "n1", "instance": "n1:9445", "gpu": str(i), "uuid": f"GPU-{i}"}
        add_gpu(r, key, H100, {"busy": 100.0}, price=3.0)
        r["prices"][-1][0]["currency"] = cur
    doc = build(W, r, CATALOGUE, Options(currency="USD"))
    assert [g["cost"] for g in doc["gpus"]] == [None, 300.0, 300.0] and doc["totals"]["cost"] == 600.0
    # Issue 50: one GPU priced in a second currency (a forged series, one node's old setting) stopped
    # every report without --currency.  The report is in the currency most GPUs are priced in, and
    # the other GPU says why it has no cost.
    doc = build(W, r, CATALOGUE)
    assert doc["currency"] == "USD" and [g["cost"] for g in doc["gpus"]] == [None, 300.0, 300.0]
    (note,) = [n for n in doc["gpus"][0]["notes"] if "EUR" in n]
    assert_mentions(note, "EUR", "USD", "--currency EUR")
    assert not any("EUR" in n for g in doc["gpus"][1:] for n in g["notes"])
    r["prices"][-1][0]["currency"] = "GBP"  # an even split is no fleet's currency: the report still asks
    with pytest.raises(ValueError, match="several currencies \\(EUR, GBP, USD\\); pick one with --currency"):
        build(W, r, CATALOGUE)


def test_a_gpu_priced_in_two_currencies_at_once_is_priced_in_the_one_picked() -> None:
    """Two price series for one GPU all range long, in USD and in EUR (two exporters with different
    settings): the report asks which to show, and prices the GPU in that one alone."""
    from gpu_exporter.report.cost import plan

    r = empty()
    key = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}
    add_gpu(r, key, H100, {"busy": 100.0}, price=3.0)
    r["prices"].append(({**key, "currency": "EUR"}, steps(W, 2.8)))
    assert plan(W, r, "EUR").steady == {gk("GPU-0"): 2.8}
    with pytest.raises(ValueError, match="several currencies"):
        build(W, r, CATALOGUE)
    assert build(W, r, CATALOGUE, Options(currency="EUR"))["totals"]["cost"] == 280.0
    assert build(W, r, CATALOGUE, Options(currency="USD"))["totals"]["cost"] == 300.0


def test_the_reports_times_are_utc_whatever_the_machines_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The JSON's times end in Z: on a machine set to Tokyo time they must still be UTC."""
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        doc = build(window_for(START, END), empty(), CATALOGUE)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert doc["range"] == {"start": "2026-11-25T21:00:00Z", "end": "2026-11-30T01:00:00Z", "hours": 100.0,
                            "step_seconds": 500, "requested_start": None, "requested_end": None}  # fmt: skip


def test_a_negative_price_is_no_price() -> None:
    """A misconfigured exporter's negative price is left out: no cost from it, never a negative one."""
    r = empty()
    key = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}
    add_gpu(r, key, H100, {"busy": 100.0}, price=-3.0)
    (g,) = build(W, r, CATALOGUE)["gpus"]
    assert (g["cost"], g["price_now_per_hour"]) == (None, None)


# -- cost.plan: which price each step's hours are multiplied by -----------------------------------------------
def gk(uuid: str) -> tuple[str, str, str]:
    """The key of a GPU of node n1 (cost.gpu_key): its uuid on its node."""
    return ("n1", uuid, "")


def priced(*gpus: tuple[str, Sequence[float | None]], seen: dict[str, float] | None = None,
           currency: str = "USD", w: Window = W) -> dict[str, Any]:  # fmt: skip
    """GPUs GPU-<name>, each with its price at every step (None: none there)."""
    r = empty()
    for name, prices in gpus:
        key = {"node": "n1", "instance": "n1:9445", "gpu": name, "uuid": f"GPU-{name}"}
        r["prices"].append(({**key, "currency": currency}, steps(w, prices)))
        r["seen"].append((key, (seen or {}).get(name, float(w.points))))
    return r


def test_a_price_of_nothing_is_a_price_and_a_negative_one_none() -> None:
    from gpu_exporter.report.cost import plan

    p = plan(W, priced(("0", [0.0] * W.points), ("1", [-1.0] * W.points), ("2", [2.0] * W.points)), "USD")
    assert p.steady == {gk("GPU-0"): 0.0, gk("GPU-2"): 2.0} and gk("GPU-1") not in p.last and p.exact == {}


def test_a_currency_whose_every_price_was_left_out_is_no_currency() -> None:
    from gpu_exporter.report.cost import currencies, pick_currency

    r = priced(("0", [2.0] * W.points))
    r["prices"].append(({"node": "n1", "instance": "n1:9445", "gpu": "1", "uuid": "GPU-1", "currency": "EUR"}, []))
    assert currencies(r) == ["USD"] and pick_currency(r, None) == "USD" and pick_currency(r, "EUR") == "EUR"


def test_the_last_price_is_the_last_steps_and_a_gpu_seen_once_has_one() -> None:
    """A price that changes at the very last step: that is the price now. A GPU seen at one step only,
    priced there: steady, at that price. Without the 'down' series (an older exporter), a GPU counts as
    seen at every step."""
    from gpu_exporter.report.cost import plan

    w = window_for(START, END, 1200)  # 100 steps
    r = priced(("0", [3.0] * 99 + [4.0]), ("1", [None] * 99 + [2.5]), ("2", [1.0] * 100), seen={"1": 1}, w=w)
    r["seen"] = [(k, v) for k, v in r["seen"] if k["gpu"] != "2"]
    p = plan(w, r, "USD")
    assert p.last == {gk("GPU-0"): 4.0, gk("GPU-1"): 2.5, gk("GPU-2"): 1.0}
    assert p.steady == {gk("GPU-1"): 2.5, gk("GPU-2"): 1.0} and p.by_piece == {gk("GPU-0"): [3.0, 4.0]}
    assert p.pieces == [(1, 99), (100, 100)]  # a piece of one step has its price too
    r["prices"].insert(
        0,
        ({"node": "n0", "instance": "n0:9445", "gpu": "9", "uuid": "GPU-9", "currency": "USD"}, steps(w, [-1.0] * 100)),
    )  # listed first, no price at all: the others are still read
    assert plan(w, r, "USD").last == {gk("GPU-0"): 4.0, gk("GPU-1"): 2.5, gk("GPU-2"): 1.0}


@pytest.mark.parametrize(("changes", "pieces"), [(7, 8), (8, None)])
def test_up_to_eight_pieces_of_one_price_each_then_step_by_step(changes: int, pieces: int | None) -> None:
    from gpu_exporter.report.cost import MAX_PIECES, plan

    assert MAX_PIECES == 8
    w = window_for(START, END, 1200)  # 100 steps
    prices: list[float | None] = [1.0 + (k * (changes + 1) // 100) / 10 for k in range(100)]
    p = plan(w, priced(("0", prices), w=w), "USD")
    if pieces is None:
        assert p.pieces == [(1, 100)] and p.exact == {gk("GPU-0"): "GPU-0"}
    else:
        assert len(p.pieces) == pieces and p.pieces[0][0] == 1 and p.pieces[-1][1] == 100 and p.exact == {}
        assert all(b + 1 == c for (_, b), (c, _) in zip(p.pieces, p.pieces[1:], strict=False))


def users_and_signals(w: Window = W200) -> dict[str, Any]:
    """n1 GPU 0, an H100 at 3.00: Unix users bob (busy 5 h, held idle 55 h), alice (held idle 50 h, in two
    series, the second her container's) and aaron (busy 10 h); alice and aaron hold it now. SM activity
    0.123456, DRAM 0.054321.
    n1 GPU 1, an L4 at 0.80 with GPU-Util only (0.654321), nobody's.
    n1 GPU 2, an unpriced H100 that user alice and pod ml/p hold busy, 100 h and 20 h.
    n1 GPU 3, an H100 at 3.00 nobody holds now: xavier (busy 30 h, idle 35 h) and erin (idle 36 h, in two
    series of 20 and 16 h).
    n1 GPU 4, a priced card the catalogue does not know, and n1 GPU 5, a GPU with no model at all.
    n1 GPU 6, an H100 at 3.00 held busy by zoe and amy, 10 h each, neither now.
    Over 200 h: no GPU holds more hours than the range."""
    r = empty()
    node = {"node": "n1", "instance": "n1:9445"}
    k0 = {**node, "gpu": "0", "uuid": "GPU-0"}
    add_gpu(r, k0, H100, {}, price=3.0, peak=10 * GIB, w=w)
    r["hours"] += [({**k0, "user": "bob", "state": "busy"}, 5.0),
                   ({**k0, "user": "bob", "state": "allocated_idle"}, 55.0),
                   ({**k0, "user": "alice", "state": "allocated_idle"}, 30.0),
                   ({**k0, "user": "alice", "container": "side", "state": "allocated_idle"}, 20.0),
                   ({**k0, "user": "aaron", "state": "busy"}, 10.0)]  # fmt: skip
    r["activity"] += [({**k0, "signal": "sm_active"}, 0.123456), ({**k0, "signal": "utilization"}, 0.99),
                      ({**k0, "signal": "dram_active"}, 0.054321)]  # fmt: skip
    r["holders_now"] = [
        ({**k0, "user": "alice"}, 1.0),
        ({**k0, "user": "aaron"}, 1.0),
        ({**k0, "user": "bob"}, 0.0),
        ({"node": "n9", "instance": "n9:9445", "gpu": "0", "uuid": "GPU-gone", "user": "eve"}, 1.0),
    ]
    k1 = {**node, "gpu": "1", "uuid": "GPU-1"}
    add_gpu(r, k1, L4, {"idle": 40.0, "busy": 60.0}, price=0.8, total=22.5 * GIB, w=w)
    r["activity"].append(({**k1, "signal": "utilization"}, 0.654321))
    k2 = {**node, "gpu": "2", "uuid": "GPU-2"}
    add_gpu(r, k2, H100, {"busy": 100.0}, holder={"user": "alice"}, w=w)
    r["hours"].append(({**k2, "namespace": "ml", "pod": "p", "state": "busy"}, 20.0))
    k3 = {**node, "gpu": "3", "uuid": "GPU-3"}
    add_gpu(r, k3, H100, {}, price=3.0, w=w)
    r["hours"] += [({**k3, "user": "xavier", "state": "busy"}, 30.0),
                   ({**k3, "user": "xavier", "state": "allocated_idle"}, 35.0),
                   ({**k3, "user": "erin", "state": "allocated_idle"}, 20.0),
                   ({**k3, "user": "erin", "container": "b", "state": "allocated_idle"}, 16.0)]  # fmt: skip
    add_gpu(r, {**node, "gpu": "4", "uuid": "GPU-4"}, "NVIDIA GeForce GT 710", {"busy": 100.0}, price=0.1,
            total=2 * GIB, w=w)  # fmt: skip
    k5 = {**node, "gpu": "5", "uuid": "GPU-5"}
    add_gpu(r, k5, H100, {"busy": 100.0}, price=3.0, w=w)
    r["info"] = [(labels, v) for labels, v in r["info"] if labels.get("uuid") != "GPU-5"]
    k6 = {**node, "gpu": "6", "uuid": "GPU-6"}
    add_gpu(r, k6, H100, {}, price=3.0, w=w)
    r["hours"] += [({**k6, "user": "zoe", "state": "busy"}, 10.0), ({**k6, "user": "amy", "state": "busy"}, 10.0)]
    return r


def test_users_signals_and_who_holds_it_now_reach_every_field() -> None:
    doc = build(W200, users_and_signals(), CATALOGUE)
    gpus = {g["gpu"]: g for g in doc["gpus"]}
    g0, g1, g2 = gpus["0"], gpus["1"], gpus["2"]
    # Its holder is who holds it now, of those the one that held it longest (alice 50 h, aaron 10 h), though
    # bob held it longer (60 h).
    assert (g0["holder"], g0["activity_p95"], g0["activity_signal"], g0["dram_active_p95"]) == \
        ("user alice", 0.1235, "SM activity", 0.0543)  # fmt: skip
    assert (g1["holder"], g1["activity_p95"], g1["activity_signal"], g1["dram_active_p95"]) == \
        ("", 0.6543, "GPU utilization", None)  # fmt: skip
    # Held idle 105 of 120 h: reclaimed from alice, who holds it now and left it idle (50 h in two series),
    # though bob left it idle longer (55 h).
    recs = {r["gpu"]: r for r in doc["recommendations"]}
    assert (recs["0"]["kind"], recs["0"]["suggested"]) == ("reclaim", "reclaim from user alice")
    assert_mentions(recs["0"]["reason"], "GPU 0 on n1", H100, "held but left idle", "105 h", "120 h", "88%", "$315",
                    "reclaiming it from user alice", "$1,916/month")  # fmt: skip
    # Nobody holds GPU 3 now: its holder held it longest (xavier, 65 h); erin left it idle longest (36 h).
    assert gpus["3"]["holder"] == "user xavier" and recs["3"]["suggested"] == "reclaim from user erin"
    assert gpus["6"]["holder"] == "user amy"  # as long as zoe: by name
    holders = {h["holder"]: h for h in doc["holders"]}
    alice, bob, pod = holders["user alice"], holders["user bob"], holders["pod ml/p"]
    assert (alice["kind"], alice["user"], alice["namespace"], alice["pod"], alice["gpus"]) == \
        ("user", "alice", "", "", 2)  # fmt: skip
    assert (pod["kind"], pod["user"], pod["namespace"], pod["pod"], pod["unpriced_hours"]) == ("pod", "", "ml", "p",
                                                                                                20.0)  # fmt: skip
    assert (alice["allocated_idle_hours"], alice["busy_hours"], alice["cost"], alice["wasted_cost"],
            alice["unpriced_hours"]) == (50.0, 100.0, 150.0, 150.0, 100.0)  # fmt: skip
    assert (bob["gpu_hours"], bob["cost"], bob["wasted_cost"], bob["unpriced_hours"]) == (60.0, 180.0, 165.0, 0.0)
    assert doc["totals"]["unpriced_hours"] == 120.0 and g2["cost"] is None and g2["holder"] == "user alice"
    assert (gpus["4"]["cost"], gpus["5"]["model"], gpus["5"]["cost"]) == (10.0, None, 300.0)
    assert "4" not in recs and "5" not in recs


def test_the_fleets_price_for_a_card_is_the_highest_it_pays_now() -> None:
    """An L4 job at 0.80 (8 GiB, 50%: 61 TFLOPS): the fleet pays 0.35 and 0.30 for its T4s (65 TFLOPS), the
    highest of which prices the T4 it is told of; two H100s at 3.00 and 2.00 price an H100 slice at 3.00."""
    r = empty()
    node = {"node": "n1", "instance": "n1:9445"}
    add_gpu(r, {**node, "gpu": "0", "uuid": "GPU-0"}, L4, {"busy": 100.0}, price=0.8, total=22.5 * GIB, peak=8 * GIB,
            activity=0.5)  # fmt: skip
    for i, price in ((1, 0.35), (2, 0.30)):
        add_gpu(r, {**node, "gpu": str(i), "uuid": f"GPU-{i}"}, "Tesla T4", {"busy": 100.0}, price=price,
                total=15 * GIB)  # fmt: skip
    (rec,) = build(W, r, CATALOGUE)["recommendations"]
    assert (rec["suggested"], rec["suggested_price_per_hour"]) == ("T4", 0.35)
    r = empty()
    add_gpu(r, {**node, "gpu": "0", "uuid": "GPU-0"}, L4, {"busy": 100.0}, price=1.0, total=22.5 * GIB, peak=12 * GIB,
            activity=0.9)  # fmt: skip
    for i, price in ((1, 3.0), (2, 2.0)):
        add_gpu(r, {**node, "gpu": str(i), "uuid": f"GPU-{i}"}, H100, {"busy": 100.0}, price=price)
    (rec,) = build(W, r, CATALOGUE)["recommendations"]
    assert (rec["suggested"], rec["suggested_price_per_hour"]) == ("H100 80GB MIG 1g.20gb", round(3.0 / 7, 4))


def test_the_status_says_which_prices_are_missing() -> None:
    r = users_and_signals()
    assert (build(W200, r, CATALOGUE)["status"], build(W200, r, CATALOGUE)["status_reason"]) == ("ok", "")
    for labels, _ in r["prices"]:
        labels["currency"] = "EUR" if labels["gpu"] in ("0", "1") else "GBP"
    doc = build(W200, r, CATALOGUE, Options(currency="USD"))
    assert (doc["status"], doc["status_reason"]) == (
        "no_currency",
        "no prices in USD: the GPUs are priced in EUR, GBP; leave out --currency or pick one of those",
    )
    r["prices"] = []
    for currency in (None, "USD"):
        doc = build(W200, r, CATALOGUE, Options(currency=currency))
        assert (doc["status"], doc["status_reason"]) == ("no_prices", (
            "no prices: the store has no gpu_price_per_hour for these GPUs in the range; set the exporter's pricing "
            "section (docs/cost.md) to see costs"))  # fmt: skip


def test_the_timeline_has_a_point_per_step() -> None:
    r = empty()
    r["timeline"] = [({"state": "busy"}, [(END - 7200, 1.0), (END - 3600, 0.5)]),
                     ({"state": "idle"}, [(END - 3600, 0.5)])]  # fmt: skip
    assert build(W, r, CATALOGUE)["timeline"] == [
        {"time": "2026-11-29T23:00:00Z", "busy_hours": 1.0, "allocated_idle_hours": 0.0,
         "allocated_unknown_hours": 0.0, "idle_hours": 0.0, "down_hours": 0.0},
        {"time": "2026-11-30T00:00:00Z", "busy_hours": 0.5, "allocated_idle_hours": 0.0,
         "allocated_unknown_hours": 0.0, "idle_hours": 0.5, "down_hours": 0.0},
    ]  # fmt: skip


def test_the_recommendations_come_largest_saving_first_then_without_a_figure_then_slower() -> None:
    """Over 100 h: H100s released (2,190 a month) and reclaimed (1,533), two L4s released (584), an unpriced
    L4 released (no figure), GPU 1 sized to a slower card (no figure): in that order, GPUs of the same
    saving by node and index (2 before 10), the slower card last."""
    r = empty()
    key = {"node": "n1", "instance": "n1:9445"}
    add_gpu(r, {**key, "gpu": "10", "uuid": "GPU-10"}, L4, {"idle": 100.0}, price=0.8, total=22.5 * GIB)
    add_gpu(r, {**key, "gpu": "2", "uuid": "GPU-2"}, L4, {"idle": 100.0}, price=0.8, total=22.5 * GIB)
    add_gpu(r, {**key, "gpu": "3", "uuid": "GPU-3"}, L4, {"idle": 100.0}, total=22.5 * GIB)
    add_gpu(r, {**key, "gpu": "4", "uuid": "GPU-4"}, H100, {"allocated_idle": 70.0, "busy": 30.0}, price=3.0,
            holder={"namespace": "ml", "pod": "a"}, peak=1 * GIB, activity=0.01)  # fmt: skip
    add_gpu(r, {**key, "gpu": "5", "uuid": "GPU-5"}, H100, {"idle": 100.0}, price=3.0)
    add_gpu(r, {**key, "gpu": "1", "uuid": "GPU-1"}, H100, {"busy": 100.0}, price=3.0,
            holder={"namespace": "ml", "pod": "b"}, peak=20 * GIB, activity=0.9)  # fmt: skip
    add_gpu(r, {**key, "gpu": "7", "uuid": "GPU-7"}, "NVIDIA L40S", {"busy": 100.0}, price=1.0, total=45 * GIB)
    doc = build(W, r, CATALOGUE, Options(allow_slower=True, allow_consumer=True))
    order = [(x["gpu"], x["kind"]) for x in doc["recommendations"]]
    assert order == [("5", "release"), ("4", "reclaim"), ("2", "release"), ("10", "release"), ("3", "release"),
                     ("1", "slower")]  # fmt: skip
    assert [x["no_saving_figure"] for x in doc["recommendations"]] == [None] * 4 + ["no price", "a slower card"]
    assert doc["totals"]["advised_saving_per_month"] == round(3.0 * 730 + 3.0 * 0.7 * 730 + 2 * 0.8 * 730, 4)
    slower = doc["recommendations"][-1]
    assert (slower["suggested"], slower["slowdown"], slower["price_source"], slower["no_saving_figure"]) == \
        ("L40S", round(0.9 * 989.4 / 362.05, 2), "the store's gpu_price_per_hour", "a slower card")  # fmt: skip
    assert doc["advice_settings"] == {"min_history_hours": 24.0, "allow_slower": True, "allow_consumer_cards": True,
                                      "min_saving": 0.0, "min_saving_ratio": 0.2}  # fmt: skip
    # Consumer cards only on request reach the sizer: a light job told of an RTX card only when allowed.
    priced_rtx = PricingSettings(currency="USD", models={"RTX 4090": 0.1})
    light = empty()
    add_gpu(light, {**key, "gpu": "0", "uuid": "GPU-0"}, H100, {"busy": 100.0}, price=3.0, peak=10 * GIB,
            activity=0.05)  # fmt: skip
    assert build(W, light, CATALOGUE, Options(pricing=priced_rtx))["recommendations"][0]["suggested"] != "RTX 4090"
    assert build(W, light, CATALOGUE, Options(pricing=priced_rtx, allow_consumer=True))["recommendations"][0][
        "suggested"] == "RTX 4090"  # fmt: skip


def test_a_range_cut_says_where_it_was_asked_to_start_and_end() -> None:
    doc = build(W, empty(), CATALOGUE, Options(requested_start=-86400.0, requested_end=END + 3600))
    assert doc["range"]["requested_start"] == "1969-12-31T00:00:00Z"
    assert doc["range"]["requested_end"] == "2026-11-30T02:00:00Z"
    assert (doc["status"], doc["status_reason"]) == ("no_data", "no gpu-exporter series in the range")
    said = build(W, empty(), CATALOGUE, Options(empty_because=("no_match", "the selector matched nothing")))
    assert (said["status"], said["status_reason"]) == ("no_match", "the selector matched nothing")


def test_a_gpu_not_seen_in_a_piece_has_no_price_there() -> None:
    """GPU-1 changes price at step 61, GPU-2 at step 31; GPU-1's exporter was gone from step 31 to 60 (no
    price, not seen): the range is cut at 31 and 61, and GPU-1's price in the piece it was not seen is
    the one before (it has no hours there to price; the store's answer tells a step without a price
    from one whose price held only by the count of steps priced)."""
    from gpu_exporter.report.cost import plan

    w = window_for(START, END, 1200)  # 100 steps
    p = plan(w, priced(("1", [3.0] * 30 + [None] * 30 + [4.0] * 40), ("2", [1.0] * 30 + [1.5] * 70),
                       seen={"1": 70}, w=w), "USD")  # fmt: skip
    assert p.pieces == [(1, 30), (31, 60), (61, 100)]
    assert p.by_piece == {gk("GPU-1"): [3.0, 3.0, 4.0], gk("GPU-2"): [1.0, 1.5, 1.5]} and p.exact == {}


def test_a_card_is_suggested_in_words_naming_the_holder_and_signal_and_a_whole_card_peak_gets_a_note() -> None:
    r = light_h100s((3.0,))
    (rec,) = build(W, r, CATALOGUE)["recommendations"]
    assert rec["reason"].startswith("pod ml/job-0")  # the holder, first
    assert rec["current_model"] == H100  # the card it would leave, which the advice's title names
    assert_mentions(rec["reason"], "6.0 GiB", "4% SM activity", "p95", H100, "GPU 0 on n1", "100 h",
                    "H100 80GB MIG 1g.10gb")  # fmt: skip
    whole = empty()
    add_gpu(whole, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}, H100, {"busy": 100.0},
            price=3.0, peak=79 * GIB, activity=0.05)  # fmt: skip
    doc = build(W, whole, CATALOGUE)
    assert doc["recommendations"] == [] and "whole card (79.0 of 80.0 GiB)" in doc["gpus"][0]["notes"][0]


def job_of(r: dict[str, Any], job: str, gpus: int, model: str = H100, *, nvlink: float = 0.0, node: str = "n1",
           first: int = 0, holder: dict[str, str] | None = None) -> None:  # fmt: skip
    """A Slurm job on ``gpus`` GPUs of a node, busy all the range at 20% SM and 1% more on each next GPU,
    with 10 GiB, priced 2.50, each GPU sending ``nvlink`` bytes/s over NVLink."""
    for i in range(first, first + gpus):
        key = {"node": node, "instance": f"{node}:9445", "gpu": str(i), "uuid": f"GPU-{node}-{i}"}
        add_gpu(r, key, model, {"busy": W.hours}, price=2.5, holder=holder or {"hpc_job": job, "user": "alice"},
                peak=10 * GIB, activity=0.2 + 0.01 * i)  # fmt: skip
        r["activity"] = [(k, nvlink if k["signal"] == "nvlink_tx" and k["uuid"] == key["uuid"] else v)
                         for k, v in r["activity"]]  # fmt: skip


def test_a_job_on_eight_gpus_is_advised_once_for_all_of_them_with_its_interconnect() -> None:
    """Issue 37: job 4242 on 8 H100s, 270 GB/s each way over NVLink, was told GPU by GPU to move to an
    L40S. It is one recommendation for 8 GPUs, naming the job, the count and the NVLink the candidate
    has, sized for its busiest GPU (27% SM: 267 TFLOPS, which an A100's 312 carries; its NVLink 300 GB/s
    each way carries the 270), and saving for all 8."""
    r = empty()
    job_of(r, "4242", 8, nvlink=270e9)
    prices = PricingSettings(currency="USD", models={"A100": 1.2, "L40S": 0.9})
    doc = build(W, r, CATALOGUE, Options(pricing=prices))
    (rec,) = doc["recommendations"]
    assert (rec["gpus"], rec["gpu"], rec["holder"]) == (8, "0, 1, 2, 3, 4, 5, 6, 7", "job 4242 of alice")
    assert (rec["current_model"], rec["suggested"]) == (H100, "A100 40GB")
    assert rec["saving_per_month"] == pytest.approx((2.5 - 1.2) * 8 * 730)
    assert_mentions(rec["reason"], "8 GPUs", "8 x A100 40GB", "NVLink, 300 GB/s each way", "27% SM activity",
                    "NVLink 270 GB/s each way")  # fmt: skip
    # Without its NVLink traffic the same job fits a slice of its own H100s (2g.20gb: 283 TFLOPS, 0.71).
    quiet = empty()
    job_of(quiet, "4242", 8)
    (rec,) = build(W, quiet, CATALOGUE, Options(pricing=PricingSettings(currency="USD", models={"L40S": 0.9})))[
        "recommendations"
    ]
    assert rec["gpus"] == 8 and "MIG" in rec["suggested"], rec


def test_a_users_gpus_and_a_job_of_mixed_cards_are_not_sized_as_one() -> None:
    """A user's processes are not a job: two GPUs of alice's are advised each on its own. A job on an
    H100 and an A100 cannot be one card's worth of advice: it gets none."""
    r = empty()
    job_of(r, "", 2, holder={"user": "alice"})
    assert [(x["gpus"], x["current_model"]) for x in build(W, r, CATALOGUE)["recommendations"]] == [(1, H100)] * 2
    mixed = empty()
    job_of(mixed, "77", 1)
    job_of(mixed, "77", 1, "NVIDIA A100-SXM4-80GB", first=1)
    assert build(W, mixed, CATALOGUE)["recommendations"] == []


def test_a_holder_is_sized_as_a_job_by_its_kind_not_by_the_words_that_name_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a holder's GPUs are sized as one is its kind's, from its labels: not the first word of
    its name, which is for people to read.  Named otherwise ("Slurm job 4242", "job owner alice"),
    job 4242 on 2 GPUs is still one job, advised once for both, and alice still a user whose two GPUs
    are advised each on its own."""
    from gpu_exporter.report.holders import Holder

    words = {"job": "Slurm job {h.hpc_job} of {h.user}", "user": "job owner {h.user}"}
    monkeypatch.setattr(Holder, "name", property(lambda h: words[h.kind].format(h=h) if h.kind else ""))
    r = empty()
    job_of(r, "4242", 2)
    job_of(r, "", 2, holder={"user": "alice"}, node="n2")
    recs = build(W, r, CATALOGUE)["recommendations"]
    assert sorted((x["holder"], x["gpus"], x["gpu"]) for x in recs) == [
        ("Slurm job 4242 of alice", 2, "0, 1"),
        ("job owner alice", 1, "0"),
        ("job owner alice", 1, "1"),
    ], recs


def test_a_job_seen_for_an_hour_is_still_advised_once_for_all_its_gpus() -> None:
    """Over a one-hour range, with --min-history-hours below it, job 4242's two GPUs get one advice for
    both, as over a week: a short history is no reason to size a job GPU by GPU."""
    w = window_for(END - 3600, END)
    r = empty()
    for i in range(2):
        key = {"node": "n1", "instance": "n1:9445", "gpu": str(i), "uuid": f"GPU-n1-{i}"}
        add_gpu(r, key, H100, {"busy": w.hours}, price=2.5, holder={"hpc_job": "4242", "user": "alice"},
                peak=6 * GIB, activity=0.04, w=w)  # fmt: skip
    (rec,) = build(w, r, CATALOGUE, Options(min_history_hours=0.5))["recommendations"]
    assert (rec["gpus"], rec["gpu"], rec["holder"], rec["seen_hours"]) == (2, "0, 1", "job 4242 of alice", 1.0)


def test_advice_from_gpu_utilization_says_the_gpu_gives_no_pipe_or_dram_activity() -> None:
    """A GPU without GPM (its utilization and NVLink traffic, no SM, pipe or DRAM activity) is sized from
    its utilization, and the advice says what that assumes: every pipe and the memory bandwidth as busy
    as it."""
    r = empty()
    key = {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}
    add_gpu(r, key, H100, {"busy": W.hours}, price=3.0, holder={"namespace": "ml", "pod": "old"}, peak=6 * GIB)
    r["activity"] += [({**key, "signal": "utilization"}, 0.04), ({**key, "signal": "nvlink_tx"}, 0.0)]
    (rec,) = build(W, r, CATALOGUE)["recommendations"]
    assert_mentions(rec["reason"], "4% GPU utilization", "the GPU gives no pipe and DRAM activity")


def test_a_gpu_counted_twice_says_why_and_that_its_hours_are_scaled_down() -> None:
    """150 h busy in the 100 h range: the note gives both figures, the likely cause (one exporter under
    two names that no label tells apart) and what the report did about it."""
    r = empty()
    add_gpu(r, {"node": "n1", "instance": "n1:9445", "gpu": "0", "uuid": "GPU-0"}, H100, {"busy": 150.0}, price=3.0)
    (g,) = build(W, r, CATALOGUE)["gpus"]
    assert g["gpu_hours"] == 100.0
    note, unsized = g["notes"]  # and, issue 48, why it got no advice
    assert unsized.startswith("not sized: its memory use is unknown")
    assert_mentions(note, "150 h", "100 h range", "scraped twice under names no label tells apart",
                    "two addresses in one job")  # fmt: skip
    assert note.endswith("its hours are scaled down to the range"), note


def test_a_jobs_recommendation_is_titled_with_its_count_in_every_format() -> None:
    from gpu_exporter.report.render import as_html, as_markdown, as_table

    r = empty()
    job_of(r, "4242", 4, nvlink=270e9)
    doc = build(W, r, CATALOGUE, Options(pricing=PricingSettings(currency="USD", models={"A100": 1.2})))
    for text in (as_table(doc), as_markdown(doc)):
        assert_mentions(text, "4 GPUs (0, 1, 2, 3) on n1", "4 x A100 40GB")
    # The HTML's bars compare what the 4 cost now with what 4 would cost: 4 x 2.50 and 4 x 1.20 a month.
    html = as_html(doc)
    assert_mentions(html, f"{4 * 2.5 * 730:,.0f} USD/month", f"{4 * 1.2 * 730:,.0f} USD/month")


def test_the_text_tables_list_gpu_2_before_gpu_10() -> None:
    """GPUs of equal waste were listed by their index as text (0, 1, 10, 11, 2, ...)."""
    from gpu_exporter.report.render import as_markdown, as_table

    r = empty()
    for i in range(12):
        key = {"node": "n1", "instance": "n1:9445", "gpu": str(i), "uuid": f"GPU-n1-{i}"}
        add_gpu(r, key, H100, {"idle": W.hours}, price=2.5)
    doc = build(W, r, CATALOGUE)
    for text in (as_table(doc), as_markdown(doc)):
        rows = [m for line in text.splitlines() if (m := re.match(r"\|? ?n1\W+(\d+)\b", line))]
        assert [int(m.group(1)) for m in rows] == list(range(12)), text
