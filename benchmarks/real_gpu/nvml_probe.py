"""Low-level checks of the real driver that the fake NVML cannot answer, printed as one JSON object.

Run on a machine with an NVIDIA GPU: ``python3 benchmarks/real_gpu/nvml_probe.py [--quick]``.
It answers: does GPM work here (and without root), does the driver write past ``numMetrics`` in
nvmlGpmMetricsGet_t (which decides whether the bindings' short arrays are safe), how long the GPM
and per-process calls take, and how nvmlDeviceGetProcessUtilization answers when nothing ran.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import statistics
import sys
import time
from typing import Any

import pynvml as N


def timed(fn: Any, n: int) -> float:
    """Median seconds of ``fn()`` over ``n`` calls."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    quick = "--quick" in sys.argv
    out: dict[str, Any] = {"uid": os.getuid(), "nvidia_ml_py": getattr(N, "__version__", None)}
    N.nvmlInit()
    out["driver"] = N.nvmlSystemGetDriverVersion()
    h = N.nvmlDeviceGetHandleByIndex(0)
    out["name"] = N.nvmlDeviceGetName(h)
    out["NVML_GPM_METRIC_MAX (bindings)"] = N.NVML_GPM_METRIC_MAX
    try:
        out["gpm_supported"] = N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
    except N.NVMLError as e:
        out["gpm_supported"] = f"error: {e}"
    try:
        a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
        N.nvmlGpmSampleGet(h, a)
        time.sleep(0.2)
        N.nvmlGpmSampleGet(h, b)
        # Canary: fill entries past numMetrics with a marker and see whether the driver touches them.
        slots = 1024

        class Big(ctypes.Structure):
            _fields_ = [
                ("version", ctypes.c_uint),
                ("numMetrics", ctypes.c_uint),
                ("sample1", N.c_nvmlGpmSample_t),
                ("sample2", N.c_nvmlGpmSample_t),
                ("metrics", N.c_nvmlGpmMetric_t * slots),
            ]

        mg = Big()
        mg.version = N.NVML_GPM_METRICS_GET_VERSION
        ids = [1, 2, 3, 5, 10, 11, 12, 13]
        mg.numMetrics = len(ids)
        mg.sample1, mg.sample2 = a, b
        for i, m in enumerate(ids):
            mg.metrics[i].metricId = m
        for i in range(len(ids), slots):
            mg.metrics[i].metricId = 0xCAFE
            mg.metrics[i].value = -7.0
        N.nvmlGpmMetricsGet(mg)
        touched = [i for i in range(len(ids), slots) if mg.metrics[i].metricId != 0xCAFE or mg.metrics[i].value != -7.0]
        out["gpm_metrics_idle"] = {
            m: (
                mg.metrics[i].nvmlReturn,
                round(mg.metrics[i].value, 3),
                (mg.metrics[i].metricInfo.shortName or b"").decode(),
            )
            for i, m in enumerate(ids)
        }
        out["gpm_entries_written_past_numMetrics"] = len(touched)
        out["gpm_first_touched_past"] = touched[:5]
        # Samples closer than 100 ms: what does the driver say?
        N.nvmlGpmSampleGet(h, a)
        N.nvmlGpmSampleGet(h, b)
        try:
            N.nvmlGpmMetricsGet(mg)
            out["gpm_pair_under_100ms"] = {
                m: (mg.metrics[i].nvmlReturn, mg.metrics[i].value) for i, m in enumerate(ids)
            }
        except N.NVMLError as e:
            out["gpm_pair_under_100ms"] = f"error: {e}"
        if not quick:
            out["gpm_sample_get_s"] = timed(lambda: N.nvmlGpmSampleGet(h, a), 200)
            time.sleep(0.15)
            N.nvmlGpmSampleGet(h, b)
            try:
                out["gpm_metrics_get_s"] = timed(lambda: N.nvmlGpmMetricsGet(mg), 200)
            except N.NVMLError as e:
                out["gpm_metrics_get_s"] = f"error: {e}"
        # Two samples of the same buffer vs a wrong device: MIG handle absent here; swap order.
        mg.sample1, mg.sample2 = b, a
        try:
            N.nvmlGpmMetricsGet(mg)
            out["gpm_reversed_pair"] = {
                m: (mg.metrics[i].nvmlReturn, round(mg.metrics[i].value, 3)) for i, m in enumerate(ids)
            }
        except N.NVMLError as e:
            out["gpm_reversed_pair"] = f"error: {e}"
        N.nvmlGpmSampleFree(a)
        N.nvmlGpmSampleFree(b)
    except N.NVMLError as e:
        out["gpm_error"] = str(e)
    try:
        out["mig_mode"] = N.nvmlDeviceGetMigMode(h)
    except N.NVMLError as e:
        out["mig_mode"] = f"error: {e}"
    for last in (0, int(time.time() * 1e6)):
        try:
            samples = N.nvmlDeviceGetProcessUtilization(h, last)
            out[f"process_util_since_{'0' if not last else 'now'}"] = [
                (s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil) for s in samples
            ]
        except N.NVMLError as e:
            out[f"process_util_since_{'0' if not last else 'now'}"] = f"error: {e} ({e.value})"
    if not quick:

        def proc_util() -> None:
            with contextlib.suppress(N.NVMLError):
                N.nvmlDeviceGetProcessUtilization(h, 0)

        out["process_util_s"] = timed(proc_util, 100)
        out["utilization_rates_s"] = timed(lambda: N.nvmlDeviceGetUtilizationRates(h), 200)
        fields = [(82, 0), (197, 0), (198, 0)]
        out["field_values_3_s"] = timed(lambda: N.nvmlDeviceGetFieldValues(h, fields), 200)
    for fn in ("nvmlDeviceGetNumFans", "nvmlDeviceGetFanSpeed"):
        try:
            out[fn] = getattr(N, fn)(h)
        except N.NVMLError as e:
            out[fn] = f"error: {e}"
    try:
        out["nvlink0"] = N.nvmlDeviceGetNvLinkState(h, 0)
    except N.NVMLError as e:
        out["nvlink0"] = f"error: {e}"
    N.nvmlShutdown()
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
