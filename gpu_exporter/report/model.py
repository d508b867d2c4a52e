"""The report: figures per GPU, per holder and in total, recommendations and a timeline, built from
the query results; its JSON is the stable, documented form, which every other format renders.

Schema ``gpu-exporter.report/v1``: hours are hours, money is in ``currency``, times are RFC 3339 UTC.
A figure that cannot be known is ``null``, never 0: a GPU without a price has ``cost: null``.

Each GPU is counted once (``cost.gpu_key``: its uuid on its node), whatever number of targets saw it
(the queries count each step once, ``queries.once``); the report names the targets (``targets``), and
a GPU's hours never exceed the range: should its series still add up to more (one exporter scraped
under two names by one job, which no label tells apart), they are scaled down to it, and a note says so.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ..accounting.settings import PricingSettings
from ..accounting.states import ALLOCATED_IDLE, ALLOCATED_UNKNOWN, BUSY, DOWN, HELD_STATES, IDLE, STATES, WASTE_STATES
from .catalogue import PIPES, Catalogue
from .client import Labels
from .cost import GpuKey, Part, currencies, money, other_currencies, pick_currency, scraper
from .cost import gpu_key as _gpu_key
from .holders import NOBODY, Holder, holder_of
from .prices import PriceList
from .queries import OWN_JOB, SLICE, Window
from .rightsizing import LINK, MIG_NOT_SIZED, MIN_HISTORY_HOURS, RELEASE, SLOWER, Advice, Link, Sizer, Usage, gpu_order

# The kinds of holder (Holder.kind) sized as a whole where they hold several GPUs: a user's processes are no
# one workload.
JOB_KINDS = ("job", "pod", "container")
TOGETHER_NOTE = "not sized: its holder's GPUs are of different models or holders, and are sized together or not at all"

SCHEMA = "gpu-exporter.report/v1"
HOURS_DIGITS = 6
MONEY_DIGITS = 4
Results = dict[str, Any]
# The labels that say which GPU a series is of; the others of the "seen" query name the target (job,
# instance, a replica label, ...) that saw it.
IDENTITY = frozenset({"node", "gpu", "uuid"})

# Why a report has nothing to show, and the exit status that says so (docs/cost.md).
OK, NO_DATA, NO_MATCH, NO_PRICES, NO_PRICES_IN_CURRENCY = "ok", "no_data", "no_match", "no_prices", "no_currency"
EXIT_STATUS = {OK: 0, NO_DATA: 3, NO_MATCH: 3, NO_PRICES: 4, NO_PRICES_IN_CURRENCY: 4}


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _h(v: float) -> float:
    return round(v, HOURS_DIGITS) + 0.0


def _m(v: float | None) -> float | None:
    return None if v is None else round(v, MONEY_DIGITS) + 0.0


def _hours_fields(hours: dict[str, float]) -> dict[str, float]:
    return {"gpu_hours": _h(sum(hours.values())), **{f"{s}_hours": _h(hours.get(s, 0.0)) for s in STATES}}


@dataclass
class _Slice:
    """One GPU instance of a card in MIG mode, with books of its own: hours at its share of the card."""

    hours: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    holders: dict[Holder, float] = field(default_factory=lambda: defaultdict(float))
    idle_holders: dict[Holder, float] = field(default_factory=lambda: defaultdict(float))
    holders_now: set[Holder] = field(default_factory=set)


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
    price_now: float | None = None
    # By holder, not by its name: what it is (its kind: a job's GPUs are sized together) stays with it.
    holders: dict[Holder, float] = field(default_factory=lambda: defaultdict(float))  # holder -> held hours
    idle_holders: dict[Holder, float] = field(default_factory=lambda: defaultdict(float))  # -> allocated idle hours
    holders_now: set[Holder] = field(default_factory=set)  # who held it in the range's last step
    memory_total: float | None = None
    memory_peak: float | None = None
    signals: dict[str, float] = field(default_factory=dict)
    instances: set[str] = field(default_factory=set)  # where the GPU was scraped, for a node without a label
    targets: set[tuple[tuple[str, str], ...]] = field(default_factory=set)  # every target that saw it
    scrapers: set[tuple[tuple[str, str], ...]] = field(default_factory=set)  # every scraper of its series
    sources: set[tuple[tuple[str, str], ...]] = field(default_factory=set)  # every target of its series
    left_out: dict[tuple[tuple[str, str], ...], float] = field(default_factory=lambda: defaultdict(float))
    slices: dict[str, _Slice] = field(default_factory=dict)  # GPU instance id -> its books (MIG mode)
    links: dict[str, float] = field(default_factory=dict)  # queries.link_queries' answers, by ``what``


@dataclass(frozen=True)
class Options:
    """What the user asked of the report beyond the range."""

    currency: str | None = None
    pricing: PricingSettings | None = None
    min_saving: float = 0.0
    min_saving_ratio: float = 0.2
    min_history_hours: float = MIN_HISTORY_HOURS
    allow_slower: bool = False
    allow_consumer: bool = False
    requested_end: float | None = None  # where a range that ended in the future was cut to now
    requested_start: float | None = None  # where a range that started before 1970 was cut to it
    empty_because: tuple[str, str] | None = None  # (status, why) when the store had nothing to show


def build(w: Window, results: Results, catalogue: Catalogue, opts: Options = Options(),
          parts: list[Part] | None = None) -> dict[str, Any]:  # fmt: skip
    """The report of ``results`` over the range ``w``; where the range was read in ``parts``
    (``split``), its money comes from theirs, and ``results`` holds their other answers together."""
    gpus: dict[GpuKey, _Gpu] = {}

    def gpu(labels: Labels) -> _Gpu:
        key = _gpu_key(labels)
        if key not in gpus:
            gpus[key] = _Gpu(key[0], labels.get("gpu", ""), key[1])
        if instance := labels.get("instance"):
            gpus[key].instances.add(instance)
        return gpus[key]

    currency = pick_currency(results, opts.currency)
    elsewhere = other_currencies(results, currency)
    priced_by = money([Part(w, results)] if parts is None else parts, currency)
    rows_of_hours = priced_by.hours
    total: dict[GpuKey, float] = defaultdict(float)
    for labels, v in rows_of_hours:
        if labels.get("state", "") in STATES:
            total[_gpu_key(labels)] += v
    # Never more hours than the range: series that still add up to more are scaled down to it.
    scale = {key: w.hours / t for key, t in total.items() if t > w.hours}
    holders: dict[Holder, dict[str, Any]] = {}
    for labels, v in rows_of_hours:
        g, state = gpu(labels), labels.get("state", "")
        if state not in STATES:
            continue
        v *= scale.get(_gpu_key(labels), 1.0)
        g.hours[state] += v
        h = holder_of(labels)
        part = g.slices.setdefault(gi, _Slice()) if (gi := labels.get(SLICE, "")) else None
        if part is not None:
            part.hours[state] += v
        if h.kind and state in HELD_STATES:
            g.holders[h] += v
            if part is not None:
                part.holders[h] += v
            if state == ALLOCATED_IDLE:
                g.idle_holders[h] += v
                if part is not None:
                    part.idle_holders[h] += v
            row = holders.setdefault(h, {"hours": defaultdict(float), "cost": 0.0, "wasted": 0.0, "gpus": {}})
            row["hours"][state] += v
            row["gpus"][_gpu_key(labels)] = g
    for labels, v in priced_by.cost:
        state = labels.get("state", "")
        if state not in STATES:  # as its hours: a state unknown here
            continue
        g = gpu(labels)
        v *= scale.get(_gpu_key(labels), 1.0)
        g.cost[state] += v
        g.priced = True
        if gi := labels.get(SLICE, ""):
            g.slices.setdefault(gi, _Slice()).cost[state] += v
        h = holder_of(labels)
        if h in holders:
            holders[h]["cost"] += v
            if state in WASTE_STATES:
                holders[h]["wasted"] += v
    for key, last in priced_by.last.items():
        if key in gpus:
            gpus[key].price_now = last
    for labels, _ in results["info"]:
        g = gpu(labels)
        g.model = labels.get("name") or g.model
        g.mig_mode = g.mig_mode or labels.get("mig_mode") == "enabled"
    # Each target's copy of a figure: the highest (one exporter's figure, read through each).
    for labels, v in results["memory_total"]:
        g = gpu(labels)
        g.memory_total = _higher(g.memory_total, v)
    for labels, v in results["memory_peak"]:
        g = gpu(labels)
        g.memory_peak = _higher(g.memory_peak, v)
    for labels, v in results["activity"]:
        g, signal = gpu(labels), labels.get("signal", "")
        g.signals[signal] = max(v, g.signals.get(signal, v))
    bound_rows = [({**labels, "what": "bound_seconds"}, v) for labels, v in results.get("pcie_bound", [])]
    for labels, v in [*results.get("links", []), *results.get("pcie_load", []), *bound_rows]:
        g, what = gpu(labels), labels.get("what", "")
        g.links[what] = max(v, g.links.get(what, v))  # each target's copy: the highest
    for labels, v in results.get("holders_now", []):
        if v > 0 and (h := holder_of(labels)).kind and _gpu_key(labels) in gpus:
            gpus[_gpu_key(labels)].holders_now.add(h)
            if gi := labels.get(SLICE, ""):
                gpus[_gpu_key(labels)].slices.setdefault(gi, _Slice()).holders_now.add(h)
    for labels, _ in results["seen"]:
        if (key := _gpu_key(labels)) in gpus:
            gpus[key].targets.add(tuple(sorted((k, x) for k, x in labels.items() if k not in IDENTITY)))
    for labels, _ in [*results["seen"], *results.get("other_jobs", [])]:
        if (key := _gpu_key(labels)) in gpus:
            gpus[key].scrapers.add(scraper(labels))
            gpus[key].sources.add(_target_of(labels))
    for labels, v in results.get("disagree", []):  # other jobs' copies that disagree with the own job's
        if (key := _gpu_key(labels)) in gpus:
            gpus[key].left_out[_target_of(labels)] += v
    for g in gpus.values():
        # A target whose copies were left out (they disagree with the own job's) is not one counted once.
        g.targets -= set(_disagreeing(g, w))
        # Without a node label, a GPU's node is named by where it was scraped (the first, of several).
        g.node = g.node or min(g.instances, default="")
    shown_as = _shown_as(list(gpus.values()))

    # What the fleet pays now for each card of the catalogue: the highest where several prices.
    fleet: dict[str, float] = {}
    for g in gpus.values():
        card = catalogue.card_of(g.model) if g.model else None
        if card is not None and g.price_now is not None and g.priced:
            fleet[card.name] = max(fleet.get(card.name, 0.0), g.price_now)
    sizer = Sizer(catalogue, PriceList(catalogue, currency, fleet, opts.pricing), min_saving=opts.min_saving,
                  min_saving_ratio=opts.min_saving_ratio, min_history_hours=opts.min_history_hours,
                  allow_slower=opts.allow_slower, allow_consumer=opts.allow_consumer)  # fmt: skip

    rows: list[dict[str, Any]] = []
    row_of: dict[int, dict[str, Any]] = {}  # each GPU's row, by its Usage (a job's members are those)
    recommendations: list[dict[str, Any]] = []
    names = Counter(h.name for h in holders)  # to tell apart holders of one name (a container's engines)
    jobs: dict[Holder, list[Usage]] = {}  # the GPUs each job, pod or container held, to size together
    for key, g in sorted(gpus.items(), key=lambda kg: (kg[1].node, gpu_order(kg[1].gpu), kg[1].uuid)):
        hours = sum(g.hours.values())
        price = sum(g.cost.values()) / hours if g.priced and hours > 0 else None
        # Its holder: who holds it now, else who held it longest (by hours, holders that come and go can
        # tie, and two engines would pick different ones).
        top = _most({h: g.holders.get(h, 0.0) for h in g.holders_now}, g.holders)
        activity: float | None = g.signals.get("sm_active")
        signal = "SM activity" if activity is not None else "GPU utilization"
        activity = g.signals.get("utilization") if activity is None else activity
        # The one to reclaim it from: who holds it now, else who held it idle longest.
        now = {h: g.idle_holders.get(h, 0.0) for h in g.holders_now}
        # Each pipe's activity where the GPU has GPM (a pipe it does not report stays unknown).
        pipes = ({p: g.signals[f"{p}_active"] for p in PIPES if f"{p}_active" in g.signals}
                 if "sm_active" in g.signals else None)  # fmt: skip
        # A GPU with no NVLink links moves nothing over NVLink: known, where absent counters are unknown.
        nvlink = g.signals.get("nvlink_tx", 0.0 if g.links.get("nvlink_links") == 0 else None)
        usage = Usage(g.node, g.gpu, g.uuid, g.model, _told_apart(top, names),
                      _told_apart(_most(now, g.idle_holders), names), g.hours[BUSY],
                      g.hours[ALLOCATED_IDLE], g.hours[IDLE], g.hours[DOWN], g.price_now if g.priced else None,
                      g.memory_total, g.memory_peak, activity, signal, g.signals.get("dram_active"),
                      g.mig_mode, pipes, nvlink, link=Link.of(g.links, g.hours[BUSY] + g.hours[ALLOCATED_IDLE]),
                      shown_as=shown_as[id(g)], unknown_hours=g.hours[ALLOCATED_UNKNOWN])  # fmt: skip
        bound = usage.link.bound_hours if usage.link else 0.0
        rows.append({
            "node": g.node, "shown_as": usage.place, "gpu": g.gpu, "uuid": g.uuid, "model": g.model,
            **_hours_fields(g.hours),
            "cost": _m(sum(g.cost.values())) if g.priced else None,
            "wasted_cost": _m(sum(g.cost[s] for s in WASTE_STATES)) if g.priced else None,
            "price_per_hour": _m(price), "price_now_per_hour": _m(usage.price_per_hour),
            "memory_total_bytes": g.memory_total, "memory_peak_bytes": g.memory_peak,
            "activity_p95": None if activity is None else round(activity, 4), "activity_signal": signal,
            "dram_active_p95": None if usage.dram_p95 is None else round(usage.dram_p95, 4),
            "holder": _told_apart(top, names), "targets": [dict(t) for t in sorted(g.targets)],
            "left_out_targets": [{**dict(t), "hours": _h(h)} for t, h in sorted(_disagreeing(g, w).items())],
            "link_bound_hours": _h(bound), "link_bound_cost": _m(bound * price) if price is not None else None,
            "notes": [*_disagree(g, w), *_over_the_range(total[key], w, g), *sizer.notes(usage),
                      *_priced_elsewhere(elsewhere.get(key) if not g.priced else None, currency)],
            "slices": [_slice_row(gi, part, usage, names)
                       for gi, part in sorted(g.slices.items(), key=_instance_order)],
        })  # fmt: skip
        row_of[id(usage)] = rows[-1]
        if g.slices:  # a card in MIG mode: each slice is reclaimed on its own; the card only released whole
            recommendations.extend(_recommendation(a, u, g.model) for u in slice_usages(g.slices, usage, names)
                                   if (a := sizer.advise_slice(u)) is not None)  # fmt: skip
            busy = any(part.hours[BUSY] > 0 for part in g.slices.values())  # a card a slice works on stays
            advice = sizer.advise(usage) if Sizer.waste(usage) == RELEASE and not busy else None
            if advice is not None:
                recommendations.append(_recommendation(advice, usage, g.model))
            elif busy:  # a card busy enough to size gets no advice: say why, as for any other
                rows[-1]["notes"].append(MIG_NOT_SIZED)
            continue
        # A job, pod or container on several GPUs is sized as a whole, below; each GPU's own release or
        # reclaim stands.  Which it is is its holder's kind, from its labels: its name is for people to
        # read and may say anything (a pod "job-7", a job shown as "Slurm job 7").
        if usage.up_hours > 0 and Sizer.waste(usage) is None and top.kind in JOB_KINDS and not sizer.starved(usage):
            jobs.setdefault(top, []).append(usage)
            continue
        decided = sizer.decide(usage)
        if isinstance(decided, Advice):
            recommendations.append(_recommendation(decided, usage, g.model))
        elif decided:  # why a GPU busy enough to size gets no advice
            rows[-1]["notes"].append(decided)
    for members in jobs.values():
        job = Sizer.together(members)  # of one GPU: that GPU
        decided = sizer.decide(job) if job is not None else TOGETHER_NOTE
        if isinstance(decided, Advice) and job is not None:
            recommendations.append(_recommendation(decided, job, job.model))
        elif decided:
            for m in members:
                row_of[id(m)]["notes"].append(decided)
    # The largest saving first; advice without a monthly figure after, slower cards last.
    recommendations.sort(key=lambda r: (r["kind"] == "slower", r["saving_per_month"] is None,
                                        -float(r["saving_per_month"] or 0), r["node"],
                                        gpu_order(r["gpu"])))  # fmt: skip

    holder_rows: list[dict[str, Any]] = []
    for h, acc in holders.items():
        held_gpus = acc["gpus"].values()
        unpriced = [x for x in held_gpus if not x.priced]
        priced_any = len(unpriced) < len(held_gpus)
        unpriced_hours = sum(x.holders.get(h, 0.0) for x in unpriced)
        holder_rows.append({
            "kind": h.kind, "holder": _told_apart(h, names), "namespace": h.namespace, "pod": h.pod,
            "hpc_job": h.hpc_job, "container": h.container, "container_engine": h.engine, "user": h.user,
            "gpus": len(held_gpus), "gpu_hours": _h(sum(acc["hours"][s] for s in HELD_STATES)),
            "busy_hours": _h(acc["hours"][BUSY]), "allocated_idle_hours": _h(acc["hours"][ALLOCATED_IDLE]),
            "allocated_unknown_hours": _h(acc["hours"][ALLOCATED_UNKNOWN]),
            "cost": _m(acc["cost"]) if priced_any else None,
            "wasted_cost": _m(acc["wasted"]) if priced_any else None,
            "unpriced_hours": _h(unpriced_hours),
        })  # fmt: skip
    holder_rows.sort(key=lambda r: (-float(r["allocated_idle_hours"]), str(r["holder"])))

    totals_hours = {s: sum(g.hours[s] for g in gpus.values()) for s in STATES}
    priced = [g for g in gpus.values() if g.priced]
    totals = {
        **_hours_fields(totals_hours),
        "cost": _m(sum(sum(g.cost.values()) for g in priced)) if priced else None,
        "wasted_cost": _m(sum(g.cost[s] for g in priced for s in WASTE_STATES)) if priced else None,
        "gpus": len(gpus), "unpriced_gpus": len(gpus) - len(priced),
        "unpriced_hours": _h(sum(sum(g.hours.values()) for g in gpus.values() if not g.priced)),
        "merged_gpus": sum(len(g.targets) > 1 for g in gpus.values()),
        "advised_saving_per_month": _m(sum(r["saving_per_month"] or 0.0 for r in recommendations)),
        # Bus-starved time beside wasted time: the hours the GPUs were held with their PCIe link at
        # queries.LINK_BOUND or more, and what those hours cost.
        "link_bound_hours": _h(sum(float(r["link_bound_hours"]) for r in rows)),
        "link_bound_cost": _m(sum(float(r["link_bound_cost"] or 0.0) for r in rows)) if priced else None,
    }  # fmt: skip
    status, why = _status(gpus, priced, currency, results, opts)
    return {
        "schema": SCHEMA,
        "range": {
            "start": iso(w.start),
            "end": iso(w.end),
            "hours": _h(w.hours),
            "step_seconds": w.step,
            "requested_start": None if opts.requested_start is None else iso(opts.requested_start),
            "requested_end": None if opts.requested_end is None else iso(opts.requested_end),
        },
        "status": status,
        "status_reason": why,
        "currency": currency if priced else None,
        "advice_settings": {
            "min_history_hours": opts.min_history_hours,
            "allow_slower": opts.allow_slower,
            "allow_consumer_cards": opts.allow_consumer,
            "min_saving": opts.min_saving,
            "min_saving_ratio": opts.min_saving_ratio,
        },
        "totals": totals,
        "gpus": rows,
        "holders": holder_rows,
        "recommendations": recommendations,
        "timeline": _timeline(results),
    }


def _priced_elsewhere(others: list[str] | None, currency: str | None) -> list[str]:
    """Why a GPU priced only in another currency has no cost: it is not summed with the report's."""
    if not others:
        return []
    return [f"priced in {', '.join(others)}, not in the report's {currency}: left out of the money "
            f"(--currency {others[0]} reports it)"]  # fmt: skip


