"""Every metric the exporter can emit, declared once.

A declaration gives the metric's name, type, unit, help, labels, the snapshot value it renders,
its collector (``--[no-]collector.<name>``) and, where there is more to say than the help, a doc
note.  ``/metrics`` (``serving.metrics``), the ``--once`` JSON (``serving.gpu_json``, from the same
series), the collector switches (``config``, ``cli`` and which NVML queries the backend makes) and the
reference table in ``docs/metrics.md`` (written by ``docs/generate.py``; CI fails when it is stale)
all derive from this table.

A value NVML gives as a field value (``nvmlDeviceGetFieldValues``) is one :class:`MetricDef` with
``fields``: which field ids, the scale to base units and, for a labelled family, the label value of
each; the backend asks for them while the metric's collector is on, converts them and puts them in
``GpuReading.field_values``, where the declaration's reader finds them.  Any other per-GPU value is
three steps: a field in :class:`~gpu_exporter.snapshot.GpuReading`, the query that fills it
(``sources/nvml/reads.py``), and one :class:`MetricDef` here whose ``value`` reads that field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal

from .snapshot import GpuReading, HolderLabels


class Collector(StrEnum):
    """Groups of series that can be switched off, with what is left out when they are."""

    NVLINK = "nvlink"
    PROCESSES = "processes"
    CLOCKS = "clocks"
    ECC = "ecc"
    PROFILING = "profiling"


COLLECTOR_HELP: Mapping[Collector, str] = {
    Collector.NVLINK: "per-link NVLink state, traffic and errors (109 series on an H100: 18 links and their count)",
    Collector.PROCESSES: "per-process memory and utilization, and process counts",
    Collector.CLOCKS: "clocks, their maxima, clock event reasons, time held back by each policy and the P-state",
    Collector.ECC: "ECC error counters and remapped rows",
    Collector.PROFILING: "GPM activity: SM, tensor, DRAM and pipe activity (Hopper+)",
}


class Scope(StrEnum):
    """What one series describes, which decides its leading labels and what ``value`` reads."""

    GPU = "gpu"  # gpu, uuid (+ holder labels); value(GpuReading)
    PROCESS = "process"  # gpu, uuid (+ holder labels), pid, process, user; value(ProcessReading)
    MIG = "mig"  # gpu, uuid (+ holder labels), mig_uuid, gpu_instance_id, compute_instance_id, mig_profile
    MIG_PROCESS = "mig_process"  # the MIG labels, then pid, process, user; value(ProcessReading)
    EXPORTER = "exporter"  # the exporter's own health: no GPU labels


SCOPE_LABELS: Mapping[Scope, tuple[str, ...]] = {
    Scope.GPU: ("gpu", "uuid"),
    Scope.PROCESS: ("gpu", "uuid", "pid", "process", "user"),
    Scope.MIG: ("gpu", "uuid", "mig_uuid", "gpu_instance_id", "compute_instance_id", "mig_profile"),
    Scope.MIG_PROCESS: ("gpu", "uuid", "mig_uuid", "gpu_instance_id", "compute_instance_id", "mig_profile",
                        "pid", "process", "user"),
    Scope.EXPORTER: (),
}  # fmt: skip
# Where the holder labels go (pods, jobs, containers, each where its attribution is on): right after
# gpu and uuid; the pod labels' default names.
POD_LABELS_AT = 2
DEFAULT_POD_LABELS = ("namespace", "pod", "container")
# Every holder label, as the reference documents the series that name one holder each.
EVERY_HOLDER = HolderLabels(pods=DEFAULT_POD_LABELS, jobs=True, containers=True)

Number = float | int | bool | None
# value(reading) -> a number, or None where the GPU does not have it (left out, never 0).  A
# metric with one label beyond its scope's returns (label value, number) pairs instead.
Reader = Callable[[Any], Number | Iterable[tuple[str, Number]]]


@dataclass(frozen=True)
class FieldValue:
    """One NVML field value (``nvmlDeviceGetFieldValues``, scope 0) a metric is read from."""

    field_id: int  # nvml.h NVML_FI_*
    scale: float = 1.0  # the driver's value times this is the metric's base unit (ns -> s: 1e-9)
    label: str = ""  # the value of the metric's one label for this field; "" for an unlabelled metric
    # The first driver version whose nvml.h gives the id this meaning, as numbers ((580, 82): 580.82);
    # older drivers, and one whose version is unknown, are not asked (the id can mean something else
    # there, or nothing).  (): every driver the exporter supports.
    since: tuple[int, ...] = ()
    # Asked once per NVLink link (the field's scope id is the link), and the series carry a "link"
    # label first; read only where the NVLink collector is on and the GPU has links.
    per_link: bool = False
    # The GPU architectures (nvml.h NVML_DEVICE_ARCH_*) it is asked of, from and below: a field that
    # one generation replaced is not asked of the other, which would answer NOT_SUPPORTED on every
    # link, nor one an older generation cannot have (C2C before Hopper), whose refusal its driver
    # would count.  A GPU whose architecture is unknown is asked all of them.
    arch_from: int = 0
    arch_below: int | None = None


@dataclass(frozen=True)
class MetricDef:
    name: str  # as exposed; counters end in _total
    type: Literal["gauge", "counter", "histogram"]
    unit: str  # the base unit the name ends with ("ratio", "bytes", ...); "" for counts, states and info
    help: str
    scope: Scope = Scope.GPU
    labels: tuple[str, ...] = ()  # beyond the scope's own
    value: Reader | None = None  # None: rendered by its own code (gpu_up, info series, the books, health)
    collector: Collector | None = None  # None: always on
    doc: str = ""  # more for docs/metrics.md: where it comes from, which cards have it
    pods: bool = False  # it always carries the pod labels (exists only with pod attribution on)
    holder: bool = False  # one holder per series, with every label of that holder (HolderLabels.detail_names)
    # The NVML field values it is read from: the poll asks for them while its collector is on, and
    # its value is read from GpuReading.field_values (no ``value`` of its own).
    fields: tuple[FieldValue, ...] = ()
    # Rendered for a GPU that does not answer too (from what its down reading keeps): a lost GPU's
    # XIDs are the reason it is lost, and must show beside its gpu_up 0.
    while_down: bool = False
    # Read at the slow cadence (settings poll_slow_interval, 30 s), not at every poll: on /metrics
    # between reads as last read, so a change shows up to that long after it happened.
    slow: bool = False

    def __post_init__(self) -> None:
        if self.fields:
            f = self.fields[0]
            want = (("link",) if f.per_link else ()) + ((self.labels[-1],) if f.label and self.labels else ())
            if (self.value is not None or self.scope != Scope.GPU or len(self.labels) != f.per_link + bool(f.label)
                    or self.labels != want or any(x.per_link != f.per_link for x in self.fields)):  # fmt: skip
                raise ValueError(f"{self.name}: a field-value metric is per GPU, with a link label first if its "
                                 "fields are per link, and one more label if they name one")  # fmt: skip
            object.__setattr__(self, "value", _field_reader(self.name, self.fields))

    def series_labels(self, holders: HolderLabels | tuple[str, ...] = ()) -> tuple[str, ...]:
        """The labels of its series, given which holders' labels are on (a tuple: the pod labels' names)."""
        h = holders if isinstance(holders, HolderLabels) else HolderLabels(pods=holders or None)  # type: ignore[arg-type]
        scope = SCOPE_LABELS[self.scope]
        names = h.detail_names if self.holder else h.names
        return (*scope[:POD_LABELS_AT], *names, *scope[POD_LABELS_AT:], *self.labels)

    @property
    def all_labels(self) -> tuple[str, ...]:
        """Its labels as documented: the holder labels only where it always has them (default names)."""
        if self.holder:
            return self.series_labels(EVERY_HOLDER)
        return self.series_labels(DEFAULT_POD_LABELS if self.pods else ())

    @property
    def family_name(self) -> str:
        """The name prometheus_client's families take: counters without _total."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name


