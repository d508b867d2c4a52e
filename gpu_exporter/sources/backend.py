"""The interface between the poller and whatever reads the GPUs (NVML, or the simulator)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..snapshot import GpuReading, GpuStatic

# Called with (function, error) for every failed query, e.g. ("nvmlDeviceGetPowerUsage", "timeout").
ErrorSink = Callable[[str, str], None]


class BackendUnavailable(Exception):
    """The GPU library cannot be used at all: not installed, driver not loaded, no permission."""

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


class GpuLost(Exception):
    """This GPU stopped answering (fell off the bus, or otherwise unreadable)."""


class ResetRequired(Exception):
    """The driver will not hand this GPU out (its handle or UUID lookup answers RESET_REQUIRED) until
    it is reset: it is there, it needs a reset, and it is not lost."""


class StaticChanged(Exception):
    """What was read of the GPU as static no longer holds (its MIG mode changed): read it again."""


@dataclass(frozen=True, slots=True)
class SystemInfo:
    driver_version: str | None
    cuda_version: str | None
    gpu_count: int


class Backend(Protocol):
    """Reads GPUs.  Implementations must be safe to call from several threads, one GPU per thread."""

    def open(self) -> SystemInfo:
        """Initialise and count GPUs.  Raises BackendUnavailable with a reason a person understands."""
        ...

    def close(self) -> None: ...

    def count(self) -> int | None:
        """How many GPUs the driver sees now (some may have appeared since ``open``); None if it
        cannot say at the moment.  Raises BackendUnavailable."""
        ...

    def read_static(self, index: int) -> GpuStatic:
        """Slow-changing facts of GPU ``index``.  Raises GpuLost, or ResetRequired."""
        ...

    def read_gpu(self, static: GpuStatic) -> GpuReading:
        """Everything that changes, for one poll.  Raises GpuLost."""
        ...

    def xid_counts(self, uuid: str) -> Mapping[int, int]:
        """XID code -> events seen on the GPU ``uuid`` so far.  Asked for a GPU that does not answer:
        the driver's XID events (79, fell off the bus) go on arriving when its queries fail."""
        ...
