"""How long ``gpu-exporter report --since 720h`` takes on the simulated 400-GPU fleet, on Prometheus
and on VictoriaMetrics side by side, and whether both give the hand-counted figures.

The fleet is ``benchmarks/fleet.py``'s: 50 nodes of 8 GPUs, each playing ``--simulate``'s workload
profiles.  Running 50 daemons for 30 days is out of reach, so the history is made the way the
daemon would have made it: the simulator (``SimulatedBackend``) is read every scrape interval on a
made-up clock for 30 days, each reading goes through the accounting's ``classify`` and ``holders``
as in the daemon, and the series the report reads are written with the labels a scrape would
give them.  Node ``i`` replays the same node shifted by ``i`` x 83 min, with its own UUIDs, and
lives its own life on top:

- **a price change** half-way through the range, at 13:37 (not on a step boundary): the H100s go
  from 2.50 to 2.80 USD/h, so every H100 is priced step by step;
- **restarts**: each node's exporter restarts 6 times, gone for 0 to 10 scrapes each time, its
  counters starting again from 0; and 3 scrapes fail at an hour boundary (the daemon kept counting);
- **holder churn**: the user who holds a GPU changes every day (a pool of 40 names), and each
  holder's series ends an hour after its last hold, as ``accounting.holder_retention`` ends it.

promtool backfills it a day at a time into Debian's Prometheus; the same samples go to Debian's
VictoriaMetrics through its import API.  The report runs as a user runs it (the CLI, JSON to a
file), alternately on each store, and its totals are compared with the hours and cost counted
while the history was written.

    .venv/bin/python benchmarks/report_fleet.py              # 30 days: ~40 minutes on 2 cores
    .venv/bin/python benchmarks/report_fleet.py --days 2     # a quick look
    .venv/bin/python benchmarks/report_fleet.py --tsdb /var/tmp/fleet   # keep the stores, reuse them

With ``--recorded``, the recording rules of alerts/gpu-report.rules.yml are evaluated on the
Prometheus history by promtool (``create-blocks-from rules``, at the phase of the hour a running
Prometheus would evaluate them) and backfilled next to it, and the report runs both ways on
Prometheus (``--prometheus.recorded no`` and ``yes``), and once more on a range that starts and ends
1,000 s before the whole hours (``prometheus-parts``: its ends raw, the hours between recorded, as
``--since 30d`` is read; ``prometheus-parts-raw``: that range raw); ``--gpus`` sizes the fleet (nodes of 8) and
``--no-vm`` leaves VictoriaMetrics out.  Results go to results/report-fleet-<gpus>-<days>d.json:

    .venv/bin/python benchmarks/report_fleet.py --recorded --no-vm --days 2 --gpus 1600
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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
    wait_ready,
)

sys.path.insert(0, str(ROOT))
from gpu_exporter.accounting.states import HELD_STATES, NOBODY, STATES, classify, holders
from gpu_exporter.snapshot import GpuReading
from gpu_exporter.sources.backend import GpuLost
from gpu_exporter.sources.simulated import SimulatedBackend

NODES = 50
GPUS_PER_NODE = 8
PRICES = {"H100": 2.50, "L40S": 1.00, "RTX 6000": 0.80}  # example figures, as in deploy/pricing.example.yaml
CHANGED = {"H100": 2.80}  # from half-way through the range
THRESHOLD = 0.10
USERS = 40  # the pool of holders' names
RESTARTS, FAILED_SCRAPES = 6, 3  # per node over the history
RETENTION_S = 3600  # a holder's series ends this long after its last hold
HELD = HELD_STATES  # a held slice or GPU without an activity signal is allocated_unknown


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
    dram: list[float | None]


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
    steps = int(days * 86400 / step) + 3600 // step + 1  # and an hour before the range
    tracks = [Track(s.uuid, s.name, 0, [], [], [], [], [], []) for s in statics.values()]
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
            tr.user.append(max(shares, key=lambda x: x[1])[0].get("user") if shares[0][0] != NOBODY else "")
            tr.used.append(g.memory_used_bytes)
            tr.util.append(g.utilization_ratio)
            tr.sm.append(g.activity.sm if g.activity is not None else None)
            tr.dram.append(g.activity.dram if g.activity is not None else None)
            if g.memory_total_bytes:
                tr.total = g.memory_total_bytes
    return tracks


@dataclass
class Node:
    """A node's own life: where its exporter was gone (restarts) and which scrapes failed."""

    stopped: set[int]  # sample indices while the exporter was restarting: nothing counted, nothing scraped
    failed: set[int]  # scrapes that failed: the daemon counted on
    restarted: set[int]  # the first sample after each restart: counters from 0 again
    shift: int