def _field_reader(name: str, fields: tuple[FieldValue, ...]) -> Reader:
    """The reader of a field-value metric: its values in ``field_values``, absent where not read."""
    if fields[0].per_link:
        return lambda g: sorted(g.link_field_values.get(name, {}).items())
    if not fields[0].label:
        return lambda g: g.field_values.get((name, ""))
    labels = tuple(f.label for f in fields)
    return lambda g: ((label, v) for label in labels if (v := g.field_values.get((name, label))) is not None)


def _activity(field: str) -> Reader:
    return lambda r: getattr(r.activity, field) if r.activity is not None else None


def _static(field: str) -> Callable[[GpuReading], Any]:
    return lambda g: getattr(g.static, field) if g.static is not None else None


def _links(field: str) -> Callable[[GpuReading], Iterable[tuple[str, Number]]]:
    return lambda g: ((str(n.link), getattr(n, field)) for n in g.nvlinks)


_GPM = "from GPM (0-1; Hopper and newer)"
_GPM_DOC = (
    "GPM (nvmlGpmSampleGet/nvmlGpmMetricsGet): Hopper and newer (H100, H200); an A100, L40S or T4 answers "
    "that it has no GPM, and the series is absent.  In MIG mode the whole GPU's value may be refused by the "
    "driver; the GPU instances' own (gpu_mig_*) go on."
)
_MIG_GPM_DOC = (
    "Per GPU instance (nvmlGpmMigSampleGet): sampled once per instance and shown on the MIG device with "
    "its lowest compute instance id, so a sum over MIG devices counts each instance once.  The mean over "
    "poll_slow_interval (30 s) or the profiling interval, whichever is longer: seven instances' pairs at every "
    "profiling interval would cost more than the rest of the poll."
)
_NVLINK_DOC = (
    "Only the links the driver says the GPU has (field NVML_FI_DEV_NVLINK_LINK_COUNT): 12 on an A100, 18 on "
    "an H100, none on an L40S, T4 or GeForce (no series at all).  A link that answers NOT_SUPPORTED part-way "
    "through the list (an inactive port of an H100 NVL) has no series of its own; the links after it do."
)
_PCIE_TOTAL_DOC = (
    "Field values 197/198 (NVML_FI_DEV_PCIE_COUNT_*_BYTES), drivers R550 and newer: R535 does not know "
    "them (its NVML_FI_MAX is 197) and GeForce cards lack them, so no series.  nvml.h says the value "
    '"can be wrapped"; a counter not yet past 2^32 is taken for 32 bits wide (an L40S\'s appear to be) '
    "and its wraps between polls are unwrapped, so the series only goes up.  Left out while such a "
    "counter disagrees with the driver's throughput sample (it wrapped more than once in a poll).  "
    "Whether the counts include protocol overhead is not documented."
)
_PCIE_RATE_DOC = (
    "From the byte counters (R550 and newer, checked against the driver's sample at every static refresh); "
    "the driver's 20 ms sample (nvmlDeviceGetPcieThroughput, KB/s x 1024) on R535, GeForce cards, on the "
    "first poll, and while a counter that may be 32 bits wide disagrees with it (then taken every poll_slow_interval, "
    '30 s).  See "PCIe throughput" '
    "below."
)
# Activity (GPM) metric name stems, the snapshot field each reads, and what it means.
ACTIVITY_METRICS = (
    ("graphics_active", "graphics", f"Fraction of time any graphics or compute engine was active since the previous poll, {_GPM}."),
    ("sm_active", "sm", f"Fraction of SMs with at least one warp resident, averaged since the previous poll, {_GPM}."),
    ("sm_occupancy", "sm_occupancy", f"Resident warps as a fraction of the SMs' maximum, averaged since the previous poll, {_GPM}."),
    ("tensor_active", "tensor", f"Fraction of time any tensor pipe was active since the previous poll, {_GPM}."),
    ("dram_active", "dram", f"DRAM bandwidth used as a fraction of the peak since the previous poll, {_GPM}."),
    ("fp64_active", "fp64", f"Fraction of time the FP64 (non-tensor) pipe was active since the previous poll, {_GPM}."),
    ("fp32_active", "fp32", f"Fraction of time the FP32 (non-tensor) pipe was active since the previous poll, {_GPM}."),
    ("fp16_active", "fp16", f"Fraction of time the FP16 (non-tensor) pipe was active since the previous poll, {_GPM}."),
)  # fmt: skip

_RECOVERY_DOC = (
    "Field value 230, driver 565 and newer (NVIDIA's release notes for 565 add it; R550's nvml.h ends at 228), "
    "the codes of nvml.h's nvmlDeviceGpuRecoveryAction_t (5-7 since nvml.h 13.x).  It "
    "replaces the deprecated 226 and 227 (NVML_FI_DEV_RESET_STATUS, _DRAIN_AND_RESET_STATUS).  Older drivers, and "
    "cards that do not report it, have no series.  GpuRecoveryRequired fires on any code but 0 and says what to do."
)
_NS = 1e-9  # NVML's time counters are in nanoseconds
_CLOCK_EVENT_COUNTERS_DOC = (
    "NVML's clock event reason counters, field values 269-271 (nvml.h NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, "
    '_HW_THERM_SLOWDOWN, _HW_POWER_BRAKE_SLOWDOWN, "in ns"; the same reasons as gpu_clock_event_active\'s).  Read from '
    "driver 580.82 on: nvidia-ml-py 12.570's nvml.h ends at 268 (NVML_FI_MAX 269), and 13.580.82's is the first to "
    "define them at 269-271; those of 12.575.51 and 13.580.65 numbered them 251-253, ids the headers before and "
    "since give to power smoothing, so no older driver is asked (580.65 and R575 have no series).  The other two counters of that nvml.h block, "
    "SW_POWER_CAP and SYNC_BOOST, are the perf-policy fields 74 and 76: gpu_violation_seconds_total's power and "
    "sync_boost.  A reason the card does not report has no series."
)


