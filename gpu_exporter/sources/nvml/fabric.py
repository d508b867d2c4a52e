"""The GPU's NVLink fabric: registration state and health (nvmlDeviceGetGpuFabricInfoV).

nvml.h: "For Hopper or newer fully supported devices"; the caller sets the struct's version.  Driver
550 takes nvmlGpuFabricInfo_v2_t (the health mask); 580's nvml.h adds v3 (the health summary), which
an older driver refuses with ARGUMENT_VERSION_MISMATCH, so v3 is asked where the driver is 580 or
newer and the bindings have it, and v2 thereafter if it is refused.  The mask's fields are decoded
with the bindings' constants: a field they do not define is not read.
"""

from __future__ import annotations

import ctypes
from types import MappingProxyType
from typing import Any

import pynvml
import structlog

from ...metric_defs import FABRIC_ISSUES, FABRIC_REGISTRATION_FAILED
from ...snapshot import FabricReading
from .device import Device, raise_error

log = structlog.get_logger(__name__)

FUNCTION = "nvmlDeviceGetGpuFabricInfoV"
SINCE = (550,)  # the first driver with it (nvidia-ml-py 12.550 binds it): an older one is not asked
SUMMARY_SINCE = (580,)  # the first driver whose nvml.h has nvmlGpuFabricInfo_v3_t
_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED


def _structs(driver: tuple[int, ...]) -> list[Any]:
    """The struct types to try, newest first: v3 where the driver and bindings have it, then v2 (named
    c_nvmlGpuFabricInfoV_t before nvidia-ml-py 13)."""
    out = []
    if driver >= SUMMARY_SINCE and (v3 := getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None)) is not None:
        out.append(v3)
    v2 = getattr(pynvml, "c_nvmlGpuFabricInfo_v2_t", None) or getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None)
    if v2 is not None:
        out.append(v2)
    return out


_MASK = "NVML_GPU_FABRIC_HEALTH_MASK_"


def _mask_values(field: str, names: tuple[str, ...]) -> frozenset[int]:
    """The values of the health mask's ``field`` that the bindings name among ``names``."""
    return frozenset(v for n in names if (v := getattr(pynvml, f"{_MASK}{field}_{n}", None)) is not None)


def _decoders() -> tuple[tuple[str, int, int, frozenset[int], frozenset[int]], ...]:
    """(issue, shift, width mask, values meaning present, values meaning absent) for each declared
    issue whose field the bindings define."""
    out = []
    for issue, d in FABRIC_ISSUES.items():
        shift = getattr(pynvml, f"{_MASK}SHIFT_{d.field}", None)
        width = getattr(pynvml, f"{_MASK}WIDTH_{d.field}", None)
        if shift is not None and width is not None:
            present, absent = _mask_values(d.field, d.present), _mask_values(d.field, d.absent)
            out.append((issue, int(shift), int(width), present, absent))
    return tuple(out)


DECODERS = _decoders()
# Issues whose mask field the installed bindings do not name (12.570 names the first four, 13.580
# INCORRECT_CONFIGURATION, 13.595 GFM_STATE: metric_defs.FABRIC_ISSUES).
UNDECODED = tuple(issue for issue in FABRIC_ISSUES if issue not in {d[0] for d in DECODERS})


_said: set[str] = set()


def _bindings_lack(what: str, needs: str) -> None:
    """Say once that the driver has (or may report) a fabric feature the installed nvidia-ml-py cannot
    ask for or decode: its series would otherwise be missing without a word (issue 49)."""
    if what not in _said:
        _said.add(what)
        log.warning("fabric_off_in_bindings", missing=what, bindings=getattr(pynvml, "__file__", None),
                    reason=f"the installed nvidia-ml-py lacks it: its series are left out; {needs} has it")  # fmt: skip


def read_fabric(dev: Device, driver: tuple[int, ...]) -> FabricReading | None:
    """This poll's fabric reading; None where the GPU has no fabric, or the driver or bindings cannot say."""
    fn = getattr(pynvml, FUNCTION, None)
    if driver < SINCE or FUNCTION in dev.unsupported:
        return None
    if fn is None:  # which GPU has a fabric cannot be asked either: said once for the node
        _bindings_lack(FUNCTION + " (the fabric of NVSwitch and multi-node NVLink GPUs)", "nvidia-ml-py 12.550.89")
        return None
    structs = _structs(driver)[dev.fabric_refused :]
    for struct in structs:
        info = struct()  # sets its version
        try:
            fn(dev.handle, ctypes.byref(info))  # nvidia-ml-py hands the pointer on as it is given
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH and struct is not structs[-1]:
                dev.fabric_refused += 1  # this driver predates the struct: the older one from now on
                continue
            dev.call(FUNCTION, raise_error, e)  # counted, and NOT_SUPPORTED remembered, as every query
            return None
        reading = decode(info)
        if reading is not None:  # this GPU has a fabric: what of it the bindings cannot read is said
            if driver >= SUMMARY_SINCE and not hasattr(pynvml, "c_nvmlGpuFabricInfo_v3_t"):
                _bindings_lack("c_nvmlGpuFabricInfo_v3_t (the health summary)", "nvidia-ml-py 13.580.65")
            if UNDECODED:
                _bindings_lack("the health mask fields of " + ", ".join(UNDECODED), "nvidia-ml-py 13.595.45")
        return reading
    return None


def decode(info: Any) -> FabricReading | None:
    """A fabric struct (v2 or v3) as a reading; None where its state says the GPU has no fabric."""
    state = int(info.state)
    if state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return None
    issues: dict[str, bool] = {}
    mask = int(info.healthMask)
    for issue, shift, width, present, absent in DECODERS:
        v = (mask >> shift) & width
        if v in present or v in absent:
            issues[issue] = v in present
    if state == _COMPLETED:  # nvml.h: status "must be checked only if state returns complete"
        issues[FABRIC_REGISTRATION_FAILED] = int(info.status) != pynvml.NVML_SUCCESS
    summary = int(getattr(info, "healthSummary", 0))  # v3 only
    return FabricReading(state=state, health_summary=summary or None, issues=MappingProxyType(issues))
