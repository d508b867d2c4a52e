"""The report: figures per GPU, per holder and in total, recommendations and a timeline, built from
the query results; ``as_json`` is its stable, documented form, which every other format renders.

Schema ``gpu-exporter.report/v1``: hours are hours, money is in ``currency``, times are RFC 3339 UTC.
A figure that cannot be known is ``null``, never 0: a GPU without a price has ``cost: null``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..accounting.states import ALLOCATED_IDLE, BUSY, DOWN, IDLE, STATES, WASTE_STATES
from .catalogue import Catalogue
from .client import Labels
from .queries import Window
from .rightsizing import Sizer, Usage

SCHEMA = "gpu-exporter.report/v1"
HOURS_DIGITS = 6
MONEY_DIGITS = 4
Results = dict[str, Any]


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _h(v: float) -> float:
    return round(v, HOURS_DIGITS) + 0.0


def _m(v: float | None) -> float | None:
    return None if v is None else round(v, MONEY_DIGITS) + 0.0


def _hours_fields(hours: dict[str, float]) -> dict[str, float]:
    return {"gpu_hours": _h(sum(hours.values())), **{f"{s}_hours": _h(hours.get(s, 0.0)) for s in STATES}}


@dataclass
class _Gpu:
    node: str
    gpu: str
    uuid: str
    model: str | None = None
    mig_mode: bool = False
    hours: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    priced: bool = False
    holders: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # holder -> held hours
    memory_total: float | None = None
    memory_peak: float | None = None
    activity: float | None = None
    signal: str = "GPU utilization"


def holder_of(labels: Labels) -> tuple[str, str, str, str]:
    """(kind, namespace, pod, user): the pod where there is one, else the user; ("", ...) for nobody."""
    ns, pod, user = labels.get("namespace", ""), labels.get("pod", ""), labels.get("user", "")
    if pod:
        return "pod", ns, pod, ""
    if user:
        return "user", "", "", user
    return "", "", "", ""


def holder_name(kind: str, ns: str, pod: str, user: str) -> str:
    return f"pod {ns}/{pod}" if kind == "pod" else (f"user {user}" if kind == "user" else "")


def _gpu_key(labels: Labels) -> str:
    node = labels.get("node") or labels.get("instance", "")
    return labels.get("uuid") or f"{node}/{labels.get('gpu', '')}"


def steady_prices(w: Window, results: Results) -> tuple[dict[str, tuple[str, float]], list[str]]:
    """GPU -> (currency, price) where one price held at every step of the range, and the UUIDs of
    the GPUs priced otherwise (changed, or missing at some steps), whose cost needs every step's."""
    stats: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    uuids: dict[str, str] = {}
    for labels, v in results["prices"]:
        key = _gpu_key(labels)
        stats[(key, labels.get("currency", ""))][labels.get("stat", "")] = v
        uuids[key] = labels.get("uuid", "")
    steady: dict[str, tuple[str, float]] = {}
    varying: set[str] = set()
    for (key, currency), st in stats.items():
        if st.get("max") == st.get("min") and st.get("count") == w.points and key not in steady:
            steady[key] = (currency, st["max"])
        else:
            varying.add(key)
    for key in varying:  # several currencies on one GPU over the range: price it step by step too
        steady.pop(key, None)
    return steady, sorted(uuids[k] for k in varying)


def cost_rows(w: Window, results: Results) -> list[tuple[Labels, float]]:
    """Cost by GPU, holder and state: hours x the one price, or every step at its own price."""
    steady, _ = steady_prices(w, results)
    rows = [({**labels, "currency": steady[k][0]}, v * steady[k][1]) for labels, v in results["hours"]
            if (k := _gpu_key(labels)) in steady]  # fmt: skip
    return rows + [(labels, v) for labels, v in results.get("cost", []) if _gpu_key(labels) not in steady]


