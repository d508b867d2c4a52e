"""Which series each part of the range is read from, and the answers of a range read in parts put
together.

The hourly series that alerts/gpu-report.rules.yml records cost the store a tenth of the raw ones, or
less, but hold whole UTC hours only, written 1 to 2 h after each ends.  A range is read:

- from them alone, where it is 24 to 720 whole hours that the rules ran for, ended 2 h ago or more;
- in three parts where only its ends keep it from them (``--since 30d``, which ends now, at seconds
  past a minute): the raw series from its start to the first whole hour, the recorded ones for the
  whole hours they have written, the raw ones from there to its end.  An end too short to be cut into
  equal steps of three scrape intervals is made an hour longer;
- else from the raw series alone.

In parts, what adds up (hours, cost) is each part's own, priced by its own prices (``cost.money``);
a figure that is a highest (memory, a GPU's model) is the highest of the parts'; activity is the
highest of the parts' p95s (the ends hold a few of the range's hours, so this sizes for at least what
the whole range's p95 would, and at most an end's bursts more: never a smaller card); who holds each
GPU now is the last part's; the timeline has a point per whole hour, the ends' steps added up into
theirs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .client import Labels
from .cost import Part
from .model import iso
from .queries import (
    HOUR,
    LAG,
    MAX_RECORDED_HOURS,
    MIN_RECORDED_HOURS,
    RangeError,
    Window,
    coverage,
    end_window,
    hour_covered,
    recorded_window,
    window_for,
)

# Tries at making an end an hour longer, where its length has no divisor from three scrape intervals to
# an hour (a prime number of seconds, or twice a large prime).  Measured over 5,000 random ranges at
# each scrape interval of 1 s to 60 s, 8 tries left none read raw whole (4 left 0.9% of --since 30d
# at 15 s), and made the ends 0.3 to 0.4 h longer on average.
GROW = 8


class NotRecorded(Exception):
    """--prometheus.recorded yes, and the recorded series do not cover the range."""


class Store(Protocol):
    def instant(self, expr: str, at: float, what: str = ...) -> list[tuple[Labels, float]]: ...

    def range(self, expr: str, start: float, end: float, step: float,
              what: str = ...) -> Sequence[tuple[Labels, Sequence[tuple[float, float]]]]: ...  # fmt: skip


@dataclass(frozen=True)
class Read:
    """A part of the range and where it is read from."""

    w: Window
    recorded: bool
    filled: bool = False  # raw: whole hours of a recorded range that the recorded series lack


def _covered(client: Store, w: Window) -> float:
    """On how many of ``w``'s hours the recording rules ran (one cheap query)."""
    got = client.instant(coverage(w), w.end + LAG)
    return got[0][1] if got else 0.0


# The most parts a range is read in where the recorded series lack some of its hours: past it, the hours
# are too scattered to read part by part (ten queries each), and the range is read raw whole.
MAX_PARTS = 12


def _filled(client: Store, w: Window, interval: Callable[[], float]) -> list[Read] | None:
    """``w``'s whole hours read recorded where the recorded series hold them (``hour_covered``) and
    raw where they do not, in time order; None where that is more than ``MAX_PARTS`` parts."""
    got = client.range(hour_covered(), w.start + HOUR + LAG, w.end + LAG, HOUR, "hours the recorded series hold")
    covered = {round(t) - LAG for _, points in got for t, _ in points}  # the hours' ends
    runs: list[list[Any]] = []
    for end in range(w.start + HOUR, w.end + HOUR, HOUR):
        if runs and runs[-1][2] == (end in covered):
            runs[-1][1] = end
        else:
            runs.append([end - HOUR, end, end in covered])
    if len(runs) > MAX_PARTS:
        return None
    return [Read(Window(a, b, HOUR), True) if rec else Read(window_for(a, b, interval()), False, filled=True)
            for a, b, rec in runs]  # fmt: skip


def _middle(client: Store, w: Window, interval: Callable[[], float]) -> tuple[list[Read], float]:
    """The whole hours of a range read in parts: recorded, where the recorded series hold them all; else
    in runs (``_filled``); none where they hold none (or too scattered); and how many they hold."""
    hours = _covered(client, w)
    if hours == w.points:
        return [Read(w, True)], hours
    return (_filled(client, w, interval) or [] if hours else []), hours


def _shown(parts: list[Read]) -> str:
    shown = "; ".join(f"{'recorded' if r.recorded else 'raw'} from {iso(r.w.start)} to {iso(r.w.end)}" for r in parts)
    line = f"reading the range in parts: {shown}"
    if missing := sum(r.w.end - r.w.start for r in parts if r.filled) // HOUR:
        line += (f" (the recorded series lack {missing} of its hours, which the hours rule did not write: "
                 "read raw)")  # fmt: skip
    return line


@dataclass(frozen=True)
class Split:
    head: Window | None  # raw, from the range's start to the first whole hour read recorded
    middle: Window  # recorded: whole hours
    tail: Window | None  # raw, from the last whole hour read recorded to the range's end