@dataclass(frozen=True)
class FabricIssue:
    """One condition of the NVLink fabric health mask (nvmlGpuFabricInfo_v2_t.healthMask and later):
    a gpu_fabric_issue label value, the mask field it is read from (nvml.h's
    NVML_GPU_FABRIC_HEALTH_MASK_<field>_* values, shifted by ..._SHIFT_<field>), and the values that
    mean the issue is there and that it is not.  A field the driver does not report (its
    NOT_SUPPORTED, 0; older drivers leave the bits 0) has no series."""

    field: str
    present: tuple[str, ...]  # value names that mean the issue is there
    absent: tuple[str, ...]  # value names that mean it is not


# The issues, by label value.  The bits and value names are the bindings' (nvidia-ml-py defines
# the DEGRADED_BW, ROUTE_* and ACCESS_TIMEOUT_RECOVERY fields from 12.570, INCORRECT_CONFIGURATION
# from 13.580, GFM_STATE from 13.595): with older bindings an issue is not read.  The registration
# itself failing (state completed, status an error) is "registration_failed", from the status.
_WRONG_CONFIGURATIONS = ("INCORRECT_SYSGUID", "INCORRECT_CHASSIS_SN", "NO_PARTITION", "INSUFFICIENT_NVLINKS",
                         "INCOMPATIBLE_GPU_FW", "INVALID_LOCATION", "GPU_STATE_INVALID")  # fmt: skip
FABRIC_ISSUES: Mapping[str, FabricIssue] = {
    "degraded_bandwidth": FabricIssue("DEGRADED_BW", ("TRUE",), ("FALSE",)),
    "route_recovery": FabricIssue("ROUTE_RECOVERY", ("TRUE",), ("FALSE",)),
    "route_unhealthy": FabricIssue("ROUTE_UNHEALTHY", ("TRUE",), ("FALSE",)),
    "access_timeout_recovery": FabricIssue("ACCESS_TIMEOUT_RECOVERY", ("TRUE",), ("FALSE",)),
    "incorrect_configuration": FabricIssue("INCORRECT_CONFIGURATION", _WRONG_CONFIGURATIONS, ("NONE",)),
    "fabric_manager_disconnected": FabricIssue("GFM_STATE", ("DISCONNECTED",), ("CONNECTED",)),
}
FABRIC_REGISTRATION_FAILED = "registration_failed"
_FABRIC_DOC = (
    "nvmlDeviceGetGpuFabricInfoV (driver 550 and newer; the health summary from 580, whose nvml.h adds "
    "nvmlGpuFabricInfo_v3_t): GPUs on an NVSwitch or multi-node NVLink fabric (HGX and DGX H100/H200/B200, "
    "GB200 NVL72).  PCIe cards and A100s answer NOT_SUPPORTED, or a state of NOT_SUPPORTED, and have no series."
)


@dataclass(frozen=True)
class ClockEventReason:
    """One bit of nvmlDeviceGetCurrentClocksEventReasons: a label value of gpu_clock_event_active."""

    bit: int  # nvml.h nvmlClocksEventReason<nvml_name> (some spelled nvmlClocksThrottleReason<nvml_name> there)
    nvml_name: str
    # The first driver whose nvml.h defines the bit; an older one never sets it, so the reason has no
    # series there rather than a 0 it cannot mean (as FieldValue.since).
    since: tuple[int, ...] = ()


# The reasons, by label value, in bit order.  BoardLimit and Reliability are first in the nvml.h of
# nvidia-ml-py 13.615.71 (its pynvml defines them; 13.610.43's does not), beside the perf-policy
# counters 77 and 79 (gpu_violation_seconds_total's board_limit and reliability).
CLOCK_EVENT_REASONS: Mapping[str, ClockEventReason] = {
    "gpu_idle": ClockEventReason(0x1, "GpuIdle"),
    "applications_clocks_setting": ClockEventReason(0x2, "ApplicationsClocksSetting"),
    "sw_power_cap": ClockEventReason(0x4, "SwPowerCap"),
    "hw_slowdown": ClockEventReason(0x8, "HwSlowdown"),
    "sync_boost": ClockEventReason(0x10, "SyncBoost"),
    "sw_thermal": ClockEventReason(0x20, "SwThermalSlowdown"),
    "hw_thermal": ClockEventReason(0x40, "HwThermalSlowdown"),
    "hw_power_brake": ClockEventReason(0x80, "HwPowerBrakeSlowdown"),
    "display_clock_setting": ClockEventReason(0x100, "DisplayClockSetting"),
    "board_limit": ClockEventReason(0x200, "BoardLimit", since=(615,)),
    "reliability": ClockEventReason(0x400, "Reliability", since=(615,)),
}


def _per_label(scale: float, ids: Iterable[tuple[int, str]], since: tuple[int, ...] = (), per_link: bool = False,
               arch_from: int = 0, arch_below: int | None = None) -> tuple[FieldValue, ...]:  # fmt: skip
    return tuple(FieldValue(fid, scale, label, since, per_link, arch_from, arch_below) for fid, label in ids)


