"""The one place that reaches past nvidia-ml-py's public API.

A few calls are made with our own ctypes structs (field values, GPM metrics), so that a poll
allocates nothing and reads plain fields, not nvidia-ml-py's attribute-hooked ones.  For those we
need the C function itself; nvidia-ml-py has no public way to get it, only the private
``_nvmlGetFunctionPointer`` (present, with this signature, in every release from 11.450 to
13.580).  A release that renames it breaks this module alone, and its test says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml


def c_function(name: str) -> Callable[..., int]:
    """The C function ``name`` of the loaded libnvidia-ml.so.1.

    Raises ``NVMLError`` (FUNCTION_NOT_FOUND) for a driver that lacks it, as the bindings' own
    calls do; the bindings cache the lookup.
    """
    fn: Callable[..., int] = pynvml._nvmlGetFunctionPointer(name)
    return fn


def check(ret: int) -> None:
    """Raise the bindings' ``NVMLError`` subclass for a return code other than SUCCESS."""
    if ret != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(ret)


def call(name: str, *args: Any) -> None:
    """Call C function ``name`` with ctypes ``args``; raises ``NVMLError`` unless it succeeds."""
    check(c_function(name)(*args))