def _told_apart(h: Holder, names: Counter[str] | None) -> str:
    """A holder's name, with its engine where another holder has the same name: a rootless
    ``docker@1000`` container and the system engine's container of the same ID are two holders."""
    if h.kind == "container" and names is not None and names[h.name] > 1:
        return f"{h.name} ({h.engine or 'no engine'})"
    return h.name


def _shown_as(gpus: list[_Gpu]) -> dict[int, str]:
    """Where each GPU is, as the report shows it: its node; where GPUs of one index share a node label
    (two exporters on one host, relabelled to one node), its instance where that tells them apart, else
    its UUID, so that no two lines read "GPU 1 on 127.0.0.1"."""
    same: dict[tuple[str, str], list[_Gpu]] = defaultdict(list)
    for g in gpus:
        same[(g.node, g.gpu)].append(g)
    shown = {}
    for group in same.values():
        places = [", ".join(sorted(g.instances)) for g in group]
        apart = len(group) > 1 and all(places) and len(set(places)) == len(group)
        for g, place in zip(group, places, strict=True):
            shown[id(g)] = g.node if len(group) == 1 else f"{g.node} ({place if apart else g.uuid or place})"
    return shown


def _higher(a: float | None, b: float) -> float:
    return b if a is None else max(a, b)


def _target_of(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in IDENTITY))


