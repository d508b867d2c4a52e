"""The values a scenario file holds: NVML error names, moving counters, process and XID lines, and
the names and limits the builders check against (``scenario.py`` builds files from them)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Self

from gpu_exporter.metric_defs import CLOCK_EVENT_REASONS as DECLARED_REASONS
from gpu_exporter.metric_defs import METRICS

from .build import nvml_header

NVML_ERRORS = frozenset(
    {
        "UNINITIALIZED",
        "INVALID_ARGUMENT",
        "NOT_SUPPORTED",
        "NO_PERMISSION",
        "NOT_FOUND",
        "INSUFFICIENT_SIZE",
        "INSUFFICIENT_POWER",
        "DRIVER_NOT_LOADED",
        "TIMEOUT",
        "IRQ_ISSUE",
        "LIBRARY_NOT_FOUND",
        "FUNCTION_NOT_FOUND",
        "CORRUPTED_INFOROM",
        "GPU_IS_LOST",
        "RESET_REQUIRED",
        "OPERATING_SYSTEM",
        "LIB_RM_VERSION_MISMATCH",
        "IN_USE",
        "MEMORY",
        "NO_DATA",
        "INSUFFICIENT_RESOURCES",
        "ARGUMENT_VERSION_MISMATCH",
        "NOT_READY",
        "GPU_NOT_FOUND",
        "INVALID_STATE",
        "UNKNOWN",
    }
)


def _header_reasons() -> dict[str, int]:
    """nvml.h's clock event reason bits by their names there (GpuIdle, ...): NVIDIA's header, not the
    exporter's declaration, so that a bit declared wrongly there shows as a scenario that disagrees.
    nvml.h 13.x spells some nvmlClocksThrottleReason* (deprecated aliases of the others)."""
    text = nvml_header().read_text(encoding="utf-8", errors="replace")
    out: dict[str, int] = {}
    for prefix, name, value in re.findall(r"#define nvmlClocks(Event|Throttle)Reason(\w+)\s+(0x[0-9A-Fa-f]+)LL", text):
        if prefix == "Event" or name not in out:
            out[name] = int(value, 16)
    return out


# nvml.h's bits, by NVIDIA's names; and by the label values the exporter declares for them (the
# names are the declaration's, the bits the header's).
NVML_CLOCK_EVENT_REASONS = _header_reasons()
CLOCK_EVENT_REASONS = {label: NVML_CLOCK_EVENT_REASONS[r.nvml_name] for label, r in DECLARED_REASONS.items()}


def _header_defines(prefix: str) -> dict[str, int]:
    """nvml.h's ``#define <prefix><NAME> <number>`` values, by NAME."""
    text = nvml_header().read_text(encoding="utf-8", errors="replace")
    return {name: int(value, 0) for name, value in re.findall(rf"#define {prefix}(\w+)\s+(0x[0-9A-Fa-f]+|\d+)", text)}


# The NVLink fabric's states and health mask, from NVIDIA's nvml.h (the exporter decodes the mask
# with nvidia-ml-py's constants: two sources that must agree).
FABRIC_STATES = {n.lower(): v for n, v in _header_defines("NVML_GPU_FABRIC_STATE_").items()}
FABRIC_HEALTH_SUMMARIES = {n.lower(): v for n, v in _header_defines("NVML_GPU_FABRIC_HEALTH_SUMMARY_").items()}
_MASK = _header_defines("NVML_GPU_FABRIC_HEALTH_MASK_")


def nvml_return_code(name: str) -> int:
    """nvml.h's nvmlReturn_t value of ``SUCCESS`` or an error name (``NOT_READY``)."""
    text = nvml_header().read_text(encoding="utf-8", errors="replace")
    enum = "NVML_SUCCESS" if name == "SUCCESS" else f"NVML_ERROR_{name}"
    m = re.search(rf"\b{enum}\s*=\s*(\d+)", text)
    if m is None:
        raise ValueError(f"no nvmlReturn_t {enum} in nvml.h")
    return int(m.group(1))


def fabric_health_mask(**fields: str) -> int:
    """A health mask from nvml.h's names: ``fabric_health_mask(DEGRADED_BW="TRUE", GFM_STATE="CONNECTED")``
    puts NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE at NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW."""
    mask = 0
    for name, value in fields.items():
        shift, v = _MASK.get(f"SHIFT_{name}"), _MASK.get(f"{name}_{value}")
        if shift is None or v is None:
            known = sorted(k.removeprefix("SHIFT_") for k in _MASK if k.startswith("SHIFT_"))
            raise ValueError(f"no nvml.h health mask value {name}_{value}; fields: {known}")
        mask |= v << shift
    return mask


