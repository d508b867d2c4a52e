"""The NVML backend: the only module that knows pynvml.

Every query goes through ``_Device.call``, which turns NVML's answers into what the rest of the
exporter understands: a value, ``None`` for "this card does not support it" (remembered, so it is
not asked again until the next static refresh), or ``GpuLost``.  Units are converted here, once:
PCIe throughput arrives in KB/s, NVLink counters in KiB, power in mW, energy in mJ, clocks in MHz.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

import pynvml
import structlog

from ..snapshot import Activity, GpuReading, GpuStatic, MigReading, NvLinkReading, ProcessReading
from .backend import BackendUnavailable, ErrorSink, GpuLost, SystemInfo
from .gpm import METRIC_FIELDS, MetricAnswer, SamplePair, activity_of
from .procfs import process_user

log = structlog.get_logger(__name__)

T = TypeVar("T")

_ERROR_NAMES: dict[int, str] = {
    v: k.removeprefix("NVML_ERROR_").lower()
    for k, v in vars(pynvml).items()
    if k.startswith("NVML_ERROR_") and isinstance(v, int)
}
# Answers meaning "this card or driver does not have that": left out, not an error to retry.
_UNSUPPORTED = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
# Answers meaning the driver itself is gone: no GPU can be read until NVML is initialised again.
_DRIVER_GONE = {
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
}

CLOCKS = {"graphics": pynvml.NVML_CLOCK_GRAPHICS, "sm": pynvml.NVML_CLOCK_SM, "memory": pynvml.NVML_CLOCK_MEM,
          "video": pynvml.NVML_CLOCK_VIDEO}  # fmt: skip
THRESHOLDS = {
    "shutdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    "slowdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    "mem_max": pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
    "gpu_max": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
}
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock_setting": 0x100,
}
# Field ids are part of the driver's ABI (nvml.h); older nvidia-ml-py releases lack some names.
_FI_MEMORY_TEMP = getattr(pynvml, "NVML_FI_DEV_MEMORY_TEMP", 82)
_FI_NVLINK_LINK_COUNT = getattr(pynvml, "NVML_FI_DEV_NVLINK_LINK_COUNT", 91)
_FI_PCIE_TX = getattr(pynvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197)
_FI_PCIE_RX = getattr(pynvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)
_FI_NVLINK_TX = getattr(pynvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138)  # KiB
_FI_NVLINK_RX = getattr(pynvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139)  # KiB
_PCIE_COUNTERS = ((_FI_PCIE_TX, 0), (_FI_PCIE_RX, 0))
# A byte counter narrower than 64 bits can wrap more than once between polls at PCIe speeds, so
# only 64-bit answers make a rate; the shortest span worth dividing by (seconds of driver time).
_WIDE_VALUES = frozenset({pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG})
_PCIE_MIN_SPAN_S = 0.1
_XID_WAIT_MS = 500
# The names under which each link's state query is remembered: built once, not per link and poll.
_NVLINK_STATE = tuple(f"nvmlDeviceGetNvLinkState({link})" for link in range(pynvml.NVML_NVLINK_MAX_LINKS))
_GPM_IDS = tuple(METRIC_FIELDS)
# nvmlGpmMetricsGet_t's metrics[] is NVML_GPM_METRIC_MAX long: 98, 210 and 477 in different
# releases, under the same struct version 1.  A driver built with a larger maximum than the
# bindings could write past their array, so we hand it our own struct, longer than any so far.
_GPM_METRIC_SLOTS = 1024
# NVML's "not available" in an unsigned answer; never a real reading.
_SENTINELS = frozenset({0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})


def error_name(code: int) -> str:
    return _ERROR_NAMES.get(code, f"error_{code}")


def _cuda_version(v: int | None) -> str | None:
    return None if v is None else f"{v // 1000}.{v % 1000 // 10}"


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t (nvml.h) in plain ctypes; the union read by ``valueType``."""

    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32), ("timestamp", ctypes.c_int64),
                ("latencyUsec", ctypes.c_int64), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", pynvml.c_nvmlValue_t)]  # fmt: skip


def _field_array(fields: tuple[tuple[int, int], ...]) -> Any:
    array = (_FieldValue * len(fields))()
    for entry, (field_id, scope) in zip(array, fields, strict=True):
        entry.fieldId, entry.scopeId = field_id, scope
    return array


def _get_field_values(handle: Any, array: Any) -> Any:
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    pynvml._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(array)), array))
    return array


_VALUE_READERS: dict[int, Callable[[Any], int | float]] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: lambda v: float(v.dVal),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: lambda v: int(v.uiVal),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: lambda v: int(v.ulVal),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: lambda v: int(v.sllVal),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: lambda v: int(v.siVal),
}


def _field_value(fv: Any) -> int | float:
    read = _VALUE_READERS.get(fv.valueType)
    return read(fv.value) if read is not None else int(fv.value.ullVal)


