"""NVML calls per poll per GPU, by card and driver, with the daemon's cadences (issue 36, item 7).

The real driver's cost is per call (benchmarks/real_gpu: on an H200, FieldValues 234-270 us for four
fields, a GPM pair 1.2 ms, ProcessUtilization 1.8-2.5 ms, PcieThroughput 0.69 ms of CPU plus 20 ms of
wait per direction).  This counts the calls a poll makes, through the real bindings on the fake
driver, over two minutes of driver time at the default 5 s poll (``advance_clock``, so the run takes
seconds): once with ``poll_slow_interval`` 0 (everything every poll, as before) and once with the
default 30 s.  The calls do not depend on this machine: the figures are exact counts, not timings.

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

from gpu_exporter.sources.nvml import NvmlBackend  # noqa: E402
from gpu_exporter.sources.poller import Poller  # noqa: E402
from tests.fakenvml import Scenario, load_in_process  # noqa: E402
from tests.fakenvml.presets import GIB, h100_sxm, preset  # noqa: E402
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


def h100s(path: Path, branch: int) -> Scenario:
    s = Scenario(path)
    s.driver(branch)
    for i in range(8):
        h100_sxm(s.add_gpu(), "calls", i, util=90, mem_used=40 * GIB, power_mw=500_000)
    return s


def mig(path: Path) -> Scenario:
    s = preset("h100-8x-mig", path)
    s.driver(580)
    return s


CASES: dict[str, Callable[[Path], Scenario]] = {
    "8x H100 SXM, R580": lambda p: h100s(p, 580),
    "8x H100 SXM, R535 (no PCIe byte counters)": lambda p: h100s(p, 535),
    "8x H100 SXM in MIG mode (7 instances), R580": mig,
}


def count(case: Callable[[Path], Scenario], slow_s: float, workdir: Path) -> tuple[dict[str, float], int]:
    """Calls per poll per GPU over RUN_S of driver time, by family, after a first poll (discovery)."""
    s = case(workdir / f"{len(os.listdir(workdir))}.scn")
    s.write()
    os.environ["FAKE_NVML_SCENARIO"] = str(s.path)
    backend = NvmlBackend(lambda f, e: None, profiling_interval=PROFILING_S, monotonic=driver_monotonic,
                          wall=driver_wall_clock, slow_interval=slow_s)  # fmt: skip
    poller = Poller(backend, errors=lambda f, e: None, monotonic=driver_monotonic)
    try:
        poller.poll()
        before = {fn: call_count(fn) for fn in FAMILIES}
        total0 = call_count("nvml")
        polls = int(RUN_S / POLL_S)
        for _ in range(polls):
            advance_clock(POLL_S)
            poller.poll()
        gpus = len(s.gpus)
        per = {FAMILIES[fn]: (call_count(fn) - n) / polls / gpus for fn, n in before.items()}
        return per, round((call_count("nvml") - total0) / polls / gpus)
    finally:
        poller.close()


def main() -> int:
    load_in_process()
    out: dict[str, object] = {}
    rows = ["| card, driver | cadence | " + " | ".join(FAMILIES.values()) + " | all calls |",
            "|---|---|" + "---|" * (len(FAMILIES) + 1)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in CASES.items():
            for slow_s, label in ((0.0, "every poll"), (30.0, "slow 30 s (default)")):
                per, total = count(case, slow_s, Path(tmp))
                out[f"{name} / {label}"] = {"per_gpu_per_poll": per, "all_calls": total}
                rows.append(f"| {name} | {label} | " + " | ".join(f"{v:.2f}" for v in per.values()) + f" | {total} |")
    text = (
        "# NVML calls per poll per GPU\n\n"
        "Written by `benchmarks/poll_calls.py`: calls a poll makes through the real bindings on the fake "
        f"driver, averaged over {RUN_S:g} s of driver time at a {POLL_S:g} s poll (profiling interval "
        f"{PROFILING_S:g} s), after the first poll. Exact counts, not timings.\n\n" + "\n".join(rows) + "\n"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "poll_calls.md").write_text(text)
    (RESULTS / "poll_calls.json").write_text(json.dumps(out, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
