"""The one place that reaches past nvidia-ml-py's public API.

A few calls are made with our own ctypes structs (field values, GPM metrics), so that a poll
allocates nothing and reads plain fields, not nvidia-ml-py's attribute-hooked ones.  For those we
need the C function itself.  nvidia-ml-py has no public way to get it, only the private
``_nvmlGetFunctionPointer`` (present, with this signature, in every release from 11.450 to
13.615), which uses the very library object the bindings loaded.  Where a release renames or drops
it, the function is looked up in ``libnvidia-ml.so.1`` directly: the soname the bindings load on
Linux, already in this process once ``nvmlInit`` ran, so the dynamic loader hands back the same
library.  ``tests/test_bindings.py`` runs both ways against the oldest and the newest nvidia-ml-py
the project allows.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import pynvml

SONAME = "libnvidia-ml.so.1"
_own: dict[str, Callable[..., int]] = {}
_own_lock = threading.Lock()


def c_function(name: str) -> Callable[..., int]:
    """The C function ``name`` of the loaded libnvidia-ml.so.1.

    Raises ``NVMLError`` (FUNCTION_NOT_FOUND) for a driver that lacks it, as the bindings' own calls
    do; both lookups are cached.
    """
    private = getattr(pynvml, "_nvmlGetFunctionPointer", None)
    if private is not None:
        fn: Callable[..., int] = private(name)
        return fn
    return _looked_up(name)


def _looked_up(name: str) -> Callable[..., int]:
    fn = _own.get(name)
    if fn is not None:
        return fn
    with _own_lock:
        try:
            fn = ctypes.CDLL(SONAME)[name]
        except OSError as e:  # no driver library at all: as the bindings say it
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) from e
        except AttributeError as e:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND) from e
        _own[name] = fn
    return fn


def check(ret: int) -> None:
    """Raise the bindings' ``NVMLError`` subclass for a return code other than SUCCESS."""
    if ret != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(ret)


def call(name: str, *args: Any) -> None:
    """Call C function ``name`` with ctypes ``args``; raises ``NVMLError`` unless it succeeds."""
    check(c_function(name)(*args))
