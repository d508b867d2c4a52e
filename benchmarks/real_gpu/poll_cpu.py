"""The exporter's CPU per poll on a real GPU, with GPM and per-process utilization, and without.

``python3 benchmarks/real_gpu/poll_cpu.py [polls]``: the real poller and NVML backend in this
process; "without" drops GPM and per-process utilization by telling the backend the GPU has neither
(the same effect as a card before Hopper). Polls alternate between the two, 0.5 s apart.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time

from gpu_exporter.snapshot import GpuReading, GpuStatic
from gpu_exporter.sources import nvml
from gpu_exporter.sources.poller import Poller


def main() -> None:
    polls = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    backend = nvml.NvmlBackend(lambda f, e: None, profiling_interval=0.1)  # due at every poll: the worst case
    poller = Poller(backend, errors=lambda f, e: None)
    poller.poll()
    real_read_gpu = backend.read_gpu

    readers = backend._readers
    assert readers.processes is not None
    real_process_utilization = readers.processes.utilization

    def without(static: GpuStatic) -> GpuReading:
        assert readers.processes is not None
        readers.processes.utilization = lambda dev, processes: processes  # type: ignore[method-assign]
        try:
            return real_read_gpu(dataclasses.replace(static, gpm_supported=False))
        finally:
            readers.processes.utilization = real_process_utilization  # type: ignore[method-assign]

    cpu: dict[str, list[float]] = {"with": [], "without": []}
    wall: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(polls):
        for arm in ("with", "without"):
            backend.read_gpu = real_read_gpu if arm == "with" else without  # type: ignore[method-assign]
            time.sleep(0.5)
            c, w = time.process_time(), time.perf_counter()
            poller.poll()
            cpu[arm].append(time.process_time() - c)
            wall[arm].append(time.perf_counter() - w)
    poller.close()
    print(json.dumps({arm: {"cpu_ms": round(statistics.median(cpu[arm]) * 1e3, 2),
                            "wall_ms": round(statistics.median(wall[arm]) * 1e3, 2)} for arm in cpu}))  # fmt: skip


if __name__ == "__main__":
    main()
