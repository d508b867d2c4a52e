"""The report's cost as charges, for the formats that FinOps tools read (``csv_export``, ``focus``): one
per GPU, holder, price period and state, whose costs add up to the report's total exactly.

The report's JSON holds each GPU's and each holder's figures over the whole range, not a GPU's time
per holder in each price period, so the charges are worked out again from the query results, by the
cost model's own functions (``cost.plan``, its pieces, ``cost.cost_rows``' rules):

- a *price period* is a run of the plan's pieces in which the GPU had one price: the whole range for a
  GPU whose price never changed, the pieces between its changes for one whose did (the range is cut
  where any GPU's price changed; the pieces of a GPU that kept its price are joined again);
- a GPU priced step by step (a price missing at some step, or a range cut into too many pieces) has
  one period, the range, at its average price (its cost / its hours: ``basis`` says which);
- the holder is the series' holder in the held states (busy, allocated but idle) and nobody in the
  others, as the report counts them; a GPU's hours are scaled down to the range as the report's are.

Money is exact to the report's precision (``model.MONEY_DIGITS``): every charge's cost is rounded to
it, and the roundings are apportioned (largest remainder, first over the GPUs, then over each GPU's
charges) so that the charges add up to the report's ``totals.cost`` to the last digit, and each GPU's
to its ``cost`` within one unit of that digit.  An unknown cost is ``None``, never 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..accounting.states import HELD_STATES, STATES
from .client import Labels
from .cost import GpuKey, Part, Plan, gpu_key, plan
from .holders import NOBODY, Holder, holder_of
from .model import HOURS_DIGITS, MONEY_DIGITS, iso

PERIOD, AVERAGE = "period", "average"  # a charge's price: the one in effect throughout, or cost / hours
_UNIT = Decimal(1).scaleb(-MONEY_DIGITS)  # the smallest amount the report shows: 0.0001


@dataclass(frozen=True)
class Charge:
    node: str
    gpu: str
    uuid: str
    model: str | None
    holder: Holder  # NOBODY for the time nobody held the GPU
    state: str
    start: int  # the price period [start, end), unix seconds
    end: int
    hours: float
    price_per_hour: float | None  # None: the GPU has no price in the period
    basis: str | None  # PERIOD or AVERAGE; None without a price
    cost: Decimal | None  # in ``currency``, to MONEY_DIGITS; None without a price
    currency: str | None

    @property
    def period_start(self) -> str:
        return iso(self.start)

    @property
    def period_end(self) -> str:
        return iso(self.end)


@dataclass
class _Row:
    key: GpuKey
    holder: Holder
    state: str
    start: int  # the price period [start, end), unix seconds
    end: int
    hours: float = 0.0
    raw_cost: float | None = None
    price: float | None = None
    basis: str | None = None


def _holder(labels: Labels, state: str) -> Holder:
    return holder_of(labels) if state in HELD_STATES else NOBODY


def _runs(prices: Sequence[float | None]) -> list[tuple[int, int, float | None]]:
    """Consecutive pieces of one price, as (first, last, price)."""
    runs: list[tuple[int, int, float | None]] = []
    for i, price in enumerate(prices):
        if runs and runs[-1][2] == price:
            runs[-1] = (runs[-1][0], i, price)
        else:
            runs.append((i, i, price))
    return runs


def _periods(key: GpuKey, p: Plan) -> list[tuple[int, int, float | None, str | None]]:
    """A GPU's price periods: (first piece, last piece, price, basis)."""
    whole = len(p.pieces) - 1
    if key in p.by_piece:
        return [(a, b, price, PERIOD if price is not None else None) for a, b, price in _runs(p.by_piece[key])]
    if key in p.steady:
        return [(0, whole, p.steady[key], PERIOD)]
    if key in p.exact:
        return [(0, whole, None, AVERAGE)]
    return [(0, whole, None, None)]


