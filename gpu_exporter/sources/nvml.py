"""The NVML backend: the only module that knows pynvml.

Every query goes through ``_Device.call``, which turns NVML's answers into what the rest of the
exporter understands: a value, ``None`` for "this card does not support it" (remembered, so it is
not asked again until the next static refresh), or ``GpuLost``.  Units are converted here, once:
PCIe throughput arrives in KB/s, NVLink counters in KiB, power in mW, energy in mJ, clocks in MHz.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, TypeVar

import pynvml
import structlog

from ..snapshot import GpuReading, GpuStatic, MigReading, NvLinkReading, ProcessReading
from .backend import BackendUnavailable, ErrorSink, GpuLost, SystemInfo

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
_FI_MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
_FI_PCIE_TX = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
_FI_PCIE_RX = pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
_FI_NVLINK_TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX  # KiB
_FI_NVLINK_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX  # KiB
_XID_WAIT_MS = 500
# NVML's "not available" in an unsigned answer; never a real reading.
_SENTINELS = frozenset({0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})


def error_name(code: int) -> str:
    return _ERROR_NAMES.get(code, f"error_{code}")


def _cuda_version(v: int | None) -> str | None:
    return None if v is None else f"{v // 1000}.{v % 1000 // 10}"


def _field_value(fv: Any) -> int | float:
    vt = fv.valueType
    if vt == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(fv.value.dVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(fv.value.uiVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(fv.value.ulVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(fv.value.sllVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return int(fv.value.siVal)
    return int(fv.value.ullVal)


class _Device:
    """One GPU's handle and what we learnt it cannot do."""

    def __init__(self, index: int, handle: Any, errors: ErrorSink) -> None:
        self.index = index
        self.handle = handle
        self.unsupported: set[str] = set()
        self.unsupported_fields: set[tuple[int, int]] = set()
        self.process_names: dict[int, str] = {}
        self.mig_process_names: dict[int, str] = {}
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
                raise GpuLost(f"GPU {self.index}: {function}: {e}") from e
            if e.value in _DRIVER_GONE:
                self._errors(function, error_name(e.value))
                raise _unavailable(e) from e
            if e.value in _UNSUPPORTED:
                self.unsupported.add(what)
                self._errors(function, "not_supported")
                log.debug("nvml_query_unsupported", gpu=self.index, query=what)
                return None
            self._errors(function, error_name(e.value))
            return None