class _Device:
    """One GPU's handle and what we learnt it cannot do."""

    def __init__(self, index: int, handle: Any, errors: ErrorSink) -> None:
        self.index = index
        self.handle = handle
        self.unsupported: set[str] = set()
        self.missing: set[str] = set()  # functions this driver does not have at all
        self.unsupported_fields: set[tuple[int, int]] = set()
        self.field_array: tuple[tuple[tuple[int, int], ...], Any] | None = None  # (fields, ctypes array)
        # The PCIe byte counters (tx, rx, driver timestamp in us) of this poll and of the one a
        # rate was last taken from; None where they are missing or too narrow to trust.
        self.pcie_counts: tuple[int, int, int] | None = None
        self.pcie_counted: tuple[int, int, int] | None = None
        self.pcie_rates: tuple[float, float] | None = None  # the last rate taken from them
        self.process_names: dict[int, str] = {}
        self.mig_process_names: dict[int, str] = {}
        self.process_users: dict[int, str | None] = {}  # pid -> user, looked up once per process
        self.process_util_seen = 0  # driver timestamp (us) of the newest per-process sample read
        self.process_util_at: float | None = None  # when it was last read (monotonic)
        self.process_util: dict[int, tuple[float | None, float | None]] = {}  # pid -> (sm, memory) then
        self.gpm: SamplePair[Any] | None = None
        self.mig_gpm: dict[tuple[int, str, str], SamplePair[Any]] = {}  # (gi, MIG uuid, profile)
        self.lost = False
        self.uuid_seen = ""
        self._errors = errors

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(handle, *args)``; None when unsupported or failing, GpuLost when the GPU is gone.

        ``what`` names the query (function plus argument) for the once-only unsupported memory;
        the error metric only gets the function name, to keep its labels bounded.
        """
        if what in self.unsupported:
            return None
        try:
            value = fn(self.handle, *args)
            if isinstance(value, int) and value in _SENTINELS:
                self._errors(what.split("(", 1)[0], "out_of_range")
                return None
            return value
        except pynvml.NVMLError as e:
            function = what.split("(", 1)[0]
            if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                self._errors(function, "gpu_is_lost")
                self.lost = True
                raise GpuLost(f"GPU {self.index}: {function}: {e}") from e
            if e.value in _DRIVER_GONE:
                self._errors(function, error_name(e.value))
                raise _unavailable(e) from e
            if e.value in _UNSUPPORTED:
                self.unsupported.add(what)
                missing = e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
                if missing:
                    self.missing.add(what)  # an older driver: said apart, so the reason is visible
                self._errors(function, "function_not_found" if missing else "not_supported")
                log.debug("nvml_query_unsupported", gpu=self.index, query=what)
                return None
            self._errors(function, error_name(e.value))
            return None


class _Baton:
    """Lets one GPU reader at a time make its quick calls, without ever making one wait on a hung GPU.

    A reader waits while the baton moves on; a holder stuck in the driver for ``stuck_s`` loses it
    (the others get a fresh one), so a hung GPU delays the others by ``stuck_s`` once, then not at all.
    """

    def __init__(self, wait_s: float = 0.02, stuck_s: float = 0.1, monotonic: Callable[[], float] = time.monotonic):
        self._wait_s = wait_s
        self._stuck_s = stuck_s
        self._mono = monotonic
        self._baton = threading.Lock()
        self._taken_at = 0.0
        self._swap = threading.Lock()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        while True:
            baton = self._baton
            if baton.acquire(timeout=self._wait_s):
                self._taken_at = self._mono()
                try:
                    yield
                finally:
                    baton.release()
                return
            if self._mono() - self._taken_at >= self._stuck_s:
                with self._swap:
                    if self._baton is baton:
                        self._baton = threading.Lock()  # the stuck holder releases the old one, if ever
                        self._taken_at = self._mono()


class NvmlBackend:
    """Reads GPUs through the real NVML library (libnvidia-ml.so.1) via nvidia-ml-py."""

    def __init__(
        self,
        errors: ErrorSink,
        *,
        profiling_interval: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
        disabled: frozenset[str] = frozenset(),
    ) -> None:
        self._errors = errors
        # Collectors switched off: their queries are never made (and their series are absent).
        self._nvlink, self._clocks, self._ecc, self._processes_on, self._profiling = (
            name not in disabled for name in ("nvlink", "clocks", "ecc", "processes", "profiling")
        )
        # GPM and per-process utilization are re-read this often: the driver's own CPU cost of
        # them (about 1.2 ms per GPM pair, 2 ms per process read, on an H200) dwarfs everything
        # else a poll does, so they get their own, slower cadence.
        self._profiling_interval = profiling_interval
        self._mono = monotonic
        self._devices: dict[int, _Device] = {}
        self._lock = threading.Lock()
        self._baton = _Baton()
        self._xid_counts: dict[int, Counter[int]] = {}
        # One XID thread for the backend's life, watching the NVML session of the moment: a
        # registration stuck in a hung driver holds that one thread, however often NVML restarts.
        self._xid_cond = threading.Condition()
        self._xid_session: tuple[int, int] | None = None  # (serial, GPU count) while open
        self._xid_serial = 0
        self._xid_idle = threading.Event()
        self._xid_idle.set()
        self._xid_thread: threading.Thread | None = None
        self._open = False

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> SystemInfo:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise _unavailable(e) from e
        self._open = True
        driver = _try(pynvml.nvmlSystemGetDriverVersion)
        cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            self.close()
            raise _unavailable(e) from e
        with self._xid_cond:
            self._xid_serial += 1
            self._xid_session = (self._xid_serial, count)
            self._xid_cond.notify_all()
        if self._xid_thread is None or not self._xid_thread.is_alive():
            self._xid_thread = threading.Thread(target=self._watch_xids, name="xid-events", daemon=True)
            self._xid_thread.start()
        return SystemInfo(driver_version=driver, cuda_version=_cuda_version(cuda), gpu_count=count)

    def count(self) -> int | None:
        try:
            return int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as e:
            if e.value in _DRIVER_GONE:
                raise _unavailable(e) from e
            self._errors("nvmlDeviceGetCount", error_name(e.value))
            return None

    def close(self) -> None:
        with self._xid_cond:
            self._xid_session = None
            self._xid_cond.notify_all()
        # Let the XID thread free its event set before NVML shuts down, unless the driver holds it.
        self._xid_idle.wait(timeout=2 * _XID_WAIT_MS / 1000)
        with self._lock:
            devices = list(self._devices.values())
            self._devices.clear()
        for dev in devices:
            self._free_gpm(dev)
        if self._open:
            self._open = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    # -- static facts -------------------------------------------------------------------------
    def read_static(self, index: int) -> GpuStatic:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as e:
            self._errors("nvmlDeviceGetHandleByIndex", error_name(e.value))
            raise GpuLost(f"GPU {index}: {e}") from e
        dev = _Device(index, handle, self._errors)
        uuid = dev.call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID)
        if uuid is None:
            raise GpuLost(f"GPU {index}: its UUID cannot be read")
        pci = dev.call("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo)
        mig = dev.call("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode)
        fans = dev.call("nvmlDeviceGetNumFans", pynvml.nvmlDeviceGetNumFans)
        if fans is None and "nvmlDeviceGetNumFans" in dev.missing:
            fans = -1  # an older driver: fall back to the one-fan nvmlDeviceGetFanSpeed
        static = GpuStatic(
            index=index,
            uuid=uuid,
            name=dev.call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName) or "unknown",
            pci_bus_id=pci.busId if pci is not None else "",
            serial=dev.call("nvmlDeviceGetSerial", pynvml.nvmlDeviceGetSerial),
            mig_mode="unsupported" if mig is None else ("enabled" if mig[0] else "disabled"),
            clock_max_hertz=MappingProxyType(
                {
                    name: mhz * 1e6
                    for name, kind in CLOCKS.items()
                    if self._clocks
                    and (mhz := dev.call(f"nvmlDeviceGetMaxClockInfo({name})", pynvml.nvmlDeviceGetMaxClockInfo, kind))
                    is not None
                }
            ),
            pcie_max_generation=dev.call(
                "nvmlDeviceGetMaxPcieLinkGeneration", pynvml.nvmlDeviceGetMaxPcieLinkGeneration
            ),
            pcie_max_width=dev.call("nvmlDeviceGetMaxPcieLinkWidth", pynvml.nvmlDeviceGetMaxPcieLinkWidth),
            temperature_thresholds_celsius=MappingProxyType(
                {
                    name: float(t)
                    for name, kind in THRESHOLDS.items()
                    if (
                        t := dev.call(
                            f"nvmlDeviceGetTemperatureThreshold({name})", pynvml.nvmlDeviceGetTemperatureThreshold, kind
                        )
                    )
                    is not None
                }
            ),
            fan_count=fans or 0,
            nvlink_count=self._count_nvlinks(dev) if self._nvlink else 0,
            gpm_supported=self._gpm_supported(dev) if self._profiling else False,
        )
        with self._lock:
            old = self._devices.get(index)
            self._devices[index] = dev
        if old is not None:
            if old.uuid_seen == uuid and not old.lost:
                # A static refresh of the same GPU: keep its GPM samples and PCIe counts, so
                # activity and throughput have no gap.
                dev.gpm, dev.mig_gpm = old.gpm, old.mig_gpm
                dev.pcie_counted, dev.pcie_rates = old.pcie_counted, old.pcie_rates
                old.gpm, old.mig_gpm = None, {}
                for pair in [dev.gpm, *dev.mig_gpm.values()]:
                    if pair is not None:
                        pair.unsupported.clear()  # asked again after each static refresh, as other queries are
                if dev.gpm is not None and dev.gpm.closed:
                    dev.gpm = None
                dev.mig_gpm = {k: v for k, v in dev.mig_gpm.items() if not v.closed}
            else:
                self._free_gpm(old)
        dev.uuid_seen = uuid
        return static

    # -- per poll -------------------------------------------------------------------------------
    def read_gpu(self, static: GpuStatic) -> GpuReading:
        with self._lock:
            dev = self._devices.get(static.index)
        if dev is None:
            raise GpuLost(f"GPU {static.index} has not been discovered")
        # The quick calls one GPU at a time: each ctypes call lets go of the GIL, and eight readers
        # doing them at once hand it to each other on every call (a thread switch each, which
        # cost more than the calls).  Only the blocking PCIe reads below run side by side.
        with self._baton.hold():
            reading = self._read_quick(dev, static)
        rates = _pcie_rates(dev)
        if rates is not None:
            return replace(reading, pcie_tx_bytes_per_second=rates[0], pcie_rx_bytes_per_second=rates[1])
        N = pynvml
        c = dev.call
        # No counters to take a rate from (the first poll, an older card, a wrapped counter): the
        # driver's own sample, each blocking ~20 ms (and 0.7 ms of CPU on an H200) while it watches the link.
        tx = c("nvmlDeviceGetPcieThroughput(tx)", N.nvmlDeviceGetPcieThroughput, N.NVML_PCIE_UTIL_TX_BYTES)
        rx = c("nvmlDeviceGetPcieThroughput(rx)", N.nvmlDeviceGetPcieThroughput, N.NVML_PCIE_UTIL_RX_BYTES)
        if tx is None and rx is None:
            return reading
        return replace(reading, pcie_tx_bytes_per_second=tx * 1024 if tx is not None else None,
                       pcie_rx_bytes_per_second=rx * 1024 if rx is not None else None)  # fmt: skip

    def _read_quick(self, dev: _Device, static: GpuStatic) -> GpuReading:
        """Everything but the PCIe throughput, which blocks."""
        N = pynvml
        c = dev.call
        util = c("nvmlDeviceGetUtilizationRates", N.nvmlDeviceGetUtilizationRates)
        enc = c("nvmlDeviceGetEncoderUtilization", N.nvmlDeviceGetEncoderUtilization)
        dec = c("nvmlDeviceGetDecoderUtilization", N.nvmlDeviceGetDecoderUtilization)
        total, used, free, reserved = self._memory(dev)
        temperature = c("nvmlDeviceGetTemperature", N.nvmlDeviceGetTemperature, N.NVML_TEMPERATURE_GPU)
        fields = self._fields(dev, static)
        temps = {"gpu": float(temperature)} if temperature is not None else {}
        if (mt := fields.get((_FI_MEMORY_TEMP, 0))) is not None:
            temps["memory"] = float(mt)
        fans = {
            str(i): r
            for i in range(static.fan_count)
            if (r := self._ratio("nvmlDeviceGetFanSpeed_v2",
                                 c(f"nvmlDeviceGetFanSpeed_v2({i})", N.nvmlDeviceGetFanSpeed_v2, i))) is not None
        }  # fmt: skip
        if (
            static.fan_count < 0
            and (r := self._ratio("nvmlDeviceGetFanSpeed", c("nvmlDeviceGetFanSpeed", N.nvmlDeviceGetFanSpeed)))
            is not None
        ):
            fans["0"] = r
        power = c("nvmlDeviceGetPowerUsage", N.nvmlDeviceGetPowerUsage)
        limit = c("nvmlDeviceGetEnforcedPowerLimit", N.nvmlDeviceGetEnforcedPowerLimit)
        energy = c("nvmlDeviceGetTotalEnergyConsumption", N.nvmlDeviceGetTotalEnergyConsumption)
        clocks = {
            name: mhz * 1e6
            for name, kind in CLOCKS.items()
            if self._clocks
            and (mhz := c(f"nvmlDeviceGetClockInfo({name})", N.nvmlDeviceGetClockInfo, kind)) is not None
        }
        pstate = c("nvmlDeviceGetPerformanceState", N.nvmlDeviceGetPerformanceState) if self._clocks else None
        reasons = (
            c("nvmlDeviceGetCurrentClocksEventReasons", N.nvmlDeviceGetCurrentClocksEventReasons)
            if self._clocks
            else None
        )
        gen = c("nvmlDeviceGetCurrPcieLinkGeneration", N.nvmlDeviceGetCurrPcieLinkGeneration)
        width = c("nvmlDeviceGetCurrPcieLinkWidth", N.nvmlDeviceGetCurrPcieLinkWidth)
        replay = c("nvmlDeviceGetPcieReplayCounter", N.nvmlDeviceGetPcieReplayCounter)
        ecc = {
            kind: n
            for kind, etype in (("corrected", N.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                ("uncorrected", N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
            if self._ecc and (n := c(f"nvmlDeviceGetTotalEccErrors({kind})", N.nvmlDeviceGetTotalEccErrors, etype,
                       N.NVML_AGGREGATE_ECC)) is not None
        }  # fmt: skip
        rows = c("nvmlDeviceGetRemappedRows", N.nvmlDeviceGetRemappedRows) if self._ecc else None
        nvlinks = tuple(
            NvLinkReading(
                link=link,
                up=None if (st := c(_NVLINK_STATE[link], N.nvmlDeviceGetNvLinkState, link)) is None
                else st == N.NVML_FEATURE_ENABLED,
                tx_bytes_total=_kib(fields.get((_FI_NVLINK_TX, link))),
                rx_bytes_total=_kib(fields.get((_FI_NVLINK_RX, link))),
            )
            for link in range(static.nvlink_count)
        )  # fmt: skip
        with self._lock:
            xids = MappingProxyType(dict(self._xid_counts.get(static.index, {})))
        processes = self._processes(dev, dev.process_names, dev.process_users,
                                    dev.process_util if static.mig_mode != "enabled" else None) \
            if self._processes_on else ()  # fmt: skip
        # Names of processes that exited go with them, so the cache stays the size of the GPU's users.
        dev.process_names = {p.pid: p.name for p in processes}
        dev.process_users = {p.pid: p.user for p in processes}
        if processes and static.mig_mode != "enabled":
            processes = self._process_utilization(dev, processes)
        activity = self._gpm_activity(dev, dev.gpm, lambda s: pynvml.nvmlGpmSampleGet(dev.handle, s.handle)) \
            if static.gpm_supported else None  # fmt: skip
        return GpuReading(
            index=static.index,
            uuid=static.uuid,
            up=True,
            static=static,
            utilization_ratio=self._ratio("nvmlDeviceGetUtilizationRates", util.gpu if util else None),
            memory_copy_utilization_ratio=self._ratio("nvmlDeviceGetUtilizationRates", util.memory if util else None),
            encoder_utilization_ratio=self._ratio("nvmlDeviceGetEncoderUtilization", enc[0] if enc else None),
            decoder_utilization_ratio=self._ratio("nvmlDeviceGetDecoderUtilization", dec[0] if dec else None),
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            temperature_celsius=MappingProxyType(temps),
            fan_speed_ratio=MappingProxyType(fans),
            power_usage_watts=power / 1000 if power is not None else None,
            power_limit_watts=limit / 1000 if limit is not None else None,
            energy_consumed_joules_total=energy / 1000 if energy is not None else None,
            clock_hertz=MappingProxyType(clocks),
            performance_state=int(pstate) if pstate is not None and pstate != N.NVML_PSTATE_UNKNOWN else None,
            clock_event_active=MappingProxyType(
                {} if reasons is None else {name: bool(reasons & bit) for name, bit in CLOCK_EVENT_REASONS.items()}
            ),
            pcie_tx_bytes_total=_int(fields.get((_FI_PCIE_TX, 0))),
            pcie_rx_bytes_total=_int(fields.get((_FI_PCIE_RX, 0))),
            pcie_link_generation=gen,
            pcie_link_width=width,
            pcie_replay_errors_total=replay,
            nvlinks=nvlinks,
            ecc_errors_total=MappingProxyType(ecc),
            remapped_rows_total=MappingProxyType(
                {} if rows is None else {"correctable": rows[0], "uncorrectable": rows[1]}
            ),
            row_remap_pending=bool(rows[2]) if rows is not None else None,
            row_remap_failure=bool(rows[3]) if rows is not None else None,
            xid_errors_total=xids,
            processes=processes,
            migs=self._migs(dev, static) if static.mig_mode == "enabled" else (),
            activity=activity,
        )

    def _ratio(self, function: str, percent: int | None) -> float | None:
        """A percentage as a ratio; beyond 100 it is a sentinel or garbage: left out, and counted."""
        if percent is None:
            return None
        if not 0 <= percent <= 100:
            self._errors(function, "out_of_range")
            return None
        return percent / 100

    def _memory(self, dev: _Device) -> tuple[int | None, int | None, int | None, int | None]:
        """Memory through the v2 struct, whose ``used`` excludes driver-reserved memory.

        Drivers before R510 lack v2; their v1 ``used`` includes the reserved part.
        """
        v2 = dev.call("nvmlDeviceGetMemoryInfo(v2)", _memory_v2)
        if v2 is not None:
            return v2.total, v2.used, v2.free, v2.reserved
        v1 = dev.call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo)
        if v1 is not None:
            return v1.total, v1.used, v1.free, None
        return None, None, None, None

    def _fields(self, dev: _Device, static: GpuStatic) -> dict[tuple[int, int], int | float]:
        wanted = [(_FI_MEMORY_TEMP, 0), (_FI_PCIE_TX, 0), (_FI_PCIE_RX, 0)]
        for link in range(static.nvlink_count):
            wanted += [(_FI_NVLINK_TX, link), (_FI_NVLINK_RX, link)]
        key = tuple(w for w in wanted if w not in dev.unsupported_fields)
        if not key:
            return {}
        # One array per GPU, kept while the wanted fields stay the same: no per-poll allocation,
        # and plain ctypes, as nvidia-ml-py's hooked structs cost a Python call per field read.
        if dev.field_array is None or dev.field_array[0] != key:
            dev.field_array = (key, _field_array(key))
        array = dev.field_array[1]
        dev.pcie_counts = None
        if dev.call("nvmlDeviceGetFieldValues", _get_field_values, array) is None:
            return {}
        out: dict[tuple[int, int], int | float] = {}
        for k, fv in zip(key, array, strict=True):
            ret = fv.nvmlReturn
            if ret == pynvml.NVML_SUCCESS:
                out[k] = _field_value(fv)
            elif ret in _UNSUPPORTED:
                dev.unsupported_fields.add(k)
                self._errors("nvmlDeviceGetFieldValues", "not_supported")
            elif ret == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"GPU {dev.index}: nvmlDeviceGetFieldValues: GPU is lost")
            else:
                self._errors("nvmlDeviceGetFieldValues", error_name(ret))
        tx, rx = (out.get(k) for k in _PCIE_COUNTERS)
        if tx is not None and rx is not None:
            stamps = [fv.timestamp for k, fv in zip(key, array, strict=True)
                      if k in _PCIE_COUNTERS and fv.valueType in _WIDE_VALUES]  # fmt: skip
            if len(stamps) == 2:
                dev.pcie_counts = (int(tx), int(rx), max(stamps))
        return out

    def _migs(self, dev: _Device, static: GpuStatic) -> tuple[MigReading, ...]:
        """The MIG devices of a GPU in MIG mode: memory, processes and GPM activity.

        GPU-Util and most other values are only per parent GPU (NVML answers NOT_SUPPORTED on a
        MIG handle), so they are not asked for here; GPM is the one utilization per instance.
        """
        N = pynvml
        count = dev.call("nvmlDeviceGetMaxMigDeviceCount", N.nvmlDeviceGetMaxMigDeviceCount) or 0
        out = []
        for i in range(count):
            try:
                handle = N.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
            except N.NVMLError as e:
                if e.value == N.NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost(f"GPU {dev.index}: MIG device {i}: {e}") from e
                continue  # NOT_FOUND: an empty slot
            mig = _Device(dev.index, handle, self._errors)
            mig.unsupported = dev.unsupported  # learnt once per GPU, not per MIG device
            uuid = mig.call("nvmlDeviceGetUUID(mig)", N.nvmlDeviceGetUUID)
            if uuid is None:
                continue
            name = mig.call("nvmlDeviceGetName(mig)", N.nvmlDeviceGetName) or ""
            mem = mig.call("nvmlDeviceGetMemoryInfo(mig)", N.nvmlDeviceGetMemoryInfo)
            gi = mig.call("nvmlDeviceGetGpuInstanceId", N.nvmlDeviceGetGpuInstanceId)
            profile = _mig_profile(name)
            out.append(
                MigReading(
                    index=i,
                    uuid=uuid,
                    profile=profile,
                    gpu_instance_id=gi,
                    compute_instance_id=mig.call("nvmlDeviceGetComputeInstanceId", N.nvmlDeviceGetComputeInstanceId),
                    memory_total_bytes=mem.total if mem is not None else None,
                    memory_used_bytes=mem.used if mem is not None else None,
                    memory_free_bytes=mem.free if mem is not None else None,
                    processes=self._processes(mig, dev.mig_process_names, dev.process_users)
                    if self._processes_on
                    else (),
                    activity=self._mig_activity(dev, gi, uuid, profile) if static.gpm_supported else None,
                )
            )
        dev.mig_process_names = {p.pid: p.name for m in out for p in m.processes}
        if static.gpm_supported:
            # An instance that is gone, or re-created under another identity, loses its samples:
            # a new one is never diffed against the old one's counters.
            live = {(m.gpu_instance_id, m.uuid, m.profile) for m in out}
            for key in [k for k in dev.mig_gpm if k not in live]:
                dev.mig_gpm.pop(key).close()
        return tuple(out)

    # -- GPM ---------------------------------------------------------------------------------
    def _gpm_supported(self, dev: _Device) -> bool:
        support = dev.call("nvmlGpmQueryDeviceSupport", pynvml.nvmlGpmQueryDeviceSupport)
        if support is None:
            return False
        if not support.isSupportedDevice:
            # Not an error of the card: a GPU before Hopper.  Counted once, like other unsupported queries.
            self._errors("nvmlGpmQueryDeviceSupport", "not_supported")
            log.debug("gpm_unsupported", gpu=dev.index)
            return False
        return True

    def _mig_activity(self, dev: _Device, gi: int | None, uuid: str, profile: str) -> Activity | None:
        if gi is None:
            return None
        key = (gi, uuid, profile)
        pair = dev.mig_gpm.get(key)
        if pair is None and "nvmlGpmMigSampleGet" not in dev.unsupported:
            pair = self._new_pair(dev)
            if pair is not None:
                dev.mig_gpm[key] = pair
        return self._gpm_activity(
            dev, pair, lambda s: pynvml.nvmlGpmMigSampleGet(dev.handle, gi, s.handle), what="nvmlGpmMigSampleGet"
        )

    def _new_pair(self, dev: _Device) -> SamplePair[Any] | None:
        try:
            return SamplePair(_GPM_CALLS, self._mono, self._profiling_interval)
        except pynvml.NVMLError as e:
            self._gpm_failed(dev, "nvmlGpmSampleAlloc", e)
            return None

    def _gpm_activity(
        self, dev: _Device, pair: SamplePair[Any] | None, fill: Callable[[Any], Any], what: str = "nvmlGpmSampleGet"
    ) -> Activity | None:
        """One GPM sample of a GPU or GPU instance, diffed against the previous poll's."""
        if what in dev.unsupported or "nvmlGpmMetricsGet" in dev.unsupported:
            return None
        if pair is None and what == "nvmlGpmSampleGet":
            pair = dev.gpm = self._new_pair(dev)
        if pair is None:
            return None
        ids = tuple(i for i in _GPM_IDS if i not in pair.unsupported)
        if not ids:
            pair.close()  # this device has none of the metrics: keep no buffers for it
            return None
        try:
            answers, fresh = pair.take(fill, ids)
        except pynvml.NVMLError as e:
            self._gpm_failed(dev, getattr(e, "gpm_function", what), e)
            return None
        if answers is None:
            return None
        if fresh:
            self._gpm_checked(pair, answers)
            pair.activity = activity_of(answers)
        return pair.activity

    def _gpm_checked(self, pair: SamplePair[Any], answers: dict[int, MetricAnswer]) -> None:
        for metric, a in answers.items():
            if a.ratio is not None:
                continue
            if a.error in _UNSUPPORTED:
                pair.unsupported.add(metric)  # not asked again until the next static refresh
                self._errors("nvmlGpmMetricsGet", "not_supported")
            elif a.error:
                self._errors("nvmlGpmMetricsGet", error_name(a.error))
            else:
                self._errors("nvmlGpmMetricsGet", "out_of_range")

    def _gpm_failed(self, dev: _Device, function: str, e: pynvml.NVMLError) -> None:
        if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            self._errors(function, "gpu_is_lost")
            dev.lost = True
            raise GpuLost(f"GPU {dev.index}: {function}: {e}") from e
        if e.value in _DRIVER_GONE:
            self._errors(function, error_name(e.value))
            raise _unavailable(e) from e
        if e.value in _UNSUPPORTED or e.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
            # A version mismatch means this driver and these bindings disagree on the struct:
            # treated as unsupported (as gpud does), said once, until the next static refresh.
            dev.unsupported.add(function)
            self._errors(
                function, error_name(e.value) if e.value != pynvml.NVML_ERROR_NOT_SUPPORTED else "not_supported"
            )
            log.info("gpm_unavailable", gpu=dev.index, function=function, reason=str(e))
            self._free_gpm(dev, whole_gpu=function != "nvmlGpmMigSampleGet")
            return
        self._errors(function, error_name(e.value))

    def _free_gpm(self, dev: _Device, whole_gpu: bool = True) -> None:
        """Free the device's samples: all of them, or only its MIG instances' ones."""
        pairs = list(dev.mig_gpm.values())
        dev.mig_gpm = {}
        if whole_gpu and dev.gpm is not None:
            pairs.append(dev.gpm)
            dev.gpm = None
        for pair in pairs:
            try:
                if not pair.close():
                    log.warning("gpm_samples_leaked", gpu=dev.index, reason="a call on this GPU is stuck")
            except pynvml.NVMLError as e:
                self._errors("nvmlGpmSampleFree", error_name(e.value))

    # -- processes -------------------------------------------------------------------------------
    def _process_utilization(self, dev: _Device, processes: tuple[ProcessReading, ...]) -> tuple[ProcessReading, ...]:
        """Per-process SM and memory utilization, from the driver's samples since the previous poll.

        A process without a sample was idle since then (the driver keeps samples only of busy
        processes), so it reads 0; where the call is not supported, the fields stay None.
        """
        what = "nvmlDeviceGetProcessUtilization"
        if what in dev.unsupported:
            return _without_util(processes) if dev.process_util else processes
        now = self._mono()
        if dev.process_util_at is not None and now - dev.process_util_at < self._profiling_interval:
            # Not due: ``_processes`` filled in the values read last time (a new process waits).
            return processes
        dev.process_util_at = now
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(dev.handle, dev.process_util_seen)
        except pynvml.NVMLError as e:
            # NOT_FOUND: no process was busy since the last read.  nvidia-ml-py raises even on
            # SUCCESS when the driver had nothing to report.
            if e.value not in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):
                dev.call(what, _raise, e)  # counts it, and remembers NOT_SUPPORTED, as every query does
                return _without_util(processes)
            samples = []
        latest: dict[int, Any] = {}
        for sample in samples:
            seen = latest.get(sample.pid)
            if seen is None or sample.timeStamp > seen.timeStamp:
                latest[sample.pid] = sample
            dev.process_util_seen = max(dev.process_util_seen, int(sample.timeStamp))
        out = []
        dev.process_util = {}
        for p in processes:
            sample = latest.get(p.pid)
            sm = self._ratio(what, sample.smUtil) if sample is not None else 0.0
            mem = self._ratio(what, sample.memUtil) if sample is not None else 0.0
            dev.process_util[p.pid] = (sm, mem)
            out.append(replace(p, sm_utilization_ratio=sm, memory_utilization_ratio=mem))
        return tuple(out)

    def _processes(
        self,
        dev: _Device,
        names: dict[int, str],
        users: dict[int, str | None],
        util: dict[int, tuple[float | None, float | None]] | None = None,
    ) -> tuple[ProcessReading, ...]:
        """Compute and graphics processes; ``names`` and ``users`` are those already looked up, by pid,
        ``util`` the per-process utilization last read."""
        found: dict[int, ProcessReading] = {}
        no_util = (None, None)
        for kind, fn in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                         ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses)):  # fmt: skip
            for p in dev.call(f"nvmlDeviceGet{kind.title()}RunningProcesses", fn) or ():
                if p.pid in found:
                    continue
                name = names.get(p.pid) or _process_name(p.pid)
                user = users[p.pid] if p.pid in users else process_user(p.pid)
                sm, mem = util.get(p.pid, no_util) if util else no_util
                found[p.pid] = ProcessReading(pid=p.pid, name=name, used_memory_bytes=p.usedGpuMemory, kind=kind,
                                              user=user, sm_utilization_ratio=sm,
                                              memory_utilization_ratio=mem)  # fmt: skip
        return tuple(found.values())

    def _count_nvlinks(self, dev: _Device) -> int:
        """Links answer GetNvLinkState from 0 upwards; the first that does not is past the last."""
        n = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                pynvml.nvmlDeviceGetNvLinkState(dev.handle, link)
            except pynvml.NVMLError as e:
                if link == 0 and e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    # An empty NVLink panel needs a visible reason: this driver lacks the call.
                    self._errors("nvmlDeviceGetNvLinkState", "function_not_found")
                    log.warning("nvlink_state_unavailable", gpu=dev.index,
                                reason="the driver has no nvmlDeviceGetNvLinkState; links are not listed")  # fmt: skip
                break
            n += 1
        return n

    # -- XID events --------------------------------------------------------------------------
    def _watch_xids(self) -> None:
        """Count XID events per GPU, session after session.  Its own thread: the poller never waits on it."""
        while True:
            with self._xid_cond:
                self._xid_cond.wait_for(lambda: self._xid_session is not None)
                session = self._xid_session
                self._xid_idle.clear()
            assert session is not None
            try:
                self._watch_session(session)
            except Exception:
                log.exception("xid_watch_failed")
            finally:
                self._xid_idle.set()

    def _watch_session(self, session: tuple[int, int]) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as e:
            log.info("xid_events_unavailable", reason=str(e))
            with self._xid_cond:  # nothing to watch until NVML is opened again
                self._xid_cond.wait_for(lambda: self._xid_session != session)
            return
        handles: list[Any] = []
        for index in range(session[1]):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(index)
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
                handles.append(h)
            except pynvml.NVMLError as e:
                log.info("xid_events_unavailable", gpu=index, reason=str(e))
        try:
            while self._xid_session == session:
                if not handles:
                    with self._xid_cond:
                        self._xid_cond.wait_for(lambda: self._xid_session != session)
                    break
                try:
                    event = pynvml.nvmlEventSetWait_v2(event_set, _XID_WAIT_MS)
                except pynvml.NVMLError as e:
                    if e.value != pynvml.NVML_ERROR_TIMEOUT:
                        self._errors("nvmlEventSetWait", error_name(e.value))
                        with self._xid_cond:
                            self._xid_cond.wait_for(lambda: self._xid_session != session, timeout=1.0)
                    continue
                try:
                    index = pynvml.nvmlDeviceGetIndex(event.device)
                except pynvml.NVMLError:
                    continue
                with self._lock:
                    self._xid_counts.setdefault(index, Counter())[int(event.eventData)] += 1
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(event_set)


