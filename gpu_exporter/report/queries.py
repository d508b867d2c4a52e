"""The PromQL the report asks, over a window of whole steps that tiles the range exactly.

Every query aggregates on the server: per GPU and holder at most, never raw samples.  Sums over
the range are subqueries of ``increase()`` over consecutive steps, so no single evaluation loads
more than one step of samples (Prometheus's ``query.max-samples`` is per evaluation).

The steps tile ``[start, end)`` exactly, whatever the two times are: the step divides the range's
length, and since a subquery's points sit on multiples of its step (in Prometheus and in
VictoriaMetrics alike), the queries are evaluated at the first multiple of the step at or after the
end, and every selector inside them looks back by the difference (``offset``).  The subquery spans
just under a whole number of steps, so that Prometheus 2 (whose ranges include their start) and 3
(whose do not) see the same points.

Only constructs that Prometheus and VictoriaMetrics read alike are used (docs/cost.md lists the
ones that differ): no ``or`` between series whose labels match (VictoriaMetrics fills one's gaps
with the other's points, Prometheus keeps both), prices per step by ``last_over_time`` of the step
(an instant selector at a step's end finds nothing during an outage, and finds a staleness marker
right after one).

Each GPU is counted once, however many scrapers saw it (two scrape jobs of one exporter, an HA pair
of Prometheus behind one query front, federation): its series that differ only in labels the
scrapers attach (``job``, a replica label, ...) are copies of one counter, and each step takes the
largest of their increases, never their sum (``once``; asked only where some GPU was seen through
two scrapers, as it aggregates at every step).  Within one scraper, the series of a GPU that
differ only in ``instance`` are one exporter that moved (a pod recreated on a new address): one
after the other, they are added up.  A GPU is its ``uuid`` on its ``node``; without a uuid (a GPU
lost before it was first read), its index on its target.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from .holders import LABELS as HOLDER_LABELS

# Every label of a holder that the exporter writes on a series (snapshot.HOLDER_LABELS, all kinds; the
# report may not import the snapshot, so tests/test_holder_names_agree.py holds the two equal): what
# tells one exporter's series of a GPU and state apart.  Two series that differ in nothing of these, the
# GPU and the state are copies of one counter, seen through two scrapers (``once``).
EVERY_HOLDER_LABEL = ("namespace", "pod", "container", "hpc_job", "user", "slurm_account", "slurm_partition",
                      "container_engine", "container_id", "container_name")  # fmt: skip

MAX_POINTS = 720
MIN_STEP = 5  # seconds
GPU = "node, instance, gpu, uuid"
JOIN = "job, instance, gpu, uuid"  # what a GPU's series from one exporter share
HELD = 'state=~"busy|allocated_idle|allocated_unknown"'  # every held state, a MIG slice held with activity unknown too
DOWN = 'state="down"'
# Who holds a GPU, as gpu_state_seconds_total names one holder per series: a pod, a Slurm job (with its
# user), a container (by ID and name) or a Unix user (holders.py).  Grouping by fewer would give a
# container's time to nobody and merge the jobs of one user.
HOLDER = ", ".join(HOLDER_LABELS)
# A GPU instance of a card in MIG mode, whose books are its own (gpu_state_seconds_total): grouped by
# where a slice's hours, holders and advice are its own; absent on a whole GPU.
SLICE = "gpu_instance_id"
# What one exporter writes on a GPU's state series besides the GPU itself: two series of a GPU that
# agree on these and the state are copies of one counter.
EXPORTED = ", ".join((*EVERY_HOLDER_LABEL, SLICE, "state"))
EVERY_HOLDER_LABEL_AND_SLICE = ", ".join((*EVERY_HOLDER_LABEL, SLICE))
WITH_UUID, WITHOUT_UUID = 'uuid!=""', 'uuid=""'
# The job the docs tell users to scrape the exporter in: docs/deploying.md's ``job_name: gpu-exporter``, the
# ServiceMonitor's Service (the Helm chart's ``<release>-gpu-exporter``); GpuExporterDown matches it so.
# Where its copy of a GPU and another target's disagree about who held it, its copy is the GPU's.
OWN_JOB = ".*gpu-exporter.*"
OWN, FOREIGN = f'job=~"{OWN_JOB}"', f'job!~"{OWN_JOB}"'

_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"^\s*\{{\s*(?:{_MATCHER}(?:,{_MATCHER})*,?\s*)?\}}\s*$")


class SelectorError(ValueError):
    pass


class RangeError(ValueError):
    """A range the report cannot tile exactly in enough steps."""


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
    """``points`` steps of ``step`` seconds that tile ``[start, end)``."""

    start: int
    end: int
    step: int
    # The scrape interval the steps were cut for (0: unknown): how many samples a step holds where no
    # scrape failed, which tells the steps that a scrape gap cut into (``counted``).
    scrape: float = field(default=0.0, compare=False)

    @property
    def points(self) -> int:
        return (self.end - self.start) // self.step

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600

    def from_epoch(self) -> Window:
        """The steps that start three steps or more after 1970: no store holds samples before 1970, and
        VictoriaMetrics 1.79 answers nothing for a subquery whose range reaches back to within about
        two steps of it (measured with steps of 1,000,000 to 4,380,000 s)."""
        least = 3 * self.step
        if self.start >= least:
            return self
        return replace(self, start=self.start + -((self.start - least) // self.step) * self.step)

    @property
    def at(self) -> int:
        """When the instant queries are evaluated: the first multiple of the step at or after the end."""
        return -(-self.end // self.step) * self.step

    @property
    def offset(self) -> int:
        """How far every selector looks back from ``at``, so that the steps end where the range does."""
        return self.at - self.end


def _divisors(n: int) -> list[int]:
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def window_for(start: float, end: float, scrape_interval: float = 0.0) -> Window:
    """The finest steps that tile ``[start, end)`` exactly: a step that divides the range's length,
    at most MAX_POINTS of them, each at least MIN_STEP and three scrape intervals long (so that every
    step's ``increase()`` has samples)."""
    if start != int(start) or end != int(end):
        raise RangeError("the range's start and end must be whole seconds")
    lo, hi = int(start), int(end)
    span = hi - lo
    if span <= 0:
        raise RangeError("the range is empty: the start must be before the end")
    least = max(MIN_STEP, math.ceil(3 * scrape_interval), math.ceil(span / MAX_POINTS))
    if least > span:
        raise RangeError(f"the range is {span} s long, less than a step can be ({least} s: three scrape intervals, "
                         "at least 5 s), so no step in it could count anything: make it longer")  # fmt: skip
    step = next(d for d in _divisors(span) if d >= least)
    # A length with no divisor near the wanted step (a prime number of seconds) would leave a handful
    # of steps, too few for the percentiles right-sizing reads: refuse it, rather than round it.
    wanted = min(60, span // least)
    if span // step < wanted / 2:
        raise RangeError(f"a range of {span} s cannot be cut into equal steps of {least} s or more ({span // step} "
                         "would be all): give a start and an end on whole minutes")  # fmt: skip
    return Window(lo, hi, step, scrape_interval)


def end_window(start: int, end: int, scrape_interval: float) -> Window:
    """The steps of a raw end of a range read in parts (``paths``): the finest that tile it exactly, as
    ``window_for``'s, but as few as one, at most an hour each (the recorded hours' own step, so that no
    price is held longer than an hour's); an end a few hours long at most, whose activity is the
    highest of its steps', needs no percentile's worth of them."""
    span = end - start
    least = max(MIN_STEP, math.ceil(3 * scrape_interval), math.ceil(span / MAX_POINTS))
    step = next((d for d in _divisors(span) if d >= least), span)
    if not least <= step <= HOUR:
        raise RangeError(f"an end of {span} s has no step of {least} s to an hour that tiles it")
    return Window(start, end, step, scrape_interval)


@dataclass(frozen=True)
class Query:
    key: str
    what: str  # for progress lines
    expr: str
    kind: str = "instant"  # or "range"
    at: int | None = None  # an instant query's time, where it is not the window's
    # A range query's times are this much later than the window's steps, and its points are moved back by
    # as much: the recorded series hold an hour's figure in a sample of the hour after the next (LAG).
    shift: int = 0


def _sel(name: str, matchers: str, *extra: str) -> str:
    parts = [m for m in (matchers, *extra) if m]
    return f"{name}{{{', '.join(parts)}}}" if parts else name


PROBES = ("3599999ms", "59999ms")  # an hour and a minute, without the sample at their start, as both engines read


def probe(matchers: str, window: str) -> str:
    """The most samples in ``window`` of one GPU's state series, at the range's end, for the scrape
    interval: the most, so that a GPU whose exporter restarted in that window does not slow the guess."""
    return f"max(count_over_time({_sel('gpu_state_seconds_total', matchers, DOWN)}[{window}]))"


def scrape_interval(per_hour: float | None, per_minute: float | None) -> float:
    """The scrape interval from the samples of the last hour, or of the last minute where that says
    less (series younger than an hour); 0 where there are none."""
    guesses = [3600 / per_hour] if per_hour else []
    if per_minute and per_minute >= 2:
        guesses.append(60 / per_minute)
    return min(guesses, default=0.0)


class _Tiles:
    """Selectors and subqueries over a window's steps."""

    def __init__(self, w: Window, matchers: str) -> None:
        self.w, self.matchers = w, matchers
        self.s = f"{w.step}s"
        self.off = f" offset {w.offset}s" if w.offset else ""
        self.span = f"{w.points * w.step * 1000 - 1}ms"
        self.open = f"{w.step * 1000 - 1}ms"

    def range(self, metric: str, *extra: str) -> str:
        """One step of samples, ending at a step's end, without the sample at its start (Prometheus 2
        would read it twice, in this step and the one before; VictoriaMetrics never reads it)."""
        return f"{_sel(metric, self.matchers, *extra)}[{self.open}]{self.off}"

    def counter(self, metric: str, *extra: str) -> str:
        """One step of a counter's samples, with the sample at the step's start (Prometheus 2 reads it in
        the range; VictoriaMetrics reads the last sample before the range): where a target saw a GPU."""
        return f"{_sel(metric, self.matchers, *extra)}[{self.s}]{self.off}"

    def counted(self, metric: str, *extra: str, floor: str = "") -> str:
        """A counter's increase over each step, across a scrape gap (``counted``)."""
        return counted(_sel(metric, self.matchers, *extra), self.w, self.w.offset, floor)

    def over(self, inner: str) -> str:
        """A subquery of ``inner`` at the end of every step."""
        return f"({inner})[{self.span}:{self.s}]"

    def tiled(self, outer: str, inner: str, metric: str, *extra: str) -> str:
        """``outer`` over the range of ``inner`` of each step, each sample read once: a subquery of an
        instant selector would decode the chunk around every step, most samples twice."""
        return f"{outer}({inner}({self.range(metric, *extra)})[{self.span}:{self.s}])"


# How long a run of failed scrapes may be for the exporter's counters to carry a GPU's hours across it
# (or a step, where a step is longer): how far back a step looks for the sample before a gap.
BRIDGE = 15 * 60


def counted(selector: str, w: Window, offset: int = 0, floor: str = "") -> str:
    """A counter's increase over the step ending ``offset`` s before each evaluation: its last sample
    less the last one before the step, however far back (up to ``BRIDGE``, or a step where a step is
    longer), so that the seconds of a scrape gap are in the first step after it, each state's on its
    own counter.

    Not ``increase()``, which loses a gap on Prometheus: it extrapolates at most half a scrape interval
    past a gap's edge, and a step with fewer than two samples counts nothing (a minute of failed scrapes
    at 15 s lost a fifth of a 5-minute range), where VictoriaMetrics' counts from the sample before the
    step, as this does.  Where the counter went down (the exporter restarted: what it counted before is
    lost, and ``gaps`` says so where that was in a gap), the larger of ``increase()`` and the new
    process's last sample, what it counted (``increase()`` extrapolates from its first, or has no two
    samples to count from, where VictoriaMetrics' counts it all); where the counter has no sample
    before the step (a new holder), ``increase()``.  The recorded hours are this at a step of an hour
    (``rules``).  ("+ 0" drops the metric name, which Prometheus 2's last_over_time() keeps: each
    step's branches agree on labels.)

    ``floor`` (``counted_until``), per GPU, holder and state, where copies of the counter from several
    jobs are counted once (``once``): the last reading of it counted before the step, by whichever
    job's series, to count from instead of the series' own last sample, so that a scrape gap one job
    bridged and another's copy counted is counted once."""
    off = f" offset {offset}s" if offset else ""
    window = f"{selector}[{w.step}s]{off}"  # with the sample before the step (as increase() reads it)
    last = f"last_over_time({selector}[{w.step * 1000 - 1}ms]{off})"
    before = f"last_over_time({selector}[{max(BRIDGE, w.step)}s] offset {offset + w.step}s)"
    since = f"{last} - {before}"
    if floor:  # from the last reading counted, of any job's; else (none in BRIDGE) from its own
        since = f"(({last} - on (node, gpu, uuid, {EXPORTED}) group_left {floor}) or ({since}))"
    # The difference only where the counter never went down in the step: a restart whose new counter
    # rose past the old one's last sample would hide the seconds counted before it.
    carried = f"{since} >= 0 unless resets({window}) > 0"
    # Else the larger of increase() and, where the counter went down, its last sample.
    restarted = f'label_replace({last} + 0 < {before}, "{SIDE}", "restart", "", "")'
    larger = f'max without ({SIDE}) (label_replace(increase({window}), "{SIDE}", "increase", "", "") or {restarted})'
    return f"(({carried}) or {larger})"


# A label of counted()'s own, to take the larger of two figures of one series.
SIDE = "counted_as"


class PerSeries(Protocol):
    """An expression per series, given a matcher to add to its selectors, and the ``floor`` of
    ``counted`` for the exporter's own job's series where ``once`` has one."""

    def __call__(self, m: str, floor: str = "") -> str: ...


def once(per_series: PerSeries, keep: str, own_saw: Callable[[str], str] | None = None, floor: str = "") -> str:
    """``per_series`` (an expression per series, given a matcher to add to its selectors) with each
    GPU's counter counted once at this step, under the exporter's labels and ``node`` (and ``keep``):

    - within one scraper, the series that differ only in ``instance`` (an exporter that moved) are
      added up;
    - copies of one series seen through several scrapers (told apart by ``job``, a replica label or
      any other label a scraper attaches) give the largest of their values: one counter read twice,
      whose increases differ only by where each scraper's samples fall;
    - a GPU without a uuid is its index on its target: its ``instance`` is kept;
    - where ``own_saw`` (a GPU's presence at this step, given a matcher) is given, copies are one GPU
      only where they agree on its holders: at a step where the exporter's own job (``OWN_JOB``) saw
      a GPU, the other jobs' series of it are not counted (``foreign``), only its own;
    - where ``floor`` is given (``counted_until``), each step counts from the last reading counted
      before it, whichever job's it was, so that a scrape gap is counted once.

    The two halves read disjoint series (with a uuid, without), whose label sets never match, so
    ``or`` is a plain union on every engine."""
    by = f"{EXPORTED}{keep}"
    return (
        f"max by (node, gpu, uuid, {by}) ({foreign(per_series, own_saw, floor)}) or "
        f"max by (node, instance, gpu, {by}) ({per_series(WITHOUT_UUID)})"
    )


def foreign(per_series: PerSeries, own_saw: Callable[[str], str] | None, floor: str = "") -> str:
    """Each series of a GPU with a uuid, an exporter's instances added up, each step's; with ``own_saw``,
    another job's only where the exporter's own job did not see the GPU at that step.  A copy from
    another job that carries a GPU's ``node``, ``gpu`` and ``uuid`` with other holders (a scraped pod
    that copies them) is not that GPU's: taking each series' largest copy would add its holders to the
    real ones'.  Where the own job saw the GPU, its series are the GPU's (honest copies agree with them;
    their largest differs by where the scrapers' samples fall); elsewhere, every job's count.  The two
    sides differ in ``job``, so ``or`` is a plain union."""
    if own_saw is None:
        return f"sum without (instance) ({per_series(WITH_UUID)})"
    own, other = f"{WITH_UUID}, {OWN}", f"{WITH_UUID}, {FOREIGN}"
    saw = own_saw(f"{own}, {DOWN}")
    mine = f"sum without (instance) ({per_series(own, floor)})"
    theirs = f"sum without (instance) ({per_series(other, floor)})"
    return f"{mine} or ({theirs} unless on (node, gpu, uuid) {saw})"


def _union(parts: list[tuple[str, str, str]]) -> str:
    """Expressions told apart by a label of their own: their label sets never match, so ``or`` is a
    plain union on every engine."""
    return " or ".join(f'label_replace({expr}, "{label}", "{value}", "", "")' for label, value, expr in parts)


# The activity series the report reads (gpu_<name>_ratio), by their signal label.
ACTIVITY_SIGNALS = ("sm_active", "utilization", "dram_active", "tensor_active", "fp64_active", "fp32_active",
                    "fp16_active")  # fmt: skip


def price_queries(w: Window, price: Callable[[int], str], priced_steps: str, shift: int = 0,
                  suffix: str = "") -> list[Query]:  # fmt: skip
    """Each GPU's price where it changed, and on how many steps it had one.

    ``price`` is the expression of each GPU's price at a step, or (given seconds to look back) at the
    step before.  The range query answers only the steps where a price is new: the first step,
    a step whose price differs from the one before, and one after a step without a price.  A fleet's
    prices hold for weeks, so that is a point or two per GPU where every step's price would be 720
    (30 days: 130 MiB at 10,000 GPUs, past the answer bound); the steps between carry the price before
    them (``cost.plan``).  ``priced_steps`` counts the steps with a price: a step without one (pricing
    turned on or off in the range) reads the same as a step whose price held."""
    first = w.start + w.step + shift  # the range query's first step, which has no step before it in the answer
    same = f"({price(0)}) == ({price(w.step)})"
    changed = f"({price(0)}) unless (({same}) and on () (vector(time()) > {first}))"
    return [Query("prices", f"prices{suffix}", changed, "range", shift=shift),
            Query("priced_steps", f"steps priced{suffix}", priced_steps,
                  at=w.end + shift if shift else None)]  # fmt: skip


def queries(w: Window, matchers: str) -> list[Query]:
    """What the report asks whatever the prices say (the hours and the timeline follow, once the prices
    tell where to cut the range and the targets whether any GPU was seen twice: ``hours``, ``timeline``).
    Aggregations sit outside the subqueries where they can: per series, a subquery costs a step's
    samples; an aggregation inside one is redone at every one of its steps."""
    t = _Tiles(w, matchers)
    price, state = "gpu_price_per_hour", "gpu_state_seconds_total"
    # The steps on which the GPU had a price, under any holder's labels (the exporter puts the GPU's
    # holders on its price): counted per series, a GPU whose pod changed daily would have a day's.
    priced = f"max by ({GPU}, currency) (last_over_time({t.range(price)}) >= 0)"
    return [
        *price_queries(w, lambda back: f"max by ({GPU}, currency) (last_over_time({_sel(price, matchers)}[{t.open}]"
                                       f"{f' offset {back}s' if back else ''})) >= 0",
                       f"count_over_time(({priced})[{t.span}:{t.s}])"),
        # On how many steps each target saw each GPU (its unheld "down" series exists from its first poll):
        # every label but the exporter's is kept, so that the report names the targets it counted once.
        Query("seen", "GPUs seen, by target",
              f"max without ({EXPORTED}) ({t.tiled('count_over_time', 'max_over_time', state, DOWN)})"),
        Query("info", "GPU models",
              f"max by ({GPU}, name, mig_mode) ({t.tiled('max_over_time', 'max_over_time', 'gpu_info')})"),
        Query("memory_total", "memory sizes",
              f"max by ({GPU}) ({t.tiled('max_over_time', 'max_over_time', 'gpu_memory_total_bytes')})"),
        Query("memory_peak", "memory peaks (highest)",
              f"max by ({GPU}) ({t.tiled('max_over_time', 'max_over_time', 'gpu_memory_used_max_bytes')})"),
        Query("activity", "activity while held (p95 of bursts)",
              f"max by ({GPU}, signal) (quantile_over_time(0.95, ({held_activity(t)})[{t.span}:{t.s}]))"),
        # Who holds each GPU at the end of the range: the one to reclaim it from (a GPU's holders by
        # hours can tie, where pods come and go, and rank differently on two engines).
        Query("holders_now", "holders now",
              f"max by ({GPU}, {HOLDER}, {SLICE}) (stddev_over_time({t.range(state, HELD)}) > bool 0)"),
        *link_queries(t),
    ]  # fmt: skip


# The links' facts the report reads, by their ``what`` label: how many NVLink links (0: none, so no
# NVLink traffic to keep), and the PCIe link's generation and width, the highest each reached (an idle
# card trains down; under load it trains up to what the slot allows) beside their maximum.
LINK_FACTS = {
    "nvlink_links": "gpu_nvlink_links",
    "pcie_gen": "gpu_pcie_link_generation",
    "pcie_max_gen": "gpu_pcie_link_max_generation",
    "pcie_width": "gpu_pcie_link_width",
    "pcie_max_width": "gpu_pcie_link_max_width",
    "pcie_capacity": "gpu_pcie_link_max_bytes_per_second",
}
# What the recorded path asks of the links: not the generation and width the link trained at, since an
# idle card trains down, and a GPU idle in the range's last hour would read as a link to fix; a starved
# link is found where the range is read raw, over the whole range.
RECORDED_LINK_FACTS = {k: v for k, v in LINK_FACTS.items() if k not in ("pcie_gen", "pcie_width")}
# A step whose PCIe traffic (either way, the step's mean) is at this share of the link's capacity or
# more is link-bound: the GPU waits on the bus.
LINK_BOUND = 0.9


def link_queries(t: _Tiles) -> list[Query]:
    """What the links were: ``links`` (LINK_FACTS, each the highest over the range) and ``pcie_load``:
    while held, the p95 of each step's mean PCIe traffic as a share of the link's capacity (``rx``,
    ``tx``); and ``pcie_bound``: the seconds of the held steps where either way was at LINK_BOUND or more."""
    facts = _union([("what", what, f"max_over_time({t.range(metric)})") for what, metric in LINK_FACTS.items()])
    held = f"stddev_over_time({t.range('gpu_state_seconds_total', HELD)}) > 0"
    capacity = f"avg_over_time({t.range('gpu_pcie_link_max_bytes_per_second')})"
    shares = _union([("what", way, f"avg_over_time({t.range(f'gpu_pcie_{way}_bytes_per_second')}) / {capacity}")
                     for way in ("rx", "tx")])  # fmt: skip
    bound = f"(max without (what) ({shares}) >= {LINK_BOUND}) and on ({JOIN}) ({held})"
    return [
        Query("links", "links (NVLink, PCIe)", f"max by ({GPU}, what) (max_over_time({t.over(facts)}))"),
        Query("pcie_load", "PCIe load while held",
              f"max by ({GPU}, what) (quantile_over_time(0.95, {t.over(f'({shares}) and on ({JOIN}) ({held})')}))"),
        Query("pcie_bound", "PCIe-bound time",
              f"max by ({GPU}) (count_over_time({t.over(bound)})) * {t.w.step}"),
    ]  # fmt: skip


def held_activity(t: _Tiles) -> str:
    """Each step's activity while held, per signal (one series per GPU and ``signal``)."""
    # Held in a step: a held state's counter changed between two of the step's samples. Not increase() > 0,
    # which the engines answer differently where a counter starts (a new holder) or restarts; and one
    # pass over the samples, where max > min would take two.
    held = f"stddev_over_time({t.range('gpu_state_seconds_total', HELD)}) > 0"
    # The activity while held, per signal, at its bursts: each step's highest poll (a poll's value is
    # already a mean over seconds), whose p95 over the range is what the bursts reach, where the mean
    # of each step would smooth an endpoint's bursts into its idle.  SM activity where the GPU has
    # GPM, else GPU-Util (as GpuUnderutilized reads it); DRAM bandwidth used; each pipe's activity;
    # and NVLink's data sent, all links together.  One held test per step serves them all.
    signals = _union([
        *(("signal", name, f"max_over_time({t.range(f'gpu_{name}_ratio')})") for name in ACTIVITY_SIGNALS),
        ("signal", "nvlink_tx", f"sum without (link) (rate({t.range('gpu_nvlink_tx_bytes_total')}))"),
    ])  # fmt: skip
    return f"({signals}) and on ({JOIN}) ({held})"


def _each(per_series: PerSeries, copies: bool, keep: str = "", own_saw: Callable[[str], str] | None = None,
          floor: str = "") -> str:  # fmt: skip
    """Each step's increases: counted once (``once``) where some GPU was seen through two scrapers,
    else as they are.  Counting once aggregates at every step of the subquery, which takes Prometheus
    about as long again as reading the samples: a store with one scraper per GPU does not pay it."""
    return once(per_series, keep, own_saw, floor) if copies else per_series("")


def counted_until(state: Callable[[str], str], w: Window, offset: int = 0) -> str:
    """The ``floor`` of ``counted`` where copies are counted once (``once``): per GPU, holder and state,
    the counter's last reading that was counted before the step, by whichever job's series it was
    counted: the exporter's own job's last reading (within ``BRIDGE``), or a copy's from another job at
    a step where the own job did not see the GPU, which is where ``foreign`` counted the copy instead.
    Each copy reads one counter, so the latest reading is the largest.

    Every series, the own job's and the copies', counts from there: without it, the own job's first
    step after a scrape gap would count again the gap's seconds that the copies counted in it, and a
    copy's first step in the gap would start from its own last reading, before or after the own job's
    (seconds counted twice, or never).  A copy's readings at steps the own job saw are not counted, and
    are left out: a subquery over the steps.  ``state`` is the state counter's selector, given a
    matcher."""
    off = f" offset {offset}s" if offset else ""
    bridge = max(BRIDGE, w.step)
    own = f"last_over_time({state(f'{WITH_UUID}, {OWN}')}[{bridge}s] offset {offset + w.step}s)"
    theirs = (
        f"last_over_time({state(f'{WITH_UUID}, {FOREIGN}')}[{w.step * 1000 - 1}ms]{off}) unless on "
        f"(node, gpu, uuid) last_over_time({state(f'{WITH_UUID}, {OWN}, {DOWN}')}[{w.step}s]{off})"
    )
    back = math.ceil(bridge / w.step) * w.step
    copies = f"last_over_time(({theirs})[{back * 1000 - 1}ms:{w.step}s] offset {w.step}s)"
    by = f"node, gpu, uuid, {EXPORTED}"
    return (
        f'max by ({by}) (label_replace(max by ({by}) ({own}), "{SIDE}", "own", "", "") or '
        f'label_replace(max by ({by}) ({copies}), "{SIDE}", "copy", "", ""))'
    )


def _saw(t: _Tiles, recorded: bool) -> Callable[[str], str]:
    """Whether a GPU's "down" series (given its matchers) has a sample in each step: where its target
    saw it.  Recorded, the hour's "down" figure (``REC_DOWN``)."""
    if recorded:
        return lambda m: hourly(REC_DOWN, t.matchers, m)
    return lambda m: f"last_over_time({t.counter('gpu_state_seconds_total', m)})"


def _recorded_state(matchers: str) -> PerSeries:
    """The recorded hours of each series, with no floor: a recorded hour bridges a gap only from the hour
    before, and only where the own job saw the GPU in it, where ``foreign`` counted no copy."""
    return lambda m, floor="": hourly(REC_STATE, matchers, m)


def timeline(w: Window, matchers: str, copies: bool = False, recorded: bool = False) -> Query:
    """The hours of each state at each step, for the whole selection (a range query).  Asked at the
    multiples of the step the window's end is moved to (``Window.offset``), each selector looking back
    by as much, and moved back: as the hours' subquery is, whose points sit there (so does the
    subquery of ``counted_until``)."""
    if recorded:
        each = _each(_recorded_state(matchers), copies, own_saw=_saw(_Tiles(w, matchers), True))
        return Query("timeline", "hours over time", f"sum by (state) ({each}) / 3600", "range", shift=LAG)
    t = _Tiles(w, matchers)
    floor = counted_until(lambda m: _sel("gpu_state_seconds_total", matchers, m), w, w.offset)
    each = _each(lambda m, floor="": t.counted("gpu_state_seconds_total", m, floor=floor), copies,
                 own_saw=_saw(t, False), floor=floor)  # fmt: skip
    return Query("timeline", "hours over time", f"sum by (state) ({each}) / 3600", "range", shift=w.offset)


def hours(w: Window, matchers: str, first: int = 1, last: int | None = None, copies: bool = False,
          recorded: bool = False) -> Query:  # fmt: skip
    """GPU-hours by GPU, holder and state over steps ``first`` to ``last`` of the window (1-based, both
    included; all of them by default): ``increase()`` over consecutive steps, summed, each GPU's once
    where ``copies`` (some GPU seen through two scrapers).  A range whose prices changed is asked in
    pieces that each hold one price per GPU, so that hours x price is its cost."""
    last = w.points if last is None else last
    if not 1 <= first <= last <= w.points:
        raise ValueError(f"steps {first} to {last} are not within the window's 1 to {w.points}")
    t = _Tiles(w, matchers)
    holder = f"{GPU}, {HOLDER}, {SLICE}, state"
    span = f"{(last - first + 1) * w.step * 1000 - 1}ms"
    if recorded and not copies:  # the hours' samples as they are: no step to evaluate (``recorded_range``)
        summed = f"sum_over_time({recorded_range(REC_STATE, matchers, last - first + 1)})"
    elif recorded:
        each = _each(_recorded_state(matchers), copies, own_saw=_saw(t, True))
        summed = f"sum_over_time(({each})[{span}:{t.s}])"
    else:
        floor = counted_until(lambda m: _sel("gpu_state_seconds_total", matchers, m), w, w.offset)
        inner = _each(lambda m, floor="": t.counted("gpu_state_seconds_total", m, floor=floor), copies,
                      own_saw=_saw(t, False), floor=floor)  # fmt: skip
        summed = f"sum_over_time(({inner})[{span}:{t.s}])"
    whole = (first, last) == (1, w.points)
    what = "GPU-hours by state and holder" + ("" if whole else f" (steps {first} to {last})")
    return Query("hours" if whole else f"hours:{first}:{last}", what, f"sum by ({holder}) ({summed}) / 3600",
                 at=_at(w, recorded) - (w.points - last) * w.step)  # fmt: skip


_UUID = re.compile(r"^[A-Za-z0-9-]+$")


def _currency_matcher(currency: str) -> str:
    return 'currency="' + currency.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exact_cost(w: Window, matchers: str, uuids: list[str], currency: str, copies: bool = False,
               recorded: bool = False) -> Query:  # fmt: skip
    """The cost of each step at the price of that step (the last one the step saw), for GPUs whose
    price changed or was missing in part of the range (for the others, hours x their one price is
    exact and costs no query).  Prices of one currency only: a GPU priced in two at once would match
    two price series and fail the whole query.  Each series is priced by its own target's price (never
    another node's), then, where ``copies``, counted once (``once``)."""
    t = _Tiles(w, matchers)
    only = f'uuid=~"{"|".join(uuids)}"' if len(uuids) <= 200 and all(_UUID.match(u) for u in uuids) else ""

    def priced_series(m: str, floor: str = "") -> str:
        if recorded:
            hours = hourly(REC_STATE, matchers, only, m)
            price = f"max by ({JOIN}, currency) ({hourly(REC_PRICE, matchers, only, m, _currency_matcher(currency))})"
        else:
            prices = t.range("gpu_price_per_hour", only, m, _currency_matcher(currency))
            price = f"max by ({JOIN}, currency) (last_over_time({prices}))"
            hours = t.counted("gpu_state_seconds_total", only, m, floor=floor)
        return f"{hours} * on ({JOIN}) group_left (currency) {price}"

    floor = "" if recorded else counted_until(lambda m: _sel("gpu_state_seconds_total", matchers, only, m), w,
                                                   w.offset)  # fmt: skip
    priced = _each(priced_series, copies, ", currency", _saw(t, recorded), floor)
    return Query(
        "cost",
        "cost of GPUs whose price changed",
        f"sum by ({GPU}, {HOLDER}, {SLICE}, state, currency) (sum_over_time({t.over(priced)})) / 3600",
        at=_at(w, recorded) if recorded else None,
    )


def other_jobs(w: Window, matchers: str, recorded: bool = False) -> Query:
    """On how many steps each target of a job other than the exporter's own (``OWN_JOB``) wrote any state
    series of each GPU: a copy the "seen" query (the "down" series) need not show, as a forged one
    leaves it out.  With "seen", whether some GPU's series come through two scrapers (``cost.seen_twice``).
    A store that scrapes only the exporter's own job reads nothing here."""
    t = _Tiles(w, matchers)
    if recorded:
        inner = f"count_over_time({_sel(REC_STATE, matchers, WITH_UUID, FOREIGN)}[{w.points * HOUR}s] offset 1ms)"
        return Query("other_jobs", "GPUs seen by other jobs (recorded)", f"max without ({EXPORTED}) ({inner})",
                     at=w.end + LAG)  # fmt: skip
    inner = t.tiled("count_over_time", "max_over_time", "gpu_state_seconds_total", WITH_UUID, FOREIGN)
    return Query("other_jobs", "GPUs seen by other jobs", f"max without ({EXPORTED}) ({inner})")


def disagreeing(w: Window, matchers: str, recorded: bool = False) -> Query:
    """The hours each target of another job gave a GPU's holders that the exporter's own job did not
    report at steps it saw the GPU: the copies ``once`` leaves out, per GPU and target, for the report
    to name.  Honest copies give none: where a holder's series has two samples of another scraper's in
    a step, it has one of the own job's at least (their scrapes are less than an interval apart)."""
    t = _Tiles(w, matchers)
    state = "gpu_state_seconds_total"
    if recorded:

        def per(m: str) -> str:
            return hourly(REC_STATE, matchers, m)

        present = per
    else:

        def per(m: str) -> str:
            return t.counted(state, m)

        def present(m: str) -> str:
            return f"last_over_time({t.counter(state, m)})"

    own, other = f"{WITH_UUID}, {OWN}", f"{WITH_UUID}, {FOREIGN}"
    lacked = (f"({per(other)} unless on (node, gpu, uuid, {EXPORTED}) {present(own)}) "
              f"and on (node, gpu, uuid) {_saw(t, recorded)(f'{own}, {DOWN}')}")  # fmt: skip
    return Query("disagree", "copies from other jobs that disagree",
                 f"sum without ({EXPORTED}) (sum_over_time(({lacked})[{w.points * w.step * 1000 - 1}ms:{t.s}])) / 3600",
                 at=_at(w, recorded))  # fmt: skip


def presence(matchers: str, w: Window) -> str:
    """How many GPUs the store saw in the range (their unheld "down" series), for an empty report: run
    without the selector, it tells a selector that matched nothing from a range without data.  Each GPU
    once, however many targets saw it."""
    t = _Tiles(w, matchers)
    return _count_gpus(t.tiled("max_over_time", "max_over_time", "gpu_state_seconds_total", DOWN))


def anywhere(matchers: str) -> str:
    """Whether the store holds gpu-exporter's series now: how many GPUs."""
    return _count_gpus(_sel("gpu_state_seconds_total", matchers, DOWN))


def _count_gpus(down: str) -> str:
    """The GPUs among "down" series: a GPU with a uuid once on its node, one without once per target."""
    return f'count(max by (node, instance, gpu, uuid) (label_replace({down}, "instance", "", "uuid", ".+")))'


# The recorded path.  alerts/gpu-report.rules.yml keeps, once an hour, each series' figure of the last
# whole UTC hour but one: what the raw queries above compute for a step of that hour, at a step of an
# hour (``rules``, the file's expressions).  An hour later than needed, so that scrapes that arrive
# late are in; an hour of its own because Prometheus evaluates a group at a phase of the hour that
# hashes from its name (and vmalert at the hour): the figure of the hour ending at H is in the sample
# recorded in [H + 1 h, H + 2 h), whatever the phase.  The report reads those samples at H + LAG,
# looking back an hour, and reads 1 sample per series and hour instead of a scrape's every sample.
#
# Over a range of whole hours whose raw step is an hour (720 h: 30 days), both paths evaluate the
# same expressions on the same samples: the same hours, prices, and so money, to the float.

HOUR = 3600
LAG = 2 * HOUR
MIN_RECORDED_HOURS, MAX_RECORDED_HOURS = 24, MAX_POINTS
REC_STATE = "gpu:report_state_seconds:hour"
REC_PRICE = "gpu:report_price_per_hour:hour"
REC_DOWN = "gpu:report_down:hour"
REC_INFO = "gpu:report_info:hour"
REC_MEMORY_TOTAL = "gpu:report_memory_total_bytes:hour"
REC_MEMORY_PEAK = "gpu:report_memory_used_max_bytes:hour"
REC_ACTIVITY = "gpu:report_activity_held:hour"
REC_MARKER = "gpu:report_rules:hour"  # the group ran for that hour


def rules() -> dict[str, str]:
    """The recording rules of alerts/gpu-report.rules.yml, by name (tests/test_report_recorded.py holds
    the file to them): the raw queries' expression of one step, at a step of an hour, for the hour
    ending a whole hour before the evaluation (a subquery's point sits on a multiple of its step)."""
    t = _Tiles(Window(0, HOUR, HOUR), "")
    state = "gpu_state_seconds_total"
    per_hour = {
        REC_STATE: counted(state, t.w),
        # One price a GPU and target, whoever held it: the exporter writes the holders on the price,
        # and a GPU whose pod changed daily would have 30 price series a month, each an hour's sample.
        REC_PRICE: f"max without ({EVERY_HOLDER_LABEL_AND_SLICE}) (last_over_time({t.range('gpu_price_per_hour')}))",
        REC_DOWN: f"max_over_time({t.range(state, DOWN)})",
        REC_INFO: f"max_over_time({t.range('gpu_info')})",
        REC_MEMORY_TOTAL: f"max_over_time({t.range('gpu_memory_total_bytes')})",
        REC_MEMORY_PEAK: f"max_over_time({t.range('gpu_memory_used_max_bytes')})",
        REC_ACTIVITY: held_activity(t),
    }
    out = {name: f"last_over_time(({expr})[1h:1h] offset 1h)" for name, expr in per_hour.items()}
    out[REC_MARKER] = "vector(1)"
    return out


def hourly(metric: str, matchers: str, *extra: str) -> str:
    """A recorded series' figure of the hour ending LAG before the evaluation: its one sample of the
    hour before (the look-back ends a millisecond early: a sample at the evaluation's very time is of
    the next hour, and Prometheus 2 includes a range's start)."""
    return f"last_over_time({_sel(metric, matchers, *extra)}[1h] offset 1ms)"


def recorded_range(metric: str, matchers: str, hours: int) -> str:
    """The samples of ``hours`` hours of a recorded series, for a function over time, read at the last
    hour's end + LAG: the look-back spans the hours and ends a millisecond early (as ``hourly``), so
    that each engine reads the same samples whether it includes a range's start or not.  Read as they
    are, without a subquery's step by step evaluation: a tenth of the store's time, or less."""
    return f"{_sel(metric, matchers)}[{hours * HOUR}s] offset 1ms"


def recorded_window(start: float, end: float) -> Window | None:
    """The window of the recorded path: steps of an hour over a range of whole hours, 1 to 30 days;
    None where the range is not one (the raw path then reads it)."""
    if start % HOUR or end % HOUR:
        return None
    hours = (int(end) - int(start)) // HOUR
    if not MIN_RECORDED_HOURS <= hours <= MAX_RECORDED_HOURS:
        return None
    return Window(int(start), int(end), HOUR)


def _at(w: Window, recorded: bool) -> int:
    return w.end + LAG if recorded else w.at


def _hours_of(w: Window, inner: str, outer: str) -> str:
    """``outer`` over the range's hours of ``inner`` (read at each hour's end + LAG)."""
    return f"{outer}(({inner})[{w.points * HOUR * 1000 - 1}ms:1h])"


def hour_covered(matchers: str = "") -> str:
    """1 where the recorded series hold an hour's hours, read at the hour's end + LAG: the rules ran
    (their marker), the hours rule wrote something (each GPU's "down" series has a figure every hour it
    was seen for a whole hour), and it wrote every GPU the rules saw that hour (``REC_DOWN``, recorded
    by a rule of its own).  A ruler's limit or timeout that failed the hours rule alone, for one hour or
    for some GPUs, leaves the hour uncovered, where the marker alone would say it ran."""
    written = hourly(REC_STATE, matchers, DOWN)
    return (f"max({hourly(REC_MARKER, '')}) and on () count({written}) unless on () "
            f"count({hourly(REC_DOWN, matchers)} unless {written})")  # fmt: skip


def coverage(w: Window) -> str:
    """On how many of the range's hours the recorded series hold the hours (``hour_covered``): all, or
    some and which (``hour_covered`` of each hour, a range query), or the raw path."""
    return _hours_of(w, hour_covered(), "count_over_time")


def recorded_queries(w: Window, matchers: str) -> list[Query]:
    """``queries`` on the recorded series: each the raw query's figure at a step of an hour.  Who holds
    each GPU now is asked of the raw series (the range's last hour only)."""
    at = w.end + LAG
    raw = {q.key: q for q in queries(w, matchers)}

    def over(outer: str, metric: str) -> str:
        return f"{outer}({recorded_range(metric, matchers, w.points)})"

    def price(back: int) -> str:  # as ``hourly`` reads it, ``back`` seconds earlier
        selector = f"{_sel(REC_PRICE, matchers)}[1h] offset {back * 1000 + 1}ms"
        return f"max by ({GPU}, currency) (last_over_time({selector})) >= 0"

    # The hours on which the GPU had a price, whichever series held it (``queries``): the recorded prices
    # hold no holder (``rules``), but hours recorded by an older rule file do.
    priced = _hours_of(w, f"max by ({GPU}, currency) ({hourly(REC_PRICE, matchers)} >= 0)", "count_over_time")
    return [
        *price_queries(w, price, priced, LAG, " (recorded)"),
        Query("seen", "GPUs seen, by target (recorded)",
              f"max without ({EXPORTED}) ({over('count_over_time', REC_DOWN)})", at=at),
        Query("info", "GPU models (recorded)", f"max by ({GPU}, name, mig_mode) ({over('max_over_time', REC_INFO)})",
              at=at),
        Query("memory_total", "memory sizes (recorded)",
              f"max by ({GPU}) ({over('max_over_time', REC_MEMORY_TOTAL)})", at=at),
        Query("memory_peak", "memory peaks (recorded)",
              f"max by ({GPU}) ({over('max_over_time', REC_MEMORY_PEAK)})", at=at),
        Query("activity", "activity while held (recorded)",
              f"max by ({GPU}, signal) (quantile_over_time(0.95, {recorded_range(REC_ACTIVITY, matchers, w.points)}))",
              at=at),
        raw["holders_now"],
        # How many NVLink links and what PCIe link each GPU may have, from the raw series of the range's
        # last hour (a few gauges): the recorded series hold no links, and a link's load is not asked here.
        Query("links", "links (NVLink, PCIe; the last hour)", "max by ({GPU}, what) ({facts})".format(
            GPU=GPU, facts=_union([("what", what, f"max_over_time({_sel(metric, matchers)}[1h])")
                                   for what, metric in RECORDED_LINK_FACTS.items()])), at=w.end),
    ]  # fmt: skip


def fleet(w: Window, matchers: str, recorded: bool) -> Query:
    """The UUIDs of the GPUs in the range (a row each; a GPU without one, a row without the label)."""
    if recorded:
        inner = f"count_over_time({_sel(REC_DOWN, matchers)}[{w.points * HOUR}s] offset 1ms)"
        return Query("fleet", "GPUs in the range (recorded)", f"count by (uuid) ({inner})", at=w.end + LAG)
    inner = f"count_over_time({_sel('gpu_state_seconds_total', matchers, DOWN)}[{w.end - w.start}s])"
    return Query("fleet", "GPUs in the range", f"count by (uuid) ({inner})", at=w.end)
