"""Field values (``nvmlDeviceGetFieldValues``): memory temperature, the PCIe byte counters and the
NVLink traffic counters, all in one call per GPU, and the PCIe rate taken from the counters."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from ..backend import GpuLost
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
_PCIE_COUNTERS = ((FI_PCIE_TX, 0), (FI_PCIE_RX, 0))
# A byte counter narrower than 64 bits can wrap more than once between polls at PCIe speeds, so
# only 64-bit answers make a rate; the shortest span worth dividing by (seconds of driver time).
_WIDE_VALUES = frozenset({pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG})
_PCIE_MIN_SPAN_S = 0.1


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
    bindings.call("nvmlDeviceGetFieldValues", handle, ctypes.c_int32(len(array)), array)
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


def read_fields(dev: Device, wanted: list[tuple[int, int]]) -> dict[tuple[int, int], int | float]:
    """(field id, scope) -> value, of the ``wanted`` ones this GPU has, in one call; sets
    ``dev.pcie_counts`` when the PCIe byte counters are among them."""
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
        elif ret in UNSUPPORTED:
            dev.unsupported_fields.add(k)
            dev.errors("nvmlDeviceGetFieldValues", "not_supported")
        elif ret == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(f"GPU {dev.index}: nvmlDeviceGetFieldValues: GPU is lost")
        else:
            dev.errors("nvmlDeviceGetFieldValues", error_name(ret))
    tx, rx = (out.get(k) for k in _PCIE_COUNTERS)
    if tx is not None and rx is not None:
        stamps = [fv.timestamp for k, fv in zip(key, array, strict=True)
                  if k in _PCIE_COUNTERS and fv.valueType in _WIDE_VALUES]  # fmt: skip
        if len(stamps) == 2:
            dev.pcie_counts = (int(tx), int(rx), max(stamps))
    return out


def pcie_rates(dev: Device) -> tuple[float, float] | None:
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