def _pcie_rates(dev: _Device) -> tuple[float, float] | None:
    """PCIe bytes per second, both ways, since the poll a rate was last taken from; None if there is none.

    The average over the whole poll interval, where the driver's own throughput query samples
    20 ms of it: a rate Prometheus would get from the counters, and no blocking call.
    """
    now, then = dev.pcie_counts, dev.pcie_counted
    if now is None or then is None or now[0] < then[0] or now[1] < then[1]:
        # No counters, a first reading, or a counter that wrapped or was reset: start over.
        dev.pcie_counted, dev.pcie_rates = now, None
        return None
    span = (now[2] - then[2]) / 1e6
    if span < _PCIE_MIN_SPAN_S:
        # Too short to divide by: the last rate stands, and the next span starts at the older reading.
        return dev.pcie_rates
    dev.pcie_counted = now
    dev.pcie_rates = (now[0] - then[0]) / span, (now[1] - then[1]) / span
    return dev.pcie_rates


def _memory_v2(handle: Any) -> Any:
    return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)


def _without_util(processes: tuple[ProcessReading, ...]) -> tuple[ProcessReading, ...]:
    return tuple(replace(p, sm_utilization_ratio=None, memory_utilization_ratio=None) for p in processes)


def _raise(handle: Any, e: pynvml.NVMLError) -> None:
    raise e


