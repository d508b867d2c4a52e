"""One poll of one GPU: every value that changes, in base units.

Units are converted here, once: PCIe throughput arrives in KB/s, NVLink counters in KiB, power in
mW, energy in mJ, clocks in MHz.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

import pynvml

from ...metric_defs import ARCH_BLACKWELL, CLOCK_EVENT_REASONS, FIELD_METRICS, NVLINK5_SINCE
from ...snapshot import FabricReading, GpuReading, GpuStatic, LinkKey, NvLinkReading
from ..backend import StaticChanged
from ..cadence import Cadence
from .device import Device
from .fabric import read_fabric
from .fields import (
    FI_MEMORY_TEMP,
    FI_NVLINK5_RX,
    FI_NVLINK5_TX,
    FI_NVLINK_RX,
    FI_NVLINK_TX,
    FI_PCIE_RX,
    FI_PCIE_TX,
    read_fields,
)
from .mig import read_migs
from .processes import ProcessReader
from .profiling import GpmReader
from .static import CLOCKS, NVLINK_STATE

# nvml.h: a fan's speed "may exceed 100% in certain cases"; 255 (0xFF) is no reading.
FAN_MAX_PERCENT = 200


@dataclass(frozen=True)
class Readers:
    """What a poll reads besides the plain queries: ``None`` where that collector is off."""

    clocks: bool
    ecc: bool
    processes: ProcessReader | None
    gpm: GpmReader | None
    # The collectors switched off, and the driver's version as numbers (() where unknown), for the
    # declared field values (metric_defs.FieldValue) a poll asks for.
    disabled: frozenset[str] = frozenset()
    driver_version: tuple[int, ...] = ()
    # What changes slowly is read at most this often (seconds; 0: every poll), and shown from the last
    # read meanwhile: the declarations marked ``slow`` (ECC counts, remapped rows, NVLink link states,
    # one call per link, and error counters, 54 field values on an H100, and the fabric), the driver's
    # PCIe sample where there are no byte counters (two 20 ms samples), and MIG instances' GPM pairs.
    slow_s: float = 0.0
    poll_s: float = 0.0  # the time between polls (0: unknown), which paces the slow reads (cadence.py)

    @cached_property
    def slow(self) -> Cadence:
        """The slow reads' cadence: every ``slow_s``, at the poll nearest each plan."""
        return Cadence.of(self.slow_s, self.poll_s)

    @cached_property
    def clock_event_reasons(self) -> tuple[tuple[str, int], ...]:
        """(label value, bit) of each declared clock event reason the driver's nvml.h defines."""
        return tuple((name, r.bit) for name, r in CLOCK_EVENT_REASONS.items() if self.driver_version >= r.since)

    @cached_property
    def _declared(self) -> tuple[tuple[str, int, float, str, bool, int, int | None], ...]:
        """(metric, field id, scale, label value, per link, arch from, arch below) of each field value a
        metric declares, where its collector is on and the driver's nvml.h has the id
        (metric_defs.FieldValue.since)."""
        return tuple(
            (d.name, f.field_id, f.scale, f.label, f.per_link, f.arch_from, f.arch_below)
            for d in FIELD_METRICS
            if d.collector is None or d.collector not in self.disabled
            for f in d.fields
            if self.driver_version >= f.since
        )

    @cached_property
    def _by_arch(self) -> dict[tuple[int | None, bool], tuple[tuple[str, int, float, str], ...]]:
        return {}  # filled by _of, once per architecture a node has (one, mostly)

    def _of(self, arch: int | None, per_link: bool) -> tuple[tuple[str, int, float, str], ...]:
        if (got := self._by_arch.get((arch, per_link))) is None:
            got = self._by_arch[arch, per_link] = tuple(
                (name, fid, scale, label)
                for name, fid, scale, label, link, lo, hi in self._declared
                if link == per_link and (arch is None or (lo <= arch and (hi is None or arch < hi)))
            )
        return got

    def fields(self, arch: int | None) -> tuple[tuple[str, int, float, str], ...]:
        """(metric, field id, scale, label value) of the device-wide field values to ask of a GPU of
        ``arch`` (nvml.h NVML_DEVICE_ARCH_*; None: unknown, asked all): a field outside its declared
        architectures is not asked, which spares a card the refusals its driver would count."""
        return self._of(arch, False)

    def link_fields(self, arch: int | None) -> tuple[tuple[str, int, float, str], ...]:
        """The same for the per-link field values (asked once per link)."""
        return self._of(arch, True)

    def nvlink5_bytes(self, arch: int | None) -> bool:
        """Whether to ask NVLink 5's byte counters (fields.FI_NVLINK5_TX/RX), where 138/139 do not apply."""
        return self.driver_version >= NVLINK5_SINCE and (arch is None or arch >= ARCH_BLACKWELL)