# NVLink error counters per link, by the error label.  Before Blackwell, nvml.h's
# NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY/_RECOVERY/_CRC (161-163), which every supported driver defines;
# Blackwell's NVLink 5 answers them NOT_SUPPORTED and counts instead in the
# NVML_FI_DEV_NVLINK_COUNT_* fields (206-221), first in nvidia-ml-py 12.560's nvml.h.
NVLINK_DL_ERRORS = ((161, "replay"), (162, "recovery"), (163, "crc"))
NVLINK5_ERRORS = (
    (206, "malformed_packet"), (207, "buffer_overrun"), (208, "receive"), (209, "receive_remote"),
    (210, "receive_general"), (211, "local_link_integrity"), (212, "transmit_discard"),
    (213, "recovery_successful"), (214, "recovery_failed"), (219, "effective"), (221, "symbol"),
)  # fmt: skip
NVLINK5_SINCE = (560,)
# NVLink-C2C's error counters (the link of a GH200's or GB200's GPU to its Grace CPU), device-wide:
# nvml.h's NVML_FI_DEV_C2C_LINK_ERROR_INTR ("CRC Error Counter"), _REPLAY and _REPLAY_B2B, 231-233.
# The nvml.h of CUDA 12.8 (driver 570) and nvidia-ml-py 12.570 skip the ids; 12.575's define them.
C2C_ERRORS = ((231, "crc"), (232, "replay"), (233, "replay_b2b"))
C2C_SINCE = (575,)
ARCH_HOPPER = 9  # nvml.h NVML_DEVICE_ARCH_HOPPER: the first with NVLink-C2C (GH200)
ARCH_BLACKWELL = 10  # nvml.h NVML_DEVICE_ARCH_BLACKWELL: NVLink 5
_NVLINK_ERRORS_DOC = (
    "Per link and kind, since the driver loaded.  Hopper and older (A100, H100, H200): replay, recovery and crc "
    "(field values 161-163, NVML_FI_DEV_NVLINK_ERROR_DL_*).  Blackwell (B200, GB200) answers those NOT_SUPPORTED "
    "and counts NVLink 5's instead (206-221, NVML_FI_DEV_NVLINK_COUNT_*, asked of driver 560 and newer): "
    "malformed_packet, buffer_overrun, receive, receive_remote, receive_general, local_link_integrity, "
    "transmit_discard, recovery_successful, recovery_failed, effective (the sum of errors in each packet) and symbol.  "
    "A kind the card does not count has no series; dcgm-exporter's DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL "
    "is the sum of crc over the links."
)


_G: Final = "gauge"
_C: Final = "counter"
_H: Final = "histogram"
_PROC, _NVL, _CLK, _ECC, _PRF = (Collector.PROCESSES, Collector.NVLINK, Collector.CLOCKS, Collector.ECC,
                                 Collector.PROFILING)  # fmt: skip
_CAPPED = "capped like gpu_process_memory_used_bytes"