def _shown(target: tuple[tuple[str, str], ...]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in target) + "}"


def _own(target: tuple[tuple[str, str], ...]) -> bool:
    return re.fullmatch(OWN_JOB, dict(target).get("job", "")) is not None


def _disagreeing(g: _Gpu, w: Window) -> dict[tuple[tuple[str, str], ...], float]:
    """The targets of other jobs whose copies gave the GPU's holders more than a step's hours that the
    exporter's own job did not report (a holder's first step can differ by a scrape, never by more)."""
    return {t: h for t, h in g.left_out.items() if h > w.step / 3600}


def _disagree(g: _Gpu, w: Window) -> list[str]:
    """A note naming the targets whose copies of a GPU disagree with the exporter's own job's."""
    if not (left := _disagreeing(g, w)):
        return []
    own = ", ".join(_shown(t) for t in sorted(g.targets) if _own(t)) or f'job=~"{OWN_JOB}"'
    others = ", ".join(f"{_shown(t)} ({h:.3g} h)" for t, h in sorted(left.items()))
    return [
        f"its copies from {others} disagree with the exporter's own job, {own}, about who held it (holders "
        "it did not report): they are left out, and the own job's copy is counted"
    ]


def _over_the_range(hours: float, w: Window, g: _Gpu | None = None) -> list[str]:
    """A note where a GPU's series added up to more than the range by more than a step: not the
    engines' extrapolation at a step's edges, but the same counter read twice, or targets that
    disagree about who held it and none of which is the exporter's own job to keep."""
    if hours <= w.hours + w.step / 3600:
        return []
    if g is not None and len(g.scrapers) > 1:
        named = ", ".join(_shown(t) for t in sorted(g.sources))
        return [
            f"its series add up to {hours:.3g} h in the {w.hours:.3g} h range: its targets {named} disagree about "
            f'who held it, and not one alone is the exporter\'s own job (job=~"{OWN_JOB}") to count; its hours, '
            "and its holders', are scaled down to the range: report one target with --selector"
        ]
    if g is not None and len(g.sources) > 1:  # one job's targets at once, not one after the other (a move)
        named = ", ".join(_shown(t) for t in sorted(g.sources))
        return [
            f"its series add up to {hours:.3g} h in the {w.hours:.3g} h range: one job read it from {named} at "
            "once, one exporter at two addresses or a copy with its labels that disagrees about who held it; its "
            "hours, and its holders', are scaled down to the range: scrape the exporter in a job of its own"
        ]
    return [
        f"its series add up to {hours:.3g} h in the {w.hours:.3g} h range: one exporter scraped twice under "
        "names no label tells apart (two addresses in one job?); its hours are scaled down to the range"
    ]


