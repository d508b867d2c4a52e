"""What profiling-grade activity (GPM) and per-process utilization add to a poll.

Side by side in one run, alternating poll by poll so that machine noise hits both arms alike:
- 8x H100 (20 ms PCIe sampling), 64 processes: GPM and per-process utilization on, and off (the
  same scenario with both answering NOT_SUPPORTED, so no call is made after the first).
- 8x H100 in MIG mode, 7 instances each (56 GPM pairs per poll), with GPM on and off.
CPU is process CPU time per poll (all threads), wall is the poll's duration. The budget (issue:
"GPM and process utilization together add at most 2 ms of CPU per poll", and nothing blocks) is
checked against the median difference. The fake's calls cost what a C function call costs; the
real driver's are far dearer, and the report quotes the real H200's figures beside ours.

    .venv/bin/python benchmarks/gpm_cost.py [--polls 200]

Writes benchmarks/results/gpm_cost.md and gpm_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakenvml import Scenario, load_in_process  # noqa: E402
from tests.fakenvml.presets import preset  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GIB = 1024**3
BUDGET_CPU_S = 0.002
# Measured on one H200 (driver 580.159.04) by benchmarks/real_gpu/nvml_probe.py: median wall time
# of one call, 200 calls (100 for the process call).
REAL_H200 = {"nvmlGpmSampleGet": 31.7e-6, "nvmlGpmMetricsGet (8 metrics)": 1409.5e-6,
             "nvmlDeviceGetProcessUtilization": 2121.2e-6, "nvmlDeviceGetUtilizationRates": 0.88e-6}  # fmt: skip


def training(path: Path, gpm: bool) -> Scenario:
    s = preset("h100-8x-training", path)
    for i, g in enumerate(s.gpus):
        g.processes.clear()
        for p in range(8):
            g.add_process(50_000 + 10 * i + p, 8 * GIB, name=f"worker{p}", sm=10 + p, mem=5)
        if not gpm:
            g.gpm_supported(None).process_utilization(None)
    s.write()
    return s


def mig(path: Path, gpm: bool) -> Scenario:
    s = preset("h100-8x-mig", path)
    if not gpm:
        for g in s.gpus:
            g.gpm_supported(None)
    s.write()
    return s


def measure(paths: dict[str, Path], polls: int) -> dict[str, dict[str, float]]:
    """Alternate the arms poll by poll; each arm has its own poller (the fake re-reads the
    scenario named by the environment at each nvmlInit, so each arm is re-initialised in turn)."""
    from gpu_exporter.logs import configure_logging
    from gpu_exporter.sources.nvml import NvmlBackend
    from gpu_exporter.sources.poller import Poller

    configure_logging("json", "warning")
    cpu: dict[str, list[float]] = {k: [] for k in paths}
    wall: dict[str, list[float]] = {k: [] for k in paths}
    pollers = {}
    for name, path in paths.items():
        os.environ["FAKE_NVML_SCENARIO"] = str(path)
        # Re-read at every poll: the cost when due, the worst case of any --profiling.interval.
        backend = NvmlBackend(lambda f, e: None, profiling_interval=0.1)
        pollers[name] = Poller(backend, errors=lambda f, e: None)
        pollers[name].poll()  # discovery
        pollers[name].close()
    for i in range(polls):
        for name, path in paths.items():
            os.environ["FAKE_NVML_SCENARIO"] = str(path)
            poller = pollers[name]
            poller.poll()  # (re)opens NVML on this arm's scenario, takes the first GPM sample
            time.sleep(0.11)  # a GPM pair needs 100 ms
            c0, w0 = time.process_time(), time.perf_counter()
            snap = poller.poll()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
            assert all(g.up for g in snap.gpus)
            if i == 0 and name.endswith("on"):
                assert any(g.activity or any(m.activity for m in g.migs) for g in snap.gpus), name
            poller.close()
    return {name: {"cpu_median_s": statistics.median(cpu[name]), "wall_median_s": statistics.median(wall[name]),
                   "polls": len(cpu[name])} for name in paths}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--polls", type=int, default=200)
    args = ap.parse_args()
    load_in_process()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        paths = {"8 GPUs, 64 processes: off": training(d / "a.scn", False).path,
                 "8 GPUs, 64 processes: on": training(d / "b.scn", True).path,
                 "8 GPUs x 7 MIG: off": mig(d / "c.scn", False).path,
                 "8 GPUs x 7 MIG: on": mig(d / "d.scn", True).path}  # fmt: skip
        res = measure(paths, args.polls)
    rows = []
    verdicts = {}
    for scenario in ("8 GPUs, 64 processes", "8 GPUs x 7 MIG"):
        off, on = res[f"{scenario}: off"], res[f"{scenario}: on"]
        added = on["cpu_median_s"] - off["cpu_median_s"]
        verdicts[scenario] = {"added_cpu_s": added, "met": added <= BUDGET_CPU_S}
        rows.append(f"| {scenario} | {off['cpu_median_s'] * 1e3:.2f} | {on['cpu_median_s'] * 1e3:.2f} | "
                    f"{added * 1e3:+.2f} | {off['wall_median_s'] * 1e3:.1f} | {on['wall_median_s'] * 1e3:.1f} | "
                    f"{'met' if added <= BUDGET_CPU_S else 'missed'} |")  # fmt: skip
    doc = {"date": time.strftime("%Y-%m-%d"), "polls": args.polls, "results": res, "verdicts": verdicts,
           "real_h200_call_wall_s": REAL_H200}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gpm_cost.json").write_text(json.dumps(doc, indent=2) + "\n")
    real = "\n".join(f"| {k} | {v * 1e6:.1f} |" for k, v in REAL_H200.items())
    md = f"""# GPM and per-process utilization: cost per poll

{doc["date"]}, {args.polls} polls per arm, arms alternating poll by poll, against the fake NVML.
Budget: at most {BUDGET_CPU_S * 1e3:.0f} ms of CPU per poll added.

| scenario | CPU off (ms) | CPU on (ms) | added | wall off (ms) | wall on (ms) | budget |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

"On" takes per GPU one nvmlGpmSampleGet and one nvmlGpmMetricsGet (8 metrics), per MIG instance
one nvmlGpmMigSampleGet and one nvmlGpmMetricsGet, and per GPU not in MIG mode one
nvmlDeviceGetProcessUtilization. Nothing in them blocks: no sleep, and the pair is taken between
polls.

## The real driver

The fake's calls cost what any C call does. On a real H200 (driver 580.159.04,
`benchmarks/real_gpu/nvml_probe.py`), median wall time per call, in microseconds:

| call | µs |
|---|---|
{real}

So on real hardware the driver itself spends about 1.4 ms in nvmlGpmMetricsGet and 2.1 ms in
nvmlDeviceGetProcessUtilization per GPU and poll: 28 ms for 8 GPUs, spread over the per-GPU read
threads (the poll's wall time grows by about 3.5 ms, not 28). Whether that is CPU time in the
library or a wait on the kernel driver, this run cannot tell; the exporter's own Python work
around the calls is what the table above measures.
"""
    (RESULTS / "gpm_cost.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
