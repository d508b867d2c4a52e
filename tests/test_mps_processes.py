"""Clients of an MPS server: listed by nvmlDeviceGetMPSComputeRunningProcesses only (the compute
list shows the server, nvidia-cuda-mps-server), read beside the compute and graphics lists, each
process once, and a driver or card without the call costs the other lists nothing."""

from __future__ import annotations

import ctypes
import json
from typing import Any

import pytest

from tests.exporter_helpers import make_poller, samples_of, value
from tests.fakenvml import Err, Scenario, build_library, run_python
from tests.fakenvml.presets import GIB, MIB, h100_sxm, mig_uuid
from tests.fakenvml.runtime import call_count as calls

SERVER, CLIENT_A, CLIENT_B, XORG = 999_990_001, 999_990_002, 999_990_003, 999_990_004


def mps_node(scenario: Scenario) -> Any:
    """One H100 with an MPS server and two clients, and Xorg as a graphics process."""
    g = h100_sxm(scenario.add_gpu(), "mps", 0, util=90, mem_used=40 * GIB, power_mw=500_000)
    g.add_process(SERVER, 30 * MIB, name="nvidia-cuda-mps-server")
    g.add_process(CLIENT_A, 12 * GIB, kind="mps", name="trainer")
    g.add_process(CLIENT_B, 20 * GIB, kind="mps", name="inference")
    g.add_process(XORG, 64 * MIB, kind="graphics", name="Xorg")
    return g


def process_errors(errors: Any) -> dict[tuple[str, str], int]:
    return {k: n for k, n in errors.counts.items() if "RunningProcesses" in k[0]}


# -- the fake driver, through nvidia-ml-py --------------------------------------------------------------
def test_the_clients_are_in_the_mps_list_and_the_server_in_the_compute_list(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    mps_node(scenario)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert [(p.pid, p.usedGpuMemory) for p in N.nvmlDeviceGetComputeRunningProcesses(h)] == [(SERVER, 30 * MIB)]
    mps = N.nvmlDeviceGetMPSComputeRunningProcesses_v3(h)
    assert [(p.pid, p.usedGpuMemory) for p in mps] == [(CLIENT_A, 12 * GIB), (CLIENT_B, 20 * GIB)]
    assert [p.pid for p in N.nvmlDeviceGetGraphicsRunningProcesses(h)] == [XORG]
    assert N.nvmlSystemGetProcessName(CLIENT_A) == "trainer"


def test_every_version_nvml_h_declares_answers_in_its_own_layout(scenario: Scenario, nvml: Any) -> None:
    """nvml.h declares the unversioned symbol (v1 entries, 16 bytes), _v2 and _v3 (24 bytes, with
    instance ids); each is counted under its own name."""
    N = nvml
    mps_node(scenario)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)

    class V1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    name = "nvmlDeviceGetMPSComputeRunningProcesses"
    before = {v: calls(name + v) for v in ("", "_v2", "_v3")}  # counted since the library was loaded

    for version, struct in (("", V1), ("_v2", N.c_nvmlProcessInfo_v2_t), ("_v3", N.c_nvmlProcessInfo_v3_t)):
        fn = N._nvmlGetFunctionPointer(name + version)
        count = ctypes.c_uint(0)
        assert fn(h, ctypes.byref(count), None) == N.NVML_ERROR_INSUFFICIENT_SIZE and count.value == 2
        buf = (struct * 4)()
        count = ctypes.c_uint(4)
        assert fn(h, ctypes.byref(count), buf) == N.NVML_SUCCESS and count.value == 2
        assert [(e.pid, e.usedGpuMemory) for e in buf[:2]] == [(CLIENT_A, 12 * GIB), (CLIENT_B, 20 * GIB)]
        if struct is not V1:
            assert buf[0].gpuInstanceId == 0xFFFFFFFF  # no MIG
    made = {v: calls(name + v) - n for v, n in before.items()}
    assert made == {"": 6, "_v2": 2, "_v3": 2}  # a prefix counts every version: the unversioned one's 2 besides


