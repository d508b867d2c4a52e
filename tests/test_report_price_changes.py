"""The prices as the store answers them now (issue 37, the fleet at 10,000 GPUs): each GPU's price only
at the steps where it is new, and the count of steps it had one, plan the same pieces, prices and
step-by-step GPUs as every step's price did, with a point or two per GPU where every step's took
720 (30 days: 130 MiB of answer at 10,000 GPUs, past --prometheus.max-answer-mib's 128).

``as_the_store_answers`` is what ``queries.price_queries`` asks of a store, written out in Python:
the range query keeps a step's price where it is the first step, or the step before had no price or
another one; the instant query counts the steps with a price.  That the stores answer so is
test_report_history's and test_report_engines' to show (real Prometheus and VictoriaMetrics, money
to the cent)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gpu_exporter.report.cost import MAX_PIECES, plan
from gpu_exporter.report.queries import Window

END = 1_796_000_400.0
W = Window(int(END) - 100 * 1200, int(END), 1200)  # 100 steps of 20 min
KEY = {"node": "n1", "instance": "n1:9445"}


def every_step(gpus: dict[str, Sequence[float | None]], seen: dict[str, float] | None = None) -> dict[str, Any]:
    """The answer of every step's price (the old prices query): GPU-<name>'s price per step."""
    r: dict[str, Any] = {"prices": [], "seen": []}
    for name, prices in gpus.items():
        key = {**KEY, "gpu": name, "uuid": f"GPU-{name}"}
        points = [(W.start + (k + 1) * W.step, v) for k, v in enumerate(prices) if v is not None]
        r["prices"].append(({**key, "currency": "USD"}, points))
        r["seen"].append((key, (seen or {}).get(name, float(W.points))))
    return r


def as_the_store_answers(r: dict[str, Any], w: Window = W) -> dict[str, Any]:
    out = {**r, "prices": [], "priced_steps": []}
    for labels, points in r["prices"]:
        at = dict(points)
        kept = [(t, v) for t, v in points if t == w.start + w.step or at.get(t - w.step) != v]
        out["prices"].append((labels, kept))
        out["priced_steps"].append((labels, float(len(points))))
    return out


CASES: dict[str, tuple[dict[str, Sequence[float | None]], dict[str, float] | None]] = {
    "steady": ({"0": [2.5] * 100, "1": [0.0] * 100}, None),
    "one-change": ({"0": [2.5] * 50 + [2.8] * 50, "1": [1.0] * 100}, None),
    "two-gpus-change-apart": ({"0": [3.0] * 30 + [4.0] * 70, "1": [1.0] * 60 + [1.5] * 40}, None),
    "back-and-forth": ({"0": [2.0] * 20 + [3.0] * 20 + [2.0] * 60}, None),
    "priced-late": ({"0": [None] * 10 + [2.0] * 90}, None),  # pricing turned on in the range: step by step
    "priced-till": ({"0": [2.0] * 90 + [None] * 10}, None),  # ... and off
    "gap-seen": ({"0": [2.0] * 40 + [None] * 10 + [2.0] * 50}, None),  # a gap where it was seen
    "gap-unseen": ({"0": [2.0] * 40 + [None] * 10 + [2.0] * 50}, {"0": 90.0}),  # gone: not seen either
    "gap-then-change": ({"0": [3.0] * 30 + [None] * 30 + [4.0] * 40, "1": [1.0] * 30 + [1.5] * 70}, {"0": 70.0}),
    "too-many-pieces": ({str(i): [1.0] * (10 * i + 5) + [2.0] * (95 - 10 * i) for i in range(MAX_PIECES + 1)}, None),
    "negative": ({"0": [-1.0] * 100, "1": [2.0] * 100}, None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_the_prices_where_they_change_plan_what_every_steps_prices_did(case: str) -> None:
    gpus, seen = CASES[case]
    full = every_step(gpus, seen)
    new, old = plan(W, as_the_store_answers(full), "USD"), plan(W, full, "USD")
    assert (new.pieces, new.steady, new.exact, new.last) == (old.pieces, old.steady, old.exact, old.last)
    for key, prices in old.by_piece.items():
        # A piece where the GPU had no price (and was not seen, else it is priced step by step) holds no
        # hours of it: its price there is the one before, never a price it did not have when seen.
        assert [n if o is None else o for n, o in zip(new.by_piece[key], prices, strict=True)] == new.by_piece[key]
    assert new.by_piece.keys() == old.by_piece.keys()


def test_the_answer_holds_a_point_or_two_per_gpu() -> None:
    """A month's 720 steps, one price change: two points where every step's answer held 720."""
    w = Window(int(END) - 720 * 3600, int(END), 3600)
    r = {"prices": [({**KEY, "gpu": "0", "uuid": "GPU-0", "currency": "USD"},
                     [(w.start + (k + 1) * w.step, 2.5 if k < 400 else 2.8) for k in range(w.points)])]}  # fmt: skip
    ((_, points),) = as_the_store_answers({**r, "seen": []}, w)["prices"]
    assert points == [(w.start + w.step, 2.5), (w.start + 401 * w.step, 2.8)]


def test_a_gpu_counted_without_a_price_at_every_step_it_was_seen_is_priced_step_by_step() -> None:
    """The count tells a step without a price from one whose price held, which the points cannot."""
    full = every_step({"0": [2.0] * 40 + [None] * 10 + [2.0] * 50})
    answered = as_the_store_answers(full)
    assert [len(points) for _, points in answered["prices"]] == [2]  # step 1 and step 51
    assert plan(W, answered, "USD").exact == {("n1", "GPU-0", ""): "GPU-0"}
    answered["priced_steps"] = [(labels, 100.0) for labels, _ in answered["priced_steps"]]
    assert plan(W, answered, "USD").steady == {("n1", "GPU-0", ""): 2.0}


def test_the_steps_priced_are_those_of_the_reports_currency() -> None:
    """A GPU priced in EUR all along and in USD for 60 of its 100 steps: in USD it is priced step by step
    (its EUR count is no USD price), in EUR it holds one price."""
    usd = every_step({"0": [None] * 40 + [2.0] * 60})
    eur = every_step({"0": [1.8] * 100})
    both = as_the_store_answers(usd)
    extra = as_the_store_answers(eur)
    for k in ("prices", "priced_steps"):
        both[k] += [({**labels, "currency": "EUR"}, v) for labels, v in extra[k]]
    key = ("n1", "GPU-0", "")
    assert plan(W, both, "USD").exact == {key: "GPU-0"} and key not in plan(W, both, "USD").steady
    assert plan(W, both, "EUR").steady == {key: 1.8} and plan(W, both, "EUR").exact == {}