def node_life(node: int, total: int, step: int) -> Node:
    rng = random.Random(node)
    stopped: set[int] = set()
    restarted: set[int] = set()
    per_hour = 3600 // step
    for _ in range(RESTARTS):
        at = rng.randrange(per_hour + 1, total - 20)
        length = rng.randrange(0, 11)
        stopped.update(range(at, at + length))
        restarted.add(at + length)
    hours = total // per_hour
    failed = {rng.randrange(2, hours - 1) * per_hour for _ in range(FAILED_SCRAPES)} if hours > 3 else set()
    # The history's samples sit on whole minutes from a whole hour: these fall on an hour boundary.
    return Node(stopped - restarted, failed - stopped - restarted, restarted, node * 83 * 60 // step)


@dataclass
class Truth:
    """The hours and cost the history holds, counted as it is written."""

    hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATES, 0.0))
    cost: float = 0.0
    wasted_cost: float = 0.0


def _lab(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def price_of(name: str, t: int, change_at: int) -> float | None:
    for key, p in PRICES.items():
        if key in name:
            return CHANGED.get(key, p) if t >= change_at else p
    return None


@dataclass
class GpuState:
    counters: dict[tuple[str, str], float] = field(default_factory=dict)
    last_used: dict[tuple[str, str], int] = field(default_factory=dict)


def write_day(om: IO[str], vm: IO[str] | None, tracks: list[Track], lives: list[Node], t0: int, step: int,
              first: int, last: int, states: dict[tuple[int, int], GpuState], range_start: int, change_at: int,
              truth: Truth, gpus: int) -> int:  # fmt: skip
    """Samples first..last-1 of every node's series, in OpenMetrics (seconds) and in the Prometheus text
    VictoriaMetrics imports (milliseconds); ``states`` carries the counters across days."""
    lines = 0
    n = len(tracks[0].state)

    def emit(name: str, rows: list[tuple[Any, int]]) -> None:
        nonlocal lines
        om.write("".join(f"{name} {v} {t0 + k * step}\n" for v, k in rows))
        if vm is not None:
            vm.write("".join(f"{name} {v} {(t0 + k * step) * 1000}\n" for v, k in rows))
        lines += len(rows)

    for gi, tr in enumerate(tracks):
        polls = max(1, 300 // step)  # the daemon's 5-minute peak window, at this interval
        for node, life in enumerate(lives):
            if node * GPUS_PER_NODE + gi >= gpus:  # the last node of a fleet not a multiple of 8 has fewer
                continue
            uuid = f"{tr.uuid[:-4]}{node:04d}"
            base = {"job": "gpu-exporter", "instance": f"10.0.{node // 250}.{node % 250}:9445",
                    "node": f"node-{node:03d}", "gpu": str(gi), "uuid": uuid}  # fmt: skip
            st = states.setdefault((node, gi), GpuState())
            series: dict[tuple[str, str], list[tuple[Any, int]]] = {}
            gauges: dict[str, list[tuple[Any, int]]] = {}
            for k in range(first, last):
                j = (k + life.shift) % n
                t = t0 + k * step
                if k in life.stopped:
                    continue
                if k in life.restarted:
                    st.counters.clear()
                    st.last_used.clear()
                elif k > 0:
                    state = tr.state[j]
                    user = f"{tr.user[j]}-{(node * 7 + gi + (t // 86400)) % USERS:02d}" if tr.user[j] else ""
                    key = (user if state in HELD else "", state)
                    st.counters[key] = st.counters.get(key, 0.0) + step
                    st.last_used[key] = k
                    if t > range_start:
                        truth.hours[state] += step / 3600
                        price = price_of(tr.name, t, change_at)
                        if price is not None:
                            truth.cost += price * step / 3600
                            if state in ("idle", "allocated_idle"):
                                truth.wasted_cost += price * step / 3600
                if k in life.failed:
                    continue
                # As the daemon keeps them: the unheld idle and down series always, the others while
                # used and for the holder retention after.
                live = {("", "idle"), ("", "down")} | {key for key, at in st.last_used.items()
                                                      if (k - at) * step <= RETENTION_S}  # fmt: skip
                for key in live:
                    series.setdefault(key, []).append((st.counters.get(key, 0.0), k))
                price = price_of(tr.name, t, change_at)
                if price is not None:
                    gauges.setdefault(f"gpu_price_per_hour{{{_lab({**base, 'currency': 'USD'})}}}", []).append(
                        (price, k)
                    )
                if tr.state[j] == "down":
                    continue  # a lost GPU exports gpu_up 0 and its counters, nothing else
                gauges.setdefault(f"gpu_info{{{_lab({**base, 'name': tr.name, 'mig_mode': 'disabled'})}}}",
                                  []).append((1, k))  # fmt: skip
                gauges.setdefault(f"gpu_memory_total_bytes{{{_lab(base)}}}", []).append((tr.total, k))
                window = [x for x in tr.used[max(0, j - polls + 1) : j + 1] if x is not None]
                if window:
                    gauges.setdefault(f"gpu_memory_used_max_bytes{{{_lab(base)}}}", []).append((max(window), k))
                for metric, values in (("gpu_utilization_ratio", tr.util), ("gpu_sm_active_ratio", tr.sm),
                                       ("gpu_dram_active_ratio", tr.dram)):  # fmt: skip
                    if values[j] is not None:
                        gauges.setdefault(f"{metric}{{{_lab(base)}}}", []).append((values[j], k))
            for (user, state), rows in series.items():
                emit(f"gpu_state_seconds_total{{{_lab({**base, 'user': user, 'state': state})}}}", rows)
            for name, rows in gauges.items():
                emit(name, rows)
    return lines


def backfill(tmp: Path, tracks: list[Track], days: float, step: int, end: int, vm_url: str | None,
             gpus: int) -> dict[str, Any]:  # fmt: skip
    """The history into Prometheus's TSDB (promtool, a day at a time) and into VictoriaMetrics."""
    per_day = 86400 // step
    total = len(tracks[0].state)
    t0 = end - (total - 1) * step
    range_start = end - int(days * 86400)
    change_at = range_start + int(days * 86400) // 2 // 86400 * 86400 + 13 * 3600 + 37 * 60
    lives = [node_life(node, total, step) for node in range(math.ceil(gpus / GPUS_PER_NODE))]
    states: dict[tuple[int, int], GpuState] = {}
    truth = Truth()
    samples, gen_s, promtool_s, vm_s = 0, 0.0, 0.0, 0.0
    for first in range(0, total, per_day):
        a = time.monotonic()
        om, vm = tmp / "day.om", tmp / "day.prom"
        with open(om, "w") as fo, open(vm if vm_url else os.devnull, "w") as fv:
            samples += write_day(fo, fv if vm_url else None, tracks, lives, t0, step, first,
                                 min(total, first + per_day), states, range_start, change_at, truth, gpus)  # fmt: skip
            fo.write("# EOF\n")
        b = time.monotonic()
        r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
                            str(om), str(tmp / "tsdb")], capture_output=True, text=True, timeout=1800)  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"promtool: {r.stderr[-2000:]}")
        c = time.monotonic()
        if vm_url:
            with open(vm, "rb") as f:
                req = urllib.request.Request(vm_url + "/api/v1/import/prometheus", data=f, method="POST")
                req.add_header("Content-Length", str(vm.stat().st_size))
                urllib.request.urlopen(req, timeout=1800).read()
            vm.unlink()
        om.unlink()
        gen_s, promtool_s, vm_s = gen_s + b - a, promtool_s + c - b, vm_s + time.monotonic() - c
        log(f"report-fleet: day {first // per_day + 1} of {math.ceil(total / per_day)} in both stores "
            f"({samples:,} samples)")  # fmt: skip
    if vm_url:
        urllib.request.urlopen(vm_url + "/internal/force_flush", timeout=600).read()
    return {"samples": samples, "generate_s": gen_s, "promtool_s": promtool_s, "victoriametrics_import_s": vm_s,
            "start": t0, "end": end, "range_start": range_start, "price_change_at": change_at,
            "truth": {"hours": truth.hours, "cost": truth.cost, "wasted_cost": truth.wasted_cost}}  # fmt: skip


