"""The month of a large fleet, read from the hourly recorded series only: how long ``gpu-exporter
report --prometheus.recorded yes`` takes on it, how much memory it needs, and what it costs the store.

No raw history is made: the series that alerts/gpu-report.rules.yml records (``gpu:report_*:hour``) are
written directly, an hour's figure at the time a ruler running the group 20 minutes past each hour
writes it, with the labels the rules keep (the target's, the GPU's, the holder's).  The raw series the
recorded path still reads, over the range's last hour only (who holds each GPU now, its links), are
written beside them, a sample a minute.

The fleet: nodes of 8 GPUs, 7 of 8 nodes H100 (2.50 USD/h, 2.80 from half-way through the month on
every other node), the rest L40S (1.00).  Each GPU plays one of five lives, by its index: busy (50 min
of each hour) with some allocated idle time; mostly allocated and idle; never held (idle); held by day
and idle by night; down for a day in the middle, then busy.  Its holder, a pod, is one all month, or,
with ``--churn``, a new pod every day (at a time of day of its own), whose series end an hour after its
last hold as the exporter's holder retention ends them.

The hours and cost are counted while the series are written, and compared with the report's totals.

    .venv/bin/python benchmarks/report_month.py --gpus 2500 --store vm
    .venv/bin/python benchmarks/report_month.py --gpus 10000 --churn --store vm --store prometheus \
        --report-args "" --report-args "--prometheus.max-answer-mib 4096"

Each store starts on a fresh directory; the report runs cold (right after the store restarted) and
warm (once more), as a user runs it (the CLI, JSON to a file).  Printed and written to
results/report-month-<gpus>[-churn].json: wall, the report's peak RSS, the store's CPU seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
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
    tempdir,
    wait_ready,
    which,
)

HOUR = 3600
LAG = 2 * HOUR  # the recorded figure of an hour is read at its end + LAG (gpu_exporter/report/queries.py)
PHASE = 1200  # the ruler runs the hourly group this long past each hour
GPUS_PER_NODE = 8
PRICES = {"H100": (2.50, 2.80), "L40S": (1.00, 1.00)}  # before and after half-way (every other node)
SIGNALS = ("sm_active", "utilization", "dram_active", "tensor_active", "fp64_active", "fp32_active", "fp16_active")
RETENTION_HOURS = 1  # a holder's series are written this long after its last hold, at 0


@dataclass
class Truth:
    hours: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cost: float = 0.0


@dataclass(frozen=True)
class Gpu:
    index: int
    node: int
    model: str
    life: int  # 0 busy, 1 allocated idle, 2 never held, 3 day and night, 4 down a day
    price_changes: bool

    @property
    def base(self) -> dict[str, str]:
        n = self.node
        return {"job": "gpu-exporter", "instance": f"10.{n // 62500}.{n // 250 % 250}.{n % 250}:9445",
                "node": f"node-{self.node:05d}", "gpu": str(self.index % GPUS_PER_NODE),
                "uuid": f"GPU-{uuid.UUID(bytes=hashlib.md5(str(self.index).encode()).digest())}"}  # fmt: skip


def fleet(gpus: int) -> list[Gpu]:
    out = []
    for i in range(gpus):
        node = i // GPUS_PER_NODE
        model = "L40S" if node % 8 == 7 else "H100"
        out.append(Gpu(i, node, model, (i * 7 + node) % 5, node % 2 == 0))
    return out


def hour_of(g: Gpu, h: int, hours: int) -> tuple[dict[str, int], bool]:
    """Seconds in each state in hour ``h``, and whether the GPU was held."""
    if g.life == 0:
        return {"busy": 3000, "allocated_idle": 600}, True
    if g.life == 1:
        return {"busy": 300, "allocated_idle": 3300}, True
    if g.life == 2:
        return {"idle": 3600}, False
    if g.life == 3:
        return ({"busy": 3600}, True) if 8 <= h % 24 < 20 else ({"idle": 3600}, False)
    if hours // 2 <= h < hours // 2 + 24:
        return {"down": 3600}, False
    return {"busy": 3400, "allocated_idle": 200}, True


def holder(g: Gpu, h: int, churn: bool) -> dict[str, str]:
    """The pod holding the GPU in hour ``h`` (while it is held)."""
    day = (h + g.index % 24) // 24 if churn else 0
    return {"namespace": f"team-{g.index % 40:02d}", "pod": f"train-{g.index:05d}-{day:02d}", "container": "main"}


def _key(name: str, labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return (("__name__", name), *sorted(labels.items()))


def gpu_series(
    g: Gpu, start: int, hours: int, churn: bool, truth: Truth
) -> dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]:
    """One GPU's recorded series: labels -> (time in ms, value), the hours and cost counted in ``truth``."""
    mid = start + hours // 2 * HOUR
    series: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = defaultdict(list)
    base = g.base
    info = {"name": f"NVIDIA {g.model}", "pci_bus_id": f"00000000:{g.index % 8 + 1:02X}:00.0",
            "driver_version": "580.95.05", "cuda_version": "13.0", "serial": str(1650000000000 + g.index),
            "mig_mode": "disabled", "device": f"nvidia{g.index % 8}"}  # fmt: skip
    total = 85_520_809_984 if g.model == "H100" else 48_305_799_168
    signals = [*(SIGNALS if g.model == "H100" else SIGNALS[:4]), *(("nvlink_tx",) if g.model == "H100" else ())]
    keys: dict[tuple[str, tuple[tuple[str, str], ...], str], tuple[tuple[str, str], ...]] = {}

    def add(name: str, hk: tuple[tuple[str, str], ...], extra: dict[str, str], at: int, v: float) -> None:
        # The series' labels made once (sorting them is most of the time otherwise).
        ck = (name, hk, next(iter(extra.values()), ""))
        key = keys.get(ck)
        if key is None:
            key = keys[ck] = _key(name, {**base, **dict(hk), **extra})
        series[key].append((at, v))

    last_held: dict[tuple[tuple[str, str], ...], int] = {}  # a holder's labels -> the last hour it held
    for h in range(hours):
        at = (start + (h + 1) * HOUR + HOUR + PHASE) * 1000  # written an hour after the hour ends, and some
        states, held = hour_of(g, h, hours)
        hk = tuple(sorted(holder(g, h, churn).items())) if held else ()
        if held:
            last_held[hk] = h
        for k, since in list(last_held.items()):
            if h - since > RETENTION_HOURS:
                del last_held[k]
        # The unheld idle and down series always; each holder's held states while it holds, and for
        # the retention after (at 0).
        for state in ("idle", "down"):
            add(
                "gpu:report_state_seconds:hour",
                (),
                {"state": state},
                at,
                float(0 if held else states.get(state, 0)),
            )
        for hkey in last_held:
            now = hkey == hk and held
            for state in ("busy", "allocated_idle"):
                add("gpu:report_state_seconds:hour", hkey, {"state": state}, at,
                    float(states.get(state, 0)) if now else 0.0)  # fmt: skip
        price = PRICES[g.model][1 if g.price_changes and start + (h + 1) * HOUR > mid else 0]
        add("gpu:report_price_per_hour:hour", (), {"currency": "USD"}, at, price)
        add("gpu:report_down:hour", (), {"state": "down"}, at, 0.0)
        for state, sec in states.items():
            truth.hours[state] += sec / HOUR
            truth.cost += price * sec / HOUR
        if "down" in states:
            continue  # a lost GPU exports its counters and gpu_up 0, nothing else
        add("gpu:report_info:hour", hk, info, at, 1.0)
        add("gpu:report_memory_total_bytes:hour", hk, {}, at, float(total))
        add("gpu:report_memory_used_max_bytes:hour", hk, {}, at,
            float(total * (0.3 + 0.05 * (g.index % 10))) if held else 0.0)  # fmt: skip
        if held:
            for i, signal in enumerate(signals):
                v = 2.5e10 if signal == "nvlink_tx" else round(0.2 + 0.07 * ((g.index + i) % 10), 4)
                add("gpu:report_activity_held:hour", hk, {"signal": signal}, at, v)
    return series