class _GpmMetric(ctypes.Structure):
    """nvmlGpmMetric_t (nvml.h), metricInfo flattened; plain ctypes, as nvidia-ml-py's
    attribute-hooked structs cost a Python call per field read."""

    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double),
                ("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]  # fmt: skip


class _GpmMetricsGet(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint),
                ("sample1", ctypes.c_void_p), ("sample2", ctypes.c_void_p),
                ("metrics", _GpmMetric * _GPM_METRIC_SLOTS)]  # fmt: skip


class _Sample(NamedTuple):
    """A GPM sample buffer: nvidia-ml-py's handle, and its address for our metrics struct."""

    handle: Any
    address: int


class _NvmlGpmCalls:
    """GPM through nvidia-ml-py, with a metrics struct long enough for any driver, one per thread
    (each GPU is read by one thread at a time), so polls allocate nothing."""

    def __init__(self) -> None:
        self._local = threading.local()

    def alloc(self) -> _Sample:
        handle = pynvml.nvmlGpmSampleAlloc()
        return _Sample(handle, ctypes.cast(handle, ctypes.c_void_p).value or 0)

    def free(self, sample: _Sample) -> None:
        pynvml.nvmlGpmSampleFree(sample.handle)

    def metrics(self, older: _Sample, newer: _Sample, ids: tuple[int, ...]) -> dict[int, tuple[int, float]]:
        mg = getattr(self._local, "mg", None)
        if mg is None:
            mg = self._local.mg = _GpmMetricsGet()
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(ids)
        mg.sample1, mg.sample2 = older.address, newer.address
        metrics = mg.metrics
        for i, metric in enumerate(ids):
            metrics[i].metricId = metric
        try:
            pynvml.nvmlGpmMetricsGet(mg)
        except pynvml.NVMLError as e:
            e.gpm_function = "nvmlGpmMetricsGet"  # tells the caller which of the pair's calls failed
            raise
        # Read back by position: the answers are in the order asked.
        return {metric: (metrics[i].nvmlReturn, metrics[i].value) for i, metric in enumerate(ids)}


