"""The curve of ``report_fleet.py --recorded`` runs (results/report-fleet-<gpus>-<days>d.json): each
path's median report time and store CPU against the GPU-hours of the range, a least-squares line
through them, and what the line says for 30 days of 10,000 GPUs.  A line, because each path's work
is per series and sample (raw: every scrape; recorded: one sample per series and hour) and the series
grow with the GPUs; its fixed part is the CLI's start and the queries' round trips.

    .venv/bin/python benchmarks/report_fleet_fit.py        # writes results/report-fleet-curve.md
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from benchlib import RESULTS

TARGET_GPUS, TARGET_HOURS = 10_000, 720


def runs() -> list[dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("report-fleet-*-*d.json"))]
    return sorted(found, key=lambda r: (r["days"], r["gpus"]))


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x: (a, b, the largest relative miss of a measured point)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    miss = max(abs(a + b * x - y) / y for x, y in zip(xs, ys, strict=True) if y > 0)
    return a, b, miss


def markdown(results: list[dict[str, Any]]) -> Iterator[str]:
    yield "# `gpu-exporter report` against the fleet's size: raw and recorded series"
    yield ""
    yield "| GPUs | days | samples | path | report, median | store CPU, median | cost, USD | each run |"
    yield "|---|---|---|---|---|---|---|---|"
    for r in results:
        for path, walls in r["report_wall_s"].items():
            cost = r["report_summary"][path]["totals"]["cost"]
            yield (f"| {r['gpus']:,} | {r['days']:g} | {r['backfill']['samples']:,} | {path} | "
                   f"{r['report_wall_median_s'][path]:.1f} s | {r['store_cpu_median_s'][path]:.1f} s | "
                   f"{cost:,.2f} | {', '.join(f'{x:.1f}' for x in walls)} s |")  # fmt: skip
    yield ""
    yield (
        f"Least-squares line through each path's medians against GPU-hours, and what it says for "
        f"{TARGET_GPUS:,} GPUs x {TARGET_HOURS} h ({TARGET_GPUS * TARGET_HOURS:,} GPU-hours):"
    )
    yield ""
    yield "| path | figure | fixed | per 1,000 GPU-hours | largest miss of a point | at 10,000 GPUs x 30 days |"
    yield "|---|---|---|---|---|---|"
    for path in sorted({p for r in results for p in r["report_wall_s"]}):
        have = [r for r in results if path in r["report_wall_s"]]
        if len(have) < 2:
            continue
        xs = [r["gpus"] * r["days"] * 24 for r in have]
        for figure, key in (("report wall", "report_wall_median_s"), ("store CPU", "store_cpu_median_s")):
            a, b, miss = fit(xs, [r[key][path] for r in have])
            at = a + b * TARGET_GPUS * TARGET_HOURS
            yield f"| {path} | {figure} | {a:.2f} s | {b * 1000:.3f} s | {miss:.0%} | **{at:,.0f} s** |"
    yield ""
    for r in results:
        s = r["report_summary"]
        if "prometheus" in s and "prometheus-recorded" in s:
            raw, rec = s["prometheus"]["totals"], s["prometheus-recorded"]["totals"]
            yield (f"- {r['gpus']:,} GPUs, {r['days']:g} days: recorded cost {rec['cost']:,.2f} against raw "
                   f"{raw['cost']:,.2f} USD ({(rec['cost'] - raw['cost']) / raw['cost']:+.3%}); hours "
                   f"{rec['gpu_hours']:,.1f} against {raw['gpu_hours']:,.1f}.")  # fmt: skip


def main(argv: list[str]) -> int:
    results = runs()
    if not results:
        print("no results/report-fleet-<gpus>-<days>d.json: run report_fleet.py --recorded first", file=sys.stderr)
        return 1
    text = "\n".join(markdown(results)) + "\n"
    (RESULTS / "report-fleet-curve.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
