"""NVML calls per poll per GPU, by card and driver, with the daemon's cadences (issues 36 and 49).

The real driver's cost is per call (benchmarks/real_gpu: on an H200, FieldValues 234-270 us for four
fields, a GPM pair 1.2 ms, ProcessUtilization 1.8-2.5 ms, PcieThroughput 0.69 ms of CPU plus 20 ms of
wait per direction).  This counts the calls a poll makes, through the real bindings on the fake
driver, over two minutes of driver time at the default 5 s poll (``advance_clock``, so the run takes
seconds): once with ``poll_slow_interval`` 0 (everything every poll) and once with the default 30 s;
and multiplies them by those costs: the driver's time per GPU and poll, low and high.  The cards
include GPUs with 1, 2 and 8 busy processes each (per-process utilization is read only where a GPU
has processes) and a busy L40S, whose 32-bit PCIe counters move more than half their range in a poll.
The calls do not depend on this machine: the figures are exact counts, not timings.

    .venv/bin/python benchmarks/poll_calls.py

Writes benchmarks/results/poll_calls.md and poll_calls.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pynvml  # noqa: E402

from gpu_exporter.sources.nvml import NvmlBackend  # noqa: E402
from gpu_exporter.sources.poller import Poller  # noqa: E402
from tests.fakenvml import Scenario, load_in_process  # noqa: E402
from tests.fakenvml.presets import GIB, h100_sxm, l40s, preset  # noqa: E402
from tests.fakenvml.runtime import advance_clock, call_count, driver_monotonic, driver_wall_clock  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
POLL_S, RUN_S, PROFILING_S = 5.0, 120.0, 10.0  # the daemon's defaults, two minutes of them
# What the real driver charges per call, where benchmarks/real_gpu measured it on an H200 (us of CPU).
FAMILIES = {
    "nvmlDeviceGetFieldValues": "FieldValues",
    "nvmlDeviceGetNvLinkState": "NvLinkState",
    "nvmlDeviceGetTotalEccErrors": "TotalEccErrors",
    "nvmlDeviceGetRemappedRows": "RemappedRows",
    "nvmlDeviceGetPcieThroughput": "PcieThroughput",
    "nvmlGpmSampleGet": "GpmSampleGet",
    "nvmlGpmMigSampleGet": "GpmMigSampleGet",
    "nvmlGpmMetricsGet": "GpmMetricsGet",
    "nvmlDeviceGetProcessUtilization": "ProcessUtilization",
    "nvmlDeviceGetGpuFabricInfoV": "GpuFabricInfoV",
}


# The driver's time per call on an H200 (driver 580), low and high, in us: docs/performance.md and
# benchmarks/README.md ("Limitations").  ProcessUtilization is per call of the bindings (its sizing
# call and the read, as benchmarks/real_gpu/call_cost.py times it); any other call, a simple getter, 2 us.
COST_US = {
    "FieldValues": (234.0, 270.0),
    "PcieThroughput": (690.0, 690.0),
    "GpmSampleGet": (48.0, 48.0),
    "GpmMigSampleGet": (48.0, 48.0),
    "GpmMetricsGet": (1200.0, 1200.0),
    "ProcessUtilization": (1800.0, 2500.0),
}
SIMPLE_US = 2.0


def h100s(path: Path, branch: int, processes: int = 0) -> Scenario:
    s = Scenario(path)
    s.driver(branch)
    for i in range(8):
        g = h100_sxm(s.add_gpu(), "calls", i, util=90, mem_used=40 * GIB, power_mw=500_000)
        for k in range(processes):  # busy ones: each has a per-process sample at every read
            g.add_process(10_000 + 100 * i + k, 4 * GIB, name=f"worker{k}", sm=60 // processes + 1, mem=10)
    return s


def busy_l40s(path: Path) -> Scenario:
    """8 L40S moving 10 GB/s out and 5 GB/s in: their 32-bit counters pass 2^31 in every 5 s poll."""
    s = Scenario(path)
    s.driver(580)
    for i in range(8):
        g = l40s(s.add_gpu(), "calls", i, util=90)
        g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=10_000_000 // 1024 * 1000,
               rx_kbps=5_000_000 // 1024 * 1000, replay=0, counter_bits=32)  # fmt: skip
    return s


def mig(path: Path) -> Scenario:
    s = preset("h100-8x-mig", path)
    s.driver(580)
    return s


CASES: dict[str, Callable[[Path], Scenario]] = {
    "8x H100 SXM, R580": lambda p: h100s(p, 580),
    "8x H100 SXM, R580, 1 process per GPU": lambda p: h100s(p, 580, 1),
    "8x H100 SXM, R580, 2 processes per GPU": lambda p: h100s(p, 580, 2),
    "8x H100 SXM, R580, 8 processes per GPU": lambda p: h100s(p, 580, 8),
    "8x H100 SXM, R535 (no PCIe byte counters)": lambda p: h100s(p, 535),
    "8x H100 SXM in MIG mode (7 instances), R580": mig,
    "8x L40S, R580, PCIe busy (32-bit counters)": busy_l40s,
}


class Reads:
    """Counts the bindings' nvmlDeviceGetProcessUtilization calls (each one or two C calls: the sizing
    call, and the read where there are samples), which the driver's cost was measured per."""

    def __init__(self) -> None:
        self.n = 0
        self._inner = pynvml.nvmlDeviceGetProcessUtilization
        pynvml.nvmlDeviceGetProcessUtilization = self

    def __call__(self, handle: object, since: int) -> object:
        self.n += 1
        return self._inner(handle, since)