_GPM_CALLS = _NvmlGpmCalls()


_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")


def _mig_profile(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` -> ``1g.10gb``."""
    m = _MIG_PROFILE.search(name)
    return m.group(1) if m else "unknown"


def _kib(v: int | float | None) -> int | None:
    return None if v is None else int(v) * 1024


def _int(v: int | float | None) -> int | None:
    return None if v is None else int(v)


def _try(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except pynvml.NVMLError:
        return None


def _process_name(pid: int) -> str:
    """The process's name from /proc when this container can see it, else as NVML knows it."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
        if name:
            return name
    except OSError:
        pass
    try:
        full = pynvml.nvmlSystemGetProcessName(pid)
    except pynvml.NVMLError:
        return "unknown"
    if isinstance(full, bytes):
        full = full.decode(errors="replace")
    return os.path.basename(full.split(" ", 1)[0]) or "unknown"


_REASONS = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "the NVIDIA driver library libnvidia-ml.so.1 was not found",
        "install the NVIDIA driver (or mount it into the container), or try --simulate to run without a GPU",
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded",
        "check `lsmod | grep nvidia` and the driver installation, or try --simulate to run without a GPU",
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVIDIA driver library does not match the loaded kernel module (driver upgraded without reboot?)",
        "reboot or reload the nvidia kernel module",
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "no permission to use the NVIDIA driver",
        "the exporter needs read access to /dev/nvidiactl and /dev/nvidia*; or try --simulate",
    ),
}


def _unavailable(e: pynvml.NVMLError) -> BackendUnavailable:
    reason, hint = _REASONS.get(
        e.value, (f"NVML could not be initialised: {e}", "or try --simulate to run without a GPU")
    )
    return BackendUnavailable(reason, hint)