def prometheus(children: Children, tmp: Path, days: float) -> tuple[str, subprocess.Popen[bytes]]:
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
    port = free_port()
    with open(tmp / "prometheus.log", "wb") as f:
        proc = children.start(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                               f"--storage.tsdb.retention.time={int(days) + 10}d",
                               "--storage.tsdb.max-block-duration=24h"], stdout=f, stderr=f)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/-/ready", "Prometheus", tmp / "prometheus.log")
    return url, proc


REPORT_RULES = ROOT / "alerts" / "gpu-report.rules.yml"
LAG = 7200  # the rules record an hour's figures 1 to 2 h after it ends (gpu_exporter/report/queries.py)


def record(url: str, tmp: Path, start: int, end: int) -> dict[str, Any]:
    """The report's recording rules evaluated by promtool on the history, as blocks for Prometheus to load."""
    t = time.monotonic()
    out = tmp / "rules-blocks"
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", f"--url={url}", f"--start={start}",
                        f"--end={end + LAG}", f"--output-dir={out}", str(REPORT_RULES)], capture_output=True,
                       text=True, timeout=7200)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"promtool rules: {r.stderr[-2000:]}")
    for block in out.iterdir():
        block.rename(tmp / "tsdb" / block.name)
    out.rmdir()
    return {"rules_backfill_s": time.monotonic() - t}


