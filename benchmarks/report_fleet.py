"""How long ``gpu-exporter report --since 30d`` takes on the simulated 400-GPU fleet.

The fleet is ``benchmarks/fleet.py``'s: 50 nodes of 8 GPUs, each playing ``--simulate``'s workload
profiles.  Running 50 daemons for 30 days is out of reach, so the history is made the way the
daemon would have made it: the simulator (``SimulatedBackend``) is read every scrape interval on a
made-up clock for 30 days, each reading goes through the accounting's ``classify`` and ``holders``
as in the daemon, and the series the report reads are written with the labels a scrape would
give them.  Node ``i`` replays the same node shifted by ``i`` x 83 min, with its own UUIDs.  promtool
backfills it a day at a time, and a real Prometheus (Debian's) serves it to the report, run as a
user runs it: the CLI, JSON to a file, three times.

    .venv/bin/python benchmarks/report_fleet.py              # 30 days, 30 s scrape: ~15 minutes
    .venv/bin/python benchmarks/report_fleet.py --days 2     # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import (
    RESULTS,
    ROOT,
    Children,
    cpu_seconds,
    exit_on_sigterm,
    free_port,
    log,
    machine,
    machine_line,
    median,
    tempdir,
)

sys.path.insert(0, str(ROOT))
from gpu_exporter.accounting.states import NOBODY, classify, holders
from gpu_exporter.snapshot import GpuReading
from gpu_exporter.sources.backend import GpuLost
from gpu_exporter.sources.simulated import SimulatedBackend

NODES = 50
GPUS_PER_NODE = 8
PRICES = {"H100": 2.50, "L40S": 1.00, "RTX 6000": 0.80}  # example figures, as in deploy/pricing.example.yaml
THRESHOLD = 0.10


@dataclass
class Track:
    """One simulated GPU's readings, one per scrape interval."""

    uuid: str
    name: str
    total: int
    state: list[str]
    user: list[str]
    used: list[float | None]
    util: list[float | None]
    sm: list[float | None]


def simulate(days: float, step: int) -> list[Track]:
    clock = [0.0]
    backend = SimulatedBackend(GPUS_PER_NODE, clock=lambda: clock[0])
    backend.open()
    statics = {}
    for i in range(GPUS_PER_NODE):
        try:
            statics[i] = backend.read_static(i)
        except GpuLost:
            clock[0] += 400.0  # the "lost" profile answers outside its window
            statics[i] = backend.read_static(i)
    clock[0] = 0.0
    steps = int(days * 86400 / step) + 120  # and an hour before the range
    tracks = [Track(s.uuid, s.name, 0, [], [], [], [], []) for s in statics.values()]
    for k in range(steps):
        clock[0] = k * step
        for i, s in statics.items():
            try:
                g = backend.read_gpu(s)
            except GpuLost:
                g = GpuReading(index=i, uuid=s.uuid, up=False)
            tr = tracks[i]
            tr.state.append(classify(g, THRESHOLD))
            shares = holders(g, pod_mode=False)
            tr.user.append(max(shares, key=lambda x: x[1])[0][3] if shares[0][0] != NOBODY else "")
            tr.used.append(g.memory_used_bytes)
            tr.util.append(g.utilization_ratio)
            tr.sm.append(g.activity.sm if g.activity is not None else None)
            if g.memory_total_bytes:
                tr.total = g.memory_total_bytes
    return tracks