EVENT_XID_CRITICAL = 0x8
# The NVLink error counters fakenvml.c keeps per link (its nvlink_errors[], whose field ids are nvml.h's
# macros): NVLink 4's DL counters, then NVLink 5's.
NVLINK_ERROR_KINDS = frozenset({
    "replay", "recovery", "crc", "malformed_packet", "buffer_overrun", "receive", "receive_remote", "receive_general",
    "local_link_integrity", "transmit_discard", "recovery_successful", "recovery_failed", "effective", "symbol",
})  # fmt: skip
# NVLink-C2C's error counters (fields 231-233), by the names of the fake's c2c.errors.<kind> keys.
C2C_ERROR_KINDS = ("crc", "replay", "replay_b2b")
THRESHOLDS = ("shutdown", "slowdown", "mem_max", "gpu_max", "acoustic_min", "acoustic_curr", "acoustic_max", "gps_curr")
CLOCKS = ("graphics", "sm", "memory", "video")
# GPM metrics a scenario can set, in percent, by their key names in the file (gpm.<name>).
# The perf-policy counters (fields 74-79) and the clock event reason counters (269-271) by the label
# values their metrics declare.  Which field id serves each is the fake's own nvml.h model
# (fakenvml.c's violation_names and clock_event_names, in id order); test_fakenvml_field_names.py
# holds that model and the declarations' ids to one another.
VIOLATION_POLICIES = tuple(f.label for f in METRICS["gpu_violation_seconds_total"].fields)
CLOCK_EVENT_COUNTERS = tuple(f.label for f in METRICS["gpu_clock_event_seconds_total"].fields)
GPM_METRICS = ("graphics_util", "sm_util", "sm_occupancy", "integer_util", "any_tensor_util", "dfma_tensor_util",
               "hmma_tensor_util", "dmma_tensor_util", "imma_tensor_util", "dram_bw_util", "fp64_util", "fp32_util",
               "fp16_util")  # fmt: skip
MAX_FANS = 8
MAX_NVLINKS = 36
# Driver branches the fake models (README: "Driver profiles"), each with a real release's driver,
# NVML and CUDA versions: what nvmlSystemGet*Version answer for a scenario of that branch.
DRIVER_PROFILES: dict[int, tuple[str, str, int]] = {
    535: ("535.183.01", "12.535.183.01", 12020),
    550: ("550.54.15", "12.550.54.15", 12040),
    570: ("570.133.20", "12.570.133.20", 12080),
    580: ("580.65.06", "13.580.65.06", 13000),
}


