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
from .errors import DRIVER_GONE, REMEMBERED, SENTINELS, error_name, unavailable

if TYPE_CHECKING:
    from ..gpm import SamplePair
    from .pcie import PcieCounters, Sample
    from .reads import Slow

log = structlog.get_logger(__name__)

T = TypeVar("T")


class Device:
    """One GPU's handle, what it cannot do, and what its reads carry from one poll to the next."""

    def __init__(
        self, index: int, handle: Any, errors: ErrorSink, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.index = index
        self.handle = handle
        self.unsupported: set[str] = set()
        self.missing: set[str] = set()  # functions this driver does not have at all
        # The same for its MIG devices, learnt once for all of them: a MIG handle refusing a query
        # says nothing of the parent's (issue 26: a MIG device's NOT_SUPPORTED hid the parent's processes).
        self.mig_unsupported: set[str] = set()
        self.mig_missing: set[str] = set()
        self.unsupported_fields: set[tuple[int, int]] = set()
        self.fields: Any = None  # fields.FieldArray: this GPU's one field-value array, reused
        self.slow_fields: Any = None  # and the slow cadence's (reads.Slow)
        # The PCIe byte counters (tx, rx, when read in monotonic us) of this poll, None where missing,
        # and what the rate is taken from across polls (pcie.PcieCounters, carried over refreshes).
        self.pcie_counts: tuple[int | None, int | None, int, int] | None = None  # tx, rx, read at, bits
        # Spans are measured on it, never on the driver's timestamps: those are wall time (nvml.h "CPU
        # timestamp"), which NTP or an admin can step by an hour either way.
        self.monotonic = monotonic
        self.pcie: PcieCounters | None = None
        # (the next one's plan, monotonic, cadence.py; the sample): the one taken at the slow cadence
        self.pcie_sampled: tuple[float, Sample] | None = None
        # Keyed by (pid, start time): a pid alone may name a later process (processes.py).
        self.process_names: dict[tuple[int, int | None], str] = {}
        self.mig_process_names: dict[tuple[int, int | None], str] = {}
        self.process_users: dict[tuple[int, int | None], str | None] = {}  # user, looked up once per process
        self.process_util_seen = 0  # driver timestamp (us) of the newest per-process sample read
        self.process_util_at: float | None = None  # when it was last read (monotonic)
        self.process_util_due = 0.0  # when the next read is planned (monotonic, cadence.py)
        self.process_util: dict[tuple[int, int | None], tuple[float | None, float | None]] = {}  # (sm, memory) then
        self.gpm: SamplePair[Any] | None = None
        self.mig_gpm: dict[tuple[int, str, str], SamplePair[Any]] = {}  # (gi, MIG uuid, profile)
        # (gi, MIG uuid) -> (GPU instance profile id, placement start), read once per instance (mig.py).
        self.gpu_instances: dict[tuple[int, str], tuple[int | None, int | None]] = {}
        self.slow: Slow | None = None  # reads.Slow: ECC, rows and link states as last read
        self.fabric_refused = 0  # fabric struct versions this driver refused (fabric.py), newest first
        self.lost = False
        # A query answered RESET_REQUIRED since the poll began (read_quick clears it): the reading
        # says so, rather than leaving an unreadable GPU's values out without a word.
        self.reset_required = False
        self.uuid_seen = ""
        self.errors = errors

    def mig(self, handle: Any) -> Device:
        """One of this GPU's MIG devices, sharing what its MIG devices cannot do (not the parent's)."""
        mig = Device(self.index, handle, self.errors, self.monotonic)
        mig.unsupported, mig.missing = self.mig_unsupported, self.mig_missing
        return mig

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
                raise self.lost_on(function) from e
            if e.value in DRIVER_GONE:
                self.errors(function, error_name(e.value))
                raise unavailable(e) from e
            if e.value == pynvml.NVML_ERROR_RESET_REQUIRED:
                self.reset_required = True
            if e.value in REMEMBERED:
                # Not supported, not in this driver, or not allowed: asking again each poll changes
                # nothing until the next static refresh, so it is said once, under its own reason.
                self.unsupported.add(what)
                if e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self.missing.add(what)  # an older driver: said apart, so the reason is visible
                self.errors(function, error_name(e.value))
                log.debug("nvml_query_unsupported", gpu=self.index, query=what)
                return None
            self.errors(function, error_name(e.value))
            return None

    def ratio(self, function: str, percent: int | None, most: int = 100) -> float | None:
        """A percentage as a ratio; beyond ``most`` it is a sentinel or garbage: left out, and counted."""
        if percent is None:
            return None
        if not 0 <= percent <= most:
            self.errors(function, "out_of_range")
            return None
        return percent / 100

    def lost_on(self, function: str) -> GpuLost:
        """``function`` said GPU_IS_LOST: counted, and the GPU marked lost, so that when it comes back
        under the same UUID (after a reset) nothing is diffed across.  Every loss path comes here."""
        self.errors(function, "gpu_is_lost")
        self.lost = True
        return GpuLost(f"GPU {self.index}: {function}: GPU is lost")


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