def driver_ms(per: dict[str, float], total: float) -> tuple[float, float]:
    """The driver's time per GPU and poll at the H200's per-call costs: (low, high) in ms."""
    costly = sum(per.get(f, 0.0) for f in COST_US if f != "ProcessUtilization") + per.get("ProcessUtilization C", 0.0)
    simple = max(0.0, total - costly) * SIMPLE_US
    low = sum(per.get(f, 0.0) * c[0] for f, c in COST_US.items()) + simple
    high = sum(per.get(f, 0.0) * c[1] for f, c in COST_US.items()) + simple
    return low / 1000, high / 1000


def count(case: Callable[[Path], Scenario], slow_s: float, workdir: Path, reads: Reads) -> tuple[dict[str, float], int]:
    """Calls per poll per GPU over RUN_S of driver time, by family, after a first poll (discovery).
    ProcessUtilization counts the bindings' calls; "ProcessUtilization C" the C calls under them."""
    s = case(workdir / f"{len(os.listdir(workdir))}.scn")
    s.write()
    os.environ["FAKE_NVML_SCENARIO"] = str(s.path)
    backend = NvmlBackend(lambda f, e: None, profiling_interval=PROFILING_S, monotonic=driver_monotonic,
                          wall=driver_wall_clock, slow_interval=slow_s, poll_interval=POLL_S)  # fmt: skip
    poller = Poller(backend, errors=lambda f, e: None, monotonic=driver_monotonic)
    try:
        poller.poll()
        before = {fn: call_count(fn) for fn in FAMILIES}
        total0, reads0 = call_count("nvml"), reads.n
        polls = int(RUN_S / POLL_S)
        for _ in range(polls):
            advance_clock(POLL_S)
            poller.poll()
        gpus = len(s.gpus)
        per = {FAMILIES[fn]: (call_count(fn) - n) / polls / gpus for fn, n in before.items()}
        per["ProcessUtilization C"] = per["ProcessUtilization"]
        per["ProcessUtilization"] = (reads.n - reads0) / polls / gpus
        return per, round((call_count("nvml") - total0) / polls / gpus)
    finally:
        poller.close()


def main() -> int:
    load_in_process()
    reads = Reads()
    out: dict[str, object] = {}
    columns = [*FAMILIES.values(), "ProcessUtilization C"]
    rows = ["| card, driver | cadence | " + " | ".join(columns) + " | all calls | driver ms (H200 costs) |",
            "|---|---|" + "---|" * (len(columns) + 2)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in CASES.items():
            for slow_s, label in ((0.0, "every poll"), (30.0, "slow 30 s (default)")):
                per, total = count(case, slow_s, Path(tmp), reads)
                low, high = driver_ms(per, total)
                out[f"{name} / {label}"] = {"per_gpu_per_poll": per, "all_calls": total,
                                            "driver_ms_per_gpu_poll": [round(low, 3), round(high, 3)]}  # fmt: skip
                rows.append(f"| {name} | {label} | " + " | ".join(f"{per[c]:.2f}" for c in columns)
                            + f" | {total} | {low:.2f}-{high:.2f} |")  # fmt: skip
    text = (
        "# NVML calls per poll per GPU\n\n"
        "Written by `benchmarks/poll_calls.py`: calls a poll makes through the real bindings on the fake "
        f"driver, averaged over {RUN_S:g} s of driver time at a {POLL_S:g} s poll (profiling interval "
        f"{PROFILING_S:g} s), after the first poll. Exact counts, not timings. ProcessUtilization counts "
        "the bindings' calls, ProcessUtilization C the C calls under them (a sizing call, and the read "
        "where there are samples). Driver ms: the calls times an H200's per-call costs (FieldValues "
        "234-270 us, PcieThroughput 690 us, GpmSampleGet 48 us, GpmMetricsGet 1.2 ms, ProcessUtilization "
        "1.8-2.5 ms per call of the bindings, any other call 2 us), per GPU and poll, low-high.\n\n"
        + "\n".join(rows)
        + "\n"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "poll_calls.md").write_text(text)
    (RESULTS / "poll_calls.json").write_text(json.dumps(out, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