def write_fleet(out: IO[str], gpus: list[Gpu], start: int, hours: int, churn: bool, truth: Truth) -> int:
    """Every recorded series of ``hours`` hours from ``start``, a JSON line per series (VictoriaMetrics'
    import format); the samples written."""
    samples = 0
    for g in gpus:
        series = gpu_series(g, start, hours, churn, truth)
        for key, points in series.items():
            out.write(json.dumps({"metric": dict(key), "values": [v for _, v in points],
                                  "timestamps": [t for t, _ in points]}) + "\n")  # fmt: skip
            samples += len(points)
    # The group ran, every hour.
    stamps = [(start + (h + 2) * HOUR + PHASE) * 1000 for h in range(hours)]
    out.write(json.dumps({"metric": {"__name__": "gpu:report_rules:hour"}, "values": [1.0] * hours,
                          "timestamps": stamps}) + "\n")  # fmt: skip
    return samples + hours


def write_last_hour(out: IO[str], gpus: list[Gpu], start: int, hours: int, churn: bool) -> int:
    """The raw series the recorded path reads over the range's last hour: the held states' counters (who
    holds each GPU now) and the links' gauges, a sample a minute."""
    samples = 0
    end = start + hours * HOUR
    stamps = [(end - HOUR + 60 * k) * 1000 for k in range(60)]
    for g in gpus:
        states, held = hour_of(g, hours - 1, hours)
        who = holder(g, hours - 1, churn) if held else {}
        on = {**g.base, **who}
        rows: list[tuple[dict[str, str], list[float]]] = []
        if held:
            for state, s in states.items():
                rows.append(({"__name__": "gpu_state_seconds_total", **on, "state": state},
                             [1e6 + s * k / 60 for k in range(60)]))  # fmt: skip
        if "down" not in states:
            h100 = g.model == "H100"
            for name, v in (("gpu_nvlink_links", 18 if h100 else 0), ("gpu_pcie_link_max_generation", 5 if h100 else 4),
                            ("gpu_pcie_link_max_width", 16),
                            ("gpu_pcie_link_max_bytes_per_second", 63e9 if h100 else 31.5e9)):  # fmt: skip
                rows.append(({"__name__": name, **on}, [float(v)] * 60))
        for metric, values in rows:
            out.write(json.dumps({"metric": metric, "values": values, "timestamps": stamps}) + "\n")
            samples += len(values)
    return samples