_DEFS: tuple[MetricDef, ...] = (
    MetricDef("gpu_up", _G, "", "1 when the GPU answered the last poll, 0 when it is lost or unreadable, or when the driver no longer lists a GPU seen since the exporter started (under its last labels, until it answers again or the exporter restarts)."),
    MetricDef("gpu_info", _G, "", "Constant 1; the labels describe the GPU and its driver.",
              labels=("name", "pci_bus_id", "driver_version", "cuda_version", "serial", "mig_mode", "device"),
              doc="mig_mode is \"unsupported\" on cards without MIG (L40S, T4, GeForce), \"enabled\" or \"disabled\" on A100 and H100; serial is absent on GeForce cards.  device is the GPU's device file (nvidia0 for /dev/nvidia0, from nvmlDeviceGetMinorNumber), as dcgm-exporter's device label: what a DRA claim, GKE's device plugin and the kubelet name a GPU by; empty where the driver does not say (Windows)."),
    MetricDef("gpu_utilization_ratio", _G, "ratio", "Fraction of the last sample period in which a kernel ran (0-1).",
              value=lambda g: g.utilization_ratio,
              doc="nvml.h: the sample period is between 1/6 s and 1 s, depending on the product.  Not given for a GPU in MIG mode (the series is absent); a GPU instance's activity is gpu_mig_*_ratio (GPM, Hopper)."),
    MetricDef("gpu_memory_copy_utilization_ratio", _G, "ratio", "Fraction of the last sample period in which memory was read or written (0-1).",
              value=lambda g: g.memory_copy_utilization_ratio),
    MetricDef("gpu_encoder_utilization_ratio", _G, "ratio", "Video encoder utilization (0-1).",
              value=lambda g: g.encoder_utilization_ratio,
              doc="Cards with an NVENC engine (T4, L40S, GeForce); A100 and H100 have none to measure."),
    MetricDef("gpu_decoder_utilization_ratio", _G, "ratio", "Video decoder utilization (0-1).",
              value=lambda g: g.decoder_utilization_ratio,
              doc="Cards with an NVDEC engine (A100, H100, L40S, T4, GeForce)."),
    *(MetricDef(f"gpu_{stem}_ratio", _G, "ratio", text, value=_activity(field), collector=_PRF, doc=_GPM_DOC)
      for stem, field, text in ACTIVITY_METRICS),
    MetricDef("gpu_memory_total_bytes", _G, "bytes", "Total installed GPU memory in bytes.",
              value=lambda g: g.memory_total_bytes),
    MetricDef("gpu_memory_used_bytes", _G, "bytes", "GPU memory allocated by processes, in bytes (excludes driver-reserved memory where the driver reports it separately).",
              value=lambda g: g.memory_used_bytes,
              doc="nvmlDeviceGetMemoryInfo_v2 (R510 and newer: every driver the exporter is tested against); an older driver's v1 counts the reserved memory as used."),
    MetricDef("gpu_memory_free_bytes", _G, "bytes", "GPU memory free for allocation, in bytes.",
              value=lambda g: g.memory_free_bytes),
    MetricDef("gpu_memory_reserved_bytes", _G, "bytes", "GPU memory reserved by the driver and firmware, in bytes.",
              value=lambda g: g.memory_reserved_bytes,
              doc="Only through nvmlDeviceGetMemoryInfo_v2 (R510 and newer); absent where only v1 answers."),
    MetricDef("gpu_temperature_celsius", _G, "celsius", "Temperature in degrees Celsius, by sensor (gpu die, memory).",
              labels=("sensor",), value=lambda g: g.temperature_celsius.items(),
              doc="sensor=gpu is nvmlDeviceGetTemperatureV from driver 570 on, the deprecated nvmlDeviceGetTemperature (removed in CUDA 14) before.  sensor=memory is field value 82 (NVML_FI_DEV_MEMORY_TEMP): HBM cards (A100, H100) have it; GDDR cards (L40S, T4, GeForce) answer NOT_SUPPORTED, as the L4 does (DCGM #311), and have no memory series."),
    MetricDef("gpu_temperature_threshold_celsius", _G, "celsius", "Temperature thresholds in degrees Celsius (slowdown, shutdown, gpu_max, mem_max).",
              labels=("threshold",),
              value=lambda g: g.static.temperature_thresholds_celsius.items() if g.static else (),
              doc="mem_max on cards with a memory sensor (HBM: A100, H100); the others where the card reports them."),
    MetricDef("gpu_fan_speed_ratio", _G, "ratio", "Fan speed as a fraction of its maximum, per fan (can exceed 1).",
              labels=("fan",), value=lambda g: g.fan_speed_ratio.items(),
              doc="The intended speed as a fraction of the product's maximum noise-tolerance speed; nvml.h: it \"may exceed 100% in certain cases\", so values up to 2 are kept (255%, no reading, is left out and counted).  Passively cooled cards (A100, H100, L40S, T4) have no fans and no series."),
    MetricDef("gpu_power_usage_watts", _G, "watts", "Power draw in watts.", value=lambda g: g.power_usage_watts,
              doc="nvml.h: instantaneous on GA100 (A100) and older architectures (T4, V100); a 1 s average on other Ampere and newer GPUs (H100, H200, L40S, A10, GeForce RTX 30/40), so a short spike shows smaller there."),
    MetricDef("gpu_power_limit_watts", _G, "watts", "Enforced power limit in watts.", value=lambda g: g.power_limit_watts),
    MetricDef("gpu_energy_consumed_joules_total", _C, "joules", "Energy consumed since the driver was loaded, in joules.",
              value=lambda g: g.energy_consumed_joules_total,
              doc="nvmlDeviceGetTotalEnergyConsumption: Volta and newer (A100, H100, L40S, T4); absent on cards without it (many GeForce)."),
    MetricDef("gpu_clock_hertz", _G, "hertz", "Current clock frequency in hertz, per clock domain.",
              labels=("clock",), value=lambda g: g.clock_hertz.items(), collector=_CLK),
    MetricDef("gpu_clock_max_hertz", _G, "hertz", "Maximum clock frequency in hertz, per clock domain.",
              labels=("clock",), value=lambda g: g.static.clock_max_hertz.items() if g.static else (), collector=_CLK),
    MetricDef("gpu_performance_state", _G, "", "Performance state (0 = P0, the fastest, up to 15).",
              value=lambda g: g.performance_state, collector=_CLK,
              doc="Every card and driver; in MIG mode the whole GPU's."),
    MetricDef("gpu_clock_event_active", _G, "", "1 while a clock event reason (throttling) is active, per reason.",
              labels=("reason",), value=lambda g: g.clock_event_active.items(), collector=_CLK,
              doc="nvmlDeviceGetCurrentClocksEventReasons (R535 and newer, the renamed ThrottleReasons); the reasons are the nvml.h nvmlClocksEventReason* bits: " + ", ".join(CLOCK_EVENT_REASONS) + ".  board_limit and reliability from driver 615 on (the first nvml.h to define them); older drivers have no series for them."),
    MetricDef("gpu_violation_seconds_total", _C, "seconds", "Seconds the GPU's clocks were held below their target since the driver loaded, by policy (power, thermal, sync_boost, board_limit, low_utilization, reliability).",
              labels=("policy",), fields=_per_label(_NS, ((74, "power"), (75, "thermal"), (76, "sync_boost"), (77, "board_limit"),
                                                          (78, "low_utilization"), (79, "reliability"))), collector=_CLK,
              doc="NVML's perf-policy counters (field values 74-79, nanoseconds; what nvmlDeviceGetViolationStatus and dcgm-exporter's DCGM_FI_DEV_POWER_VIOLATION and DCGM_FI_DEV_THERMAL_VIOLATION read; known to every driver from R535 on). A policy the card does not report has no series; rate() of one is the fraction of time it held the GPU back."),
    MetricDef("gpu_clock_event_seconds_total", _C, "seconds", "Seconds the GPU's clocks were slowed since the driver loaded, by clock event reason (sw_thermal, hw_thermal, hw_power_brake).",
              labels=("reason",), fields=_per_label(_NS, ((269, "sw_thermal"), (270, "hw_thermal"), (271, "hw_power_brake")), since=(580, 82)),
              collector=_CLK, doc=_CLOCK_EVENT_COUNTERS_DOC),
    MetricDef("gpu_reset_required", _G, "", "1 when the driver answers the GPU's queries with NVML_ERROR_RESET_REQUIRED: it answers, but must be reset before it can be used again (its other values are then absent).",
              value=lambda g: g.reset_required,
              doc="Every driver; the simulator never sets it.  GpuResetRequired fires on it."),
    MetricDef("gpu_fabric_state", _G, "", "The GPU's registration with its NVLink fabric (nvmlDeviceGetGpuFabricInfoV): 1 not started, 2 in progress, 3 completed.",
              value=lambda g: g.fabric.state if g.fabric else None,
              doc=_FABRIC_DOC + "  Until it is 3, CUDA cannot use the fabric (jobs fail with error 802, \"system not yet initialized\", where the fabric manager is not running); GpuFabricNotReady fires after 5 min.", slow=True),
    MetricDef("gpu_fabric_health", _G, "", "The driver's summary of the GPU's NVLink fabric health: 1 healthy, 2 unhealthy, 3 limited capacity.",
              value=lambda g: g.fabric.health_summary if g.fabric else None, doc=_FABRIC_DOC, slow=True),
    MetricDef("gpu_fabric_issue", _G, "", "1 while the GPU's NVLink fabric reports an issue, 0 while it reports its absence, by issue (" + ", ".join((*FABRIC_ISSUES, FABRIC_REGISTRATION_FAILED)) + ").",
              labels=("issue",), value=lambda g: g.fabric.issues.items() if g.fabric else (),
              doc=_FABRIC_DOC + "  From the health mask, each issue where the driver reports its field (older drivers report fewer); registration_failed where the state is completed with an error status.  GpuFabricUnhealthy fires on any 1.", slow=True),
    MetricDef("gpu_recovery_action", _G, "", "The recovery the driver says the GPU needs (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): 0 none, 1 reset the GPU, 2 reboot the node, 3 drain peer-to-peer traffic, 4 drain and reset, 5 recover the IMEX domain, 6 reset the PCIe bus, 7 reboot the system.",
              fields=(FieldValue(230, since=(565,)),), doc=_RECOVERY_DOC),
    MetricDef("gpu_pcie_tx_bytes_per_second", _G, "bytes_per_second", "PCIe transmit throughput in bytes per second: the mean since the previous poll from the byte counter where there is one, else a 20 ms driver sample.",
              value=lambda g: g.pcie_tx_bytes_per_second, doc=_PCIE_RATE_DOC),
    MetricDef("gpu_pcie_rx_bytes_per_second", _G, "bytes_per_second", "PCIe receive throughput in bytes per second: the mean since the previous poll from the byte counter where there is one, else a 20 ms driver sample.",
              value=lambda g: g.pcie_rx_bytes_per_second, doc=_PCIE_RATE_DOC),
    MetricDef("gpu_pcie_tx_bytes_total", _C, "bytes", "PCIe bytes transmitted since the driver loaded (a narrow counter's wraps unwrapped).",
              value=lambda g: g.pcie_tx_bytes_total, doc=_PCIE_TOTAL_DOC),
    MetricDef("gpu_pcie_rx_bytes_total", _C, "bytes", "PCIe bytes received since the driver loaded (a narrow counter's wraps unwrapped).",
              value=lambda g: g.pcie_rx_bytes_total, doc=_PCIE_TOTAL_DOC),
    MetricDef("gpu_pcie_link_generation", _G, "", "Current PCIe link generation (idle cards may train down).",
              value=lambda g: g.pcie_link_generation,
              doc="Every card; an idle card trains its link down to save power, so compare with gpu_pcie_link_max_generation under load."),
    MetricDef("gpu_pcie_link_max_generation", _G, "", "Maximum PCIe link generation of the card and slot.",
              value=_static("pcie_max_generation")),
    MetricDef("gpu_pcie_link_width", _G, "", "Current PCIe link width in lanes.", value=lambda g: g.pcie_link_width),
    MetricDef("gpu_pcie_link_max_width", _G, "", "Maximum PCIe link width in lanes.", value=_static("pcie_max_width")),
    MetricDef("gpu_pcie_link_max_bytes_per_second", _G, "bytes_per_second", "Usable bandwidth of one direction of the link at its current generation and width: transfer rate per lane (2.5/5/8/16/32/64 GT/s) x line-code efficiency (8b/10b for Gen1-2, 128b/130b for Gen3-5, 242/256 for Gen6) / 8 x lanes.",
              value=lambda g: g.pcie_link_max_bytes_per_second),
    MetricDef("gpu_pcie_replay_errors_total", _C, "", "PCIe replay counter (link-level retransmissions).",
              value=lambda g: g.pcie_replay_errors_total,
              doc="Every card; since the driver loaded."),
    MetricDef("gpu_nvlink_tx_bytes_total", _C, "bytes", "NVLink data bytes transmitted, per link (NVML KiB x 1024).",
              labels=("link",), value=_links("tx_bytes_total"), collector=_NVL, doc=_NVLINK_DOC),
    MetricDef("gpu_nvlink_rx_bytes_total", _C, "bytes", "NVLink data bytes received, per link (NVML KiB x 1024).",
              labels=("link",), value=_links("rx_bytes_total"), collector=_NVL, doc=_NVLINK_DOC),
    MetricDef("gpu_nvlink_errors_total", _C, "", "NVLink errors since the driver loaded, per link and kind (replay, recovery, crc before Blackwell; NVLink 5's counters on Blackwell).",
              labels=("link", "error"),
              fields=(*_per_label(1.0, NVLINK_DL_ERRORS, per_link=True, arch_below=ARCH_BLACKWELL),
                      *_per_label(1.0, NVLINK5_ERRORS, NVLINK5_SINCE, per_link=True, arch_from=ARCH_BLACKWELL)),
              collector=_NVL, doc=_NVLINK_ERRORS_DOC, slow=True),
    MetricDef("gpu_c2c_errors_total", _C, "", "NVLink-C2C (GPU to Grace CPU) link errors since the driver loaded, by kind (crc, replay, replay_b2b).",
              labels=("error",), fields=_per_label(1.0, C2C_ERRORS, C2C_SINCE, arch_from=ARCH_HOPPER), collector=_NVL,
              doc="Grace Hopper (GH200) and Grace Blackwell (GB200) GPUs, driver 575 and newer (field values 231-233, "
                  "NVML_FI_DEV_C2C_LINK_ERROR_INTR, _REPLAY, _REPLAY_B2B: CRC errors, replays, back-to-back replays; "
                  "one count per GPU, read as DCGM reads its DCGM_FI_DEV_C2C_LINK_ERROR_* fields, 1400-1402).  Every other "
                  "GPU has no series: one before Hopper is not asked (its driver answers INVALID_ARGUMENT), a Hopper or "
                  "Blackwell without Grace answers NOT_SUPPORTED and is not asked again until the next static refresh.  A rising crc or replay_b2b count on a GPU whose jobs slow down "
                  "points at the C2C link."),
    MetricDef("gpu_nvlink_up", _G, "", "1 when the NVLink link is active, per link.",
              labels=("link",), value=_links("up"), collector=_NVL, doc=_NVLINK_DOC, slow=True),
    MetricDef("gpu_nvlink_links", _G, "", "NVLink links the GPU has, as the driver says (0: none).",
              value=_static("nvlink_links"), collector=_NVL,
              doc="Field NVML_FI_DEV_NVLINK_LINK_COUNT: 12 on an A100 SXM, 18 on an H100 SXM; 0 where the card "
                  "has none (the driver answers NOT_SUPPORTED: an L40S, a T4, a PCIe H100 without a bridge), so "
                  "that a GPU known to move nothing over NVLink tells itself apart from one whose NVLink is "
                  "unknown (no series: the NVLink collector off, or an exporter too old to say).  The report "
                  "reads it to size such a GPU without an NVLink card."),
    MetricDef("gpu_ecc_errors_total", _C, "", "ECC memory errors over the device lifetime, by type (corrected, uncorrected).",
              labels=("type",), value=lambda g: g.ecc_errors_total.items(), collector=_ECC,
              doc="The aggregate count (NVML_AGGREGATE_ECC: \"persist across reboots\", the device's lifetime), not the volatile one (reset each time the driver loads) that dcgm-exporter's default DCGM_FI_DEV_ECC_DBE_VOL_TOTAL reads; its DCGM_FI_DEV_ECC_DBE_AGG_TOTAL is this.  Cards with ECC enabled (data-center cards such as A100, H100, L40S, T4); GeForce cards have none and no series.", slow=True),
    MetricDef("gpu_remapped_rows_total", _C, "", "Memory rows remapped, by cause (correctable, uncorrectable).",
              labels=("cause",), value=lambda g: g.remapped_rows_total.items(), collector=_ECC,
              doc="nvml.h: Ampere and newer (A100, H100, L40S); a T4 retires pages instead and has no series; not given on a GPU in MIG mode with active instances.", slow=True),
    MetricDef("gpu_row_remap_pending", _G, "", "1 when a row remap is pending and the GPU needs a reset.",
              value=lambda g: g.row_remap_pending, collector=_ECC,
              doc="As gpu_remapped_rows_total: Ampere and newer (A100, H100, L40S), not a T4, not in MIG mode with active instances.", slow=True),
    MetricDef("gpu_row_remap_failure", _G, "", "1 when a row remap has failed.",
              value=lambda g: g.row_remap_failure, collector=_ECC,
              doc="As gpu_remapped_rows_total: Ampere and newer (A100, H100, L40S), not a T4, not in MIG mode with active instances.", slow=True),
    MetricDef("gpu_xid_errors_total", _C, "", "XID error events seen since the exporter started, by XID code.",
              labels=("xid",), value=lambda g: ((str(x), n) for x, n in sorted(g.xid_errors_total.items())),
              while_down=True,
              doc="Counted per GPU UUID, so a count stays with its GPU when an NVML restart gives the GPUs other indices.  When a GPU falls off the bus (the event wait answers GPU_IS_LOST) the other GPUs go on being watched, and the lost GPU keeps its series (its XID 79 among them) beside gpu_up 0."),
    MetricDef("gpu_processes", _G, "", "Processes using the GPU, all of them (also those beyond the per-GPU series cap).",
              value=lambda g: len(g.processes), collector=_PROC,
              doc="Compute and graphics processes of the whole GPU; in MIG mode the parent lists the processes of every instance (each MIG device lists its own in gpu_mig_process_memory_used_bytes)."),
    MetricDef("gpu_process_memory_used_bytes", _G, "bytes", "GPU memory used by a process, in bytes (the processes using the most memory, up to the configured cap per GPU).",
              scope=Scope.PROCESS, value=lambda p: p.used_memory_bytes, collector=_PROC,
              doc="Absent for a process whose memory the driver does not report (NVML_VALUE_NOT_AVAILABLE: WDDM, or no permission)."),
    MetricDef("gpu_process_sm_utilization_ratio", _G, "ratio", f"SM utilization of a process in the driver's latest sample since the previous poll (0-1; 0 when idle since then; {_CAPPED}).",
              scope=Scope.PROCESS, value=lambda p: p.sm_utilization_ratio, collector=_PROC,
              doc="nvmlDeviceGetProcessUtilization: not on a GPU in MIG mode (nvml.h), where the series is absent."),
    MetricDef("gpu_process_memory_utilization_ratio", _G, "ratio", f"Memory (frame buffer) utilization of a process in the driver's latest sample since the previous poll (0-1; {_CAPPED}).",
              scope=Scope.PROCESS, value=lambda p: p.memory_utilization_ratio, collector=_PROC,
              doc="nvmlDeviceGetProcessUtilization: not on a GPU in MIG mode (nvml.h), where the series is absent."),
    MetricDef("gpu_pod_info", _G, "", "Constant 1 for every Kubernetes container holding the GPU or one of its MIG devices (device_uuid), from the kubelet; present only with pod attribution on.",
              labels=("device_uuid",), pods=True),
    MetricDef("gpu_holder_info", _G, "", "Constant 1 for every holder of the GPU or one of its MIG devices (device_uuid): a pod, a Slurm job, a container or a user, by kind, with every label of its kind.",
              labels=("kind", "device_uuid", "uid", "claim_namespace", "claim_name"), holder=True, collector=_PROC,
              doc="Kinds: pod (namespace, pod, container; with pod attribution on, the only kind), job (hpc_job, user, slurm_account, slurm_partition), container (container_engine, container_id, container_name), user.  A job's labels beyond hpc_job, and the container labels, are present only where their attribution is on.  A pod's uid (the label OpenCost joins on) is there where its processes' cgroups give it, and claim_namespace and claim_name where it holds the device through a DRA resource claim; see docs/holders-processes-mig.md."),
    MetricDef("gpu_mig_info", _G, "", "Constant 1 for each MIG device of a GPU in MIG mode; the labels give its UUID, GPU and compute instance ids and profile.",
              scope=Scope.MIG, value=lambda m: 1,
              doc="A100 and H100 in MIG mode; compute_instance_id tells apart the compute instances of one GPU instance."),
    MetricDef("gpu_mig_memory_total_bytes", _G, "bytes", "Memory of a MIG device, in bytes.",
              scope=Scope.MIG, value=lambda m: m.memory_total_bytes),
    MetricDef("gpu_mig_memory_used_bytes", _G, "bytes", "Memory used on a MIG device, in bytes.",
              scope=Scope.MIG, value=lambda m: m.memory_used_bytes),
    MetricDef("gpu_mig_memory_free_bytes", _G, "bytes", "Memory free on a MIG device, in bytes.",
              scope=Scope.MIG, value=lambda m: m.memory_free_bytes),
    *(MetricDef(f"gpu_mig_{stem}_ratio", _G, "ratio", f"Like gpu_{stem}_ratio, for one MIG GPU instance, from GPM (0-1).",
                scope=Scope.MIG, value=_activity(field), collector=_PRF, doc=_MIG_GPM_DOC)
      for stem, field, _ in ACTIVITY_METRICS),
    MetricDef("gpu_mig_process_memory_used_bytes", _G, "bytes", f"Memory used by a process on a MIG device, in bytes ({_CAPPED}).",
              scope=Scope.MIG_PROCESS, value=lambda p: p.used_memory_bytes, collector=_PROC),
    # The accounting's books (serving/accounting_metrics.py renders them from the ledger, not a snapshot).
    MetricDef("gpu_state_seconds_total", _C, "seconds", "Seconds each GPU spent in each state (busy, allocated_idle, allocated_unknown, idle, down), by holder: the pod with pod attribution, else the Slurm job, container or user holding it; a shared GPU's time is split between its holders, a GPU in MIG mode's between its GPU instances (gpu_instance_id) by their share of the card.",
              labels=("gpu_instance_id", "state"), holder=True,
              doc="One holder per series, with the labels of its kind (as gpu_holder_info); the job and container labels are present only where their attribution is on.  Time nobody held has every holder label empty.  allocated_unknown: held, but the driver gives no activity to judge it by (a MIG slice of an A100 or A30, which have no GPM).  A GPU in MIG mode keeps books per GPU instance (gpu_instance_id, at most 7 per card), each from its own GPM activity and holders, its seconds weighted by its compute slices out of the card's (a 1g of 7 counts 1/7 of each second), so a card's series add up to its time; the slices no instance takes count as idle with gpu_instance_id empty, as does a whole GPU's time (and a card's down)."),
    MetricDef("gpu_last_active_timestamp_seconds", _G, "seconds", "Unix time the GPU was last busy (activity at or above the idle threshold); absent until it has been busy since the exporter started."),
    MetricDef("gpu_memory_used_max_bytes", _G, "bytes", "Highest GPU memory used seen by the polls over the memory peak window (default 5 min), in bytes."),
    MetricDef("gpu_price_per_hour", _G, "", "Price of the GPU per hour in the configured currency, from the pricing settings; absent where no price is configured.",
              labels=("currency",)),
    MetricDef("gpu_energy_price_per_kwh", _G, "", "Price of one kWh of energy in the configured currency, from the pricing settings; absent where none is configured.",
              labels=("currency",)),
    # The exporter's own health.
    MetricDef("gpu_exporter_build_info", _G, "", "Constant 1; labels give the exporter's version.",
              scope=Scope.EXPORTER, labels=("version", "python_version", "nvidia_ml_py_version")),
    MetricDef("gpu_exporter_nvml_up", _G, "", "1 when NVML is initialised and answering.", scope=Scope.EXPORTER),
    MetricDef("gpu_exporter_nvml_released", _G, "", "1 while NVML is let go of on request (SIGUSR1), so that a GPU reset or a driver upgrade finds no client holding the driver; 0 otherwise.",
              scope=Scope.EXPORTER,
              doc="gpu_exporter_nvml_up is 0 meanwhile and GpuExporterNvmlDown holds off; SIGUSR2, or the end of --poll.release-for, takes NVML again.  See docs/troubleshooting.md."),
    MetricDef("gpu_exporter_poll_duration_seconds", _H, "seconds", "Wall time of one poll of all GPUs.", scope=Scope.EXPORTER),
    MetricDef("gpu_exporter_last_poll_success_timestamp_seconds", _G, "seconds", "Unix time of the last poll in which NVML answered.",
              scope=Scope.EXPORTER),
    MetricDef("gpu_exporter_config_reload_failures_total", _C, "", "Configuration reloads (SIGHUP) that failed, the running configuration kept: a file that does not load, a setting refused, a web config that does not load.",
              scope=Scope.EXPORTER),
    MetricDef("gpu_exporter_config_last_reload_success_timestamp_seconds", _G, "seconds", "Unix time the configuration in force was loaded: at start, then at each successful reload (SIGHUP).",
              scope=Scope.EXPORTER),
    MetricDef("gpu_exporter_alerts", _G, "", "Pending and firing alerts, like Prometheus's ALERTS: the number of alerts with these labels.",
              scope=Scope.EXPORTER, labels=("alertname", "alertstate", "severity", "gpu", "uuid")),
    MetricDef("gpu_exporter_notifications_total", _C, "", "Alert notifications by receiver and outcome (sent, retried, rejected, dropped).",
              scope=Scope.EXPORTER, labels=("receiver", "outcome")),
    MetricDef("gpu_exporter_notification_queue_length", _G, "", "Alerts waiting for a receiver that is slow or down (to an Alertmanager: not yet delivered; to a webhook: in groups with an undelivered change).",
              scope=Scope.EXPORTER, labels=("receiver",)),
    MetricDef("gpu_exporter_kubelet_refreshes_total", _C, "", "Refreshes of pod attribution from the kubelet's PodResources API, by outcome (ok, error, missing).",
              scope=Scope.EXPORTER, labels=("outcome",)),
    MetricDef("gpu_exporter_pod_attribution_unattributed_devices", _G, "", "Devices the kubelet lists as held by a container that the exporter gave to no GPU at the last poll, by reason: other_driver (a DRA driver other than gpu.nvidia.com), unparsed (an id in no known form), vfio (passed through to a VM), bad_claim (a claim without a name or namespace), no_such_device (no GPU of the node has it); present with pod attribution on.",
              scope=Scope.EXPORTER, labels=("reason",)),
    MetricDef("gpu_exporter_pod_attribution_expired_total", _C, "", "Times the last good pod attribution was dropped because the kubelet had not answered for kubernetes.keep_last_good_for.",
              scope=Scope.EXPORTER),
    MetricDef("gpu_exporter_holder_errors_total", _C, "", "Failed reads of the sources of Slurm jobs and container names, by source: job_mapping (the job mapping directory or one of its files), engine_api (a container engine's socket); present where the source is on.",
              scope=Scope.EXPORTER, labels=("source",)),
    MetricDef("gpu_exporter_log_lines_dropped_total", _C, "", "Log lines dropped because the reader of the exporter's stderr did not keep up (the daemon never waits on its log).",
              scope=Scope.EXPORTER),
    MetricDef("gpu_exporter_nvml_errors_total", _C, "", "Failed NVML queries, by function and error (not_supported, function_not_found, no_permission, and invalid_argument for a field value the driver does not know, are counted once per GPU and query, then again after each static refresh).",
              scope=Scope.EXPORTER, labels=("function", "error")),
)  # fmt: skip

