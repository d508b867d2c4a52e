"""Where the store has scrape gaps, and whether the exporter's counters covered them.

A gap is a run of steps in which a target's scrapes failed: its GPUs' unheld "down" series (which
every GPU has from the exporter's first poll) holds fewer samples than regular scrapes put in a step.
The hours need nothing from here (``queries.counted`` carries a gap's seconds on the counters); the
report names each gap so that whoever reads it knows the store's history is not whole, and whether
the bill is: the counters covered a gap where none of them went down across it, and did not where one
did (the exporter restarted in the gap: what it counted before is lost) or where the gap is longer
than the report bridges (``queries.BRIDGE``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .client import Labels
from .model import iso
from .queries import BRIDGE, DOWN, Query, Window, _sel

TARGET = "node, instance"
MAX_CHECKED = 20  # gaps whose counters are checked one query each; the longest first
Point = tuple[float, float]


def gap_query(w: Window, matchers: str) -> Query:
    """Each target's samples in each step (a range query of the window's steps): the most of its GPUs'
    "down" series, one sample a scrape."""
    down = _sel("gpu_state_seconds_total", matchers, DOWN)
    return Query("gaps", "scrape gaps", f"max by ({TARGET}) (count_over_time({down}[{w.step * 1000 - 1}ms]))", "range")


@dataclass
class Gap:
    node: str
    instance: str
    start: int  # the first step's start that lacks scrapes
    end: int  # the last such step's end
    missing: float  # seconds of scrapes missing
    resumed: int  # the end of the first step after the gap with scrapes (where the counters are compared)
    covered: bool | None = None
    why: str = ""


def find(w: Window, rows: Sequence[tuple[Labels, Sequence[Point]]]) -> list[Gap]:
    """The gaps of each target: runs of steps that hold fewer samples than regular scrapes put there (or
    none), between two steps that hold some, two scrapes or more missing in all.  Needs the scrape
    interval (``w.scrape``): without it, no gap is told from a slower scrape."""
    if not w.scrape:
        return []
    full = math.floor(w.step / w.scrape + 1e-9)
    out: list[Gap] = []
    for labels, points in rows:
        counts = {round(t): v for t, v in points}
        times = sorted(counts)
        if not times:
            continue
        run: list[int] = []
        for t in range(times[0], times[-1] + w.step, w.step):
            n = counts.get(t, 0.0)
            if n < full:
                run.append(t)
                continue
            if run and run[0] != times[0]:  # a run that starts with the series is its beginning, no gap
                missing = sum(max(0.0, w.step - counts.get(x, 0.0) * w.scrape) for x in run)
                if missing >= 2 * w.scrape:
                    out.append(Gap(labels.get("node", ""), labels.get("instance", ""), run[0] - w.step, run[-1],
                                   missing, t))  # fmt: skip
            run = []
    return sorted(out, key=lambda g: (g.start, g.node, g.instance))


def check(matchers: str, gap: Gap) -> str:
    """How many of the gap's target's state counters went down from the first step of the gap to the
    first whole step after it (the samples on both sides of the gap): a restart in it."""
    target = [f'{k}="{_escape(v)}"' for k, v in (("node", gap.node), ("instance", gap.instance))]
    sel = _sel("gpu_state_seconds_total", matchers, *target)
    return f"sum(resets({sel}[{gap.resumed - gap.start}s]) > bool 0)"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def covered(w: Window, matchers: str, gaps: list[Gap], ask: Callable[[str, float], list[tuple[Labels, float]]]) -> None:
    """Mark each gap covered or not, asked of the store (``check``), the longest ``MAX_CHECKED`` gaps;
    the others are left unknown."""
    bridge = max(BRIDGE, w.step)
    for n, gap in enumerate(sorted(gaps, key=lambda g: -g.missing)):
        if gap.missing + w.scrape > bridge:  # the step after it finds no sample before it (queries.counted)
            gap.covered, gap.why = False, f"longer than the {bridge // 60} min the report bridges"
            continue
        if n >= MAX_CHECKED:
            gap.why = f"not checked (only the {MAX_CHECKED} longest gaps are)"
            continue
        got = ask(check(matchers, gap), gap.resumed)
        if not got:
            gap.why = "no counter on both sides of it"
            continue
        down = got[0][1]
        gap.covered = down == 0
        gap.why = (
            "the exporter's counters kept counting through it"
            if gap.covered
            else "counter reset: the exporter restarted in it, and what it counted before is lost"
        )


def as_json(gaps: list[Gap]) -> list[dict[str, Any]]:
    return [
        {"node": g.node, "instance": g.instance, "from": iso(g.start), "to": iso(g.end),
         "missing_seconds": round(g.missing, 3), "covered": g.covered, "why": g.why}
        for g in gaps
    ]  # fmt: skip


def lines(doc: dict[str, Any]) -> list[str]:
    """The gaps as sentences, for every format."""
    out = []
    gaps = doc.get("store_gaps") or []
    # A node with two targets that lost scrapes (the exporter's own job and a federation's copy, when the
    # store itself was down) names each: two lines under one name would read as one gap twice.
    targets: dict[str, set[str]] = {}
    for g in gaps:
        targets.setdefault(g["node"], set()).add(g["instance"])
    for g in gaps:
        verdict = {True: "covered", False: "NOT covered", None: "coverage unknown"}[g["covered"]]
        where = g["node"] or g["instance"]
        if g["node"] and len(targets[g["node"]]) > 1:
            where = f"{g['node']} ({g['instance']})"
        out.append(f"{where}: about {_duration(g['missing_seconds'])} of failed scrapes between "
                   f"{g['from']} and {g['to']}; {verdict}: {g['why']}")  # fmt: skip
    return out


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class Store(Protocol):
    def instant(self, expr: str, at: float, what: str = ...) -> list[tuple[Labels, float]]: ...

    def range(self, expr: str, start: float, end: float, step: float,
              what: str = ...) -> Sequence[tuple[Labels, Sequence[Point]]]: ...  # fmt: skip


def scan(client: Store, windows: list[Window], matchers: str) -> list[Gap]:
    """The gaps in the parts of the range read raw (``windows``), each checked: two queries, and one per
    gap (``covered``).  The recorded hours hold no scrapes to count."""
    out: list[Gap] = []
    for w in windows:
        q = gap_query(w, matchers)
        gaps = find(w, client.range(q.expr, w.start + w.step, w.end, w.step, q.what))
        covered(w, matchers, gaps, lambda expr, at: client.instant(expr, at, "counters across a scrape gap"))
        out += gaps
    return out