def _recommendation(advice: Advice, u: Usage, model: str | None) -> dict[str, Any]:
    """One recommendation as the report shows it; ``gpus`` is how many GPUs it is for (a job's)."""
    return {
        "node": u.node, "shown_as": u.place, "gpu": u.gpu, "uuid": u.uuid, "holder": u.holder,
        "current_model": model,
        "gpus": u.count, "kind": advice.kind, "suggested": advice.suggested, "reason": advice.reason,
        "saving_per_month": _m(advice.saving_per_month),
        "suggested_price_per_hour": _m(advice.suggested_price_per_hour), "slowdown": round(advice.slowdown, 2),
        "price_source": advice.price_source, "seen_hours": _h(u.seen_hours),
        "no_saving_figure": _no_figure(advice, u), "gpu_instance_id": u.instance or None,
    }  # fmt: skip


def _instance_order(item: tuple[str, _Slice]) -> tuple[int, str]:
    return gpu_order(item[0])


def _share(part: _Slice, card: Usage) -> float:
    """A slice's share of the card: its hours (at its share) over the card's hours up.  Exact for a slice
    that lived through the range; one made or destroyed within it reads smaller, over the whole range,
    which leaves its money (hours x price) as it is."""
    up = card.up_hours
    return min(1.0, sum(v for s, v in part.hours.items() if s != DOWN) / up) if up > 0 else 0.0