def split(start: float, end: float, now: float, interval: float) -> Split | None:
    """The range in three where it has 24 to 720 whole hours that the rules have written by ``now``,
    each end (raw, None where empty) long enough to be cut into steps of three scrape intervals
    (``interval``) to an hour; None where it has not."""
    if start != int(start) or end != int(end):
        return None  # the raw path says why it cannot tile such a range
    first = math.ceil(start / HOUR) * HOUR
    last = min(math.floor(end / HOUR), (math.floor(now) - LAG) // HOUR) * HOUR
    ends: list[Window | None] = []
    for head in (True, False):
        for _ in range(GROW):
            a, b = (start, first) if head else (last, end)
            if a >= b:
                ends.append(None)
                break
            try:
                ends.append(end_window(int(a), int(b), interval))
                break
            except RangeError:  # too short, or a length with no divisor near a step: an hour more
                first, last = (first + HOUR, last) if head else (first, last - HOUR)
        else:
            return None
    if not MIN_RECORDED_HOURS * HOUR <= last - first <= MAX_RECORDED_HOURS * HOUR:
        return None
    return Split(ends[0], Window(first, last, HOUR), ends[1])


RECORDED = "reading the hourly recorded series (alerts/gpu-report.rules.yml)"


# Most stores have no recording rules: say, in words, what loading them would change.
NO_RULES = (
    "; load alerts/gpu-report.rules.yml into the store (docs/fleet.md) and the report reads one sample per GPU "
    "and hour instead of every scrape"
)


def reads(client: Store, mode: str, start: float, end: float, now: float,
          interval: Callable[[], float]) -> tuple[list[Read], str]:  # fmt: skip
    """The parts the range is read in, in time order, and a progress line that says from which series.
    ``interval`` is the scrape interval (asked of the store, where a part is read raw); mode ``yes``
    fails where no part of the range can be read recorded, ``no`` reads it raw."""
    if mode == "no":
        return [Read(window_for(start, end, interval()), False)], "reading the raw series"
    w = recorded_window(start, end)
    if w is not None and w.end + LAG <= now:
        hours = _covered(client, w)
        if hours == w.points:
            return [Read(w, True)], RECORDED
        if hours and (filled := _filled(client, w, interval)) is not None:
            return filled, _shown(filled)
        why = f"the recorded series hold {hours:.0f} of the range's {w.points} hours"
        if not hours:
            why += NO_RULES
    else:
        why = (
            "the range is not 1 to 30 days on whole hours"
            if w is None
            else f"the recording rules write an hour's figures 1 to 2 h after it ends (the range ends {iso(w.end)})"
        )
        parts = split(start, end, now, interval())
        if parts is None:
            why += ", nor does it hold 24 to 720 whole hours written with its ends read raw"
        elif (inner := _middle(client, parts.middle, interval))[0]:
            together = [*([Read(parts.head, False)] if parts.head else []), *inner[0],
                        *([Read(parts.tail, False)] if parts.tail else [])]  # fmt: skip
            return together, _shown(together)
        else:
            hours = inner[1]
            why = f"the recorded series hold {hours:.0f} of the {parts.middle.points} whole hours within it"
            if not hours:
                why += NO_RULES
    if mode == "yes":
        raise NotRecorded(f"--prometheus.recorded yes: {why}")
    return [Read(window_for(start, end, interval()), False)], f"reading the raw series: {why}"


# The answers whose rows are put together as they come: the model takes each GPU's highest figure of
# them (memory, activity), its model, and every target that saw it.
_ROWS = (
    "prices",
    "seen",
    "info",
    "memory_total",
    "memory_peak",
    "activity",
    "other_jobs",
    "disagree",
    "links",
    "pcie_load",
)


def together(parts: list[Part]) -> dict[str, Any]:
    """The non-money answers of the parts, as the model reads one range's: rows put together, who holds
    each GPU now from the last part, the timeline by whole hour.  Their money is ``cost.money``'s."""
    out: dict[str, Any] = {key: [row for part in parts for row in part.results.get(key, [])] for key in _ROWS}
    # A GPU's link-bound seconds are each part's: added up, where the model takes the highest of each row.
    bound: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
    for part in parts:
        for labels, v in part.results.get("pcie_bound", []):
            bound[tuple(sorted(labels.items()))] += v
    out["pcie_bound"] = [(dict(k), v) for k, v in bound.items()]
    out["holders_now"] = parts[-1].results["holders_now"]
    points: dict[tuple[tuple[str, str], ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for part in parts:
        for labels, values in part.results["timeline"]:
            for t, v in values:
                # A step's hours go to the whole hour it ends in (an end's last, partial hour: the end).
                points[tuple(sorted(labels.items()))][min(-(-t // HOUR) * HOUR, part.w.end)] += v
    out["timeline"] = [(dict(key), sorted(p.items())) for key, p in points.items()]
    return out


def filled_json(planned: list[Read]) -> dict[str, Any]:
    """Which hours were read raw because the recorded series lack them (runs of whole hours)."""
    return {
        "missing_hours": [
            {"from": iso(r.w.start), "to": iso(r.w.end), "hours": (r.w.end - r.w.start) // HOUR}
            for r in planned
            if r.filled
        ]
    }


def recorded_lines(doc: dict[str, Any]) -> list[str]:
    """The hours the recorded series lacked and that were read raw instead, as sentences."""
    missing = (doc.get("recorded") or {}).get("missing_hours") or []
    if not missing:
        return []
    runs = ", ".join(f"{r['from']} to {r['to']}" for r in missing)
    n = sum(r["hours"] for r in missing)
    return [
        f"the recording rules left {n} hour{'s' if n != 1 else ''} of the range without hours ({runs}): "
        "read from the raw series instead"
    ]
