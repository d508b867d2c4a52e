"""Field values (``nvmlDeviceGetFieldValues``): memory temperature, the perf-policy counters, the PCIe
byte counters and the NVLink traffic counters, all in one call per GPU through one array per GPU.

The array is reused from poll to poll (no allocation per poll), and restored to its pristine state,
field ids set and every value zeroed, before each call: some drivers add into the caller's
``value`` instead of writing it (go-nvml #46: "18, 28, 38, 48 ... increase linearly"), which
nvidia-ml-py never meets because it builds a fresh, zeroed array per call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from . import bindings
from .device import Device
from .errors import UNSUPPORTED, error_name

# Field ids are part of the driver's ABI (nvml.h); older nvidia-ml-py releases lack some names.
FI_MEMORY_TEMP = getattr(pynvml, "NVML_FI_DEV_MEMORY_TEMP", 82)
FI_NVLINK_LINK_COUNT = getattr(pynvml, "NVML_FI_DEV_NVLINK_LINK_COUNT", 91)
FI_PCIE_TX = getattr(pynvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197)
FI_PCIE_RX = getattr(pynvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)
FI_NVLINK_TX = getattr(pynvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138)  # KiB
FI_NVLINK_RX = getattr(pynvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139)  # KiB
# NVLink 5's (Blackwell), where the KiB counters do not apply: bytes (nvml.h "Total Tx bytes on the
# link in NVLink5"), first in nvidia-ml-py 12.560's nvml.h.
FI_NVLINK5_TX = getattr(pynvml, "NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES", 202)
FI_NVLINK5_RX = getattr(pynvml, "NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES", 204)
_PCIE_COUNTERS = ((FI_PCIE_TX, 0), (FI_PCIE_RX, 0))
# A field id the driver does not know (197/198 on R535, whose NVML_FI_MAX is 197) comes back per
# entry as INVALID_ARGUMENT: as final for this driver as NOT_SUPPORTED is for this card.
_NOT_HERE = UNSUPPORTED | {pynvml.NVML_ERROR_INVALID_ARGUMENT}
# nvmlValueType_t (nvml.h); 6, unsigned short, came with R570 and is missing from older bindings.
_DOUBLE, _UINT, _ULONG, _ULL, _SLL, _SINT, _USHORT = range(7)


class _Value(ctypes.Union):
    """nvmlValue_t (nvml.h), all seven members, whatever the installed bindings know."""

    _fields_ = [("dVal", ctypes.c_double), ("siVal", ctypes.c_int), ("uiVal", ctypes.c_uint),
                ("ulVal", ctypes.c_ulong), ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong),
                ("usVal", ctypes.c_ushort)]  # fmt: skip


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t (nvml.h) in plain ctypes; the union read by ``valueType``."""

    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32), ("timestamp", ctypes.c_int64),
                ("latencyUsec", ctypes.c_int64), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", _Value)]  # fmt: skip


_VALUE_READERS: dict[int, Callable[[Any], int | float]] = {
    _DOUBLE: lambda v: float(v.dVal),
    _UINT: lambda v: int(v.uiVal),
    _ULONG: lambda v: int(v.ulVal),
    _ULL: lambda v: int(v.ullVal),
    _SLL: lambda v: int(v.sllVal),
    _SINT: lambda v: int(v.siVal),
    _USHORT: lambda v: int(v.usVal),
}
# Widths of the integer types a counter can come in, for counters that wrap at their type's width.
VALUE_BITS = {_UINT: 32, _USHORT: 16, _ULONG: 8 * ctypes.sizeof(ctypes.c_ulong), _ULL: 64, _SLL: 64}


class FieldArray:
    """One GPU's array for a set of fields, with a pristine copy to restore it from before each call."""

    def __init__(self, fields: tuple[tuple[int, int], ...]) -> None:
        self.fields = fields
        self.array = (_FieldValue * len(fields))()
        for entry, (field_id, scope) in zip(self.array, fields, strict=True):
            entry.fieldId, entry.scopeId = field_id, scope
        self._pristine = (_FieldValue * len(fields))()
        self._size = ctypes.sizeof(self.array)
        ctypes.memmove(self._pristine, self.array, self._size)
        # Where the PCIe byte counters are, found once, not by a walk over every field each poll.
        self.pcie_at = tuple((i, k) for i, k in enumerate(fields) if k in _PCIE_COUNTERS)

    def reset(self) -> None:
        """Ids set, everything else zero: one memmove, no allocation."""
        ctypes.memmove(self.array, self._pristine, self._size)


