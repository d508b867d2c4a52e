"""What NVML's return codes mean to the exporter: a name for the error metric, "not supported",
"the driver is gone", and the sentence a person reads when NVML cannot be used at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pynvml

from ..backend import BackendUnavailable

T = TypeVar("T")

_ERROR_NAMES: dict[int, str] = {
    v: k.removeprefix("NVML_ERROR_").lower()
    for k, v in vars(pynvml).items()
    if k.startswith("NVML_ERROR_") and isinstance(v, int)
}
# Answers meaning "this card or driver does not have that": left out, not an error to retry.
UNSUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
# Answers that stay the same until something changes on the node (a static refresh asks again):
# remembered and counted once, where a retry each poll would count them every poll.
REMEMBERED = UNSUPPORTED | {pynvml.NVML_ERROR_NO_PERMISSION}
# Answers meaning the driver itself is gone: no GPU can be read until NVML is initialised again.
DRIVER_GONE = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# NVML's "not available" in an unsigned answer; never a real reading.
SENTINELS = frozenset({0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})


def error_name(code: int) -> str:
    return _ERROR_NAMES.get(code, f"error_{code}")


def try_call(fn: Callable[[], T]) -> T | None:
    """``fn()``, or None when NVML says no (for facts that are nice to have, like the driver version)."""
    try:
        return fn()
    except pynvml.NVMLError:
        return None


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


def unavailable(e: pynvml.NVMLError) -> BackendUnavailable:
    """NVML cannot be used at all: why, and what to do about it."""
    reason, hint = _REASONS.get(
        e.value, (f"NVML could not be initialised: {e}", "or try --simulate to run without a GPU")
    )
    return BackendUnavailable(reason, hint)
