"""How poll time, rendering and /metrics grow with GPUs, MIG devices and processes.

Each scenario runs in a fresh daemon process against the fake NVML: polls timed one by one
(wall and process CPU, rendering separately), then the HTTP server it serves them from is
measured with wrk at one connection. Processes are real (idle ``sleep``s), as in vs_nvitop.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import ROOT, Children, get, log, parse_samples, wrk

sys.path.insert(0, str(ROOT))
from tests.fakenvml import Scenario, subprocess_env
from tests.fakenvml.presets import GIB, gpu_uuid, h100_sxm, mig_uuid

# Runs in the project's interpreter, against the fake: the daemon's own poller and publish path.
HARNESS = """
import json, statistics, sys, time
from gpu_exporter.settings.config import load_settings
from gpu_exporter.daemon import Daemon
from gpu_exporter.logs import configure_logging
from gpu_exporter.sources.nvml import NvmlBackend

configure_logging("json", "warning")
polls, top_n = int(sys.argv[1]), int(sys.argv[2])
settings = load_settings({"web_listen_address": "127.0.0.1:0", "poll_interval": 3600, "process_top_n": top_n})
d = Daemon(settings, NvmlBackend)
for _ in range(2):
    d.poll_once()  # discovery, static facts, first process names
walls, cpus, publish = [], [], []
for _ in range(polls):
    c0, w0 = time.process_time(), time.perf_counter()
    snap = d.poller.poll()
    c1, w1 = time.process_time(), time.perf_counter()
    d.publish(snap)  # rules, then the /metrics body rendered once for every scrape until the next poll
    publish.append(time.perf_counter() - w1)
    walls.append(w1 - w0)
    cpus.append(c1 - c0)
    time.sleep(0.05)
assert all(g.up for g in snap.gpus), "a GPU is down"
d.start()
time.sleep(0.5)
q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(len(xs) * p))] * 1000
print(json.dumps({"port": d.port, "gpus": len(snap.gpus), "polls": polls,
                  "poll_wall_ms": statistics.median(walls) * 1000, "poll_wall_p90_ms": q(walls, 0.9),
                  "poll_cpu_ms": statistics.median(cpus) * 1000, "render_ms": statistics.median(publish) * 1000}),
      flush=True)