def slice_usages(slices: dict[str, _Slice], card: Usage, names: Counter[str] | None = None) -> list[Usage]:
    """Each slice of a card in MIG mode as a GPU of its own: its hours in its own time (the books' hours
    over its share), its price the card's x its share, its holder its own."""
    out = []
    for gi, part in sorted(slices.items(), key=_instance_order):
        share = _share(part, card)
        if share <= 0:
            continue
        top = _most({h: part.holders.get(h, 0.0) for h in part.holders_now}, part.holders)
        idle = _most({h: part.idle_holders.get(h, 0.0) for h in part.holders_now}, part.idle_holders)
        out.append(replace(
            card, holder=_told_apart(top, names), idle_holder=_told_apart(idle, names),
            busy_hours=part.hours[BUSY] / share, allocated_idle_hours=part.hours[ALLOCATED_IDLE] / share,
            idle_hours=part.hours[IDLE] / share,
            unknown_hours=part.hours[ALLOCATED_UNKNOWN] / share, down_hours=card.down_hours,
            price_per_hour=None if card.price_per_hour is None else card.price_per_hour * share,
            instance=gi, share=share,
        ))  # fmt: skip
    return out


def _slice_row(gi: str, part: _Slice, card: Usage, names: Counter[str] | None = None) -> dict[str, Any]:
    """A slice's figures as the report shows them: its hours at its share of the card (they add up to
    the card's), its cost and waste, who holds it."""
    top = _most({h: part.holders.get(h, 0.0) for h in part.holders_now}, part.holders)
    return {
        "gpu_instance_id": gi, "share": round(_share(part, card), 4), **_hours_fields(part.hours),
        "cost": _m(sum(part.cost.values())) if part.cost else None,
        "wasted_cost": _m(sum(part.cost[s] for s in WASTE_STATES)) if part.cost else None,
        "holder": _told_apart(top, names),
    }  # fmt: skip


