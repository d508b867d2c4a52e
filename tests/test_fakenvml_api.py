"""Every entry point of the fake NVML library, called through the real pynvml bindings."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest

from tests.fakenvml import GPU_IS_LOST, NOT_SUPPORTED, Counter, Err, Gpu, Scenario
from tests.fakenvml.runtime import advance_clock
from tests.timing import LATE_S, NEVER_S

GIB = 1024**3
MIB = 1024**2
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
MIG_UUID = "MIG-99999999-8888-7777-6666-555555555555"


def full_gpu(g: Gpu) -> Gpu:
    """One GPU with every value set to something distinct."""
    g.identity("NVIDIA H100 80GB HBM3", UUID0).pci("00000000:18:00.0", 0x233010DE, 0x16C110DE)
    g.serial("1652324000123").minor_number(3)
    g.utilization(87, 41).memory(80 * GIB, 60 * GIB, reserved=512 * MIB).codec(12, 7, period_us=100000)
    g.temperature(66, memory=71).thresholds(shutdown=92, slowdown=89, mem_max=95, gpu_max=87)
    g.fans(30, 35)
    g.power(612345, 700000).energy(123456789)
    g.clocks(
        graphics=1755, sm=1760, memory=2619, video=1500, max_graphics=1980, max_sm=1985, max_memory=2620, max_video=1755
    )
    g.pstate(2).clocks_event_reasons("sw_power_cap", "hw_thermal")
    g.pcie(
        gen=4,
        max_gen=5,
        width=8,
        max_width=16,
        tx_kbps=123456,
        rx_kbps=654321,
        sample_ms=5,
        replay=17,
        tx_bytes=1111,
        rx_bytes=2222,
    )
    g.nvlink(0, True, tx_kib=1000, rx_kib=2000).nvlink(1, False, tx_kib=3000, rx_kib=4000)
    g.ecc(corrected=5, uncorrected=1, corrected_volatile=2, uncorrected_volatile=0)
    g.remapped_rows(correctable=3, uncorrectable=1, pending=True, failure=False)
    g.mig_mode(False, pending=True, max_devices=7)
    return g


@pytest.fixture
def full(scenario: Scenario, nvml: Any) -> Any:
    full_gpu(scenario.add_gpu())
    g = scenario.add_gpu().identity("NVIDIA A100-SXM4-80GB", UUID1).pci("00000000:19:00.0")
    g.mig_mode(True)
    g.add_mig("NVIDIA A100-SXM4-80GB MIG 3g.40gb", MIG_UUID, 2, 0).memory(40 * GIB, 10 * GIB)
    scenario.write()
    nvml.nvmlInit()
    return nvml


def test_system_calls(full: Any) -> None:
    N = full
    assert N.nvmlSystemGetDriverVersion() == "550.54.15"
    assert N.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert N.nvmlSystemGetCudaDriverVersion() == 12040
    assert N.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert N.nvmlDeviceGetCount() == 2


def test_identity(full: Any) -> None:
    N = full
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert N.nvmlDeviceGetUUID(h) == UUID0
    assert N.nvmlDeviceGetSerial(h) == "1652324000123"
    assert N.nvmlDeviceGetIndex(h) == 0
    assert N.nvmlDeviceGetMinorNumber(h) == 3
    pci = N.nvmlDeviceGetPciInfo(h)
    assert pci.busId == "00000000:18:00.0"
    assert pci.busIdLegacy == "0000:18:00.0"
    assert (pci.domain, pci.bus, pci.device) == (0, 0x18, 0)
    assert pci.pciDeviceId == 0x233010DE
    assert pci.pciSubSystemId == 0x16C110DE
    assert ctypes.addressof(N.nvmlDeviceGetHandleByUUID(UUID1).contents) == ctypes.addressof(
        N.nvmlDeviceGetHandleByIndex(1).contents
    )
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetHandleByIndex(2)


def test_utilization_and_memory(full: Any) -> None:
    N = full
    h = N.nvmlDeviceGetHandleByIndex(0)
    u = N.nvmlDeviceGetUtilizationRates(h)
    assert (u.gpu, u.memory) == (87, 41)
    assert N.nvmlDeviceGetEncoderUtilization(h) == [12, 100000]
    assert N.nvmlDeviceGetDecoderUtilization(h) == [7, 100000]
    v1 = N.nvmlDeviceGetMemoryInfo(h)
    v2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    free = 80 * GIB - 60 * GIB - 512 * MIB
    assert (v2.total, v2.used, v2.reserved, v2.free) == (80 * GIB, 60 * GIB, 512 * MIB, free)
    # v1 "used" is everything not free, reserved memory included: the classic v1/v2 mismatch.
    assert (v1.total, v1.used, v1.free) == (80 * GIB, 60 * GIB + 512 * MIB, free)


def test_memory_v2_checks_the_struct_version(full: Any) -> None:
    N = full
    h = N.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(N.NVMLError_ArgumentVersionMismatch):
        N.nvmlDeviceGetMemoryInfo(h, version=0x01000028)


def test_thermal_power_clocks(full: Any) -> None:
    N = full
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU) == 66
    thresholds = {
        N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
        N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
        N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95,
        N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
    }
    for t, want in thresholds.items():
        assert N.nvmlDeviceGetTemperatureThreshold(h, t) == want
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetTemperatureThreshold(h, N.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN)
    assert N.nvmlDeviceGetNumFans(h) == 2
    assert [N.nvmlDeviceGetFanSpeed_v2(h, i) for i in range(2)] == [30, 35]
    assert N.nvmlDeviceGetFanSpeed(h) == 30
    assert N.nvmlDeviceGetPowerUsage(h) == 612345
    assert N.nvmlDeviceGetEnforcedPowerLimit(h) == 700000
    assert N.nvmlDeviceGetPowerManagementLimit(h) == 700000
    assert N.nvmlDeviceGetTotalEnergyConsumption(h) == 123456789
    clocks = {
        N.NVML_CLOCK_GRAPHICS: (1755, 1980),
        N.NVML_CLOCK_SM: (1760, 1985),
        N.NVML_CLOCK_MEM: (2619, 2620),
        N.NVML_CLOCK_VIDEO: (1500, 1755),
    }
    for c, (now, top) in clocks.items():
        assert N.nvmlDeviceGetClockInfo(h, c) == now
        assert N.nvmlDeviceGetMaxClockInfo(h, c) == top
    assert N.nvmlDeviceGetPerformanceState(h) == 2
    want = N.nvmlClocksEventReasonSwPowerCap | N.nvmlClocksEventReasonHwThermalSlowdown
    assert N.nvmlDeviceGetCurrentClocksEventReasons(h) == want
    assert N.nvmlDeviceGetCurrentClocksThrottleReasons(h) == want


def test_pcie(full: Any) -> None:
    N = full
    h = N.nvmlDeviceGetHandleByIndex(0)
    # KB/s, exactly as the driver reports it: converting to bytes is the reader's job.
    assert N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES) == 123456
    assert N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES) == 654321
    assert N.nvmlDeviceGetCurrPcieLinkGeneration(h) == 4
    assert N.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
    assert N.nvmlDeviceGetCurrPcieLinkWidth(h) == 8
    assert N.nvmlDeviceGetMaxPcieLinkWidth(h) == 16
    assert N.nvmlDeviceGetPcieReplayCounter(h) == 17


def test_field_values_and_nvlink(full: Any) -> None:
    N = full
    h = N.nvmlDeviceGetHandleByIndex(0)
    ids = [
        (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
        (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),
        (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1),
        (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 1),
        (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 2),
        N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        N.NVML_FI_DEV_MEMORY_TEMP,
        N.NVML_FI_DEV_NVLINK_LINK_COUNT,
        N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        N.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,  # not implemented by the fake: per-field NOT_SUPPORTED
    ]
    vals = N.nvmlDeviceGetFieldValues(h, ids)
    ok = N.NVML_SUCCESS
    assert [(v.nvmlReturn, v.value.ullVal) for v in vals[:4]] == [(ok, 1000), (ok, 2000), (ok, 3000), (ok, 4000)]
    assert vals[0].scopeId == 0 and vals[2].scopeId == 1
    assert vals[0].valueType == N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert vals[4].nvmlReturn == N.NVML_ERROR_INVALID_ARGUMENT  # link 2 is past the count: no such link
    assert (vals[5].value.ullVal, vals[6].value.ullVal) == (1111, 2222)
    assert (vals[7].nvmlReturn, vals[7].valueType, vals[7].value.uiVal) == (ok, N.NVML_VALUE_TYPE_UNSIGNED_INT, 71)
    assert (vals[8].nvmlReturn, vals[8].value.uiVal) == (ok, 2)
    assert vals[9].value.ullVal == 123456789
    assert vals[10].value.ullVal == 17
    assert vals[11].nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED
    assert all(v.timestamp > 1_600_000_000_000_000 for v in vals)  # microseconds since 1970
    assert N.nvmlDeviceGetNvLinkState(h, 0) == N.NVML_FEATURE_ENABLED
    assert N.nvmlDeviceGetNvLinkState(h, 1) == N.NVML_FEATURE_DISABLED
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetNvLinkState(h, 2)


def test_errors_ecc_and_rows(full: Any) -> None:
    N = full
    h = N.nvmlDeviceGetHandleByIndex(0)
    C, U = N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert N.nvmlDeviceGetTotalEccErrors(h, C, N.NVML_AGGREGATE_ECC) == 5
    assert N.nvmlDeviceGetTotalEccErrors(h, U, N.NVML_AGGREGATE_ECC) == 1
    assert N.nvmlDeviceGetTotalEccErrors(h, C, N.NVML_VOLATILE_ECC) == 2
    assert N.nvmlDeviceGetTotalEccErrors(h, U, N.NVML_VOLATILE_ECC) == 0
    assert N.nvmlDeviceGetRemappedRows(h) == (3, 1, 1, 0)


def test_mig(full: Any) -> None:
    N = full
    plain, parent = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
    assert N.nvmlDeviceGetMigMode(plain) == [0, 1]
    assert N.nvmlDeviceGetMaxMigDeviceCount(plain) == 7
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetMigDeviceHandleByIndex(plain, 0)
    assert N.nvmlDeviceGetMigMode(parent) == [1, 1]
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    # pynvml hands this one back as a c_uint rather than an int.
    assert int(getattr(N.nvmlDeviceIsMigDeviceHandle(mig), "value", 1)) == 1
    assert int(getattr(N.nvmlDeviceIsMigDeviceHandle(parent), "value", 1)) == 0
    assert N.nvmlDeviceGetUUID(mig) == MIG_UUID
    assert N.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert N.nvmlDeviceGetGpuInstanceId(mig) == 2
    assert N.nvmlDeviceGetComputeInstanceId(mig) == 0
    mem = N.nvmlDeviceGetMemoryInfo(mig, version=N.nvmlMemory_v2)
    assert (mem.total, mem.used) == (40 * GIB, 10 * GIB)
    back = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert ctypes.addressof(back.contents) == ctypes.addressof(parent.contents)
    by_uuid = N.nvmlDeviceGetHandleByUUID(MIG_UUID)
    assert ctypes.addressof(by_uuid.contents) == ctypes.addressof(mig.contents)
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetGpuInstanceId(parent)


def test_a_missing_value_reads_as_not_supported(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    scenario.add_gpu().identity("Bare", UUID0)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    calls: list[Callable[[], object]] = [
        lambda: N.nvmlDeviceGetSerial(h),
        lambda: N.nvmlDeviceGetUtilizationRates(h),
        lambda: N.nvmlDeviceGetMemoryInfo(h),
        lambda: N.nvmlDeviceGetTemperature(h, 0),
        lambda: N.nvmlDeviceGetNumFans(h),  # a passively cooled card
        lambda: N.nvmlDeviceGetFanSpeed_v2(h, 0),
        lambda: N.nvmlDeviceGetPowerUsage(h),
        lambda: N.nvmlDeviceGetTotalEnergyConsumption(h),
        lambda: N.nvmlDeviceGetClockInfo(h, 0),
        lambda: N.nvmlDeviceGetPcieThroughput(h, 0),
        lambda: N.nvmlDeviceGetCurrPcieLinkGeneration(h),
        lambda: N.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        lambda: N.nvmlDeviceGetRemappedRows(h),
        lambda: N.nvmlDeviceGetMigMode(h),
        lambda: N.nvmlDeviceGetPciInfo(h),
    ]
    for call in calls:
        with pytest.raises(N.NVMLError_NotSupported):
            call()
    fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_MEMORY_TEMP, (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)])
    assert [v.nvmlReturn for v in fv] == [N.NVML_ERROR_NOT_SUPPORTED] * 2


@pytest.mark.parametrize(
    ("err", "exc"),
    [
        ("NOT_SUPPORTED", "NVMLError_NotSupported"),
        ("GPU_IS_LOST", "NVMLError_GpuIsLost"),
        ("NO_PERMISSION", "NVMLError_NoPermission"),
        ("UNKNOWN", "NVMLError_Unknown"),
        ("TIMEOUT", "NVMLError_Timeout"),
    ],
)
def test_any_value_can_be_an_error(scenario: Scenario, nvml: Any, err: str, exc: str) -> None:
    N = nvml
    g = full_gpu(scenario.add_gpu())
    for key in (
        "util.gpu",
        "memory.used",
        "temperature.gpu",
        "fan.1",
        "power.usage_mw",
        "pcie.rx_kbps",
        "nvlink.0.tx_kib",
        "temperature.memory",
        "ecc.uncorrected.aggregate",
        "serial",
        "rows.pending",
    ):
        g.error(key, err)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    error = getattr(N, exc)
    broken_calls: tuple[Callable[[], object], ...] = (
        lambda: N.nvmlDeviceGetUtilizationRates(h),
        lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2),
        lambda: N.nvmlDeviceGetTemperature(h, 0),
        lambda: N.nvmlDeviceGetFanSpeed_v2(h, 1),
        lambda: N.nvmlDeviceGetPowerUsage(h),
        lambda: N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES),
        lambda: N.nvmlDeviceGetTotalEccErrors(h, 1, 1),
        lambda: N.nvmlDeviceGetSerial(h),
        lambda: N.nvmlDeviceGetRemappedRows(h),
    )
    for call in broken_calls:
        with pytest.raises(error):
            call()
    # Values next to the broken ones still read.
    assert N.nvmlDeviceGetFanSpeed_v2(h, 0) == 30
    assert N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES) == 123456
    code = getattr(N, f"NVML_ERROR_{err}")
    fv = N.nvmlDeviceGetFieldValues(
        h,
        [
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
            N.NVML_FI_DEV_MEMORY_TEMP,
            (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),
        ],
    )
    assert [v.nvmlReturn for v in fv] == [code, code, N.NVML_SUCCESS]


def test_error_strings_match_the_driver(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    assert str(N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)) == "Not Supported"
    assert str(N.NVMLError(N.NVML_ERROR_GPU_IS_LOST)) == "GPU is lost"
    assert str(N.NVMLError(N.NVML_ERROR_NO_PERMISSION)) == "Insufficient Permissions"
    assert str(N.NVMLError(N.NVML_ERROR_DRIVER_NOT_LOADED)) == "Driver Not Loaded"


def test_a_lost_gpu_fails_every_call_and_the_others_carry_on(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    full_gpu(scenario.add_gpu())
    full_gpu(scenario.add_gpu()).identity("other", UUID1)
    scenario.write()
    N.nvmlInit()
    h0 = N.nvmlDeviceGetHandleByIndex(0)
    scenario.gpu(0).lost()
    scenario.write()
    assert N.nvmlDeviceGetCount() == 2  # the driver still counts it
    lost_calls: tuple[Callable[[], object], ...] = (
        lambda: N.nvmlDeviceGetHandleByIndex(0),
        lambda: N.nvmlDeviceGetHandleByUUID(UUID0),
        lambda: N.nvmlDeviceGetName(h0),
        lambda: N.nvmlDeviceGetMemoryInfo(h0),
        lambda: N.nvmlDeviceGetPcieThroughput(h0, 0),
        lambda: N.nvmlDeviceGetFieldValues(h0, [N.NVML_FI_DEV_MEMORY_TEMP]),
        lambda: N.nvmlDeviceGetComputeRunningProcesses(h0),
    )
    for call in lost_calls:
        with pytest.raises(N.NVMLError_GpuIsLost):
            call()
    h1 = N.nvmlDeviceGetHandleByIndex(1)
    assert N.nvmlDeviceGetName(h1) == "other"
    scenario.gpu(0).recovered()
    scenario.write()
    assert N.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"


def test_a_gpu_can_be_lost_after_a_delay_and_return(scenario: Scenario, nvml: Any) -> None:
    """The loss is scheduled in driver time, which ``advance_clock`` moves on without waiting."""
    N = nvml
    # Lost NEVER_S after the scenario loads: no machine is that slow to the first read.
    full_gpu(scenario.add_gpu()).lost(after_s=NEVER_S, until_s=2 * NEVER_S)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetPowerUsage(h) == 612345
    advance_clock(NEVER_S)
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetPowerUsage(h)
    advance_clock(NEVER_S)
    assert N.nvmlDeviceGetPowerUsage(h) == 612345


def test_string_buffers_that_are_too_small(full: Any) -> None:
    N = full
    h = N.nvmlDeviceGetHandleByIndex(0)
    fn = N._nvmlGetFunctionPointer("nvmlDeviceGetName")
    buf = ctypes.create_string_buffer(5)
    assert fn(h, buf, ctypes.c_uint(5)) == N.NVML_ERROR_INSUFFICIENT_SIZE
    buf = ctypes.create_string_buffer(96)
    assert fn(h, buf, ctypes.c_uint(96)) == N.NVML_SUCCESS
    assert isinstance(buf.value, bytes)  # C hands out bytes; pynvml decodes to str


def test_calls_before_init_are_uninitialized(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    full_gpu(scenario.add_gpu())
    scenario.write()
    N.nvmlInit()
    N.nvmlShutdown()
    fn = N._nvmlGetFunctionPointer("nvmlDeviceGetCount_v2")
    count = ctypes.c_uint()
    assert fn(ctypes.byref(count)) == N.NVML_ERROR_UNINITIALIZED


def test_init_is_reference_counted(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    full_gpu(scenario.add_gpu())
    scenario.write()
    N.nvmlInit()
    N.nvmlInit()
    N.nvmlShutdown()
    assert N.nvmlDeviceGetCount() == 1
    N.nvmlShutdown()
    with pytest.raises(N.NVMLError_Uninitialized):
        N.nvmlDeviceGetCount()


@pytest.mark.parametrize(
    ("err", "exc"), [("DRIVER_NOT_LOADED", "NVMLError_DriverNotLoaded"), ("NO_PERMISSION", "NVMLError_NoPermission")]
)
def test_init_failures(scenario: Scenario, nvml: Any, err: str, exc: str) -> None:
    N = nvml
    full_gpu(scenario.add_gpu())
    scenario.init_error = err
    scenario.write()
    with pytest.raises(getattr(N, exc)):
        N.nvmlInit()
    scenario.init_error = None
    scenario.write()
    N.nvmlInit()  # the driver came back
    assert N.nvmlDeviceGetCount() == 1


def test_driver_disappearing_while_initialised(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    full_gpu(scenario.add_gpu())
    scenario.write()
    N.nvmlInit()
    scenario.init_error = "DRIVER_NOT_LOADED"
    scenario.write()
    with pytest.raises(N.NVMLError_DriverNotLoaded):
        N.nvmlDeviceGetCount()
    scenario.init_error = None
    scenario.write()
    assert N.nvmlDeviceGetCount() == 1


def test_pcie_throughput_blocks_for_the_sampling_time(scenario: Scenario, nvml: Any) -> None:
    import threading
    import time

    N = nvml
    sample_s, gpus = 0.2, 64
    for _ in range(gpus):
        full_gpu(scenario.add_gpu()).pcie(sample_ms=sample_s * 1000)
    scenario.write()
    N.nvmlInit()
    handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    t0 = time.monotonic()
    N.nvmlDeviceGetPcieThroughput(handles[0], 0)
    one = time.monotonic() - t0
    assert one >= sample_s
    # 64 GPUs sampled from 64 threads overlap: the fake does not hold its lock while sampling.
    # One after another they would take 12.8 s, more than one sample + LATE_S.
    assert gpus * sample_s > sample_s + LATE_S
    t0 = time.monotonic()
    threads = [threading.Thread(target=N.nvmlDeviceGetPcieThroughput, args=(h, 0)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - t0 < sample_s + LATE_S


def test_default_pcie_sampling_time_is_20ms(scenario: Scenario, nvml: Any) -> None:
    import time

    N = nvml
    full_gpu(scenario.add_gpu()).unset("pcie.sample_ms")
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    t0 = time.monotonic()
    N.nvmlDeviceGetPcieThroughput(h, 0)
    assert time.monotonic() - t0 >= 0.02


def test_injected_delay_hangs_calls_on_that_device_only(scenario: Scenario, nvml: Any) -> None:
    import time

    N = nvml
    full_gpu(scenario.add_gpu()).delay(300)
    full_gpu(scenario.add_gpu())
    scenario.write()
    N.nvmlInit()
    h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
    t0 = time.monotonic()
    N.nvmlDeviceGetPowerUsage(h0)
    assert time.monotonic() - t0 >= 0.3
    # GPU 0 now hangs for NEVER_S: a call on GPU 1 that shared its delay would miss LATE_S.
    scenario.gpu(0).delay(NEVER_S * 1000)
    scenario.write()
    t0 = time.monotonic()
    N.nvmlDeviceGetPowerUsage(h1)
    assert time.monotonic() - t0 < LATE_S


def test_moving_counters_advance_at_their_rate(scenario: Scenario, nvml: Any) -> None:
    import time

    N = nvml
    g = full_gpu(scenario.add_gpu())
    g.energy(Counter(1000, 1_000_000)).pcie(replay=Counter(0, 500_000))
    g.nvlink(0, True, tx_kib=Counter(0, 2_000_000)).ecc(corrected=Counter(0, 100_000), uncorrected=0)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)

    def read() -> tuple[float, float, list[int]]:
        before = time.monotonic()
        fv = N.nvmlDeviceGetFieldValues(h, [(N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)])
        vals = [
            N.nvmlDeviceGetTotalEnergyConsumption(h),
            N.nvmlDeviceGetPcieReplayCounter(h),
            fv[0].value.ullVal,
            N.nvmlDeviceGetTotalEccErrors(h, 0, 1),
        ]
        return before, time.monotonic(), vals

    # Each value was read between ``before`` and ``after``: the rate lies between the change over the
    # longest span and over the shortest, however late a busy machine ran either read.
    before0, after0, a = read()
    time.sleep(0.25)
    before1, after1, b = read()
    for x, y, want in zip(a, b, [1_000_000, 500_000, 2_000_000, 100_000], strict=True):
        slowest, fastest = (y - x) / (after1 - before0), (y - x) / (before1 - after0)
        assert slowest < want * 1.25 and fastest > want * 0.8, (want, slowest, fastest)


def test_sys_error_values_and_unknown_handles(full: Any) -> None:
    N = full
    bogus = ctypes.pointer(ctypes.c_int(0))
    fn = N._nvmlGetFunctionPointer("nvmlDeviceGetPowerUsage")
    out = ctypes.c_uint()
    assert fn(ctypes.cast(bogus, N.c_nvmlDevice_t), ctypes.byref(out)) == N.NVML_ERROR_INVALID_ARGUMENT


def test_err_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown NVML error"):
        Err("NOT_SUPPORTD")
    assert str(NOT_SUPPORTED) == "!NOT_SUPPORTED" and str(GPU_IS_LOST) == "!GPU_IS_LOST"