def build(w: Window, results: Results, catalogue: Catalogue, *, currency: str | None = None,
          min_saving: float = 0.0, min_saving_ratio: float = 0.2) -> dict[str, Any]:  # fmt: skip
    gpus: dict[str, _Gpu] = {}

    def gpu(labels: Labels) -> _Gpu:
        key = _gpu_key(labels)
        if key not in gpus:
            gpus[key] = _Gpu(labels.get("node") or labels.get("instance", ""), labels.get("gpu", ""),
                             labels.get("uuid", ""))  # fmt: skip
        return gpus[key]

    costs = cost_rows(w, results)
    currencies = sorted({labels.get("currency", "") for labels, _ in costs} - {""})
    if currency is None and len(currencies) > 1:
        raise ValueError(f"the GPUs are priced in several currencies ({', '.join(currencies)}); pick one with "
                         "--currency")  # fmt: skip
    currency = currency or (currencies[0] if currencies else None)
    holders: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for labels, v in results["hours"]:
        g, state = gpu(labels), labels.get("state", "")
        if state not in STATES:
            continue
        g.hours[state] += v
        h = holder_of(labels)
        if h[0] and state in (BUSY, ALLOCATED_IDLE):
            g.holders[holder_name(*h)] += v
            row = holders.setdefault(h, {"hours": defaultdict(float), "cost": 0.0, "wasted": 0.0, "gpus": set(),
                                         "priced": False})  # fmt: skip
            row["hours"][state] += v
            row["gpus"].add(g.uuid or f"{g.node}/{g.gpu}")
    for labels, v in costs:
        state = labels.get("state", "")
        if labels.get("currency") != currency or state not in STATES:  # as its hours: a state unknown here
            continue
        g = gpu(labels)
        g.cost[state] += v
        g.priced = True
        h = holder_of(labels)
        if h in holders:
            holders[h]["cost"] += v
            holders[h]["priced"] = True
            if state in WASTE_STATES:
                holders[h]["wasted"] += v
    for labels, _ in results["info"]:
        g = gpu(labels)
        g.model = labels.get("name") or g.model
        g.mig_mode = g.mig_mode or labels.get("mig_mode") == "enabled"
    for labels, v in results["memory_total"]:
        gpu(labels).memory_total = v
    for labels, v in results["memory_peak"]:
        gpu(labels).memory_peak = v
    for labels, v in results["activity"]:
        # A GPU whose SM activity is missing at some steps (the first poll has no GPM pair yet) has a
        # series of each signal, in no set order: SM activity, as GpuUnderutilized uses, wins.
        g, sm = gpu(labels), labels.get("signal") == "sm_active"
        if sm or g.signal != "SM activity":
            g.activity = v
            g.signal = "SM activity" if sm else "GPU utilization"

    # What the fleet pays per card of the catalogue: the price of the hours it was billed.
    paid: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for g in gpus.values():
        card = catalogue.card_of(g.model) if g.model else None
        total = sum(g.hours.values())
        if card and g.priced and total > 0:
            paid[card.name][0] += sum(g.cost.values())
            paid[card.name][1] += total
    fleet_prices = {card: c / h for card, (c, h) in paid.items() if h > 0}
    sizer = Sizer(catalogue, currency or catalogue.currency, fleet_prices, min_saving, min_saving_ratio)

    rows: list[dict[str, Any]] = []
    recommendations: list[dict[str, Any]] = []
    for g in sorted(gpus.values(), key=lambda g: (g.node, _index(g.gpu), g.uuid)):
        total = sum(g.hours.values())
        price = sum(g.cost.values()) / total if g.priced and total > 0 else None
        top = max(g.holders.items(), key=lambda kv: kv[1])[0] if g.holders else ""
        usage = Usage(g.node, g.gpu, g.uuid, g.model, top, g.hours[BUSY] + g.hours[ALLOCATED_IDLE], g.hours[IDLE],
                      w.hours, price, g.memory_total, g.memory_peak, g.activity, g.signal, g.mig_mode)  # fmt: skip
        rows.append({
            "node": g.node, "gpu": g.gpu, "uuid": g.uuid, "model": g.model, **_hours_fields(g.hours),
            "cost": _m(sum(g.cost.values())) if g.priced else None,
            "wasted_cost": _m(sum(g.cost[s] for s in WASTE_STATES)) if g.priced else None,
            "price_per_hour": _m(price), "memory_total_bytes": g.memory_total, "memory_peak_bytes": g.memory_peak,
            "activity_p95": None if g.activity is None else round(g.activity, 4), "activity_signal": g.signal,
            "holder": top, "notes": sizer.notes(usage),
        })  # fmt: skip
        advice = sizer.advise(usage)
        if advice is not None:
            recommendations.append({
                "node": g.node, "gpu": g.gpu, "uuid": g.uuid, "holder": top, "current_model": g.model,
                "suggested": advice.suggested, "reason": advice.reason,
                "saving_per_month": _m(advice.saving_per_month),
                "suggested_price_per_hour": _m(advice.suggested_price_per_hour), "slowdown": round(advice.slowdown, 2),
            })  # fmt: skip
    recommendations.sort(key=lambda r: -float(r["saving_per_month"] or 0))

    holder_rows: list[dict[str, Any]] = []
    for (kind, ns, pod, user), acc in holders.items():
        holder_rows.append({
            "kind": kind, "holder": holder_name(kind, ns, pod, user), "namespace": ns, "pod": pod, "user": user,
            "gpus": len(acc["gpus"]), "gpu_hours": _h(acc["hours"][BUSY] + acc["hours"][ALLOCATED_IDLE]),
            "busy_hours": _h(acc["hours"][BUSY]), "allocated_idle_hours": _h(acc["hours"][ALLOCATED_IDLE]),
            "cost": _m(acc["cost"]) if acc["priced"] else None,
            "wasted_cost": _m(acc["wasted"]) if acc["priced"] else None,
        })  # fmt: skip
    holder_rows.sort(key=lambda r: (-float(r["allocated_idle_hours"]), str(r["holder"])))

    totals_hours = {s: sum(g.hours[s] for g in gpus.values()) for s in STATES}
    priced = [g for g in gpus.values() if g.priced]
    totals = {
        **_hours_fields(totals_hours),
        "cost": _m(sum(sum(g.cost.values()) for g in priced)) if priced else None,
        "wasted_cost": _m(sum(g.cost[s] for g in priced for s in WASTE_STATES)) if priced else None,
        "gpus": len(gpus), "unpriced_gpus": len(gpus) - len(priced),
    }  # fmt: skip
    return {
        "schema": SCHEMA,
        "range": {"start": iso(w.start), "end": iso(w.end), "hours": _h(w.hours), "step_seconds": w.step},
        "currency": currency or (sizer.currency if recommendations else None),
        "totals": totals,
        "gpus": rows,
        "holders": holder_rows,
        "recommendations": recommendations,
        "timeline": _timeline(results),
    }


def _index(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def _timeline(results: Results) -> list[dict[str, Any]]:
    points: dict[float, dict[str, Any]] = {}
    for labels, values in results["timeline"]:
        state = labels.get("state", "")
        if state not in STATES:
            continue
        for t, v in values:
            points.setdefault(t, {"time": iso(t), **{f"{s}_hours": 0.0 for s in STATES}})[f"{state}_hours"] = _h(v)
    return [points[t] for t in sorted(points)]


__all__ = ["DOWN", "IDLE", "SCHEMA", "build"]