def victoria_metrics(children: Children, data: Path, log_path: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """Debian's VictoriaMetrics with its default limits, but for a retention that keeps the month."""
    port = free_port()
    with open(log_path, "ab") as f:
        proc = children.start(["victoria-metrics", f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
                               "-retentionPeriod=10y"], stdout=f, stderr=f)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", "VictoriaMetrics", log_path, timeout=600)
    return url, proc


def prometheus(children: Children, tmp: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """Debian's Prometheus with its default limits, on the backfilled blocks."""
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = free_port()
    with open(tmp / "prometheus.log", "ab") as f:
        proc = children.start(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                               "--storage.tsdb.retention.time=60d"], stdout=f, stderr=f)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/-/ready", "Prometheus", tmp / "prometheus.log", timeout=600)
    return url, proc


def import_vm(url: str, path: Path) -> float:
    t = time.monotonic()
    with open(path, "rb") as f:
        req = urllib.request.Request(url + "/api/v1/import", data=f, method="POST")
        req.add_header("Content-Length", str(path.stat().st_size))
        urllib.request.urlopen(req, timeout=3600).read()
    urllib.request.urlopen(url + "/internal/force_flush", timeout=600).read()
    return time.monotonic() - t


def backfill_prometheus(tmp: Path, src: Path) -> float:
    """promtool's OpenMetrics backfill: it needs each metric family's samples together, so the file is
    written by metric name."""
    t = time.monotonic()
    by_name: dict[str, list[str]] = defaultdict(list)
    with open(src) as f:
        for line in f:
            by_name[json.loads(line)["metric"]["__name__"]].append(line)
    om = tmp / "backfill.om"
    with open(om, "w") as out:
        for name, lines in by_name.items():
            for line in lines:
                d = json.loads(line)
                m = d["metric"]
                m.pop("__name__")
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(m.items()))
                head = f"{name}{{{labels}}}" if labels else name
                out.write("".join(f"{head} {v} {t / 1000:.3f}\n" for v, t in zip(d["values"], d["timestamps"],
                                                                                  strict=True)))  # fmt: skip
        out.write("# EOF\n")
    del by_name
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=240h",
                        str(om), str(tmp / "tsdb")], capture_output=True, text=True, timeout=7200)  # fmt: skip
    om.unlink()
    if r.returncode != 0:
        raise RuntimeError(f"promtool: {r.stderr[-2000:]}")
    return time.monotonic() - t


