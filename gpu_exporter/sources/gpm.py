"""GPM sampling between polls: which samples to diff, and what the answers mean.

NVML's GPM gives activity only as the difference of two samples of one device taken at least
100 ms apart.  Each GPU, and each MIG GPU instance, keeps its previous sample from the last poll;
every poll takes one new sample and diffs it against that, so no extra sleep is ever needed and
the activity covers exactly the time since the previous poll.

This module holds that bookkeeping and nothing of NVML itself: the NVML backend hands it the
calls (``GpmCalls``), so the one module that knows pynvml stays the only one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Generic, NamedTuple, Protocol, TypeVar

from ..snapshot import Activity
from .cadence import Cadence

S = TypeVar("S")

# NVML_GPM_METRIC_* ids and the Activity field each one fills (nvml.h, "GPM Metric Identifiers").
METRIC_FIELDS: Mapping[int, str] = {
    1: "graphics",  # NVML_GPM_METRIC_GRAPHICS_UTIL
    2: "sm",  # NVML_GPM_METRIC_SM_UTIL
    3: "sm_occupancy",  # NVML_GPM_METRIC_SM_OCCUPANCY
    5: "tensor",  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    10: "dram",  # NVML_GPM_METRIC_DRAM_BW_UTIL
    11: "fp64",  # NVML_GPM_METRIC_FP64_UTIL
    12: "fp32",  # NVML_GPM_METRIC_FP32_UTIL
    13: "fp16",  # NVML_GPM_METRIC_FP16_UTIL
}
MIN_INTERVAL_S = 0.1  # nvml.h: samples closer than this are not meaningful
# GPM percentages can overshoot 100 a little from sampling jitter; beyond this they are garbage.
_TOLERANCE_PERCENT = 102.0


class GpmCalls(Protocol[S]):
    """The NVML calls GPM needs; ``S`` is the driver's opaque sample handle."""

    def alloc(self) -> S: ...

    def free(self, sample: S) -> None: ...

    def metrics(self, older: S, newer: S, ids: tuple[int, ...]) -> dict[int, tuple[int, float]]:
        """metric id -> (NVML return code of that metric, value in percent)."""
        ...


class MetricAnswer(NamedTuple):
    """What one metric of one pair said: a ratio, or why not."""

    ratio: float | None
    error: int = 0  # the metric's own nvmlReturn; 0 with ratio None means out of range


class SamplePair(Generic[S]):
    """Two sample buffers of one device, used in turn.

    ``take`` fills the spare buffer through ``fill`` and diffs it against the previous one.  A
    pair closer than ``MIN_INTERVAL_S`` is skipped and the older sample kept, so the next poll
    spans a long enough interval.  A pair belongs to one device or instance: a caller keys its
    pairs by what they sample and starts a new one for anything else, never diffing across.
    A poll that comes too soon after the previous one repeats the last answers rather than
    leaving a gap in the series.
    """

    def __init__(
        self, calls: GpmCalls[S], monotonic: Callable[[], float], interval: float = MIN_INTERVAL_S, slack: float = 0.0
    ) -> None:
        self._calls = calls
        # Sampled on a cadence of its own (cadence.py): every ``interval`` on the poll nearest its plan.
        self._cadence = Cadence(max(interval, MIN_INTERVAL_S), min(slack, max(interval, MIN_INTERVAL_S) / 2))
        self._planned: float | None = None  # when the next sample is due
        self._mono = monotonic
        self._older_at: float | None = None
        self.unsupported: set[int] = set()  # metric ids this device answered NOT_SUPPORTED for
        self._last: dict[int, MetricAnswer] | None = None
        self.activity: Activity | None = None  # the last answers as an Activity, kept by the caller
        self._lock = threading.Lock()  # a GPU stuck in the driver must not race a re-init's close()
        older = calls.alloc()
        try:
            spare = calls.alloc()
        except BaseException:
            calls.free(older)
            raise
        self._buffers: tuple[S, S] | None = (older, spare)  # (older, spare); None once closed

    def take(self, fill: Callable[[S], None], ids: tuple[int, ...]) -> tuple[dict[int, MetricAnswer] | None, bool]:
        """Sample now: the answers since the previous sample (None when there is no pair yet), and
        whether they are new (False: repeated, the poll came sooner than ``interval``, at least
        100 ms, after the previous sample kept).  The driver spends ~1.2 ms of CPU per metrics
        call, so a longer interval bounds the cost; each answer still covers its whole interval.

        Raises whatever ``fill`` or the metrics call raise; the pair then keeps its previous sample.
        """
        if not self._lock.acquire(blocking=False):
            return self._last, False  # another thread is still inside the driver with these buffers
        try:
            if self._buffers is None:
                return None, False  # closed
            older, spare = self._buffers
            asked = self._mono()
            planned = self._cadence.take(self._planned, asked) if self._older_at is not None else asked
            if planned is None or (self._older_at is not None and asked - self._older_at < MIN_INTERVAL_S):
                return self._last, False  # not due: no call at all
            fill(spare)
            now = self._mono()
            if self._older_at is None:  # the first sample: no pair yet
                self._buffers, self._older_at = (spare, older), now
                self._planned = self._cadence.take(None, asked)
                return None, False
            # Past the due check above, and on a monotonic clock, ``now`` is at least 100 ms after the
            # older sample.
            raw = self._calls.metrics(older, spare, ids) if ids else {}
            self._buffers, self._older_at = (spare, older), now  # only once fill and metrics went through
            self._planned = planned
            self._last = {i: _answer(*raw[i]) for i in ids if i in raw}
            return self._last, True
        finally:
            self._lock.release()

    @property
    def closed(self) -> bool:
        return self._buffers is None

    def close(self, timeout: float = 0.5) -> bool:
        """Free both buffers.  False if a thread stuck in the driver still holds them: then they
        are left allocated, since freeing memory the driver is writing to would be worse."""
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            for sample in self._buffers or ():
                self._calls.free(sample)
            self._buffers = None
            return True
        finally:
            self._lock.release()


def _answer(code: int, percent: float) -> MetricAnswer:
    if code:
        return MetricAnswer(None, code)
    if not 0.0 <= percent <= _TOLERANCE_PERCENT:  # NaN fails both comparisons too
        return MetricAnswer(None)
    return MetricAnswer(min(percent, 100.0) / 100.0)


def activity_of(answers: Mapping[int, MetricAnswer]) -> Activity | None:
    """The answers as an Activity; None when not one metric had a value."""
    known = {METRIC_FIELDS[i]: a.ratio for i, a in answers.items() if i in METRIC_FIELDS and a.ratio is not None}
    return Activity(**known) if known else None
