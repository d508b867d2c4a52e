"""The driver's process lists, read in the record size the driver writes, whatever the bindings think.

``nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses_v3`` kept its name while its record
changed size twice (the drivers' nvml.h as NVIDIA/nvidia-settings carries it: b2f0e7f for 510.39,
39c3e28 for 535.43, 0cb3bef for 535.98, 74cae7f for 535.104.05; nvitop #79, #88, #89):

============================  ==========================================================
510.39 to 530.41              24 bytes (``nvmlProcessInfo_v2_t``: pid, memory, GPU/compute instance)
535.43 to 535.86, 535.104 on  32 bytes (``usedGpuCcProtectedMemory`` appended), same name
535.98                        no ``_v3`` at all (``_v2``, 24 bytes, remains)
550 on                        24 bytes again; the 32-byte record moved to the versioned
                              ``nvmlDeviceGetRunningProcessDetailList`` (``nvmlProcessDetail_v1_t``)
============================  ==========================================================

nvidia-ml-py sizes its buffer by its own release: 12.535.x reads 32 bytes, 12.550 and 13.x read 24.
Either, on the other kind of driver, reads every record after the first at the wrong offset: on an
R535 node 13.x shows a second process as pid 0 (the low half of the first one's protected memory)
and loses the real one.  So the lists are read here with our own buffer, and the size is the
driver's: expected from what it has, as nvitop judges it (R535 alone has
``nvmlDeviceGetConfComputeMemSizeInfo``, new in 535, without ``nvmlDeviceGetRunningProcessDetailList``,
new in 550), then checked against what it wrote.  The buffer is filled with 0xA5 before the call and
is big enough for the largest record; a record's last byte is the top byte of a count or an
instance id, 0x00 or 0xFF and never 0xA5, so where the written bytes end says the size.  A driver
whose writes contradict its functions is believed over them, and said once.

``nvmlDeviceGetRunningProcessDetailList`` itself would name its record by version, but nvml.h gives
it "Hopper or newer" devices only: the ``_v3`` read is needed for every other card anyway, and one
way of reading for all is what this module keeps.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

import pynvml
import structlog

from . import bindings

log = structlog.get_logger(__name__)

NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # nvml.h NVML_VALUE_NOT_AVAILABLE, as an unsigned long long
_FILL = 0xA5
_LARGEST = 32
# Native alignment, as the C structs are laid out: pid, 4 bytes of padding, memory (, gi, ci (, cc)).
_LAYOUTS = {16: struct.Struct("@IQ"), 24: struct.Struct("@IQII"), 32: struct.Struct("@IQIIQ")}
_SIZES = {"_v3": (24, 32), "_v2": (24,), "": (16,)}  # what each symbol has ever written
# Room for processes that start between the sizing call and the read, and more than twice the count:
# a driver that clears the whole buffer then shows more bytes than its records could fill at the
# largest size, and the expected size stands (_measured).
_HEADROOM = 8


class Record(NamedTuple):
    pid: int
    used_memory: int | None  # None: NVML_VALUE_NOT_AVAILABLE


@dataclass(frozen=True)
class Layout:
    """Which symbol of a list is called, and the record size the driver is expected to write."""

    suffix: str  # "_v3", "_v2" or "" (the unversioned v1 call)
    size: int


def _has(name: str, call: Any = None) -> bool:
    """Whether the driver has C function ``name``: the symbol, and (``call`` given) an answer other
    than FUNCTION_NOT_FOUND, NVML's "this version of NVML does not implement it"."""
    try:
        fn = bindings.c_function(name)
    except pynvml.NVMLError:
        return False
    return call is None or call(fn) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND


class _DetailList(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("mode", ctypes.c_uint), ("numProcArrayEntries", ctypes.c_uint),
                ("procArray", ctypes.c_void_p)]  # fmt: skip


def choose(handle: Any) -> Layout:
    """The layout of this driver's process lists, judged from the functions it has.  The two probes
    ask for nothing (an empty list, a size that may be NOT_SUPPORTED) and are made once per session."""
    if _has("nvmlDeviceGetComputeRunningProcesses_v3"):
        sizes = (ctypes.c_ulonglong * 2)()
        conf = _has("nvmlDeviceGetConfComputeMemSizeInfo", lambda f: f(handle, ctypes.byref(sizes)))
        empty = _DetailList(version=ctypes.sizeof(_DetailList) | 1 << 24)  # nvmlProcessDetailList_v1
        detail = _has("nvmlDeviceGetRunningProcessDetailList", lambda f: f(handle, ctypes.byref(empty)))
        return Layout("_v3", 32 if conf and not detail else 24)
    if _has("nvmlDeviceGetComputeRunningProcesses_v2"):  # 535.98, or a driver before 510
        return Layout("_v2", 24)
    return Layout("", 16)


_said: set[tuple[str, int, int]] = set()


def running(handle: Any, function: str, layout: Layout) -> list[Record]:
    """The processes ``function`` (``nvmlDeviceGetComputeRunningProcesses`` and its kin, unversioned)
    lists on ``handle``; raises ``NVMLError`` as the bindings' own calls do."""
    name = function + layout.suffix
    fn = bindings.c_function(name)
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == pynvml.NVML_SUCCESS:
        return []
    for _ in range(3):
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            bindings.check(ret)
        room = 2 * count.value + _HEADROOM
        buf = (ctypes.c_ubyte * (room * _LARGEST))()
        ctypes.memset(buf, _FILL, ctypes.sizeof(buf))
        count = ctypes.c_uint(room)
        ret = fn(handle, ctypes.byref(count), buf)
        if ret == pynvml.NVML_SUCCESS:
            return _records(bytes(buf), count.value, name, layout)
    bindings.check(ret)
    return []


def _records(raw: bytes, n: int, name: str, layout: Layout) -> list[Record]:
    size = _measured(raw, n, layout) if n else layout.size
    if size != layout.size and (name, size, layout.size) not in _said:
        _said.add((name, size, layout.size))
        log.warning("nvml_process_record_size", function=name, written=size, expected=layout.size,
                    why="the driver wrote records of another size than its functions say; read as written")  # fmt: skip
    shape = _LAYOUTS[size]
    out = []
    for i in range(n):
        pid, used = shape.unpack_from(raw, i * size)[:2]
        out.append(Record(pid, None if used == NOT_AVAILABLE else used))
    return out


def _measured(raw: bytes, n: int, layout: Layout) -> int:
    """The record size the driver wrote: where its bytes end, over the count; the expected size
    where that is no size the symbol has ever written (more than the records could fill: a driver
    that cleared the buffer)."""
    written = len(raw.rstrip(bytes([_FILL])))
    size, rest = divmod(written, n)
    return size if not rest and size in _SIZES[layout.suffix] else layout.size