sys.stdin.read()
"""


@dataclass(frozen=True)
class Case:
    name: str
    gpus: int
    processes: int
    mig: int = 0
    top_n: int = 20


CASES = [
    Case("1 GPU, 8 processes", 1, 8),
    Case("8 GPUs, 64 processes", 8, 64),
    Case("16 GPUs, 128 processes", 16, 128),
    Case("8 GPUs x 7 MIG, 56 processes", 8, 56, mig=7),
    Case("8 GPUs, 0 processes", 8, 0),
    Case("8 GPUs, 512 processes", 8, 512),
    Case("8 GPUs, 512 processes, process_top_n 0 (all)", 8, 512, top_n=0),
]


def build(case: Case, path: Path, pids: list[int]) -> Scenario:
    s = Scenario(path)
    per_gpu = case.processes // case.gpus
    for i in range(case.gpus):
        g = s.add_gpu()
        if case.mig:
            g.identity("NVIDIA A100-SXM4-80GB", gpu_uuid("scale-mig", i))
            g.pci(f"00000000:{0x10 + i:02X}:00.0").memory(80 * GIB, 40 * GIB).mig_mode(True, max_devices=7)
            g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=1000, rx_kbps=1000)
            g.temperature(50).power(300_000, 400_000)
            for m in range(case.mig):
                g.add_mig("NVIDIA A100-SXM4-80GB MIG 1g.10gb", mig_uuid("scale-mig", i, m), 7 + m, 0).memory(
                    10 * GIB, 5 * GIB
                )
            for p in range(per_gpu):
                g.add_process(pids[i * per_gpu + p], GIB, gpu_instance_id=7 + p % case.mig, compute_instance_id=0)
        else:
            h100_sxm(g, "scale", i, util=60 + i % 30, mem_used=60 * GIB, power_mw=500_000)
            for p in range(per_gpu):
                g.add_process(pids[i * per_gpu + p], 64 * 1024**2 * (1 + p))
    s.write()
    return s


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError("the scale harness said nothing in time")
    return proc.stdout.readline()


def run(tmp: Path, *, polls: int, wrk_s: float) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with Children() as children:
        pids = [children.start(["sleep", "3600"]).pid for _ in range(max(c.processes for c in CASES))]
        for case in CASES:
            log(f"scale: {case.name}")
            scn = build(case, tmp / "scale.scn", pids)
            with open(tmp / "scale-harness.log", "wb") as err:
                proc = children.start([sys.executable, "-c", HARNESS, str(polls), str(case.top_n)],
                                      env=subprocess_env(scn.path), stdout=subprocess.PIPE, stderr=err,
                                      stdin=subprocess.PIPE, cwd=ROOT)  # fmt: skip
            try:
                line = read_line(proc, 120 + polls)
                if not line:
                    raise RuntimeError((tmp / "scale-harness.log").read_text(errors="replace")[-3000:])
                row: dict[str, Any] = {"case": case.name, "gpus_expected": case.gpus, "processes": case.processes,
                                       "mig": case.mig, "top_n": case.top_n, **json.loads(line)}  # fmt: skip
                url = f"http://127.0.0.1:{row['port']}/metrics"
                body, wire = get(url)
                _, wire_gz = get(url, gzipped=True)
                samples = parse_samples(body)
                row.update(bytes=wire, gzip_bytes=wire_gz, series=len(samples))
                row["scrape"] = wrk(url, 1, wrk_s, False, threads=1)
                rows.append(row)
            finally:
                children.stop(proc)
    return {"polls": polls, "rows": rows}


def _find(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(r for r in rows if r["case"] == name)


def steps(res: dict[str, Any]) -> list[str]:
    """Growth between neighbouring cases, to spot anything super-linear."""
    rows = res["rows"]
    out = []
    pairs = [
        ("1 GPU, 8 processes", "8 GPUs, 64 processes", "GPUs x8"),
        ("8 GPUs, 64 processes", "16 GPUs, 128 processes", "GPUs x2"),
        ("8 GPUs, 0 processes", "8 GPUs, 64 processes", "processes 0 -> 64"),
        ("8 GPUs, 64 processes", "8 GPUs, 512 processes", "processes x8 (20 exported per GPU)"),
        ("8 GPUs, 512 processes", "8 GPUs, 512 processes, process_top_n 0 (all)", "export all 512"),
        ("8 GPUs, 64 processes", "8 GPUs x 7 MIG, 56 processes", "MIG on (56 devices)"),
    ]
    for a_name, b_name, what in pairs:
        a, b = _find(rows, a_name), _find(rows, b_name)
        out.append(
            f"| {what} | poll x{b['poll_wall_ms'] / a['poll_wall_ms']:.2f}, "
            f"poll CPU x{b['poll_cpu_ms'] / a['poll_cpu_ms']:.2f} | "
            f"series x{b['series'] / a['series']:.2f}, render x{b['render_ms'] / a['render_ms']:.2f} | "
            f"bytes x{b['bytes'] / a['bytes']:.2f} |"
        )
    return out


def markdown(res: dict[str, Any], plot: str | None) -> list[str]:
    lines = [
        "## Scale",
        "",
        f"Fake NVML, H100s (A100s for MIG), real processes; each case in a fresh daemon: {res['polls']} polls "
        "(medians), then wrk at 1 connection on /metrics. Rendering happens once per poll (with rule evaluation), "
        "so a scrape's cost does not depend on what is rendered except through its size.",
        "",
        "| case | poll wall (p90) | poll CPU | rules + render | series | bytes (gzip) | scrape p50 | scrapes/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        s = r["scrape"]
        lines.append(
            f"| {r['case']} | {r['poll_wall_ms']:.1f} ms ({r['poll_wall_p90_ms']:.1f}) | {r['poll_cpu_ms']:.1f} ms | "
            f"{r['render_ms']:.1f} ms | {r['series']} | {r['bytes']} ({r['gzip_bytes']}) | "
            f"{s['p50_ms']:.2f} ms | {s['requests_per_second']:.0f} |"
        )
    lines += ["", "| step | poll | rendering | bytes |", "|---|---|---|---|", *steps(res)]
    if plot:
        lines += ["", f"![scale]({plot})"]
    return lines


PLOT = """
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = json.load(open(sys.argv[1]))["rows"]
names = [r["case"].replace(", process_top_n 0 (all)", ",\\nall exported").replace(", ", ",\\n") for r in rows]
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
x = range(len(rows))
w = 0.27
a.bar([i - w for i in x], [r["poll_wall_ms"] for r in rows], w, label="poll wall")
a.bar(list(x), [r["poll_cpu_ms"] for r in rows], w, label="poll CPU")
a.bar([i + w for i in x], [r["render_ms"] for r in rows], w, label="rules + render")
a.axhline(60, color="grey", ls="--", lw=1, label="60 ms target (8 GPUs)")
a.set_ylabel("ms"); a.set_title("poll and render"); a.legend(fontsize=8)
a.set_xticks(list(x)); a.set_xticklabels(names, fontsize=7, rotation=30, ha="right")
b.bar([i - 0.2 for i in x], [r["bytes"] / 1024 for r in rows], 0.4, label="/metrics KiB")
b.bar([i + 0.2 for i in x], [r["gzip_bytes"] / 1024 for r in rows], 0.4, label="gzip KiB")
b2 = b.twinx(); b2.plot(list(x), [r["scrape"]["p50_ms"] for r in rows], "k.-", label="scrape p50 (ms)")
b2.set_ylabel("scrape p50, ms"); b.set_ylabel("KiB"); b.set_title("/metrics"); b.legend(fontsize=8, loc="upper left")
b.set_xticks(list(x)); b.set_xticklabels(names, fontsize=7, rotation=30, ha="right")
fig.tight_layout(); fig.savefig(sys.argv[2], dpi=90)
"""


def plot(res: dict[str, Any], bench_python: Path, tmp: Path, out: Path) -> bool:
    data = tmp / "scale.json"
    data.write_text(json.dumps(res))
    r = subprocess.run([str(bench_python), "-c", PLOT, str(data), str(out)], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    if r.returncode != 0:
        log(f"scale: no plot ({r.stderr.strip().splitlines()[-1:] or r.returncode})")
    return r.returncode == 0
