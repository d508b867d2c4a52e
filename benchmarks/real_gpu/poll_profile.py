"""Where a poll's CPU goes on a real GPU: each NVML query the backend makes, timed by this thread's
CPU clock, plus the XID event thread's CPU while idle and nvmlDeviceGetFieldValues by field count.

``python3 benchmarks/real_gpu/poll_profile.py [polls]``: prints one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import pynvml

from gpu_exporter.sources import nvml
from gpu_exporter.sources.nvml import backend as nvml_backend
from gpu_exporter.sources.nvml import reads
from gpu_exporter.sources.nvml.device import Device
from gpu_exporter.sources.nvml.pcie import PcieCounters
from gpu_exporter.sources.nvml.processes import ProcessReader
from gpu_exporter.sources.nvml.profiling import GpmReader
from gpu_exporter.sources.poller import Poller


def thread_cpu_s(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    polls = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    per_call: dict[str, list[float]] = defaultdict(list)
    real_call = Device.call

    def timed_call(self: Any, what: str, fn: Any, *args: Any) -> Any:
        t = time.thread_time()
        try:
            return real_call(self, what, fn, *args)
        finally:
            per_call[what.split("(", 1)[0]].append(time.thread_time() - t)

    Device.call = timed_call  # type: ignore[method-assign]
    # The larger steps of a poll, each timed whole (their NVML calls are also timed one by one above).
    steps = ((reads, "read_fields"), (reads, "read_migs"), (ProcessReader, "processes"),
             (ProcessReader, "utilization"), (GpmReader, "gpu_activity"), (GpmReader, "mig_activity"),
             (nvml_backend, "_pcie_sample"), (PcieCounters, "poll"))  # fmt: skip
    for owner, name in steps:
        real = getattr(owner, name)
        label = f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"

        def wrapped(*args: Any, _real: Any = real, _name: str = label) -> Any:
            t = time.thread_time()
            try:
                return _real(*args)
            finally:
                per_call[_name].append(time.thread_time() - t)

        setattr(owner, name, wrapped)
    backend = nvml.NvmlBackend(lambda f, e: None, profiling_interval=0.1)
    poller = Poller(backend, errors=lambda f, e: None)
    poller.poll()
    per_call.clear()
    cpu, wall = [], []
    for _ in range(polls):
        time.sleep(0.5)
        c, w = time.process_time(), time.perf_counter()
        poller.poll()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    xid = next((t for t in threading.enumerate() if t.name == "xid-events"), None)
    xid_cpu = None
    if xid is not None and xid.native_id is not None:
        before = thread_cpu_s(xid.native_id)
        time.sleep(5)
        xid_cpu = (thread_cpu_s(xid.native_id) - before) / 5
    out: dict[str, Any] = {
        "poll_cpu_ms_median": round(statistics.median(cpu) * 1e3, 2),
        "poll_wall_ms_median": round(statistics.median(wall) * 1e3, 2),
        "xid_thread_cpu_s_per_s": xid_cpu,
        "per_call_cpu_us_median_and_calls_per_poll": {
            k: (round(statistics.median(v) * 1e6, 1), round(len(v) / polls, 1))
            for k, v in sorted(per_call.items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1]))
        },
    }
    poller.close()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for n in (1, 3, 8, 16, 40):
        ids = [(82, 0), (197, 0), (198, 0)] + [(138 + (i % 2), i // 2) for i in range(40)]
        fields = ids[:n]
        times = []
        for _ in range(100):
            t = time.thread_time()
            pynvml.nvmlDeviceGetFieldValues(h, fields)
            times.append(time.thread_time() - t)
        out[f"nvmlDeviceGetFieldValues({n}) cpu_us"] = round(statistics.median(times) * 1e6, 1)
    pynvml.nvmlShutdown()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
