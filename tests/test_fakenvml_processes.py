"""Running processes: the two-call protocol, struct layouts by version, and process names."""

from __future__ import annotations

import ctypes
import subprocess
from typing import Any

import pytest

from tests.fakenvml import Err, Scenario

GIB = 1024**3


def node(scenario: Scenario, live_pid: int) -> None:
    g = scenario.add_gpu().identity("NVIDIA L40S", "GPU-00000000-0000-0000-0000-000000000001")
    g.add_process(live_pid, 3 * GIB)  # named from /proc
    g.add_process(999_999_001, 2 * GIB, name="trainer")  # not in /proc: only NVML knows its name
    g.add_process(999_999_002, None)  # memory not available (WDDM, or no permission)
    g.add_process(999_999_003, 1 * GIB, name=Err("NO_PERMISSION"))
    g.add_process(999_999_004, 256 * 1024**2, kind="graphics", name="/usr/lib/xorg/Xorg")
    scenario.add_gpu().identity("idle", "GPU-00000000-0000-0000-0000-000000000002")
    scenario.write()


def test_compute_and_graphics_processes_through_pynvml(
    scenario: Scenario, nvml: Any, live_process: subprocess.Popen[bytes]
) -> None:
    N = nvml
    node(scenario, live_process.pid)
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    compute = N.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in compute] == [
        (live_process.pid, 3 * GIB),
        (999_999_001, 2 * GIB),
        (999_999_002, None),  # pynvml maps NVML_VALUE_NOT_AVAILABLE to None
        (999_999_003, 1 * GIB),
    ]
    assert all(p.gpuInstanceId == 0xFFFFFFFF and p.computeInstanceId == 0xFFFFFFFF for p in compute)
    graphics = N.nvmlDeviceGetGraphicsRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in graphics] == [(999_999_004, 256 * 1024**2)]
    assert N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(1)) == []


def test_process_names(scenario: Scenario, nvml: Any, live_process: subprocess.Popen[bytes]) -> None:
    N = nvml
    node(scenario, live_process.pid)
    N.nvmlInit()
    assert "python" in N.nvmlSystemGetProcessName(live_process.pid)
    assert N.nvmlSystemGetProcessName(999_999_001) == "trainer"
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlSystemGetProcessName(999_999_002)
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlSystemGetProcessName(999_999_003)


def _raw(N: Any, name: str, h: Any, count: int, struct: type[ctypes.Structure] | None) -> tuple[int, int, Any]:
    fn = N._nvmlGetFunctionPointer(name)
    c_count = ctypes.c_uint(count)
    buf = (struct * max(count, 1))() if struct is not None else None
    ret = fn(h, ctypes.byref(c_count), buf)
    return ret, c_count.value, buf


def test_two_call_protocol(scenario: Scenario, nvml: Any, live_process: subprocess.Popen[bytes]) -> None:
    N = nvml
    node(scenario, live_process.pid)
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    # First call: no buffer -> INSUFFICIENT_SIZE and the count needed.
    ret, count, _ = _raw(N, "nvmlDeviceGetComputeRunningProcesses_v3", h, 0, None)
    assert (ret, count) == (N.NVML_ERROR_INSUFFICIENT_SIZE, 4)
    # A buffer too small is refused the same way, and nothing is written past it.
    ret, count, _ = _raw(N, "nvmlDeviceGetComputeRunningProcesses_v3", h, 2, N.c_nvmlProcessInfo_v3_t)
    assert (ret, count) == (N.NVML_ERROR_INSUFFICIENT_SIZE, 4)
    ret, count, buf = _raw(N, "nvmlDeviceGetComputeRunningProcesses_v3", h, 8, N.c_nvmlProcessInfo_v3_t)
    assert (ret, count) == (N.NVML_SUCCESS, 4)
    assert buf[0].pid == live_process.pid and buf[1].usedGpuMemory == 2 * GIB
    # No processes at all: SUCCESS with a zero count, even without a buffer.
    ret, count, _ = _raw(N, "nvmlDeviceGetComputeRunningProcesses_v3", N.nvmlDeviceGetHandleByIndex(1), 0, None)
    assert (ret, count) == (N.NVML_SUCCESS, 0)


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def test_struct_layout_follows_the_versioned_symbol(
    scenario: Scenario, nvml: Any, live_process: subprocess.Popen[bytes]
) -> None:
    """The unversioned symbol fills 16-byte v1 entries; _v2/_v3 fill 24-byte ones with instance ids.

    Reading one layout with the other struct gives garbage, which is the bug this catches.
    """
    N = nvml
    node(scenario, live_process.pid)
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert ctypes.sizeof(ProcessInfoV1) == 16 and ctypes.sizeof(N.c_nvmlProcessInfo_v2_t) == 24
    ret, _, v1 = _raw(N, "nvmlDeviceGetComputeRunningProcesses", h, 4, ProcessInfoV1)
    assert ret == N.NVML_SUCCESS
    assert [(e.pid, e.usedGpuMemory) for e in v1][:2] == [(live_process.pid, 3 * GIB), (999_999_001, 2 * GIB)]
    for name in ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3"):
        ret, _, v2 = _raw(N, name, h, 4, N.c_nvmlProcessInfo_v2_t)
        assert ret == N.NVML_SUCCESS
        assert [(e.pid, e.usedGpuMemory, e.gpuInstanceId) for e in v2][:2] == [
            (live_process.pid, 3 * GIB, 0xFFFFFFFF),
            (999_999_001, 2 * GIB, 0xFFFFFFFF),
        ]
    # v1 entries read as v2 are misaligned: the second pid is not where a v2 reader looks.
    ret, _, wrong = _raw(N, "nvmlDeviceGetComputeRunningProcesses", h, 4, N.c_nvmlProcessInfo_v2_t)
    assert wrong[1].pid != 999_999_001


def test_mig_processes_are_split_by_instance(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = scenario.add_gpu().identity("NVIDIA A100-SXM4-80GB", "GPU-00000000-0000-0000-0000-00000000000a")
    g.mig_mode(True)
    g.add_mig("MIG 3g.40gb", "MIG-00000000-0000-0000-0000-000000000001", 1, 0)
    g.add_mig("MIG 1g.10gb", "MIG-00000000-0000-0000-0000-000000000002", 9, 0)
    g.add_process(501, 10 * GIB, gpu_instance_id=1, compute_instance_id=0)
    g.add_process(502, 11 * GIB, gpu_instance_id=1, compute_instance_id=0)
    g.add_process(503, 2 * GIB, gpu_instance_id=9, compute_instance_id=0)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert sorted(p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h)) == [501, 502, 503]
    m0 = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    m1 = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    assert [(p.pid, p.gpuInstanceId) for p in N.nvmlDeviceGetComputeRunningProcesses(m0)] == [(501, 1), (502, 1)]
    assert [(p.pid, p.gpuInstanceId) for p in N.nvmlDeviceGetComputeRunningProcesses(m1)] == [(503, 9)]


def test_many_processes(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = scenario.add_gpu().identity("big", "GPU-00000000-0000-0000-0000-0000000000ff")
    for i in range(512):
        g.add_process(100_000 + i, i * 1024**2, name=f"worker-{i}")
    scenario.write()
    N.nvmlInit()
    procs = N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(0))
    assert len(procs) == 512
    assert procs[511].pid == 100_511 and procs[511].usedGpuMemory == 511 * 1024**2