def apportion(target: int, raws: Sequence[float]) -> list[int]:
    """Whole units for ``raws`` that add up to ``target``: each its floor, and the units left over (or
    short, where float noise put the floors above the target) to those nearest the next unit up (down)."""
    if not raws:
        return []
    units = [math.floor(r) for r in raws]
    left = target - sum(units)
    order = sorted(range(len(raws)), key=lambda i: (-(raws[i] - units[i]), i))
    if left < 0:
        order = order[::-1]
    for n in range(abs(left)):
        units[order[n % len(order)]] += 1 if left > 0 else -1
    return units


def _instances(results: dict[str, Any], pieces: Iterable[list[tuple[Labels, float]]]) -> dict[GpuKey, set[str]]:
    """Where each GPU was scraped, for one without a node label, from every answer the report reads it in."""
    seen: dict[GpuKey, set[str]] = defaultdict(set)
    answers = [*pieces, *(results[k] for k in ("info", "memory_total", "memory_peak", "activity"))]
    for answer in answers:
        for labels, _ in answer:
            if instance := labels.get("instance"):
                seen[gpu_key(labels)].add(instance)
    return seen


def _part_rows(part: Part, currency: str | None) -> tuple[list[_Row], list[list[tuple[Labels, float]]]]:
    """One part's charges before scaling and rounding, each over its price period in unix seconds; and
    the part's answers of hours (each GPU named from them)."""
    w, results = part.w, part.results
    p = plan(w, results, currency)
    pieces = [results["hours"]] if len(p.pieces) == 1 else [results[f"hours:{a}:{b}"] for a, b in p.pieces]
    periods: dict[GpuKey, list[tuple[int, int, float | None, str | None]]] = {}
    rows: dict[tuple[GpuKey, Holder, str, int], _Row] = {}

    def row(key: GpuKey, holder: Holder, state: str, first: int, last: int, price: float | None,
            basis: str | None) -> _Row:  # fmt: skip
        start, end = w.start + (p.pieces[first][0] - 1) * w.step, w.start + p.pieces[last][1] * w.step
        return rows.setdefault((key, holder, state, first), _Row(key, holder, state, start, end, price=price,
                                                                 basis=basis))  # fmt: skip

    for i, piece in enumerate(pieces):
        for labels, v in piece:
            state = labels.get("state", "")
            if state not in STATES:
                continue
            key = gpu_key(labels)
            if key not in periods:
                periods[key] = _periods(key, p)
            first, last, price, basis = next(x for x in periods[key] if x[0] <= i <= x[1])
            r = row(key, _holder(labels, state), state, first, last, price, basis)
            r.hours += v
            if price is not None:
                r.raw_cost = (r.raw_cost or 0.0) + v * price
    # Priced step by step: the cost query's figure over the part (a GPU's one period, so piece 0).
    for labels, v in results.get("cost", []):
        key, state = gpu_key(labels), labels.get("state", "")
        if key not in p.exact or labels.get("currency") != currency or state not in STATES:
            continue
        r = row(key, _holder(labels, state), state, 0, len(p.pieces) - 1, None, AVERAGE)
        r.raw_cost = (r.raw_cost or 0.0) + v
    return list(rows.values()), [*pieces, results.get("cost", [])]


def _joined(rows: list[_Row]) -> list[_Row]:
    """The parts' charges (in the parts' order), each one that goes on where one of the part before
    left off (the same GPU, holder, state and price, or both priced step by step) made one with it: a
    price period does not end where the range's parts do."""
    out: list[_Row] = []
    open_at: dict[tuple[GpuKey, Holder, str, int], _Row] = {}  # a charge, by where it ends
    for r in rows:
        before = open_at.pop((r.key, r.holder, r.state, r.start), None)
        if before is not None and before.basis == r.basis and (r.basis == AVERAGE or before.price == r.price):
            before.end, before.hours = r.end, before.hours + r.hours
            if r.raw_cost is not None:
                before.raw_cost = (before.raw_cost or 0.0) + r.raw_cost
            r = before
        else:
            out.append(r)
        open_at[(r.key, r.holder, r.state, r.end)] = r
    return out


