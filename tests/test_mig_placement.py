"""The GPU instance behind each MIG device: its profile id and placement start, from
nvmlDeviceGetGpuInstanceById and nvmlGpuInstanceGetInfo on the parent, which with the parent's minor
number are how NVIDIA's DRA driver names a MIG device (gpu-<minor>-mig-<profile>-<id>-<start>).
Read once per instance; a lookup that fails leaves both None and the rest of the reading whole."""

from __future__ import annotations

from typing import Any

import pytest

from tests.exporter_helpers import make_poller
from tests.fakenvml import Err, Scenario
from tests.fakenvml.presets import GIB, MIB, mig_uuid, preset
from tests.fakenvml.runtime import call_count as calls

H100 = "NVIDIA H100 80GB HBM3"


def gi_info(N: Any, h: Any, gi: int) -> tuple[int, int, int, int]:
    info = N.nvmlGpuInstanceGetInfo(N.nvmlDeviceGetGpuInstanceById(h, gi))
    return info.id, info.profileId, info.placement.start, info.placement.size


def mixed_h100(scenario: Scenario) -> Any:
    """An H100 80GB split 3g.40gb + 2g.20gb + 1g.10gb, the 3g one with two compute instances."""
    g = scenario.add_gpu().identity(H100, "GPU-1").memory(81559 * MIB, 30 * GIB).mig_mode(True)
    for m, (profile, gi, ci) in enumerate((("3g.40gb", 1, 0), ("3g.40gb", 1, 1), ("2g.20gb", 5, 0),
                                           ("1g.10gb", 13, 0))):  # fmt: skip
        g.add_mig(f"{H100} MIG {profile}", mig_uuid("place", 0, m), gi, ci).memory(9 * GIB, GIB)
    g.add_process(40_001, GIB, name="python3", gpu_instance_id=5, compute_instance_id=0)
    return g


# -- the fake driver, through nvidia-ml-py --------------------------------------------------------------
def test_profile_ids_are_the_devices_own_and_placements_fit(scenario: Scenario, nvml: Any) -> None:
    """The id nvidia-smi mig -lgip shows (3g 9, 2g 14, 1g 19 on an H100), not the NVML_GPU_INSTANCE_
    PROFILE_* index; each instance at the first start its profile allows that is still free."""
    N = nvml
    mixed_h100(scenario)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert [gi_info(N, h, gi) for gi in (1, 5, 13)] == [(1, 9, 0, 4), (5, 14, 4, 2), (13, 19, 6, 1)]
    info = N.nvmlGpuInstanceGetInfo(N.nvmlDeviceGetGpuInstanceById(h, 1))
    assert N.nvmlDeviceGetIndex(info.device) == 0  # the parent
    with pytest.raises(N.NVMLError_NotFound):  # nvml.h: "If the GPU instance is not found"
        N.nvmlDeviceGetGpuInstanceById(h, 2)


@pytest.mark.parametrize(("profile", "want"), [("7g.80gb", (0, 0, 8)), ("4g.40gb", (5, 0, 4)),
                                               ("1g.10gb+me", (20, 0, 1)), ("1g.20gb", (15, 0, 2))])  # fmt: skip
def test_each_profile_name_has_its_id(scenario: Scenario, nvml: Any, profile: str, want: tuple[int, ...]) -> None:
    """1g.20gb on an 80 GB card holds two memory slices: profile 15, not 19."""
    N = nvml
    g = scenario.add_gpu().identity(H100, "GPU-1").memory(81559 * MIB, 0).mig_mode(True)
    g.add_mig(f"{H100} MIG {profile}", mig_uuid("names", 0, 0), 3)
    scenario.write()
    N.nvmlInit()
    assert gi_info(N, N.nvmlDeviceGetHandleByIndex(0), 3)[1:] == want


def test_a_scenario_can_place_its_instances(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = scenario.add_gpu().identity(H100, "GPU-1").mig_mode(True)
    g.add_mig(f"{H100} MIG 1g.10gb", mig_uuid("set", 0, 0), 9, profile_id=19, placement_start=2)
    g.add_mig(f"{H100} MIG 3g.40gb", mig_uuid("set", 0, 1), 2, placement_start=4)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert [gi_info(N, h, gi) for gi in (9, 2)] == [(9, 19, 2, 1), (2, 9, 4, 4)]


def test_the_lookup_follows_the_driver(scenario: Scenario, nvml: Any) -> None:
    """nvml.h: NOT_SUPPORTED without MIG mode; "Requires privileged user" (NO_PERMISSION otherwise);
    a MIG handle is not the target device."""
    N = nvml
    g = mixed_h100(scenario)
    scenario.add_gpu().identity(H100, "GPU-2").mig_mode(False)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetGpuInstanceById(N.nvmlDeviceGetHandleByIndex(1), 1)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetGpuInstanceById(N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0), 1)
    handle = N.nvmlDeviceGetGpuInstanceById(h, 5)
    g.gpu_instances_refused()
    scenario.write()
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetGpuInstanceById(h, 1)
    assert N.nvmlGpuInstanceGetInfo(handle).profileId == 14  # a handle already had stays good
    g.values.pop("gi.lookup")
    g.migs[3].gpu_instance_refused()  # one instance gone between the listing and the lookup
    scenario.write()
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetGpuInstanceById(h, 13)
    assert gi_info(N, h, 1)[1] == 9
    g.migs[2].gpu_instance(profile_id=Err("NO_PERMISSION"))
    scenario.write()
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlGpuInstanceGetInfo(handle)


def test_a_destroyed_instance_leaves_its_handle_invalid(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = mixed_h100(scenario)
    scenario.write()
    N.nvmlInit()
    handle = N.nvmlDeviceGetGpuInstanceById(N.nvmlDeviceGetHandleByIndex(0), 13)
    del g.migs[3]
    scenario.write()
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpuInstanceGetInfo(handle)


# -- the exporter ------------------------------------------------------------------------------------
def test_each_mig_device_says_its_instances_profile_and_placement(scenario: Scenario, nvml: Any) -> None:
    mixed_h100(scenario)
    scenario.write()
    poller, errors = make_poller()
    migs = poller.poll().gpus[0].migs
    assert [(m.gpu_instance_id, m.compute_instance_id, m.gpu_instance_profile_id, m.placement_start)
            for m in migs] == [(1, 0, 9, 0), (1, 1, 9, 0), (5, 0, 14, 4), (13, 0, 19, 6)]  # fmt: skip
    assert not [k for k in errors.counts if "GpuInstance" in k[0]]
    poller.close()


def test_the_a100_preset_reads_as_nvidia_smi_would(scenario: Scenario, nvml: Any) -> None:
    s = preset("a100-mig")
    s.path = scenario.path
    s.write()
    poller, _ = make_poller()
    migs = poller.poll().gpus[0].migs
    assert [(m.profile, m.gpu_instance_profile_id, m.placement_start) for m in migs] == [
        ("3g.40gb", 9, 0), ("2g.20gb", 14, 4), ("1g.10gb", 19, 6)]  # fmt: skip
    poller.close()


def test_the_instances_are_read_once_not_every_poll(scenario: Scenario, nvml: Any) -> None:
    g = mixed_h100(scenario)
    scenario.write()
    poller, _ = make_poller()
    before = calls("nvmlDeviceGetGpuInstanceById"), calls("nvmlGpuInstanceGetInfo")
    for _ in range(3):
        poller.poll()
    made = calls("nvmlDeviceGetGpuInstanceById") - before[0], calls("nvmlGpuInstanceGetInfo") - before[1]
    assert made == (4, 4)  # one for each MIG device (two share instance 1), on the first poll only
    # An instance destroyed and made again has new MIG UUIDs: read again, once.
    g.migs[3] = g.migs[3].identity(f"{H100} MIG 1g.10gb", mig_uuid("place", 0, 99)).gpu_instance(placement_start=7)
    scenario.write()
    for _ in range(2):
        m = poller.poll().gpus[0].migs[3]
    assert calls("nvmlGpuInstanceGetInfo") - before[1] == 5
    assert (m.gpu_instance_profile_id, m.placement_start) == (19, 7)
    poller.close()


def test_a_caller_without_the_privilege_still_reads_its_mig_devices(scenario: Scenario, nvml: Any) -> None:
    """NO_PERMISSION (neither root nor the mig/monitor capability): profile and placement None, the
    memory and processes as before, and the refusal counted once, not asked again every poll."""
    mixed_h100(scenario).gpu_instances_refused("NO_PERMISSION")
    scenario.write()
    poller, errors = make_poller()
    before = calls("nvmlDeviceGetGpuInstanceById")
    for _ in range(3):
        migs = poller.poll().gpus[0].migs
        assert [(m.gpu_instance_profile_id, m.placement_start) for m in migs] == [(None, None)] * 4
        assert [m.gpu_instance_id for m in migs] == [1, 1, 5, 13]
        assert migs[0].memory_total_bytes == 9 * GIB
        assert [p.pid for p in migs[2].processes] == [40_001]
    assert calls("nvmlDeviceGetGpuInstanceById") - before == 1
    assert {k: n for k, n in errors.counts.items() if "GpuInstance" in k[0]} == {
        ("nvmlDeviceGetGpuInstanceById", "no_permission"): 1
    }
    poller.close()


def test_one_instance_failing_leaves_the_others(scenario: Scenario, nvml: Any) -> None:
    g = mixed_h100(scenario)
    g.migs[2].gpu_instance(profile_id=Err("UNKNOWN"))
    scenario.write()
    poller, errors = make_poller()
    migs = poller.poll().gpus[0].migs
    assert [(m.gpu_instance_profile_id, m.placement_start) for m in migs] == [(9, 0), (9, 0), (None, None), (19, 6)]
    assert errors.counts[("nvmlGpuInstanceGetInfo", "unknown")] == 1
    g.migs[2].gpu_instance()  # it answers again: read at the next poll
    scenario.write()
    assert (poller.poll().gpus[0].migs[2].placement_start) == 4
    poller.close()