def _no_figure(advice: Advice, u: Usage) -> str | None:
    """Why an advice has no monthly saving: none for a slower card, none without a price, none from too
    little history."""
    if advice.saving_per_month is not None:
        return None
    if advice.kind == SLOWER:
        return "a slower card"
    if advice.kind == LINK:
        return "a link to fix"
    return "no price" if u.price_per_hour is None else "too little history"


def _most(*held: dict[Holder, float]) -> Holder:
    """Who held it longest, of the first of these that names anyone (nobody where none does); of
    several as long, the first by name."""
    for hours in held:
        if hours:
            return min(hours.items(), key=lambda kv: (-kv[1], kv[0].name))[0]
    return NOBODY


def _status(gpus: dict[GpuKey, _Gpu], priced: list[_Gpu], currency: str | None, results: Results,
            opts: Options) -> tuple[str, str]:  # fmt: skip
    if not gpus:
        return opts.empty_because or (NO_DATA, "no gpu-exporter series in the range")
    if priced:
        return OK, ""
    found = currencies(results)
    if currency and found:
        return NO_PRICES_IN_CURRENCY, (f"no prices in {currency}: the GPUs are priced in {', '.join(found)}; "
                                       "leave out --currency or pick one of those")  # fmt: skip
    return NO_PRICES, ("no prices: the store has no gpu_price_per_hour for these GPUs in the range; set the "
                       "exporter's pricing section (docs/cost.md) to see costs")  # fmt: skip


def _timeline(results: Results) -> list[dict[str, Any]]:
    points: dict[float, dict[str, Any]] = {}
    for labels, values in results["timeline"]:
        state = labels.get("state", "")
        if state not in STATES:
            continue
        for t, v in values:
            points.setdefault(t, {"time": iso(t), **{f"{s}_hours": 0.0 for s in STATES}})[f"{state}_hours"] = _h(v)
    return [points[t] for t in sorted(points)]


__all__ = ["DOWN", "EXIT_STATUS", "IDLE", "SCHEMA", "Options", "build"]
