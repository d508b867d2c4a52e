"""The fake's driver profiles and quirks, through the real nvidia-ml-py: what each branch knows, and
the answers of real drivers that a kind fake would hide (README: "Driver profiles and quirks")."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fakenvml import Counter, Err, Scenario
from tests.fakenvml.presets import a100_sxm, h100_sxm, l40s, t4
from tests.timing import LATE_S, NEVER_S

GIB = 1024**3
FI_PCIE_TX, FI_PCIE_RX, FI_MEMORY_TEMP, FI_LINK_COUNT, FI_NVLINK_TX = 197, 198, 82, 91, 138


def fields(N: Any, h: Any, ids: list[Any]) -> list[Any]:
    return list(N.nvmlDeviceGetFieldValues(h, ids))


@pytest.mark.parametrize(
    ("branch", "fi_max"), [(535, 197), (550, 228), (570, 269), (580, 274)]
)  # NVML_FI_MAX of nvidia-ml-py 12.535.77, 12.550.89, 12.570.172, 13.580.82
def test_each_branch_knows_the_field_ids_of_its_own_header(scenario: Scenario, nvml: Any, branch: int,
                                                            fi_max: int) -> None:  # fmt: skip
    N = nvml
    scenario.driver(branch)
    h100_sxm(scenario.add_gpu(), "profile", 0, util=50, mem_used=GIB, power_mw=300_000)
    scenario.write()
    N.nvmlInit()
    assert N.nvmlSystemGetDriverVersion().startswith(f"{branch}.")
    h = N.nvmlDeviceGetHandleByIndex(0)
    last_known, first_unknown = fields(N, h, [fi_max - 1, fi_max])
    assert last_known.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED  # known to the driver, not modelled by the fake
    assert first_unknown.nvmlReturn == N.NVML_ERROR_INVALID_ARGUMENT
    tx, rx = fields(N, h, [FI_PCIE_TX, FI_PCIE_RX])
    want = N.NVML_ERROR_INVALID_ARGUMENT if branch == 535 else N.NVML_SUCCESS  # 197/198 came after R535
    assert (tx.nvmlReturn, rx.nvmlReturn) == (want, want)


def test_what_an_unknown_field_answers_can_be_set(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    scenario.driver(535)
    scenario.unknown_field = Err("NOT_SUPPORTED")
    h100_sxm(scenario.add_gpu(), "profile", 0, util=50, mem_used=GIB, power_mw=300_000)
    scenario.write()
    N.nvmlInit()
    (tx,) = fields(N, N.nvmlDeviceGetHandleByIndex(0), [FI_PCIE_TX])
    assert tx.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED


def test_a_function_newer_than_the_branch_is_not_found(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    scenario.driver(550)
    scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-1").temperature(50)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetTemperature(h, 0) == 50
    with pytest.raises(N.NVMLError_FunctionNotFound):  # nvmlDeviceGetTemperatureV: first in R570's bindings
        N.nvmlDeviceGetTemperatureV(h, 0)
    scenario.driver(570)
    scenario.write()
    assert N.nvmlDeviceGetTemperatureV(h, 0) == 50


@pytest.mark.parametrize(("card", "links"), [(a100_sxm, 12), (h100_sxm, 18), (l40s, 0), (t4, 0)])
def test_each_card_says_how_many_links_it_has_and_no_link_past_them_answers(
    scenario: Scenario, nvml: Any, card: Any, links: int
) -> None:
    N = nvml
    g = card(
        scenario.add_gpu(), "links", 0, util=50, mem_used=GIB, **({"power_mw": 300_000} if card is h100_sxm else {})
    )
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    (count,) = fields(N, h, [FI_LINK_COUNT])
    assert (count.nvmlReturn, count.value.uiVal) == (N.NVML_SUCCESS, links)
    for link in {links, 18, 35} | ({17} if links < 18 else set()):
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetNvLinkState(h, link)
        assert fields(N, h, [(FI_NVLINK_TX, link)])[0].nvmlReturn == N.NVML_ERROR_INVALID_ARGUMENT
    # What the independent mock answered instead: every link up to the bound, inactive, with zero counters.
    g.nvlinks(links, beyond=0)
    scenario.write()
    for link in range(links, 18):
        assert N.nvmlDeviceGetNvLinkState(h, link) == N.NVML_FEATURE_DISABLED
        tx = fields(N, h, [(FI_NVLINK_TX, link)])[0]
        assert (tx.nvmlReturn, tx.value.ullVal) == (N.NVML_SUCCESS, 0)
    with pytest.raises(N.NVMLError_InvalidArgument):  # the R580 header's bound is 18 links
        N.nvmlDeviceGetNvLinkState(h, 18)


def test_a_gap_in_the_links_answers_not_supported_and_the_links_after_it_answer(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = h100_sxm(scenario.add_gpu(), "gap", 0, util=50, mem_used=GIB, power_mw=300_000)
    g.unset("nvlink.4.state", "nvlink.4.tx_kib", "nvlink.4.rx_kib")  # an inactive port of an H100 NVL
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetNvLinkState(h, 4)
    assert N.nvmlDeviceGetNvLinkState(h, 5) == N.NVML_FEATURE_ENABLED
    assert fields(N, h, [FI_LINK_COUNT])[0].value.uiVal == 18


def test_accumulating_fields_add_into_the_callers_value(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    scenario.add_gpu().identity("NVIDIA A100-SXM4-80GB", "GPU-1").temperature(40, memory=55).fields_accumulate()
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    # nvidia-ml-py builds a fresh, zeroed array per call: the true value every time.
    assert [fields(N, h, [FI_MEMORY_TEMP])[0].value.uiVal for _ in range(3)] == [55, 55, 55]
    array = (N.c_nvmlFieldValue_t * 1)()
    array[0].fieldId = FI_MEMORY_TEMP
    seen = []
    fn = N._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    for _ in range(3):  # one array, reused as is
        assert fn(h, 1, array) == N.NVML_SUCCESS
        seen.append(array[0].value.uiVal)
    assert seen == [55, 110, 165]


def test_32_bit_pcie_counters_wrap_and_still_say_64(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = scenario.add_gpu().identity("NVIDIA L40S", "GPU-1")
    g.pcie(tx_bytes=2**32 + 5, rx_bytes=Counter(2**33 + 7, 0), counter_bits=32)
    scenario.write()
    N.nvmlInit()
    tx, rx = fields(N, N.nvmlDeviceGetHandleByIndex(0), [FI_PCIE_TX, FI_PCIE_RX])
    assert (tx.value.ullVal, rx.value.ullVal) == (5, 7)
    assert tx.valueType == N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG


def test_memory_temperature_as_an_unsigned_short(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-1").temperature(40, memory=61, memory_value_type=6)
    scenario.write()
    N.nvmlInit()
    (mt,) = fields(N, N.nvmlDeviceGetHandleByIndex(0), [FI_MEMORY_TEMP])
    assert (mt.valueType, mt.value.usVal) == (6, 61)


def test_fans_above_100_percent(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    scenario.add_gpu().identity("NVIDIA GeForce RTX 4090", "GPU-1").fans(112, 40)
    scenario.write()
    N.nvmlInit()
    assert N.nvmlDeviceGetFanSpeed_v2(N.nvmlDeviceGetHandleByIndex(0), 0) == 112


def test_an_event_wait_answers_gpu_is_lost_after_the_lost_gpus_own_events(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    for i in range(2):
        scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", f"GPU-{i}")
    scenario.gpu(0).add_xid(48)
    scenario.gpu(1).events_wait_lost().add_xid(79)
    scenario.write()
    N.nvmlInit()
    es = N.nvmlEventSetCreate()
    for i in range(2):
        N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(i), N.nvmlEventTypeXidCriticalError, es)
    scenario.gpu(1).lost()
    scenario.write()
    assert N.nvmlEventSetWait_v2(es, 100).eventData == 79
    t0 = time.monotonic()
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlEventSetWait_v2(es, int(NEVER_S * 1000))
    # At once, not after the timeout (NEVER_S); GPU 0's XID 48 does not come.
    assert time.monotonic() - t0 < LATE_S
    N.nvmlEventSetFree(es)


def test_parent_gpm_refused_in_mig_mode(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-1").gpm_supported().gpm_parent_in_mig()
    g.mig_mode(True)
    g.add_mig("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "MIG-1", 7).gpm(sm_util=40)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    s = N.nvmlGpmSampleAlloc()
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpmSampleGet(h, s)
    N.nvmlGpmMigSampleGet(h, 7, s)  # the GPU instance still answers
    g.mig_mode(False)
    scenario.write()
    N.nvmlGpmSampleGet(h, s)  # and the whole GPU, once MIG is off
    N.nvmlGpmSampleFree(s)


def test_a_sample_landing_between_the_two_process_utilization_calls(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-1").process_utilization(50)
    g.add_process(4242, GIB, name="trainer", sm=70).process_util_race(1)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(N.NVMLError_InsufficientSize):
        N.nvmlDeviceGetProcessUtilization(h, 0)
    assert [p.smUtil for p in N.nvmlDeviceGetProcessUtilization(h, 0)] == [70]  # the next read goes through


def test_process_lists_and_mig_handles_can_be_refused(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    g = scenario.add_gpu().identity("NVIDIA A100-SXM4-80GB", "GPU-1").mig_mode(True)
    g.add_mig("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "MIG-1", 1).processes_refused("compute")
    g.add_mig("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "MIG-2", 2).handle_error("GPU_IS_LOST")
    g.add_process(4242, GIB, gpu_instance_id=1, compute_instance_id=0)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetComputeRunningProcesses(mig)
    assert [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h)] == [4242]  # the parent still lists it
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
