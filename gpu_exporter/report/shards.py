"""A large fleet asked in shards of GPUs, and the shards' answers put together as one answer.

A store bounds what one query may touch: VictoriaMetrics refuses a query that matches more than 300,000
series (``-search.maxUniqueTimeseries``), Prometheus one that loads more than 50 million samples at once
(``--query.max-samples``).  Where each GPU's pod changes daily, a month of the hourly activity series is
about 250 series per GPU: 2,500 GPUs already matched 600,000 in one query, and the report failed on
the store's defaults (benchmarks/report_month.py).  Asked for ``SHARD_GPUS`` GPUs at a time, by their
UUIDs, each query stays far inside both bounds, and each answer is small.

Every query the report asks groups by GPU (its UUID among the labels) or sums over GPUs (the timeline):
a shard's answers hold its own GPUs' rows only, so the rows of all shards together are the fleet's, and
the timeline's points are added up.  A GPU seen through two scrapers (a federated copy) has one UUID, so
its copies fall in one shard and are counted once as before.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .client import Points

# At most this many GPUs a shard: at a pod a day and 8 activity signals, 500 GPUs' month is ~125,000
# series for the heaviest query, under half of VictoriaMetrics' default bound, and ~3 M samples.
SHARD_GPUS = 500
# The answers that sum over GPUs (the others are a row per GPU, or per GPU and holder).
SUMMED = frozenset({"timeline"})


@dataclass(frozen=True)
class Shard:
    """A shard's label matcher and the UUIDs of its GPUs (``WHOLE``: no matcher, the fleet asked whole)."""

    matcher: str
    uuids: frozenset[str]


WHOLE = Shard("", frozenset())  # the fleet asked whole


def _escaped(prefix: str) -> str:
    """A regex matching ``prefix`` alone, as a PromQL string's contents (RE2 and Python agree here)."""
    return re.escape(prefix).replace("\\", "\\\\").replace('"', '\\"')


def _items(uuids: list[str], prefix: str, size: int) -> list[tuple[str, list[str]]]:
    """The sorted ``uuids``, more than ``size``, all starting with ``prefix``, cut by the character after it
    into (regex, its UUIDs) of at most ``size`` each, a
    regex being a prefix with any rest (``P.*``) or a UUID alone.  Together the regexes match every string
    that starts with ``prefix``, listed or not: a GPU the fleet query did not list (an exporter that
    writes no "down" series) still falls in one shard, never in none."""
    groups: dict[str, list[str]] = {}
    for u in uuids:  # by the character after the prefix; the prefix itself is a UUID in the "" group
        groups.setdefault(u[len(prefix) : len(prefix) + 1], []).append(u)
    out: list[tuple[str, list[str]]] = []
    for c, group in groups.items():
        if c and len(group) > size:
            out += _items(group, prefix + c, size)
        else:
            out.append((_escaped(prefix + c) + ".*" if c else _escaped(prefix), group))
    # The rest under the prefix: the prefix alone, or followed by a character none of these begins with.
    others = "".join(re.escape(c) for c in groups if c).replace("\\", "\\\\").replace('"', '\\"')
    after = f"[^{others}].*"
    return [*out, (f"{_escaped(prefix)}{after if '' in groups else f'(?:{after})?'}", [])]


def _packed(items: list[tuple[str, list[str]]], size: int) -> list[list[tuple[str, list[str]]]]:
    """The items in order, as few shards of at most ``size`` UUIDs as that order allows."""
    out: list[list[tuple[str, list[str]]]] = [[]]
    n = 0
    for item in items:
        if out[-1] and n + len(item[1]) > size:
            out.append([])
            n = 0
        out[-1].append(item)
        n += len(item[1])
    return out


def shards(uuids: Iterable[str], size: int = SHARD_GPUS) -> list[Shard]:
    """The GPUs cut into shards of at most ``size``, each matched by prefixes of their UUIDs, so that a
    query stays short (VictoriaMetrics refuses one past 16 KiB) and every UUID, one without a label too,
    falls in exactly one shard; one shard without a matcher where they are that few.  Sorted, so a run
    is repeatable."""
    found = sorted(set(uuids))
    if len(found) <= size:
        return [WHOLE]
    return [Shard(f'uuid=~"{"|".join(regex for regex, _ in shard)}"', frozenset(u for _, us in shard for u in us))
            for shard in _packed(_items(found, "", size), size)]  # fmt: skip


def within(matchers: str, shard: str) -> str:
    """The selector's matchers and a shard's."""
    return ", ".join(m for m in (matchers, shard) if m)


def together(key: str, answers: Sequence[Any]) -> Any:
    """One answer of the shards' answers to a query: rows side by side, or, for a sum over GPUs, each
    series' points added up at each time."""
    if len(answers) == 1:
        return answers[0]
    if key not in SUMMED:
        return [row for answer in answers for row in answer]
    points: dict[tuple[tuple[str, str], ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for answer in answers:
        for labels, series in answer:
            for t, v in series:
                points[tuple(sorted(labels.items()))][t] += v
    return [(dict(k), Points(sorted(p.items()))) for k, p in points.items()]