def victoria_metrics(children: Children, tmp: Path) -> tuple[str, int]:
    """Debian's VictoriaMetrics as it ships, but for a retention that keeps the history and a query
    duration that lets a 30-day report finish on a busy machine."""
    port = free_port()
    with open(tmp / "victoria-metrics.log", "wb") as f:
        proc = children.start(["victoria-metrics", f"-storageDataPath={tmp / 'vm'}",
                               f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=10y",
                               "-search.maxQueryDuration=10m"], stdout=f, stderr=f)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", "VictoriaMetrics", tmp / "victoria-metrics.log")
    return url, proc.pid


def compacted(tsdb: Path, quiet_s: float = 30.0, timeout: float = 1800.0) -> int:
    """Wait until Prometheus has compacted the backfilled blocks (its first compaction comes a minute
    after it starts, and promtool writes the rules' figures as a block per rule and 2 hours): until the
    number of blocks has not changed for ``quiet_s``, after at least 90 s.  A Prometheus that recorded
    the rules itself holds them in the blocks of the raw series; hundreds of small blocks would slow
    both paths.  The number of blocks left."""
    deadline, t0 = time.monotonic() + timeout, time.monotonic()

    def blocks() -> int:
        return sum(1 for d in tsdb.iterdir() if d.is_dir() and (d / "meta.json").exists())

    last, since = blocks(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(5)
        now = blocks()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s and time.monotonic() - t0 >= 90:
            return now
    log("report-fleet: Prometheus is still compacting; measuring anyway")
    return last


def settle(pid: int, quiet_s: float = 10.0, timeout: float = 900.0) -> None:
    """Wait until a store has loaded and compacted what it will: under 5% of a core for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(quiet_s)
        if (cpu_seconds(pid) - before) / quiet_s < 0.05:
            return
    log("report-fleet: a store is still busy; measuring anyway")


# The range read in parts ends this much before the history does (and starts as much earlier): 16 min
# 40 s off the whole hour, so that both its ends are read raw.
PARTS_END_EARLY = 1000


def run_report(url: str, since: str, end: str, out: Path, *extra: str) -> tuple[float, str]:
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--since", since,
                        "--end", end, "--format", "json", "--output", str(out), *extra], capture_output=True,
                       text=True, cwd=ROOT, timeout=1800)  # fmt: skip
    wall = time.monotonic() - t
    if r.returncode != 0:
        raise RuntimeError(f"report on {url} failed ({r.returncode}): {r.stderr[-3000:]}")
    return wall, r.stderr


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    recs = doc["recommendations"]
    kinds: dict[str, int] = {}
    for r in recs:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    return {"gpus": len(doc["gpus"]), "totals": doc["totals"], "holders": len(doc["holders"]),
            "timeline_points": len(doc["timeline"]), "recommendations": len(recs), "by_kind": kinds,
            "advised_saving_per_month": sum(r["saving_per_month"] or 0 for r in recs),
            "advice": sorted((r["uuid"], r["kind"], r["suggested"]) for r in recs)}  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--days", type=float, default=30)
    p.add_argument("--step", type=int, default=60, help="scrape interval of the history, in seconds")
    p.add_argument("--reps", type=int, default=3, help="reports per store")
    p.add_argument("--tsdb", type=Path, help="keep both stores here, and reuse them if they are already there")
    p.add_argument("--gpus", type=int, default=NODES * GPUS_PER_NODE, help="the fleet's size (nodes of 8)")
    p.add_argument("--recorded", action="store_true", help="also the report on the recorded series (Prometheus)")
    p.add_argument("--no-vm", dest="vm", action="store_false", help="leave VictoriaMetrics out")
    p.add_argument(
        "--name",
        help="the results file's name (default report-fleet-<gpus>-<days>d, a point of the "
        "curve report_fleet_fit.py draws: a run on another machine belongs in a file of its own)",
    )
    args = p.parse_args(argv)
    exit_on_sigterm()
    res: dict[str, Any] = {"machine": machine(), "nodes": math.ceil(args.gpus / GPUS_PER_NODE), "gpus": args.gpus,
                           "days": args.days, "scrape_interval_s": args.step}  # fmt: skip
    with tempdir("gpu-exporter-report-fleet-") as scratch, Children() as children:
        tmp = args.tsdb or scratch
        tmp.mkdir(parents=True, exist_ok=True)
        vm_url, vm_pid = victoria_metrics(children, tmp) if args.vm else ("", 0)
        done = tmp / "backfill.json"
        if done.exists():
            res["backfill"] = json.loads(done.read_text())
            log(f"report-fleet: reusing the history in {tmp}")
        else:
            t = time.monotonic()
            tracks = simulate(args.days, args.step)
            res["simulate_s"] = time.monotonic() - t
            log(f"report-fleet: simulated one node for {args.days:g} days in {res['simulate_s']:.0f} s")
            # The recorded series of an hour are written 1 to 2 h after it: the history ends before that.
            end = int(time.time() // 3600 * 3600 - (3 if args.recorded else 1) * 3600)
            res["backfill"] = backfill(tmp, tracks, args.days, args.step, end, vm_url or None, args.gpus)
            done.write_text(json.dumps(res["backfill"]))
        prom_url, prom = prometheus(children, tmp, args.days)
        if args.recorded and not (tmp / "recorded.json").exists():
            settle(prom.pid)
            rec = record(prom_url, tmp, res["backfill"]["range_start"], res["backfill"]["end"])
            (tmp / "recorded.json").write_text(json.dumps(rec))
            children.stop(prom, grace=30)
            prom_url, prom = prometheus(children, tmp, args.days)
        if args.recorded:
            res["recorded"] = json.loads((tmp / "recorded.json").read_text())
            res["recorded"]["blocks_after_compaction"] = compacted(tmp / "tsdb")
            log(f"report-fleet: {res['recorded']['blocks_after_compaction']} blocks after compaction")
        settle(prom.pid)
        if vm_pid:
            settle(vm_pid)
        # The history ends an hour before it was made; the report's range ends where the history does.
        since = f"{args.days * 24:g}h"
        end_at = str(res["backfill"]["end"])
        paths = {"prometheus": (prom_url, prom.pid, ("--prometheus.recorded", "no"))}
        if args.recorded:
            paths["prometheus-recorded"] = (prom_url, prom.pid, ("--prometheus.recorded", "yes"))
            # A range off whole hours, as --since ends now: its ends raw, the hours between recorded.
            paths["prometheus-parts"] = (prom_url, prom.pid, ("--prometheus.recorded", "auto"))
            paths["prometheus-parts-raw"] = (prom_url, prom.pid, ("--prometheus.recorded", "no"))  # the same range
        if vm_pid:
            paths["victoriametrics"] = (vm_url, vm_pid, ("--prometheus.recorded", "no"))
        stores = {k: v[0] for k, v in paths.items()}
        pids = {k: v[1] for k, v in paths.items()}
        runs: dict[str, list[float]] = {s: [] for s in stores}
        cpu: dict[str, list[float]] = {s: [] for s in stores}
        loads: dict[str, list[float]] = {s: [] for s in stores}
        stderr: dict[str, str] = {}
        docs: dict[str, Any] = {}
        for i in range(args.reps):
            for store, url in stores.items():  # alternately, so that both meet the same machine
                loads[store].append(os.getloadavg()[0])  # the machine is shared: say how busy it was
                out = tmp / f"report-{store}.json"
                before = cpu_seconds(pids[store])
                ends = str(int(end_at) - PARTS_END_EARLY) if store.startswith("prometheus-parts") else end_at
                wall, stderr[store] = run_report(url, since, ends, out, *paths[store][2])
                runs[store].append(wall)
                # The store's own CPU time for the report: what a machine of its own would spend, whatever
                # else the shared machine runs meanwhile.
                cpu[store].append(cpu_seconds(pids[store]) - before)
                docs[store] = json.loads(out.read_text())
                log(f"report-fleet: {store}: report --since {since} took {wall:.1f} s (run {i + 1})")
    res["report_wall_s"] = runs
    res["report_wall_median_s"] = {s: median(x) for s, x in runs.items()}
    res["store_cpu_s"] = cpu
    res["store_cpu_median_s"] = {s: median(x) for s, x in cpu.items()}
    res["load_average_before_each_run"] = loads
    res["report_stderr_last"] = {s: e.strip().splitlines() for s, e in stderr.items()}
    # How close each path came to --prometheus.max-answer-mib: its largest answer, as the report says it.
    res["largest_answer"] = {s: next((line.split("; ", 1)[1] for line in reversed(e.splitlines())
                                      if "the largest answer" in line), None) for s, e in stderr.items()}  # fmt: skip
    res["report_summary"] = {s: summary(d) for s, d in docs.items()}
    if args.recorded or not args.vm:
        name = args.name or f"report-fleet-{args.gpus}-{args.days:g}d"
        (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
        print("\n".join(sizes_markdown([res])))
        return 0
    (RESULTS / "report-fleet.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "report-fleet.md").write_text("\n".join(markdown(res)) + "\n")
    print("\n".join(markdown(res)))
    return 0


def sizes_markdown(runs: list[dict[str, Any]]) -> Iterator[str]:
    """One row per fleet size and path: the median report time, the store's CPU, and the money."""
    yield "| GPUs | days | samples | path | report, median | store CPU, median | cost, USD | wasted, USD | runs |"
    yield "|---|---|---|---|---|---|---|---|---|"
    for res in runs:
        for path, walls in res["report_wall_s"].items():
            t = res["report_summary"][path]["totals"]
            yield (f"| {res['gpus']:,} | {res['days']:g} | {res['backfill']['samples']:,} | {path} | "
                   f"{res['report_wall_median_s'][path]:.1f} s | {res['store_cpu_median_s'][path]:.1f} s | "
                   f"{t['cost']:,.4f} | {t['wasted_cost']:,.4f} | {', '.join(f'{x:.1f}' for x in walls)} |"
                   )  # fmt: skip


def _off(got: float | None, want: float) -> str:
    if got is None:
        return "missing"
    return f"{(got - want) / want * 100:+.3f}%" if want else f"{got:g}"


def markdown(res: dict[str, Any]) -> Iterator[str]:
    b = res["backfill"]
    truth = b["truth"]
    yield "# `gpu-exporter report` on the simulated 400-GPU fleet"
    yield ""
    yield f"Run of {machine_line(res['machine'])}."
    yield ""
    yield (f"{res['nodes']} nodes x 8 simulated GPUs ({res['gpus']} GPUs), {res['days']:g} days of history at a "
           f"{res['scrape_interval_s']} s scrape interval, with the H100s' price changed half-way (2.50 -> 2.80 "
           f"USD/h, at 13:37), {RESTARTS} exporter restarts and {FAILED_SCRAPES} failed scrapes per node, and the "
           f"holder of every GPU changing daily: {b['samples']:,} samples of the series the report reads (generated "
           f"in {b['generate_s']:.0f} s), backfilled with promtool ({b['promtool_s']:.0f} s) into Debian's "
           f"Prometheus and imported into Debian's VictoriaMetrics ({b['victoriametrics_import_s']:.0f} s). The "
           "report runs as a user runs it (the CLI, JSON to a file), alternately on each store.")  # fmt: skip
    yield ""
    yield "| figure | Prometheus | VictoriaMetrics |"
    yield "|---|---|---|"
    med, walls, loads = res["report_wall_median_s"], res["report_wall_s"], res["load_average_before_each_run"]
    yield (f"| `report --since {res['days'] * 24:g}h`, median of {len(walls['prometheus'])} | "
           f"**{med['prometheus']:.1f} s** (target: under 15 s) | **{med['victoriametrics']:.1f} s** |")  # fmt: skip
    cpu, cpu_med = res["store_cpu_s"], res["store_cpu_median_s"]
    yield (
        f"| the store's CPU time per report, median (its work, whatever else the shared machine runs; the "
        f"report runs four queries at once) | **{cpu_med['prometheus']:.1f} s** | "
        f"**{cpu_med['victoriametrics']:.1f} s** |"
    )
    yield f"| ... each run | {', '.join(f'{x:.1f} s' for x in cpu['prometheus'])} | " \
          f"{', '.join(f'{x:.1f} s' for x in cpu['victoriametrics'])} |"  # fmt: skip
    yield f"| each run | {', '.join(f'{x:.1f} s' for x in walls['prometheus'])} | " \
          f"{', '.join(f'{x:.1f} s' for x in walls['victoriametrics'])} |"  # fmt: skip
    yield f"| 1-minute load average before each run (2 cores, shared) | " \
          f"{', '.join(f'{x:.1f}' for x in loads['prometheus'])} | " \
          f"{', '.join(f'{x:.1f}' for x in loads['victoriametrics'])} |"  # fmt: skip
    s = res["report_summary"]
    p, v = s["prometheus"], s["victoriametrics"]
    yield f"| GPUs, holders, timeline points | {p['gpus']}, {p['holders']}, {p['timeline_points']} | " \
          f"{v['gpus']}, {v['holders']}, {v['timeline_points']} |"  # fmt: skip
    for state in STATES:
        want = truth["hours"][state]
        yield (f"| {state} hours (counted: {want:,.1f}) | {p['totals'][f'{state}_hours']:,.1f} "
               f"({_off(p['totals'][f'{state}_hours'], want)}) | {v['totals'][f'{state}_hours']:,.1f} "
               f"({_off(v['totals'][f'{state}_hours'], want)}) |")  # fmt: skip
    for key in ("cost", "wasted_cost"):
        want = truth[key]
        yield (
            f"| {key.replace('_', ' ')}, USD (counted: {want:,.2f}) | {p['totals'][key]:,.2f} "
            f"({_off(p['totals'][key], want)}) | {v['totals'][key]:,.2f} ({_off(v['totals'][key], want)}) |"
        )
    yield f"| recommendations (by kind) | {p['recommendations']} ({p['by_kind']}) | " \
          f"{v['recommendations']} ({v['by_kind']}) |"  # fmt: skip
    waste = {k: x["totals"]["wasted_cost"] * 730 / (res["days"] * 24) for k, x in (("p", p), ("v", v))}
    pa, va = p["advised_saving_per_month"], v["advised_saving_per_month"]
    yield (f"| advised saving per month against the waste's cost per month, USD | {pa:,.0f} of {waste['p']:,.0f} "
           f"({pa / waste['p']:.0%}) | {va:,.0f} of {waste['v']:,.0f} ({va / waste['v']:.0%}) |")  # fmt: skip
    yield f"| the same advice on both | {'yes' if p['advice'] == v['advice'] else 'NO'} | |"
    yield ""
    for store in ("prometheus", "victoriametrics"):
        yield f"Progress lines of the last run on {store} (each query's own time; four run at once):"
        yield ""
        yield "```"
        yield from res["report_stderr_last"][store]
        yield "```"
        yield ""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