def test_mig_devices_list_their_own_clients(scenario: Scenario, nvml: Any) -> None:
    """nvml.h: per-instance information through the MIG device handles."""
    N = nvml
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-1").memory(80 * GIB, 30 * GIB).mig_mode(True)
    g.add_mig("NVIDIA H100 80GB HBM3 MIG 3g.40gb", mig_uuid("mps", 0, 0), 1)
    g.add_mig("NVIDIA H100 80GB HBM3 MIG 3g.40gb", mig_uuid("mps", 0, 1), 2)
    g.add_process(SERVER, 30 * MIB, gpu_instance_id=2, compute_instance_id=0)
    g.add_process(CLIENT_A, 5 * GIB, kind="mps", gpu_instance_id=2, compute_instance_id=0)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    m0, m1 = (N.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(2))
    assert N.nvmlDeviceGetMPSComputeRunningProcesses_v3(m0) == []  # no MPS server there: an empty list
    assert [(p.pid, p.gpuInstanceId) for p in N.nvmlDeviceGetMPSComputeRunningProcesses_v3(m1)] == [(CLIENT_A, 2)]


def test_a_card_before_volta_refuses_the_mps_list(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = scenario.add_gpu().identity("Tesla P100-PCIE-16GB", "GPU-1").processes_refused("mps")
    g.add_process(CLIENT_A, GIB, kind="mps")
    scenario.write()
    N.nvmlInit()
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetMPSComputeRunningProcesses_v3(N.nvmlDeviceGetHandleByIndex(0))


# -- the exporter ------------------------------------------------------------------------------------
def test_mps_clients_are_processes_with_their_memory(scenario: Scenario, nvml: Any) -> None:
    mps_node(scenario)
    scenario.write()
    poller, errors = make_poller()
    snap = poller.poll()
    procs = {p.pid: p for p in snap.gpus[0].processes}
    assert {pid: (p.name, p.used_memory_bytes, p.kind) for pid, p in procs.items()} == {
        SERVER: ("nvidia-cuda-mps-server", 30 * MIB, "compute"),
        CLIENT_A: ("trainer", 12 * GIB, "compute"),  # a CUDA program like any other
        CLIENT_B: ("inference", 20 * GIB, "compute"),
        XORG: ("Xorg", 64 * MIB, "graphics"),
    }
    s = samples_of(snap)
    assert value(s, "gpu_processes", gpu="0") == 4
    assert value(s, "gpu_process_memory_used_bytes", pid=str(CLIENT_B)) == 20 * GIB
    assert process_errors(errors) == {}
    poller.close()


def test_a_process_in_the_compute_and_the_mps_list_is_counted_once(scenario: Scenario, nvml: Any) -> None:
    g = mps_node(scenario)
    g.add_process(CLIENT_A, 12 * GIB, name="trainer")  # also a compute context of its own
    g.add_process(CLIENT_B, 20 * GIB, kind="graphics", name="inference")  # and one drawing too
    scenario.write()
    poller, _ = make_poller()
    snap = poller.poll()
    pids = [p.pid for p in snap.gpus[0].processes]
    assert sorted(pids) == sorted({SERVER, CLIENT_A, CLIENT_B, XORG})
    assert {p.pid: p.kind for p in snap.gpus[0].processes}[CLIENT_B] == "compute"
    s = samples_of(snap)
    assert value(s, "gpu_processes", gpu="0") == 4
    assert value(s, "gpu_process_memory_used_bytes", pid=str(CLIENT_A)) == 12 * GIB
    poller.close()


def test_mps_clients_of_a_mig_device_are_on_that_device(scenario: Scenario, nvml: Any) -> None:
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-1").memory(80 * GIB, 30 * GIB).mig_mode(True)
    g.add_mig("NVIDIA H100 80GB HBM3 MIG 3g.40gb", mig_uuid("mps", 0, 0), 1)
    g.add_mig("NVIDIA H100 80GB HBM3 MIG 3g.40gb", mig_uuid("mps", 0, 1), 2)
    g.add_process(SERVER, 30 * MIB, name="nvidia-cuda-mps-server", gpu_instance_id=2, compute_instance_id=0)
    g.add_process(CLIENT_A, 5 * GIB, kind="mps", name="trainer", gpu_instance_id=2, compute_instance_id=0)
    scenario.write()
    poller, _ = make_poller()
    m0, m1 = poller.poll().gpus[0].migs
    assert m0.processes == ()
    assert {p.pid: (p.name, p.used_memory_bytes) for p in m1.processes} == {
        SERVER: ("nvidia-cuda-mps-server", 30 * MIB),
        CLIENT_A: ("trainer", 5 * GIB),
    }
    poller.close()


def test_a_card_refusing_the_mps_list_keeps_its_other_lists_and_is_asked_once(scenario: Scenario, nvml: Any) -> None:
    """A card before Volta answers NOT_SUPPORTED (nvml.h: "For Volta or newer"): remembered until the
    static refresh, like any query the card cannot answer, so it is neither asked nor counted per poll."""
    g = mps_node(scenario).processes_refused("mps")
    g.identity("Tesla P100-PCIE-16GB", "GPU-1")
    scenario.write()
    poller, errors = make_poller()
    before = calls("nvmlDeviceGetMPSComputeRunningProcesses")
    for _ in range(3):
        snap = poller.poll()
        assert sorted(p.pid for p in snap.gpus[0].processes) == [SERVER, XORG]
    assert calls("nvmlDeviceGetMPSComputeRunningProcesses") - before == 1
    assert process_errors(errors) == {("nvmlDeviceGetMPSComputeRunningProcesses", "not_supported"): 1}
    poller.close()


def test_an_mps_list_failing_for_a_moment_is_asked_again(scenario: Scenario, nvml: Any) -> None:
    g = mps_node(scenario).processes_refused("mps", Err("UNKNOWN"))
    scenario.write()
    poller, errors = make_poller()
    assert sorted(p.pid for p in poller.poll().gpus[0].processes) == [SERVER, XORG]
    g.unset("processes.mps")
    scenario.write()
    assert sorted(p.pid for p in poller.poll().gpus[0].processes) == [SERVER, CLIENT_A, CLIENT_B, XORG]
    assert process_errors(errors) == {("nvmlDeviceGetMPSComputeRunningProcesses", "unknown"): 1}
    poller.close()


# A fresh interpreter on a library without the MPS entry points: polls, then prints what it saw.
POLL = """
import json
from tests.exporter_helpers import make_poller
poller, errors = make_poller()
seen = [sorted((p.pid, p.kind) for p in poller.poll().gpus[0].processes) for _ in range(3)]
poller.close()
print(json.dumps({"seen": seen, "errors": {f"{f}/{e}": n for (f, e), n in errors.counts.items()
                                           if "RunningProcesses" in f}}))
"""


@pytest.mark.integration  # a child Python process with its own library
def test_a_driver_without_the_mps_call_still_lists_compute_and_graphics(tmp_path: Any) -> None:
    """A library that lacks the symbols (nvml.h has them since R470/R510): nvidia-ml-py says
    FUNCTION_NOT_FOUND, counted once and not asked again; the other lists are whole every poll."""
    s = Scenario(tmp_path / "node.scn")
    mps_node(s)
    s.write()
    hidden = ("nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2",
              "nvmlDeviceGetMPSComputeRunningProcesses_v3")  # fmt: skip
    out = run_python(POLL, s.path, library_dir=build_library(hide=hidden).parent)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["seen"] == [[[SERVER, "compute"], [XORG, "graphics"]]] * 3
    assert result["errors"] == {"nvmlDeviceGetMPSComputeRunningProcesses/function_not_found": 1}