def _lab(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def write_day(path: Path, tracks: list[Track], t0: int, step: int, first: int, last: int,
              counters: dict[tuple[int, int, str, str], float]) -> int:  # fmt: skip
    """Samples first..last-1 of every node's series; ``counters`` carries the state seconds across days."""
    lines = 0
    times = [str(t0 + k * step) for k in range(first, last)]
    held = ("busy", "allocated_idle")
    with open(path, "w") as f:
        for gi, tr in enumerate(tracks):
            n = len(tr.state)
            price = next((p for k, p in PRICES.items() if k in tr.name), None)
            users = sorted({u for u in tr.user if u})
            # As the daemon keeps them: the unheld idle and down series always, the others once used.
            used = {("", s) for s, u in zip(tr.state, tr.user, strict=True) if s in held and not u}
            keys = [("", "idle"), ("", "down"), *sorted(used), *((u, s) for u in users for s in held)]
            polls = max(1, 300 // step)  # the daemon's 5-minute peak window, at this interval
            peaks = [None if not (w := [x for x in tr.used[max(0, j - polls + 1) : j + 1] if x is not None])
                     else max(w) for j in range(n)]  # fmt: skip
            for node in range(NODES):
                shift = node * 83 * 60 // step
                js = [(k + shift) % n for k in range(first, last)]
                up = [tr.state[j] != "down" for j in js]
                uuid = f"{tr.uuid[:-4]}{node:04d}"
                base = {"job": "gpu-exporter", "instance": f"10.0.{node // 250}.{node % 250}:9445",
                        "node": f"node-{node:03d}", "gpu": str(gi), "uuid": uuid}  # fmt: skip

                def emit(name: str, values: list[Any], mask: list[bool] | None = None, up: list[bool] = up) -> None:
                    nonlocal lines
                    rows = [f"{name} {v} {t}\n" for v, t, ok in zip(values, times, mask or up, strict=True)
                            if ok and v is not None]  # fmt: skip
                    f.write("".join(rows))
                    lines += len(rows)

                for u, s in keys:
                    key = (node, gi, u, s)
                    total = counters.get(key, 0.0)
                    values = []
                    for k, j in zip(range(first, last), js, strict=True):
                        if k > 0 and tr.state[j] == s and (tr.user[j] if s in held else "") == u:
                            total += step
                        values.append(total)
                    counters[key] = total
                    emit(f'gpu_state_seconds_total{{{_lab({**base, "user": u, "state": s})}}}', values,
                         [True] * len(js))  # fmt: skip
                if price is not None:
                    emit(f'gpu_price_per_hour{{{_lab({**base, "currency": "USD"})}}}', [price] * len(js),
                         [True] * len(js))  # fmt: skip
                emit(f"gpu_info{{{_lab({**base, 'name': tr.name, 'mig_mode': 'disabled'})}}}", [1] * len(js))
                emit(f"gpu_memory_total_bytes{{{_lab(base)}}}", [tr.total] * len(js))
                emit(f"gpu_memory_used_max_bytes{{{_lab(base)}}}", [peaks[j] for j in js])
                emit(f"gpu_utilization_ratio{{{_lab(base)}}}", [tr.util[j] for j in js])
                emit(f"gpu_sm_active_ratio{{{_lab(base)}}}", [tr.sm[j] for j in js])
        f.write("# EOF\n")
    return lines


def backfill(tmp: Path, tracks: list[Track], days: float, step: int, end: int) -> dict[str, Any]:
    per_day = 86400 // step
    total = len(tracks[0].state)
    t0 = end - (total - 1) * step
    counters: dict[tuple[int, int, str, str], float] = {}
    samples, gen_s, promtool_s = 0, 0.0, 0.0
    for first in range(0, total, per_day):
        a = time.monotonic()
        om = tmp / "day.om"
        samples += write_day(om, tracks, t0, step, first, min(total, first + per_day), counters)
        b = time.monotonic()
        r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
                            str(om), str(tmp / "tsdb")], capture_output=True, text=True, timeout=1800)  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"promtool: {r.stderr[-2000:]}")
        om.unlink()
        gen_s, promtool_s = gen_s + b - a, promtool_s + time.monotonic() - b
        log(
            f"report-fleet: backfilled day {first // per_day + 1} of {math.ceil(total / per_day)} ({samples:,} samples)"
        )
    return {"samples": samples, "generate_s": gen_s, "promtool_s": promtool_s, "start": t0, "end": end}


def prometheus(children: Children, tmp: Path, days: float) -> tuple[str, int]:
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
    port = free_port()
    with open(tmp / "prometheus.log", "wb") as f:
        proc = children.start(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                               f"--storage.tsdb.retention.time={int(days) + 10}d",
                               "--storage.tsdb.max-block-duration=24h"], stdout=f, stderr=f)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return url, proc.pid
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("Prometheus did not become ready:\n" + (tmp / "prometheus.log").read_text()[-3000:])


