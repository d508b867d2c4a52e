"""GPM and processes of a GPU in MIG mode as real drivers answer (issue 26, point 6): a parent that
refuses GPM leaves its instances' samples alone, a GPU instance is sampled once however many compute
instances it holds, and a MIG handle that refuses a query does not turn it off for the parent."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import pytest

from tests.exporter_helpers import make_poller, samples_of, value, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import mig_uuid

GIB = 1024**3
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def calls(prefix: str) -> int:
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    lib.fakeNvmlCallCount.restype = ctypes.c_ulonglong
    lib.fakeNvmlCallCount.argtypes = [ctypes.c_char_p]
    return int(lib.fakeNvmlCallCount(prefix.encode()))


def mig_h100(s: Scenario, instances: tuple[tuple[int, int, float], ...]) -> Any:
    """An H100 in MIG mode; ``instances``: (GPU instance id, compute instance id, SM percent)."""
    g = s.add_gpu().identity("NVIDIA H100 80GB HBM3", UUID).memory(80 * GIB, 30 * GIB).gpm_supported()
    g.mig_mode(True)
    for m, (gi, ci, sm) in enumerate(instances):
        g.add_mig("NVIDIA H100 80GB HBM3 MIG 1g.10gb", mig_uuid("gpm-mig", 0, m), gi, ci).gpm(sm_util=sm)
    return g


def mig_activity(poller: Any) -> dict[tuple[str, str], float]:
    """(gpu instance, compute instance) -> SM activity, of this poll."""
    s = samples_of(poller.poll())
    return {(dict(ls)["gpu_instance_id"], dict(ls)["compute_instance_id"]): v
            for (n, ls), v in s.items() if n == "gpu_mig_sm_active_ratio"}  # fmt: skip


def test_a_parent_refusing_gpm_in_mig_mode_leaves_its_instances_samples_alone(scenario: Scenario, nvml: Any) -> None:
    """Each static refresh asks the parent again; its NOT_SUPPORTED must not free the instances'
    sample pairs, or every refresh costs the MIG activity an interval or two."""
    mig_h100(scenario, ((1, 0, 70), (5, 0, 35))).gpm_parent_in_mig()
    scenario.write()
    poller, errors = make_poller(static_refresh_s=0.25)
    wait_for(lambda: len(mig_activity(poller)) == 2, timeout=10, what="both instances' activity")
    for _ in range(8):  # four static refreshes or so
        time.sleep(0.13)
        assert mig_activity(poller) == {("1", "0"): pytest.approx(0.70), ("5", "0"): pytest.approx(0.35)}
    assert errors.counts[("nvmlGpmSampleGet", "not_supported")] >= 2  # asked again after each refresh
    poller.close()


def test_a_gpu_instance_is_sampled_once_and_shown_once(scenario: Scenario, nvml: Any) -> None:
    """GPM is per GPU instance: with two compute instances in GPU instance 1, the instance's activity
    is on one row (its first compute instance), so a sum over rows counts it once."""
    mig_h100(scenario, ((1, 0, 70), (1, 1, 70), (5, 0, 35)))
    scenario.write()
    poller, _ = make_poller()
    wait_for(lambda: len(mig_activity(poller)) >= 2, timeout=10, what="the instances' activity")
    time.sleep(0.12)
    before = calls("nvmlGpmMigSampleGet")
    assert mig_activity(poller) == {("1", "0"): pytest.approx(0.70), ("5", "0"): pytest.approx(0.35)}
    assert calls("nvmlGpmMigSampleGet") - before == 2  # one sample per GPU instance
    poller.close()


def test_a_mig_handle_refusing_the_process_list_leaves_the_parents(scenario: Scenario, nvml: Any) -> None:
    g = scenario.add_gpu().identity("NVIDIA A100-SXM4-80GB", UUID).memory(80 * GIB, 30 * GIB).mig_mode(True)
    for m, gi in enumerate((1, 5)):
        g.add_mig("NVIDIA A100-SXM4-80GB MIG 3g.40gb", mig_uuid("procs", 0, m), gi).processes_refused("compute")
        g.add_process(30_001 + m, GIB, name="python3", gpu_instance_id=gi, compute_instance_id=0)
    scenario.write()
    poller, errors = make_poller()
    for _ in range(3):
        s = samples_of(poller.poll())
        assert value(s, "gpu_processes", gpu="0") == 2
        assert {dict(ls)["pid"] for (n, ls) in s if n == "gpu_process_memory_used_bytes"} == {"30001", "30002"}
    assert errors.counts[("nvmlDeviceGetComputeRunningProcesses", "not_supported")] == 1  # once for the MIG devices
    poller.close()