def run_report(url: str, start: int, end: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """The report as a user runs it; its wall time and peak RSS.  The RSS is GNU time's, of a child it
    forked itself: the kernel carries a process's peak RSS across exec, and a child forked from this
    process would count this one's (over 800 MiB while the Prometheus backfill holds its lines)."""
    t = time.monotonic()
    rss = out.with_suffix(".rss")
    with open(out.with_suffix(".stderr"), "w") as err:
        proc = subprocess.run([which("time"), "-f", "%M", "-o", str(rss), sys.executable, "-m", "gpu_exporter",
                               "report", "--prometheus.url", url, "--start", str(start), "--end", str(end),
                               "--prometheus.recorded", "yes", "--format", "json", "--output", str(out), *extra],
                              stderr=err, cwd=ROOT, check=False)  # fmt: skip
    wall = time.monotonic() - t
    stderr = out.with_suffix(".stderr").read_text()
    if proc.returncode != 0:
        return {"ok": False, "wall_s": round(wall, 1), "error": stderr[-1500:]}
    kib = int(rss.read_text().split()[-1])
    return {"ok": True, "wall_s": round(wall, 1), "peak_rss_mib": round(kib / 1024, 1)}


def measure(name: str, url: str, pid: int, start: int, end: int, tmp: Path, extra: list[str]) -> dict[str, Any]:
    """The report cold (the store just started) and warm (once more)."""
    runs: dict[str, Any] = {}
    for temp in ("cold", "warm"):
        before = cpu_seconds(pid)
        r = run_report(url, start, end, tmp / f"report-{name}-{temp}.json", extra)
        r["store_cpu_s"] = round(cpu_seconds(pid) - before, 1)
        if r["ok"]:
            doc = json.loads((tmp / f"report-{name}-{temp}.json").read_text())
            totals = doc["totals"]
            r["gpu_hours"], r["cost"] = totals.get("gpu_hours"), totals.get("cost")
            r["holders"], r["gpus"] = len(doc["holders"]), len(doc["gpus"])
        log(f"report-month: {name} {temp}: {r}")
        runs[temp] = r
    return runs


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=2500)
    p.add_argument("--hours", type=int, default=720)
    p.add_argument("--churn", action="store_true", help="a new pod on each GPU every day")
    p.add_argument("--store", action="append", choices=("vm", "prometheus"), help="default: both")
    p.add_argument(
        "--report-args",
        action="append",
        default=None,
        help="flags for the report, in one string: a run (cold and warm) for each (default: one, without)",
    )
    p.add_argument("--keep", type=Path, help="write the stores here and keep them")
    args = p.parse_args(argv)
    stores = args.store or ["vm", "prometheus"]
    exit_on_sigterm()
    now = int(time.time())
    end = (now // HOUR) * HOUR - 3 * HOUR  # written by the rules two hours ago or more
    start = end - args.hours * HOUR
    gpus = fleet(args.gpus)
    truth = Truth()
    res: dict[str, Any] = {"machine": machine(), "gpus": args.gpus, "hours": args.hours, "churn": args.churn,
                           "report_args": args.report_args}  # fmt: skip
    with tempdir("report-month") as tmp_dir, Children() as children:
        tmp = args.keep or tmp_dir
        tmp.mkdir(parents=True, exist_ok=True)
        src = tmp / "series.jsonl"
        t = time.monotonic()
        with open(src, "w") as f:
            res["samples"] = write_fleet(f, gpus, start, args.hours, args.churn, truth)
            res["samples"] += write_last_hour(f, gpus, start, args.hours, args.churn)
        res["generate_s"] = round(time.monotonic() - t, 1)
        with open(src) as f:
            res["series"] = sum(1 for _ in f)
        res["truth"] = {"gpu_hours": round(sum(truth.hours.values()), 3), "cost": round(truth.cost, 4),
                        "hours": {k: round(v, 3) for k, v in truth.hours.items()}}  # fmt: skip
        log(
            f"report-month: {res['series']:,} series, {res['samples']:,} samples in {res['generate_s']} s; "
            f"truth {res['truth']['gpu_hours']:,} GPU-hours, {res['truth']['cost']:,} USD"
        )
        variants = [v.split() for v in args.report_args or [""]]
        for store in stores:
            if store == "vm":
                url, proc = victoria_metrics(children, tmp / "vm", tmp / "vm.log")
                res["vm_import_s"] = round(import_vm(url, src), 1)
            else:
                res["prometheus_backfill_s"] = round(backfill_prometheus(tmp, src), 1)
                url, proc = prometheus(children, tmp)
            runs = res.setdefault({"vm": "victoriametrics"}.get(store, store), {})
            for extra in variants:
                children.stop(proc, grace=60)  # cold: the store just restarted
                url, proc = victoria_metrics(children, tmp / "vm", tmp / "vm.log") if store == "vm" else \
                    prometheus(children, tmp)  # fmt: skip
                runs[" ".join(extra) or "defaults"] = measure(store, url, proc.pid, start, end, tmp, extra)
            children.stop(proc, grace=60)
    name = f"report-month-{args.gpus}{'-churn' if args.churn else ''}.json"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / name).write_text(json.dumps(res, indent=1) + "\n")
    print(machine_line(res["machine"]))
    print(json.dumps({k: v for k, v in res.items() if k != "machine"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
