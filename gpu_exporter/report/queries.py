"""The PromQL the report asks, over a window of whole steps.

Every query aggregates on the server: per GPU and holder at most, never raw samples.  Sums over
the range are subqueries of ``increase()`` over consecutive steps, so no single evaluation loads
more than one step of samples (Prometheus's ``query.max-samples`` is per evaluation), and the
steps tile the range exactly: the window's end is aligned to the step, as Prometheus aligns a
subquery's points, and its span is just under a whole number of steps so that both Prometheus 2
(whose ranges include their start) and 3 (whose do not) see the same points.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

STEPS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
MAX_POINTS = 720
GPU = "node, instance, gpu, uuid"
WASTE = 'state=~"idle|allocated_idle"'
HELD = 'state=~"busy|allocated_idle"'

_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"^\s*\{{\s*(?:{_MATCHER}(?:,{_MATCHER})*,?\s*)?\}}\s*$")


class SelectorError(ValueError):
    pass


def selector_matchers(selector: str | None) -> str:
    """The matchers inside a ``{...}`` selector, to add to every metric the report reads."""
    if not selector:
        return ""
    if not _SELECTOR.match(selector):
        raise SelectorError(
            f"--selector {selector!r} is not a label selector; write it as PromQL does, e.g. "
            '\'{cluster="eu"}\' or \'{node=~"gpu-.*", team!="ci"}\''
        )
    inner = selector.strip()[1:-1].strip().rstrip(",")
    if "__name__" in inner:
        raise SelectorError("--selector may not name metrics (__name__): the report chooses them")
    return inner


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    step: int

    @property
    def points(self) -> int:
        return round((self.end - self.start) / self.step)

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600


def window_for(start: float, end: float, scrape_interval: float = 0.0) -> Window:
    """Whole steps ending at the last step boundary before ``end``; at most MAX_POINTS of them, and
    each at least three scrape intervals long, so that every step's ``increase()`` has samples."""
    span = end - start
    if span <= 0:
        raise ValueError("the range is empty: --start must be before --end")
    step = next((s for s in STEPS if span / s <= MAX_POINTS and s >= 3 * scrape_interval),
                3600 * math.ceil(max(span / 3600 / MAX_POINTS, 3 * scrape_interval / 3600)))  # fmt: skip
    aligned = math.floor(end / step) * step
    n = max(1, round(span / step))
    return Window(aligned - n * step, aligned, step)


@dataclass(frozen=True)
class Query:
    key: str
    what: str  # for progress lines
    expr: str
    kind: str = "instant"  # or "range"


def _sel(name: str, matchers: str, *extra: str) -> str:
    parts = [m for m in (matchers, *extra) if m]
    return f"{name}{{{', '.join(parts)}}}" if parts else name


DOWN = 'state="down"'


def probe(matchers: str, window: str) -> str:
    """Samples in ``window`` of one state series per GPU, at the range's end, for the scrape interval."""
    return f"avg(count_over_time({_sel('gpu_state_seconds_total', matchers, DOWN)}[{window}]))"


def scrape_interval(per_hour: float | None, per_minute: float | None) -> float:
    """The scrape interval from the samples of the last hour, or of the last minute where that says
    less (series younger than an hour); 0 where there are none."""
    guesses = [3600 / per_hour] if per_hour else []
    if per_minute and per_minute >= 2:
        guesses.append(60 / (per_minute - 1))
    return min(guesses, default=0.0)


def queries(w: Window, matchers: str) -> list[Query]:
    """Aggregations sit outside the subqueries: per series, a subquery costs a step's samples; an
    aggregation inside one would be redone, label sets and all, at every one of its steps.  The
    state counters, the bulk of the samples, are read twice: once for the hours, once for the
    timeline (and a third time, for the held steps' activity, only the held states)."""
    s, span = f"{w.step}s", f"{w.points * w.step * 1000 - 1}ms"
    states = _sel("gpu_state_seconds_total", matchers)
    price = _sel("gpu_price_per_hour", matchers)
    held = f"increase({_sel('gpu_state_seconds_total', matchers, HELD)}[{s}]) > 0"
    # The signal GpuUnderutilized uses: SM activity where the GPU has it (GPM), else GPU-Util.
    signal = (
        f'label_replace(avg_over_time({_sel("gpu_sm_active_ratio", matchers)}[{s}]), "signal", "sm_active", '
        f'"", "") or on (job, instance, gpu, uuid) avg_over_time({_sel("gpu_utilization_ratio", matchers)}[{s}])'
    )
    peaks = f"max_over_time({_sel('gpu_memory_used_max_bytes', matchers)}[{s}])"
    holder = f"{GPU}, namespace, pod, user, state"

    def tiled(metric: str) -> str:
        """The highest value over the range, each sample read once: a subquery of an instant selector
        would decode the chunk around every step, most samples twice."""
        return f"max_over_time(max_over_time({_sel(metric, matchers)}[{s}])[{span}:{s}])"

    # Each GPU's highest and lowest price over the range, and on how many steps it had one.
    stats = " or ".join(
        f"label_replace({agg} by ({GPU}, currency) ({outer}({inner}({price}[{s}])[{span}:{s}])), "
        f'"stat", "{name}", "", "")'
        for name, agg, outer, inner in (("max", "max", "max_over_time", "max_over_time"),
                                        ("min", "min", "min_over_time", "min_over_time"),
                                        ("count", "max", "count_over_time", "max_over_time"))
    )  # fmt: skip
    return [
        Query("hours", "GPU-hours by state and holder",
              f"sum by ({holder}) (sum_over_time(increase({states}[{s}])[{span}:{s}])) / 3600"),
        Query("prices", "prices", stats),
        Query("info", "GPU models", f"max by ({GPU}, name, mig_mode) "
                                    f"({tiled('gpu_info')})"),
        Query("memory_total", "memory sizes", f"max by ({GPU}) ({tiled('gpu_memory_total_bytes')})"),
        Query("memory_peak", "memory peaks (p98)", f"max by ({GPU}) (quantile_over_time(0.98, {peaks}[{span}:{s}]))"),
        Query("activity", "activity while held (p95)",
              f"max by ({GPU}, signal) (quantile_over_time(0.95, (({signal}) and on (job, instance, gpu, uuid) "
              f"{held})[{span}:{s}]))"),
        Query("timeline", "hours over time", f"sum by (state) (increase({states}[{s}])) / 3600", "range"),
    ]  # fmt: skip


_UUID = re.compile(r"^[A-Za-z0-9-]+$")


def exact_cost(w: Window, matchers: str, uuids: list[str]) -> Query:
    """The cost of each step at that step's price, for GPUs whose price changed or was missing in
    part of the range (for the others, hours x their one price is exact and costs no query)."""
    s, span = f"{w.step}s", f"{w.points * w.step * 1000 - 1}ms"
    only = f'uuid=~"{"|".join(uuids)}"' if len(uuids) <= 200 and all(_UUID.match(u) for u in uuids) else ""
    states = _sel("gpu_state_seconds_total", matchers, only)
    price = f"max by (job, instance, gpu, uuid, currency) ({_sel('gpu_price_per_hour', matchers, only)})"
    priced = f"increase({states}[{s}]) * on (job, instance, gpu, uuid) group_left (currency) {price}"
    return Query(
        "cost",
        "cost of GPUs whose price changed",
        f"sum by ({GPU}, namespace, pod, user, state, currency) (sum_over_time(({priced})[{span}:{s}])) / 3600",
    )