@dataclass(frozen=True)
class Err:
    """An NVML error returned instead of a value, e.g. ``Err("NOT_SUPPORTED")``."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in NVML_ERRORS:
            raise ValueError(f"unknown NVML error {self.name!r}; known: {', '.join(sorted(NVML_ERRORS))}")

    def __str__(self) -> str:
        return f"!{self.name}"


NOT_SUPPORTED = Err("NOT_SUPPORTED")
GPU_IS_LOST = Err("GPU_IS_LOST")


@dataclass(frozen=True)
class Counter:
    """A value that moves on its own: ``start`` plus ``per_second`` for every second that passes."""

    start: int
    per_second: float

    def __str__(self) -> str:
        sign = "-" if self.per_second < 0 else "+"
        return f"{self.start} {sign}{_num(abs(self.per_second))}/s"


Value = int | float | str | Err | Counter


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _render(v: Value) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (Err, Counter)):
        return str(v)
    if isinstance(v, (int, float)):
        return _num(v)
    if "\n" in v or not v.strip():
        raise ValueError(f"string values must be one non-empty line, got {v!r}")
    return v.strip()


def _check_range(name: str, v: Value | None, lo: float, hi: float) -> None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not lo <= v <= hi:
        raise ValueError(f"{name}={v} is outside {lo}..{hi}")


@dataclass
class Process:
    pid: int
    used_bytes: int | None  # None: NVML_VALUE_NOT_AVAILABLE, as under WDDM or without permission
    kind: Literal["compute", "graphics", "mps"] = "compute"  # mps: in the MPS client list only
    name: str | Err | None = None  # what nvmlSystemGetProcessName answers; None: read /proc
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    # Percent, as nvmlDeviceGetProcessUtilization reports (sm, mem, enc, dec); all 0: not sampled.
    utilization: tuple[int, int, int, int] = (0, 0, 0, 0)

    def render(self) -> str:
        parts = [self.kind, f"pid={self.pid}", f"used={'-' if self.used_bytes is None else self.used_bytes}"]
        for word, v in zip(("sm", "mem", "enc", "dec"), self.utilization, strict=True):
            if v:
                parts.append(f"{word}={v}")
        if self.name is not None:
            if isinstance(self.name, str) and (not self.name or any(c.isspace() for c in self.name)):
                raise ValueError(f"process names in scenarios cannot hold spaces: {self.name!r}")
            parts.append(f"name={self.name}")
        if self.gpu_instance_id is not None:
            parts.append(f"gi={self.gpu_instance_id}")
        if self.compute_instance_id is not None:
            parts.append(f"ci={self.compute_instance_id}")
        return " ".join(parts)


@dataclass
class Xid:
    code: int
    after_s: float | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def render(self) -> str:
        parts = [str(self.code)]
        if self.after_s is not None:
            parts.append(f"after={_num(self.after_s)}")
        if self.gpu_instance_id is not None:
            parts.append(f"gi={self.gpu_instance_id}")
        if self.compute_instance_id is not None:
            parts.append(f"ci={self.compute_instance_id}")
        return " ".join(parts)


@dataclass
class Device:
    """Keys common to whole GPUs and MIG devices.  A key never set reads as NOT_SUPPORTED."""

    values: dict[str, Value] = field(default_factory=dict)

    def set(self, key: str, value: Value) -> Self:
        self.values[key] = value
        return self

    def unset(self, *keys: str) -> Self:
        """Remove keys, so that their NVML calls answer NOT_SUPPORTED."""
        for k in keys:
            self.values.pop(k, None)
        return self

    def error(self, key: str, err: str | Err) -> Self:
        return self.set(key, err if isinstance(err, Err) else Err(err))

    def identity(self, name: str, uuid: str) -> Self:
        return self.set("name", name).set("uuid", uuid)

    def utilization(self, gpu: int | Err, memory: int | Err) -> Self:
        _check_range("util.gpu", gpu, 0, 100)
        _check_range("util.memory", memory, 0, 100)
        return self.set("util.gpu", gpu).set("util.memory", memory)

    def memory(self, total: int | Err, used: int | Err, reserved: int | Err = 0, free: int | None = None) -> Self:
        """``used`` is what NVML's v2 struct reports (allocations only); v1's used adds ``reserved``."""
        self.set("memory.total", total).set("memory.used", used).set("memory.reserved", reserved)
        if free is not None:
            self.set("memory.free", free)
        return self

    def clocks(self, **mhz: int | Err) -> Self:
        """``clocks(graphics=1980, sm=1980, memory=2619, video=1755, max_graphics=1980, ...)``."""
        for k, v in mhz.items():
            base = k.removeprefix("max_")
            if base not in CLOCKS:
                raise ValueError(f"unknown clock {k!r}; known: {CLOCKS} and max_<clock>")
            self.set(f"clock.{'max.' if k.startswith('max_') else ''}{base}_mhz", v)
        return self

    def delay(self, ms: float) -> Self:
        """Every call on this device blocks this long first, like a hung driver call."""
        return self.set("delay_ms", ms)

    def processes_refused(self, kind: Literal["compute", "graphics", "mps"], err: str | Err = "NOT_SUPPORTED") -> Self:
        """nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses fail with ``err`` on this device
        (``mps`` NOT_SUPPORTED: a card older than Volta, nvml.h)."""
        return self.error(f"processes.{kind}", err)

    def gpm(self, **percent: float | Err | None) -> Self:
        """GPM activity in percent, held until changed: ``gpm(sm_util=40, dram_bw_util=12)``.

        A metric left out answers NOT_SUPPORTED in nvmlGpmMetricsGet; None removes it.  On a whole
        GPU, GPM itself must also be switched on with ``Gpu.gpm_supported``.
        """
        for k, v in percent.items():
            if k not in GPM_METRICS:
                raise ValueError(f"unknown GPM metric {k!r}; known: {', '.join(GPM_METRICS)}")
            if v is None:
                self.values.pop(f"gpm.{k}", None)
            else:
                self.set(f"gpm.{k}", v)
        return self