def settle(pid: int, quiet_s: float = 10.0, timeout: float = 600.0) -> None:
    """Wait until Prometheus has loaded and compacted what it will: under 5% of a core for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(quiet_s)
        if (cpu_seconds(pid) - before) / quiet_s < 0.05:
            return
    log("report-fleet: Prometheus is still busy; measuring anyway")


def run_report(url: str, since: str, end: str, out: Path) -> tuple[float, str, int]:
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--since", since,
                        "--end", end, "--format", "json", "--output", str(out)], capture_output=True, text=True,
                       cwd=ROOT,
                       timeout=600)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"report failed: {r.stderr[-3000:]}")
    return time.monotonic() - t, r.stderr, r.returncode


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--days", type=float, default=30)
    p.add_argument("--step", type=int, default=60, help="scrape interval of the history, in seconds")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tsdb", type=Path, help="keep the backfilled TSDB here, and reuse it if it is already there")
    args = p.parse_args(argv)
    exit_on_sigterm()
    res: dict[str, Any] = {"machine": machine(), "nodes": NODES, "gpus": NODES * GPUS_PER_NODE, "days": args.days,
                           "scrape_interval_s": args.step}  # fmt: skip
    with tempdir("gpu-exporter-report-fleet-") as scratch, Children() as children:
        tmp = args.tsdb or scratch
        tmp.mkdir(parents=True, exist_ok=True)
        done = tmp / "backfill.json"
        if done.exists():
            res["backfill"] = json.loads(done.read_text())
            log(f"report-fleet: reusing the history in {tmp}")
        else:
            t = time.monotonic()
            tracks = simulate(args.days, args.step)
            res["simulate_s"] = time.monotonic() - t
            log(f"report-fleet: simulated one node for {args.days:g} days in {res['simulate_s']:.0f} s")
            end = int(time.time() // 3600 * 3600 - 3600)
            res["backfill"] = backfill(tmp, tracks, args.days, args.step, end)
            done.write_text(json.dumps(res["backfill"]))
        url, pid = prometheus(children, tmp, args.days)
        settle(pid)
        # The history ends an hour before it was made; the report's range ends where the history does.
        since = f"{args.days * 24:g}h"
        end_at = str(res["backfill"]["end"])
        runs, stderr = [], ""
        loads = []
        for i in range(args.reps):
            loads.append(os.getloadavg()[0])  # the machine is shared: say how busy it was
            wall, stderr, _ = run_report(url, since, end_at, tmp / "report.json")
            runs.append(wall)
            log(f"report-fleet: report --since {since} took {wall:.1f} s (run {i + 1})")
        doc = json.loads((tmp / "report.json").read_text())
    res["report_wall_s"] = runs
    res["load_average_before_each_run"] = loads
    res["report_wall_median_s"] = median(runs)
    res["report_stderr_last"] = stderr.strip().splitlines()
    res["report_summary"] = {"gpus": len(doc["gpus"]), "totals": doc["totals"],
                             "recommendations": len(doc["recommendations"]), "holders": len(doc["holders"]),
                             "timeline_points": len(doc["timeline"])}  # fmt: skip
    (RESULTS / "report-fleet.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "report-fleet.md").write_text("\n".join(markdown(res)) + "\n")
    print("\n".join(markdown(res)))
    return 0


def markdown(res: dict[str, Any]) -> Iterator[str]:
    b = res["backfill"]
    yield "# `gpu-exporter report` on the simulated 400-GPU fleet"
    yield ""
    yield f"Run of {machine_line(res['machine'])}."
    yield ""
    yield (f"{res['nodes']} nodes x 8 simulated GPUs ({res['gpus']} GPUs), {res['days']:g} days of history at a "
           f"{res['scrape_interval_s']} s scrape interval: {b['samples']:,} samples of the series the report reads, "
           f"backfilled with promtool (generated in {b['generate_s']:.0f} s, converted in {b['promtool_s']:.0f} s), "
           "served by Debian's Prometheus. The report runs as a user runs it (the CLI, JSON to a file).")  # fmt: skip
    yield ""
    yield "| figure | value |"
    yield "|---|---|"
    yield f"| `report --since {res['days'] * 24:g}h`, median of {len(res['report_wall_s'])} | " \
          f"**{res['report_wall_median_s']:.1f} s** (target: under 30 s) |"  # fmt: skip
    yield f"| each run | {', '.join(f'{x:.1f} s' for x in res['report_wall_s'])} |"
    yield f"| 1-minute load average before each run (2 cores, shared with other work) | " \
          f"{', '.join(f'{x:.1f}' for x in res['load_average_before_each_run'])} |"  # fmt: skip
    s = res["report_summary"]
    yield f"| GPUs, holders, recommendations, timeline points in the JSON | {s['gpus']}, {s['holders']}, " \
          f"{s['recommendations']}, {s['timeline_points']} |"  # fmt: skip
    t = s["totals"]
    yield f"| GPU-hours (busy / allocated idle / idle / down) | {t['gpu_hours']:,.0f} ({t['busy_hours']:,.0f} / " \
          f"{t['allocated_idle_hours']:,.0f} / {t['idle_hours']:,.0f} / {t['down_hours']:,.0f}) |"  # fmt: skip
    yield f"| cost / wasted (example prices, USD) | {t['cost']:,.0f} / {t['wasted_cost']:,.0f} |"
    yield ""
    yield "Progress lines of the last run (each query's own time; four run at once):"
    yield ""
    yield "```"
    yield from res["report_stderr_last"]
    yield "```"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
