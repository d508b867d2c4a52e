"""Windowed statistics over snapshots, for rules that instantaneous values cannot express.

Time comes from the snapshots themselves (``taken_at``), so tests drive it with made-up
snapshots and never sleep.
"""

from __future__ import annotations

import bisect
import itertools
import math

# Samples are summed exactly as integers in units of 2**-_BITS: a poll adds one and a mean is two
# lookups, instead of a pass over every sample of the window (3,600 per GPU and rule at a 1 s poll
# and a one-hour window).  Python's int / int is correctly rounded, so the mean is math.fsum's.
_BITS = 96
_ONE = 1 << _BITS


def _exact(v: float) -> int | None:
    """``v * 2**_BITS`` as an exact integer, or None where that is not exact (tiny, or not finite)."""
    if not math.isfinite(v):
        return None
    n, d = v.as_integer_ratio()
    return n * (_ONE // d) if d <= _ONE else None


class SampleWindow:
    """Samples of one series, kept for ``horizon`` seconds; means over any shorter window."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self._times: list[float] = []
        self._values: list[float] = []
        self._sums: list[int] = [0]  # _sums[i]: the exact sum of _values[:i]
        self._odd: list[int] = [0]  # _odd[i]: how many of _values[:i] have no exact integer form
        self._head = 0  # samples before it fell out of the horizon
        self._ordered = True  # times never went backwards (a wall clock can step back)

    def add(self, t: float, value: float) -> None:
        if self._times and t < self._times[-1]:
            self._ordered = False
        x = _exact(value)
        self._times.append(t)
        self._values.append(value)
        self._sums.append(self._sums[-1] + (x or 0))
        self._odd.append(self._odd[-1] + (x is None))
        self.trim(t)

    def trim(self, now: float) -> None:
        if self._ordered:
            self._head = bisect.bisect_left(self._times, now - self.horizon, self._head)
        else:  # oldest first, as they came, up to the first one still inside
            while self._head < len(self._times) and self._times[self._head] < now - self.horizon:
                self._head += 1
        if self._head > 256 and 2 * self._head > len(self._times):
            self._rebuild(list(zip(self._times[self._head :], self._values[self._head :], strict=True)))

    def _rebuild(self, samples: list[tuple[float, float]]) -> None:
        self._times, self._values, self._sums, self._odd, self._head = [], [], [0], [0], 0
        times = [t for t, _ in samples]
        self._ordered = all(a <= b for a, b in itertools.pairwise(times))
        for t, v in samples:
            x = _exact(v)
            self._times.append(t)
            self._values.append(v)
            self._sums.append(self._sums[-1] + (x or 0))
            self._odd.append(self._odd[-1] + (x is None))

    def mean(self, now: float, window: float) -> float | None:
        """Mean of the samples in (now - window, now]: the correctly rounded sum (as ``math.fsum``)
        over the count, as the shipped PromQL's ``sum_over_time / count_over_time``.  A plain ``sum``
        drifts: ``sum([0.1] * 60) / 60`` is 0.09999999999999999, below a 10% threshold."""
        if not self._ordered:
            pairs = zip(self._times[self._head :], self._values[self._head :], strict=True)
            values = [v for t, v in pairs if now - window < t <= now]
            return math.fsum(values) / len(values) if values else None
        lo = bisect.bisect_right(self._times, now - window, self._head)
        hi = bisect.bisect_right(self._times, now, lo)
        if hi == lo:
            return None
        if self._odd[hi] != self._odd[lo]:
            return math.fsum(self._values[lo:hi]) / (hi - lo)
        return (self._sums[hi] - self._sums[lo]) / _ONE / (hi - lo)

    def span(self, now: float, window: float) -> tuple[int, float]:
        """How many samples (now - window, now] holds, and how far back the oldest of them lies."""
        if not self._ordered:  # the clock stepped back: no bisecting
            times = [t for t in self._times[self._head :] if now - window < t <= now]
            return len(times), (now - min(times)) if times else 0.0
        lo = bisect.bisect_right(self._times, now - window, self._head)
        hi = bisect.bisect_right(self._times, now, lo)
        return hi - lo, (now - self._times[lo]) if hi > lo else 0.0

    def __len__(self) -> int:
        return len(self._times) - self._head


class IncreaseTracker:
    """When a counter last went up.  A counter first seen at N is a baseline, not an increase,
    unless it is known to start at zero with the process (``from_zero``), like XID counts."""

    def __init__(self, from_zero: bool = False) -> None:
        self._from_zero = from_zero
        self._last: float | None = None
        self.last_increase_at: float | None = None

    def observe(self, t: float, value: float) -> None:
        previous = self._last if self._last is not None else (0.0 if self._from_zero else value)
        if value > previous:
            self.last_increase_at = t
        self._last = value

    def increased_within(self, now: float, window: float) -> bool:
        return self.last_increase_at is not None and now - self.last_increase_at <= window