METRICS: Mapping[str, MetricDef] = {d.name: d for d in _DEFS}
# The metrics read from NVML field values (each with its FieldValues), for the backend's poll.
FIELD_METRICS: tuple[MetricDef, ...] = tuple(d for d in _DEFS if d.fields)
# Every label name the exporter's own series and alerts use, which a configured label name (the pod
# labels' names) must not take; the pod labels' default names are theirs.  ``node`` is the alerts'.
OWN_LABELS: frozenset[str] = frozenset(
    {label for d in _DEFS for label in d.series_labels(EVERY_HOLDER)} - set(DEFAULT_POD_LABELS) | {"node"}
)


# The metric names each collector contributes; every other metric is always on.
COLLECTOR_METRICS: Mapping[str, frozenset[str]] = {
    c.value: frozenset(d.name for d in _DEFS if d.collector == c) for c in Collector
}


def series_names() -> dict[str, str]:
    """Every series name a query may select -> the metric it belongs to (histograms have three)."""
    out = {}
    for d in _DEFS:
        out[d.name] = d.name
        if d.type == "histogram":
            out |= {d.name + suffix: d.name for suffix in ("_bucket", "_sum", "_count")}
    return out


def gpu_metrics(scope: Scope) -> tuple[MetricDef, ...]:
    """The declarations of one scope that read a snapshot (those with a ``value``)."""
    return tuple(d for d in _DEFS if d.scope == scope and d.value is not None)


_SLOW_DOC = "  Read every poll_slow_interval (30 s), not every poll: up to that old."


def reference_table() -> str:
    """docs/metrics.md's reference table, one row per metric."""
    rows = ["| metric | type | unit | labels | collector | meaning |", "|---|---|---|---|---|---|"]
    for d in _DEFS:
        labels = ", ".join(f"`{label}`" for label in d.all_labels)
        meaning = f"{d.help} {d.doc}{_SLOW_DOC if d.slow else ''}".strip().replace("|", "\\|")
        rows.append(f"| `{d.name}` | {d.type} | {d.unit or '-'} | {labels} | {d.collector or '-'} | {meaning} |")
    return "\n".join(rows) + "\n"
