"""What each GPU cost: its price in effect x its hours, step by step where the price changed.

The prices come first: each GPU's price at the steps where it was new (the first step, a change, a
step after one without a price: ``queries.price_queries``), each step's price the last that step saw,
so that an outage or a failed scrape at a step's end drops nothing; a step between two of them has the
price before it.  With them, on how many steps each GPU had a price.  From them:

- a GPU with one price at every step the exporter saw it costs its hours x that price;
- where prices changed, the range is cut at the steps where they did, and the hours are asked piece
  by piece (``queries.hours``): within a piece each GPU has one price, so hours x price is exact, and
  the pieces together read the samples once, as one query over the range would;
- a GPU whose price is missing at a step the exporter saw it (pricing turned on or off in the range),
  or a range cut into more than ``MAX_PIECES``, is priced by one more query, every step at its own
  price (``queries.exact_cost``), for those GPUs alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .client import Labels
from .queries import Window

MAX_PIECES = 8
Results = dict[str, Any]
# A GPU: its uuid on its node, however many targets saw it; without a uuid, its index on its node (or,
# without a node label, on its target).  Never a uuid alone: two nodes that report one uuid (two
# simulators of an older gpu-exporter) are two GPUs, each with its own price or none.
GpuKey = tuple[str, str, str]  # (node, uuid, "") or (node or instance, "", index)


def gpu_key(labels: Labels) -> GpuKey:
    if uuid := labels.get("uuid", ""):
        return labels.get("node", ""), uuid, ""
    return labels.get("node") or labels.get("instance", ""), "", labels.get("gpu", "")


def seen_twice(results: Results) -> bool:
    """Whether some GPU was seen through two scrapers: two of the targets that saw it ("seen", one row
    per target) differ in more than their instance (a job's exporter that moved to a new address is one
    scraper's, whose series the hours add up as they are).  Only then are the hours counted once step by
    step (``queries.once``), which costs the store about as much again."""
    scrapers: dict[GpuKey, set[tuple[tuple[str, str], ...]]] = defaultdict(set)
    # Another job's copies of a GPU's state series, a forged one's too (it need not write the "down" series).
    for labels, _ in [*results["seen"], *results.get("other_jobs", [])]:
        scrapers[gpu_key(labels)].add(scraper(labels))
    return any(len(s) > 1 for s in scrapers.values())


def scraper(labels: Labels) -> tuple[tuple[str, str], ...]:
    """What tells a GPU's scrapers apart: every label a scraper attaches but the instance."""
    return tuple(sorted((k, v) for k, v in labels.items() if k not in _NOT_SCRAPER))


_NOT_SCRAPER = frozenset({"node", "gpu", "uuid", "instance"})


def currencies(results: Results) -> list[str]:
    return sorted({labels["currency"] for labels, points in results["prices"] if labels.get("currency") and points})


def pick_currency(results: Results, asked: str | None) -> str | None:
    """The currency of the report: the one asked for, else the one most GPUs are priced in.  One price
    series in a second currency (a forged one, or one node's old setting) stopped every report run
    without ``--currency``; now only an even split does, where no figure would be the fleet's."""
    if asked is not None:
        return asked
    found = currencies(results)
    if len(found) <= 1:
        return found[0] if found else None
    gpus: dict[str, set[GpuKey]] = {c: set() for c in found}
    for labels, points in results["prices"]:
        if labels.get("currency") in gpus and points:
            gpus[labels["currency"]].add(gpu_key(labels))
    most = max(len(g) for g in gpus.values())
    leaders = [c for c in found if len(gpus[c]) == most]
    if len(leaders) > 1:
        raise ValueError(f"the GPUs are priced in several currencies ({', '.join(found)}); pick one with --currency")
    return leaders[0]


def other_currencies(results: Results, currency: str | None) -> dict[GpuKey, list[str]]:
    """GPUs with a price in a currency other than the report's: each one's other currencies."""
    out: dict[GpuKey, set[str]] = {}
    for labels, points in results["prices"]:
        c = labels.get("currency")
        if c and c != currency and points:
            out.setdefault(gpu_key(labels), set()).add(c)
    return {k: sorted(v) for k, v in out.items()}


@dataclass
class Plan:
    pieces: list[tuple[int, int]]  # (first, last) step of each piece, 1-based, together 1..points
    steady: dict[GpuKey, float] = field(default_factory=dict)  # GPU -> its one price
    by_piece: dict[GpuKey, list[float | None]] = field(default_factory=dict)  # GPU -> its price in each piece
    exact: dict[GpuKey, str] = field(default_factory=dict)  # GPU -> uuid, priced step by step by one more query
    last: dict[GpuKey, float] = field(default_factory=dict)  # GPU -> its price at the end of the range


def plan(w: Window, results: Results, currency: str | None) -> Plan:
    steps: dict[GpuKey, dict[int, float]] = defaultdict(dict)
    uuids: dict[GpuKey, str] = {}
    for labels, points in results["prices"]:
        if labels.get("currency") != currency or not currency:
            continue
        key = gpu_key(labels)
        uuids[key] = labels.get("uuid", "")
        for t, v in points:
            if v >= 0:  # a negative price is no price
                # The price at a step of any target that saw the GPU then (each target's copy of one
                # exporter's price); the highest, were they to differ.
                k = round((t - w.start) / w.step)
                steps[key][k] = max(v, steps[key].get(k, v))
    # On how many steps the GPU was seen: by the target that saw it longest; and on how many it had a
    # price (without that count, every step with a price is in ``steps``, as an answer of every step's).
    seen, priced = _most(results["seen"]), _most(results.get("priced_steps", []), currency)
    p = Plan([(1, w.points)])
    cuts: set[int] = set()
    changing: dict[GpuKey, dict[int, float]] = {}
    for key, prices in steps.items():  # a GPU is in ``steps`` once it has a price
        order = sorted(prices)
        p.last[key] = prices[order[-1]]
        # Without the "down" series (an older exporter), a GPU counts as seen at every step.
        if priced.get(key, len(prices)) < seen.get(key, w.points):
            p.exact[key] = uuids[key]  # no price at a step that has hours: only step by step is right
        elif len(set(prices.values())) == 1:
            p.steady[key] = prices[order[0]]
        else:
            changing[key] = prices
            cuts |= {k for k, before in zip(order[1:], order, strict=False) if prices[k] != prices[before]}
    if len(cuts) + 1 > MAX_PIECES:
        p.exact.update({key: uuids[key] for key in changing})
        return p
    starts = [1, *sorted(cuts)]
    p.pieces = [(a, b - 1) for a, b in zip(starts, [*starts[1:], w.points + 1], strict=True)]
    for key, prices in changing.items():
        # The price at the piece's first step with one, else the one in effect since before the piece.
        p.by_piece[key] = [next((prices[k] for k in range(a, b + 1) if k in prices), _before(prices, a))
                           for a, b in p.pieces]  # fmt: skip
    return p


def _most(rows: list[tuple[Labels, float]], currency: str | None = None) -> dict[GpuKey, float]:
    """Each GPU's highest figure of any target (of ``currency``'s series where given)."""
    out: dict[GpuKey, float] = {}
    for labels, v in rows:
        if currency is None or labels.get("currency") == currency:
            key = gpu_key(labels)
            out[key] = max(v, out.get(key, v))
    return out


def _before(prices: dict[int, float], step: int) -> float | None:
    """The price of the last step before ``step`` that has one."""
    earlier = [k for k in prices if k < step]
    return prices[max(earlier)] if earlier else None


def hours_rows(results: Results, p: Plan) -> list[tuple[Labels, float]]:
    """The hours of the whole range, the pieces' added up by label set."""
    if len(p.pieces) == 1:
        rows: list[tuple[Labels, float]] = results["hours"]
        return rows
    total: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
    for a, b in p.pieces:
        for labels, v in results[f"hours:{a}:{b}"]:
            total[tuple(sorted(labels.items()))] += v
    return [(dict(k), v) for k, v in total.items()]


def cost_rows(results: Results, p: Plan, currency: str | None) -> list[tuple[Labels, float]]:
    """Cost by GPU, holder and state: hours x the one price, piece by piece, or every step at its own."""
    rows = [(labels, v * p.steady[k]) for labels, v in hours_rows(results, p) if (k := gpu_key(labels)) in p.steady]
    for i, (a, b) in enumerate(p.pieces):
        piece = results["hours"] if len(p.pieces) == 1 else results[f"hours:{a}:{b}"]
        for labels, v in piece:
            price = p.by_piece.get(gpu_key(labels), [None] * len(p.pieces))[i]
            if price is not None:
                rows.append((labels, v * price))
    return rows + [(labels, v) for labels, v in results.get("cost", [])
                   if gpu_key(labels) in p.exact and labels.get("currency") == currency]  # fmt: skip


@dataclass(frozen=True)
class Part:
    """A part of the range and the answers read over it: the whole range, or one of the parts a range
    is read in (``parts``: the recorded series' whole hours in the middle, the raw series' at the ends)."""

    w: Window
    results: Results


@dataclass
class Money:
    """What the report's figures add up: hours and cost by GPU, holder and state (rows of several parts
    are added as they come), and each GPU's price at the end of the range."""

    hours: list[tuple[Labels, float]]
    cost: list[tuple[Labels, float]]
    last: dict[GpuKey, float]


def money(parts: list[Part], currency: str | None) -> Money:
    """The money of the range, part by part: each part is priced by its own plan (its own prices, its
    own pieces), so that hours x price stays exact within each; the price at the end is the last part's
    that has one for the GPU."""
    out = Money([], [], {})
    for part in parts:
        p = plan(part.w, part.results, currency)
        out.hours += hours_rows(part.results, p)
        out.cost += cost_rows(part.results, p, currency)
        out.last.update(p.last)
    return out