def charges(parts: Sequence[Part], doc: dict[str, Any]) -> list[Charge]:
    """The report's cost, one charge per GPU, holder, price period and state; ``doc`` is the report
    ``model.build`` made of these parts' answers (one part: the whole range)."""
    currency: str | None = doc["currency"]
    rows: list[_Row] = []
    answers: list[list[tuple[Labels, float]]] = []
    instances: dict[GpuKey, set[str]] = defaultdict(set)
    for part in parts:
        part_rows, part_answers = _part_rows(part, currency)
        rows += part_rows
        answers += part_answers
        for key, found in _instances(part.results, part_answers).items():
            instances[key] |= found
    rows = _joined(rows)
    range_hours = sum(part.w.hours for part in parts)
    total: dict[GpuKey, float] = defaultdict(float)
    for r in rows:
        total[r.key] += r.hours
    scale = {key: range_hours / t for key, t in total.items() if t > range_hours}
    for r in rows:
        r.hours *= scale.get(r.key, 1.0)
        r.raw_cost = None if r.raw_cost is None else r.raw_cost * scale.get(r.key, 1.0)
        if r.basis == AVERAGE and r.raw_cost is not None and r.hours > 0:
            r.price = round(r.raw_cost / r.hours, HOURS_DIGITS)

    # Float noise is no charge: a row of no hours and no cost at the report's precision is left out.
    kept = [r for r in rows if round(r.hours, HOURS_DIGITS) > 0 or abs(r.raw_cost or 0.0) >= float(_UNIT) / 2]
    costs = _cents(kept, doc["totals"]["cost"])
    return _named(instances, answers, kept, costs, doc, currency)


def _cents(rows: list[_Row], total: float | None) -> dict[int, Decimal]:
    """Each priced row's cost in units of the report's precision, adding up to ``total``: apportioned
    over the GPUs, then over each GPU's rows."""
    if total is None:
        return {}
    raw = {i: r.raw_cost for i, r in enumerate(rows) if r.raw_cost is not None}
    by_gpu: dict[GpuKey, list[int]] = defaultdict(list)
    for i in raw:
        by_gpu[rows[i].key].append(i)
    per_unit = 10**MONEY_DIGITS
    gpu_units = apportion(round(total * per_unit), [sum(raw[i] for i in idx) * per_unit for idx in by_gpu.values()])
    out: dict[int, Decimal] = {}
    for idx, units in zip(by_gpu.values(), gpu_units, strict=True):
        for i, u in zip(idx, apportion(units, [raw[i] * per_unit for i in idx]), strict=True):
            out[i] = u * _UNIT
    return out


def _named(instances: dict[GpuKey, set[str]], answers: list[list[tuple[Labels, float]]], rows: list[_Row],
           costs: dict[int, Decimal], doc: dict[str, Any], currency: str | None) -> list[Charge]:  # fmt: skip
    """The charges, each GPU named as the report names it (its node: the node label, else the first
    target that saw it), in the report's order of GPUs, then by period, holder and state."""
    labels_of: dict[GpuKey, Labels] = {}
    for answer in answers:
        for labels, _ in answer:
            labels_of.setdefault(gpu_key(labels), labels)
    models = {(g["node"], g["gpu"], g["uuid"]): g["model"] for g in doc["gpus"]}
    order = {(g["node"], g["gpu"], g["uuid"]): n for n, g in enumerate(doc["gpus"])}
    out: list[tuple[tuple[Any, ...], Charge]] = []
    for i, r in enumerate(rows):
        node = r.key[0] or min(instances.get(r.key, set()), default="")
        gpu, uuid = labels_of[r.key].get("gpu", ""), r.key[1]  # every charge is of a row of these answers
        cost = costs.get(i)
        c = Charge(node, gpu, uuid, models.get((node, gpu, uuid)), r.holder, r.state, r.start, r.end,
                   round(r.hours, HOURS_DIGITS) + 0.0, r.price, r.basis, cost,
                   currency if cost is not None else None)  # fmt: skip
        rank = order.get((node, gpu, uuid), len(order))
        out.append(((rank, node, gpu, uuid, r.start, r.holder.name, STATES.index(r.state)), c))
    return [c for _, c in sorted(out, key=lambda x: x[0])]
