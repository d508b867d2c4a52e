"""CPU and wall time of the NVML calls GPM and per-process utilization add, on a real GPU.

``python3 benchmarks/real_gpu/call_cost.py``: prints one JSON object. For each call, the median
over repeated calls of wall time (perf_counter) and of this thread's CPU time (thread_time), so a
wait in the kernel driver shows as wall without CPU. nvmlGpmMetricsGet is timed with 1, 2, 4 and 8
metrics, to see whether asking for fewer saves anything.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from typing import Any

import pynvml as N


def cost(fn: Any, n: int) -> dict[str, float]:
    walls, cpus = [], []
    for _ in range(n):
        c, w = time.thread_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.thread_time() - c)
    return {"wall_us": round(statistics.median(walls) * 1e6, 1), "cpu_us": round(statistics.median(cpus) * 1e6, 1)}


def main() -> None:
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    out: dict[str, Any] = {"driver": N.nvmlSystemGetDriverVersion(), "name": N.nvmlDeviceGetName(h)}
    a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    out["nvmlGpmSampleGet"] = cost(lambda: N.nvmlGpmSampleGet(h, a), 200)
    time.sleep(0.2)
    N.nvmlGpmSampleGet(h, b)
    ids = [1, 2, 3, 5, 10, 11, 12, 13]
    for k in (1, 2, 4, 8):
        mg = N.c_nvmlGpmMetricsGet_t()
        mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, k, a, b
        for i in range(k):
            mg.metrics[i].metricId = ids[i]
        out[f"nvmlGpmMetricsGet({k})"] = cost(lambda mg=mg: N.nvmlGpmMetricsGet(mg), 100)
    # A pair one second apart, as at a 1 s poll.
    N.nvmlGpmSampleGet(h, a)
    time.sleep(1.0)
    N.nvmlGpmSampleGet(h, b)
    mg.numMetrics = 8
    out["nvmlGpmMetricsGet(8), 1 s pair"] = cost(lambda: N.nvmlGpmMetricsGet(mg), 100)

    def proc(ts: int) -> None:
        with contextlib.suppress(N.NVMLError):
            N.nvmlDeviceGetProcessUtilization(h, ts)

    out["nvmlDeviceGetProcessUtilization(0)"] = cost(lambda: proc(0), 50)
    out["nvmlDeviceGetProcessUtilization(now)"] = cost(lambda: proc(int(time.time() * 1e6)), 50)
    out["nvmlDeviceGetUtilizationRates"] = cost(lambda: N.nvmlDeviceGetUtilizationRates(h), 200)
    out["nvmlDeviceGetMemoryInfo"] = cost(lambda: N.nvmlDeviceGetMemoryInfo(h), 200)
    out["nvmlDeviceGetPowerUsage"] = cost(lambda: N.nvmlDeviceGetPowerUsage(h), 200)
    out["nvmlDeviceGetTemperature"] = cost(lambda: N.nvmlDeviceGetTemperature(h, 0), 200)
    out["nvmlDeviceGetClockInfo"] = cost(lambda: N.nvmlDeviceGetClockInfo(h, 0), 200)
    fields = [(82, 0), (197, 0), (198, 0), (155, 0)]
    out["nvmlDeviceGetFieldValues(4)"] = cost(lambda: N.nvmlDeviceGetFieldValues(h, fields), 200)
    out["nvmlDeviceGetPcieThroughput"] = cost(lambda: N.nvmlDeviceGetPcieThroughput(h, 0), 20)
    out["nvmlDeviceGetComputeRunningProcesses"] = cost(lambda: N.nvmlDeviceGetComputeRunningProcesses(h), 200)
    N.nvmlGpmSampleFree(a)
    N.nvmlGpmSampleFree(b)
    N.nvmlShutdown()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