def _get_field_values(handle: Any, fa: FieldArray) -> FieldArray:
    fa.reset()
    bindings.call("nvmlDeviceGetFieldValues", handle, ctypes.c_int32(len(fa.fields)), fa.array)
    return fa


def read_fields(dev: Device, wanted: list[tuple[int, int]], slow: bool = False) -> dict[tuple[int, int], int | float]:
    """(field id, scope) -> value, of the ``wanted`` ones this GPU has, in one call; sets
    ``dev.pcie_counts`` when the PCIe byte counters are among them.  ``slow``: the slow cadence's
    own array (the per-link error counters), which has no PCIe counters and leaves them be."""
    key = tuple(w for w in wanted if w not in dev.unsupported_fields)
    if not slow:
        dev.pcie_counts = None
    if not key:
        return {}
    # One array per GPU and cadence, kept while the wanted fields stay the same: no per-poll
    # allocation, and plain ctypes, as nvidia-ml-py's hooked structs cost a Python call per field read.
    fa = dev.slow_fields if slow else dev.fields
    if fa is None or fa.fields != key:
        fa = FieldArray(key)
        if slow:
            dev.slow_fields = fa
        else:
            dev.fields = fa
    function = "nvmlDeviceGetFieldValues"
    if dev.call(function, _get_field_values, fa) is None:
        return {}
    read_at = dev.monotonic()
    out: dict[tuple[int, int], int | float] = {}
    for k, fv in zip(key, fa.array, strict=True):
        ret = fv.nvmlReturn
        if ret == pynvml.NVML_SUCCESS:
            read = _VALUE_READERS.get(fv.valueType)
            if read is not None:
                out[k] = read(fv.value)
            else:
                dev.errors(function, "unknown_value_type")  # a type newer than nvml.h 13: left out
        elif ret in _NOT_HERE:
            dev.unsupported_fields.add(k)  # not asked again until the next static refresh
            dev.errors(function, error_name(ret))
        elif ret == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise dev.lost_on(function)
        else:
            dev.reset_required |= ret == pynvml.NVML_ERROR_RESET_REQUIRED
            dev.errors(function, error_name(ret))
    if fa.pcie_at:
        _pcie_counts(dev, fa, out, int(read_at * 1e6))
    return out


def _pcie_counts(dev: Device, fa: FieldArray, out: dict[tuple[int, int], int | float], read_at_us: int) -> None:
    """``dev.pcie_counts``: (tx, rx, when they were read on the monotonic clock in us, bits of the
    narrower type), where either counter answered as an integer (the other None).  Not the field's
    own timestamp: that is wall time, and a rate over a span it gives stays wrong for as long as the
    clock was stepped back (an hour's step back held a 10 GB/s link at 1 GB/s for an hour)."""
    counts: dict[int, int] = {}
    width = 64
    for i, k in fa.pcie_at:
        fv = fa.array[i]
        v, bits = out.get(k), VALUE_BITS.get(fv.valueType)
        if isinstance(v, int) and bits is not None:
            counts[k[0]] = v
            width = min(width, bits)
    if counts:
        dev.pcie_counts = (counts.get(FI_PCIE_TX), counts.get(FI_PCIE_RX), read_at_us, width)


def read_one(dev: Device, field: tuple[int, int], what: str) -> int | float | None:
    """One field, through an array of its own (a static refresh, not a poll); None where this GPU or
    driver does not have it, which is not counted: the caller knows what its absence means."""
    fa = FieldArray((field,))
    if dev.call(what, _get_field_values, fa) is None:
        return None
    fv = fa.array[0]
    function = what.split("(", 1)[0]
    if fv.nvmlReturn == pynvml.NVML_SUCCESS and (read := _VALUE_READERS.get(fv.valueType)) is not None:
        return read(fv.value)
    if fv.nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST:
        raise dev.lost_on(function)
    if fv.nvmlReturn not in _NOT_HERE and fv.nvmlReturn != pynvml.NVML_SUCCESS:
        dev.errors(function, error_name(fv.nvmlReturn))
    return None