# nvml.h deprecates nvmlDeviceGetTemperature ("will be removed in CUDA 14.0") for
# nvmlDeviceGetTemperatureV, which drivers have from R570 and nvidia-ml-py binds from 12.570.
TEMPERATURE_V_SINCE = (570,)


def _temperature(dev: Device, readers: Readers) -> int | None:
    """The GPU die's temperature: through the versioned call where the driver and the bindings have
    it, else the old one (an older driver would answer FUNCTION_NOT_FOUND; its version says so first)."""
    versioned = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
    if versioned is not None and readers.driver_version >= TEMPERATURE_V_SINCE:
        return dev.call("nvmlDeviceGetTemperatureV", versioned, pynvml.NVML_TEMPERATURE_GPU)
    return dev.call("nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)


def read_quick(dev: Device, static: GpuStatic, readers: Readers, xids: Mapping[int, int]) -> GpuReading:
    """Everything but the PCIe throughput, which blocks."""
    N = pynvml
    c = dev.call
    dev.reset_required = False  # this poll's answers say it anew
    # The MIG mode, read with the static facts, is checked every poll (one cheap call): a switch
    # shows at once, not at the static refresh minutes later.
    mig = c("nvmlDeviceGetMigMode", N.nvmlDeviceGetMigMode) if static.mig_mode != "unsupported" else None
    if mig is not None and ("enabled" if mig[0] else "disabled") != static.mig_mode:
        raise StaticChanged(f"GPU {static.index}: MIG mode is now {'on' if mig[0] else 'off'}")
    util = c("nvmlDeviceGetUtilizationRates", N.nvmlDeviceGetUtilizationRates)
    enc = c("nvmlDeviceGetEncoderUtilization", N.nvmlDeviceGetEncoderUtilization)
    dec = c("nvmlDeviceGetDecoderUtilization", N.nvmlDeviceGetDecoderUtilization)
    total, used, free, reserved = _memory(dev)
    temperature = _temperature(dev, readers)
    fields = read_fields(dev, _wanted_fields(static, readers))
    temps = {"gpu": float(temperature)} if temperature is not None else {}
    if (mt := fields.get((FI_MEMORY_TEMP, 0))) is not None:
        temps["memory"] = float(mt)
    fans = _fans(dev, static)
    power = c("nvmlDeviceGetPowerUsage", N.nvmlDeviceGetPowerUsage)
    limit = c("nvmlDeviceGetEnforcedPowerLimit", N.nvmlDeviceGetEnforcedPowerLimit)
    energy = c("nvmlDeviceGetTotalEnergyConsumption", N.nvmlDeviceGetTotalEnergyConsumption)
    clocks = {
        name: mhz * 1e6
        for name, kind in CLOCKS.items()
        if readers.clocks and (mhz := c(f"nvmlDeviceGetClockInfo({name})", N.nvmlDeviceGetClockInfo, kind)) is not None
    }
    pstate = c("nvmlDeviceGetPerformanceState", N.nvmlDeviceGetPerformanceState) if readers.clocks else None
    reasons = (
        c("nvmlDeviceGetCurrentClocksEventReasons", N.nvmlDeviceGetCurrentClocksEventReasons)
        if readers.clocks
        else None
    )
    gen = c("nvmlDeviceGetCurrPcieLinkGeneration", N.nvmlDeviceGetCurrPcieLinkGeneration)
    width = c("nvmlDeviceGetCurrPcieLinkWidth", N.nvmlDeviceGetCurrPcieLinkWidth)
    replay = c("nvmlDeviceGetPcieReplayCounter", N.nvmlDeviceGetPcieReplayCounter)
    slow = _slow(dev, static, readers)
    ecc, rows, states = slow.ecc, slow.rows, slow.nvlink_up
    nvlinks = tuple(
        NvLinkReading(
            link=link,
            up=states[link] if link < len(states) else None,
            tx_bytes_total=_link_bytes(fields, FI_NVLINK_TX, FI_NVLINK5_TX, link),
            rx_bytes_total=_link_bytes(fields, FI_NVLINK_RX, FI_NVLINK5_RX, link),
        )
        for link in range(static.nvlink_count)
    )  # fmt: skip
    mig_mode = static.mig_mode == "enabled"
    proc = readers.processes
    processes = proc.processes(dev, dev.process_names, dev.process_users,
                               dev.process_util if not mig_mode else None) if proc else ()  # fmt: skip
    # Names of processes that exited go with them, so the cache stays the size of the GPU's users.
    # Kept by pid and start time: a later process given the pid is looked up afresh.
    dev.process_names = {(p.pid, p.start_time): p.name for p in processes}
    dev.process_users = {(p.pid, p.start_time): p.user for p in processes}
    if proc and processes and not mig_mode:
        processes = proc.utilization(dev, processes)
    gpm = readers.gpm if static.gpm_supported else None
    activity = gpm.gpu_activity(dev) if gpm else None
    fabric = slow.fabric
    migs, mig_slices = read_migs(dev, proc, gpm) if mig_mode else ((), None)
    return GpuReading(
        index=static.index,
        uuid=static.uuid,
        up=True,
        static=static,
        utilization_ratio=dev.ratio("nvmlDeviceGetUtilizationRates", util.gpu if util else None),
        memory_copy_utilization_ratio=dev.ratio("nvmlDeviceGetUtilizationRates", util.memory if util else None),
        encoder_utilization_ratio=dev.ratio("nvmlDeviceGetEncoderUtilization", enc[0] if enc else None),
        decoder_utilization_ratio=dev.ratio("nvmlDeviceGetDecoderUtilization", dec[0] if dec else None),
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
        field_values=MappingProxyType(
            {
                (name, label): v * scale
                for name, fid, scale, label in readers.fields(static.architecture)
                if (v := fields.get((fid, 0))) is not None
            }
        ),
        link_field_values=slow.link_field_values,
        clock_event_active=MappingProxyType(
            {} if reasons is None else {name: bool(reasons & bit) for name, bit in readers.clock_event_reasons}
        ),
        # The PCIe byte counters and their rate: the backend's, from dev.pcie_counts (pcie.py).
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
        reset_required=dev.reset_required,
        fabric=fabric,
        processes=processes,
        migs=migs,
        mig_slices=mig_slices,
        activity=activity,
    )


@dataclass(frozen=True)
class Slow:
    """What ``Readers.slow_s`` paces, as last read."""

    ecc: Mapping[str, int]
    rows: tuple[int, int, int, int] | None
    nvlink_up: tuple[bool | None, ...]
    link_field_values: Mapping[str, Mapping[LinkKey, float]]
    fabric: FabricReading | None
    read_at: float
    planned: float  # when the next read is due (monotonic, on the slow cadence)


def _slow(dev: Device, static: GpuStatic, readers: Readers) -> Slow:
    """ECC, remapped rows, link states, link error counters and the fabric: read again on the slow
    cadence (every ``slow_s``, cadence.py), and at once where a static refresh found other links, else
    as last read."""
    now = dev.monotonic()
    last = dev.slow
    fresh = last is None or len(last.nvlink_up) != static.nvlink_count
    planned = readers.slow.take(None if fresh or last is None else last.planned, now)
    if planned is None and last is not None:
        return last
    N = pynvml
    c = dev.call
    ecc = {
        kind: n
        for kind, etype in (("corrected", N.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                            ("uncorrected", N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
        if readers.ecc and (n := c(f"nvmlDeviceGetTotalEccErrors({kind})", N.nvmlDeviceGetTotalEccErrors, etype,
                   N.NVML_AGGREGATE_ECC)) is not None
    }  # fmt: skip
    rows = c("nvmlDeviceGetRemappedRows", N.nvmlDeviceGetRemappedRows) if readers.ecc else None
    states = tuple(
        None
        if (st := c(NVLINK_STATE[link], N.nvmlDeviceGetNvLinkState, link)) is None
        else st == N.NVML_FEATURE_ENABLED
        for link in range(static.nvlink_count)
    )
    links = read_fields(dev, _wanted_link_fields(static, readers), slow=True) if static.nvlink_count else {}
    link_values = _link_field_values(links, readers.link_fields(static.architecture), static.nvlink_count)
    fabric = read_fabric(dev, readers.driver_version)
    dev.slow = Slow(MappingProxyType(ecc), tuple(rows) if rows is not None else None, states, link_values, fabric, now,
                    planned if planned is not None else now)  # fmt: skip
    return dev.slow


def _wanted_fields(static: GpuStatic, readers: Readers) -> list[tuple[int, int]]:
    """The field values a poll reads: (field id, scope id), scope being the NVLink link.  A field a
    GPU answers NOT_SUPPORTED (NVLink 5's on a Hopper, 161-163 on a Blackwell) is not asked again
    until the next static refresh (fields.read_fields)."""
    wanted = [(FI_MEMORY_TEMP, 0), (FI_PCIE_TX, 0), (FI_PCIE_RX, 0)]
    wanted += [(fid, 0) for fid in dict.fromkeys(fid for _, fid, _, _ in readers.fields(static.architecture))]
    kib = static.architecture is None or static.architecture < ARCH_BLACKWELL  # NVLink 4 and older
    for link in range(static.nvlink_count):
        if kib:
            wanted += [(FI_NVLINK_TX, link), (FI_NVLINK_RX, link)]
        if readers.nvlink5_bytes(static.architecture):
            wanted += [(FI_NVLINK5_TX, link), (FI_NVLINK5_RX, link)]
    return wanted


def _wanted_link_fields(static: GpuStatic, readers: Readers) -> list[tuple[int, int]]:
    """The per-link field values (error counters), asked at the slow cadence in an array of their own:
    54 values on a Hopper, 198 on a Blackwell, which counting at every poll would cost more than the
    rest of the poll's field values together."""
    per_link = list(dict.fromkeys(fid for _, fid, _, _ in readers.link_fields(static.architecture)))
    return [(fid, link) for link in range(static.nvlink_count) for fid in per_link]


def _link_bytes(fields: Mapping[tuple[int, int], int | float], kib: int, nvlink5: int, link: int) -> int | None:
    """A link's data bytes: the KiB counter (138/139) where the GPU has it, else NVLink 5's byte
    counter (202/204, Blackwell)."""
    v = _kib(fields.get((kib, link)))
    if v is None and isinstance(b := fields.get((nvlink5, link)), int):
        v = b
    return v


def _link_field_values(
    fields: Mapping[tuple[int, int], int | float], wanted: tuple[tuple[str, int, float, str], ...], links: int
) -> Mapping[str, Mapping[LinkKey, float]]:
    out: dict[str, dict[LinkKey, float]] = {}
    for name, fid, scale, label in wanted:
        for link in range(links):
            if (v := fields.get((fid, link))) is not None:
                out.setdefault(name, {})[(str(link), label) if label else str(link)] = v * scale
    return MappingProxyType({k: MappingProxyType(v) for k, v in out.items()})


def _fans(dev: Device, static: GpuStatic) -> dict[str, float]:
    """Each fan's speed; an older driver without per-fan calls (``fan_count`` -1) reads one fan."""
    N = pynvml
    c = dev.call
    fans = {
        str(i): r
        for i in range(static.fan_count)
        if (r := dev.ratio("nvmlDeviceGetFanSpeed_v2", c(f"nvmlDeviceGetFanSpeed_v2({i})", N.nvmlDeviceGetFanSpeed_v2,
                                                           i), FAN_MAX_PERCENT)) is not None
    }  # fmt: skip
    if (
        static.fan_count < 0
        and (r := dev.ratio("nvmlDeviceGetFanSpeed", c("nvmlDeviceGetFanSpeed", N.nvmlDeviceGetFanSpeed),
                            FAN_MAX_PERCENT)) is not None
    ):  # fmt: skip
        fans["0"] = r
    return fans


def _memory(dev: Device) -> tuple[int | None, int | None, int | None, int | None]:
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


def _memory_v2(handle: Any) -> Any:
    return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)


def _kib(v: int | float | None) -> int | None:
    return None if v is None else int(v) * 1024
