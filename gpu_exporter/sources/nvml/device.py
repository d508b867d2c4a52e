"""One GPU's handle and what we learnt it cannot do; every query goes through :meth:`Device.call`.

``call`` turns NVML's answers into what the rest of the exporter understands: a value, ``None``
for "this card does not support it" (remembered, so it is not asked again until the next static
refresh), or ``GpuLost``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pynvml
import structlog

from ... import untrusted
from ..backend import ErrorSink, GpuLost
from .errors import DRIVER_GONE, SENTINELS, UNSUPPORTED, error_name, unavailable

if TYPE_CHECKING:
    from ..gpm import SamplePair

log = structlog.get_logger(__name__)

T = TypeVar("T")


class Device:
    """One GPU's handle, what it cannot do, and what its reads carry from one poll to the next."""

    def __init__(self, index: int, handle: Any, errors: ErrorSink) -> None:
        self.index = index
        self.handle = handle
        self.unsupported: set[str] = set()
        self.missing: set[str] = set()  # functions this driver does not have at all
        self.unsupported_fields: set[tuple[int, int]] = set()
        self.field_array: tuple[tuple[tuple[int, int], ...], Any] | None = None  # (fields, ctypes array)
        # The PCIe byte counters (tx, rx, driver timestamp in us) of this poll and of the one a
        # rate was last taken from; None where they are missing or too narrow to trust.
        self.pcie_counts: tuple[int, int, int] | None = None
        self.pcie_counted: tuple[int, int, int] | None = None
        self.pcie_rates: tuple[float, float] | None = None  # the last rate taken from them
        self.process_names: dict[int, str] = {}
        self.mig_process_names: dict[int, str] = {}
        self.process_users: dict[int, str | None] = {}  # pid -> user, looked up once per process
        self.process_util_seen = 0  # driver timestamp (us) of the newest per-process sample read
        self.process_util_at: float | None = None  # when it was last read (monotonic)
        self.process_util: dict[int, tuple[float | None, float | None]] = {}  # pid -> (sm, memory) then
        self.gpm: SamplePair[Any] | None = None
        self.mig_gpm: dict[tuple[int, str, str], SamplePair[Any]] = {}  # (gi, MIG uuid, profile)
        self.lost = False
        self.uuid_seen = ""
        self.errors = errors

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(handle, *args)``; None when unsupported or failing, GpuLost when the GPU is gone.

        ``what`` names the query (function plus argument) for the once-only unsupported memory;
        the error metric only gets the function name, to keep its labels bounded.
        """
        if what in self.unsupported:
            return None
        try:
            value = fn(self.handle, *args)
            if isinstance(value, int) and value in SENTINELS:
                self.errors(what.split("(", 1)[0], "out_of_range")
                return None
            return value
        except UnicodeDecodeError as e:
            # The bindings decode a string answer strictly; the driver's bytes are in the error.
            return untrusted.text(e.object)  # type: ignore[return-value]
        except pynvml.NVMLError as e:
            function = what.split("(", 1)[0]
            if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                self.errors(function, "gpu_is_lost")
                self.lost = True
                raise GpuLost(f"GPU {self.index}: {function}: {e}") from e
            if e.value in DRIVER_GONE:
                self.errors(function, error_name(e.value))
                raise unavailable(e) from e
            if e.value in UNSUPPORTED:
                self.unsupported.add(what)
                missing = e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
                if missing:
                    self.missing.add(what)  # an older driver: said apart, so the reason is visible
                self.errors(function, "function_not_found" if missing else "not_supported")
                log.debug("nvml_query_unsupported", gpu=self.index, query=what)
                return None
            self.errors(function, error_name(e.value))
            return None

    def ratio(self, function: str, percent: int | None) -> float | None:
        """A percentage as a ratio; beyond 100 it is a sentinel or garbage: left out, and counted."""
        if percent is None:
            return None
        if not 0 <= percent <= 100:
            self.errors(function, "out_of_range")
            return None
        return percent / 100


def raise_error(handle: Any, e: pynvml.NVMLError) -> None:
    """For ``Device.call(what, raise_error, e)``: an error caught elsewhere, judged like any query's."""
    raise e


class Baton:
    """Lets one GPU reader at a time make its quick calls, without ever making one wait on a hung GPU.

    A reader waits while the baton moves on; a holder stuck in the driver for ``stuck_s`` loses it
    (the others get a fresh one), so a hung GPU delays the others by ``stuck_s`` once, then not at all.
    """

    def __init__(self, wait_s: float = 0.02, stuck_s: float = 0.1, monotonic: Callable[[], float] = time.monotonic):
        self._wait_s = wait_s
        self._stuck_s = stuck_s
        self._mono = monotonic
        self._baton = threading.Lock()
        self._taken_at = 0.0
        self._swap = threading.Lock()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        while True:
            baton = self._baton
            if baton.acquire(timeout=self._wait_s):
                self._taken_at = self._mono()
                try:
                    yield
                finally:
                    baton.release()
                return
            if self._mono() - self._taken_at >= self._stuck_s:
                with self._swap:
                    if self._baton is baton:
                        self._baton = threading.Lock()  # the stuck holder releases the old one, if ever
                        self._taken_at = self._mono()