class NvmlBackend:
    """Reads GPUs through the real NVML library (libnvidia-ml.so.1) via nvidia-ml-py."""

    def __init__(self, errors: ErrorSink) -> None:
        self._errors = errors
        self._devices: dict[int, _Device] = {}
        self._lock = threading.Lock()
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
            self._devices.clear()
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
                    if (mhz := dev.call(f"nvmlDeviceGetMaxClockInfo({name})", pynvml.nvmlDeviceGetMaxClockInfo, kind))
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
            nvlink_count=_count_nvlinks(handle),
        )
        with self._lock:
            self._devices[index] = dev
        return static

    # -- per poll -------------------------------------------------------------------------------
    def read_gpu(self, static: GpuStatic) -> GpuReading:
        with self._lock:
            dev = self._devices.get(static.index)
        if dev is None:
            raise GpuLost(f"GPU {static.index} has not been discovered")
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
        power = c("nvmlDeviceGetPowerUsage", N.nvmlDeviceGetPowerUsage)
        limit = c("nvmlDeviceGetEnforcedPowerLimit", N.nvmlDeviceGetEnforcedPowerLimit)
        energy = c("nvmlDeviceGetTotalEnergyConsumption", N.nvmlDeviceGetTotalEnergyConsumption)
        clocks = {
            name: mhz * 1e6
            for name, kind in CLOCKS.items()
            if (mhz := c(f"nvmlDeviceGetClockInfo({name})", N.nvmlDeviceGetClockInfo, kind)) is not None
        }
        pstate = c("nvmlDeviceGetPerformanceState", N.nvmlDeviceGetPerformanceState)
        reasons = c("nvmlDeviceGetCurrentClocksEventReasons", N.nvmlDeviceGetCurrentClocksEventReasons)
        # Each of these blocks ~20 ms in the driver while it samples the link.
        tx = c("nvmlDeviceGetPcieThroughput(tx)", N.nvmlDeviceGetPcieThroughput, N.NVML_PCIE_UTIL_TX_BYTES)
        rx = c("nvmlDeviceGetPcieThroughput(rx)", N.nvmlDeviceGetPcieThroughput, N.NVML_PCIE_UTIL_RX_BYTES)
        gen = c("nvmlDeviceGetCurrPcieLinkGeneration", N.nvmlDeviceGetCurrPcieLinkGeneration)
        width = c("nvmlDeviceGetCurrPcieLinkWidth", N.nvmlDeviceGetCurrPcieLinkWidth)
        replay = c("nvmlDeviceGetPcieReplayCounter", N.nvmlDeviceGetPcieReplayCounter)
        ecc = {
            kind: n
            for kind, etype in (("corrected", N.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                ("uncorrected", N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
            if (n := c(f"nvmlDeviceGetTotalEccErrors({kind})", N.nvmlDeviceGetTotalEccErrors, etype,
                       N.NVML_AGGREGATE_ECC)) is not None
        }  # fmt: skip
        rows = c("nvmlDeviceGetRemappedRows", N.nvmlDeviceGetRemappedRows)
        nvlinks = tuple(
            NvLinkReading(
                link=link,
                up=None if (st := c(f"nvmlDeviceGetNvLinkState({link})", N.nvmlDeviceGetNvLinkState, link)) is None
                else st == N.NVML_FEATURE_ENABLED,
                tx_bytes_total=_kib(fields.get((_FI_NVLINK_TX, link))),
                rx_bytes_total=_kib(fields.get((_FI_NVLINK_RX, link))),
            )
            for link in range(static.nvlink_count)
        )  # fmt: skip
        with self._lock:
            xids = MappingProxyType(dict(self._xid_counts.get(static.index, {})))
        processes = self._processes(dev, dev.process_names)
        # Names of processes that exited go with them, so the cache stays the size of the GPU's users.
        dev.process_names = {p.pid: p.name for p in processes}
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
            pcie_tx_bytes_per_second=tx * 1024 if tx is not None else None,
            pcie_rx_bytes_per_second=rx * 1024 if rx is not None else None,
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
            migs=self._migs(dev) if static.mig_mode == "enabled" else (),
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
        wanted = [w for w in wanted if w not in dev.unsupported_fields]
        if not wanted:
            return {}
        values = dev.call("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, wanted)
        out: dict[tuple[int, int], int | float] = {}
        for key, fv in zip(wanted, values or (), strict=False):
            if fv.nvmlReturn == pynvml.NVML_SUCCESS:
                out[key] = _field_value(fv)
            elif fv.nvmlReturn in _UNSUPPORTED:
                dev.unsupported_fields.add(key)
                self._errors("nvmlDeviceGetFieldValues", "not_supported")
            elif fv.nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"GPU {dev.index}: nvmlDeviceGetFieldValues: GPU is lost")
            else:
                self._errors("nvmlDeviceGetFieldValues", error_name(fv.nvmlReturn))
        return out

    def _migs(self, dev: _Device) -> tuple[MigReading, ...]:
        """The MIG devices of a GPU in MIG mode: memory and processes, which NVML gives per device.

        Utilization and most other values are only per parent GPU (NVML answers NOT_SUPPORTED on
        a MIG handle), so they are not asked for here.
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
            out.append(
                MigReading(
                    index=i,
                    uuid=uuid,
                    profile=_mig_profile(name),
                    gpu_instance_id=mig.call("nvmlDeviceGetGpuInstanceId", N.nvmlDeviceGetGpuInstanceId),
                    compute_instance_id=mig.call("nvmlDeviceGetComputeInstanceId", N.nvmlDeviceGetComputeInstanceId),
                    memory_total_bytes=mem.total if mem is not None else None,
                    memory_used_bytes=mem.used if mem is not None else None,
                    memory_free_bytes=mem.free if mem is not None else None,
                    processes=self._processes(mig, dev.mig_process_names),
                )
            )
        dev.mig_process_names = {p.pid: p.name for m in out for p in m.processes}
        return tuple(out)

    def _processes(self, dev: _Device, names: dict[int, str]) -> tuple[ProcessReading, ...]:
        """Compute and graphics processes; ``names`` are those already looked up, by pid."""
        found: dict[int, ProcessReading] = {}
        for kind, fn in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                         ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses)):  # fmt: skip
            for p in dev.call(f"nvmlDeviceGet{kind.title()}RunningProcesses", fn) or ():
                if p.pid in found:
                    continue
                name = names.get(p.pid) or _process_name(p.pid)
                found[p.pid] = ProcessReading(pid=p.pid, name=name, used_memory_bytes=p.usedGpuMemory, kind=kind)
        return tuple(found.values())

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


def _memory_v2(handle: Any) -> Any:
    return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)


def _count_nvlinks(handle: Any) -> int:
    """Links answer GetNvLinkState from 0 upwards; the first that does not is past the last."""
    n = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError:
            break
        n += 1
    return n


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
