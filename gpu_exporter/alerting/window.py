"""Windowed statistics over snapshots, for rules that instantaneous values cannot express.

Time comes from the snapshots themselves (``taken_at``), so tests drive it with made-up
snapshots and never sleep.
"""

from __future__ import annotations

import bisect
import itertools
import math
from array import array

# Samples are summed exactly as integers in units of 2**-_BITS: a poll adds one and a mean is two
# lookups, instead of a pass over every sample of the window (3,600 per GPU and rule at a 1 s poll
# and a one-hour window).  Python's int / int is correctly rounded, so the mean is math.fsum's.
_BITS = 96
_ONE = 1 << _BITS
# The running sums are kept modulo 2**128, as two unsigned 64-bit words: the difference of two of
# them is a window's sum exactly as long as that lies within +-2**127.  Values of magnitude below
# _LIMIT keep it there for windows of up to _MAX_EXACT samples; others take the math.fsum path.
_LIMIT = 1 << 8
_MAX_EXACT = 1 << (127 - _BITS - 8)
_MOD = 1 << 128
_WORD = (1 << 64) - 1


def _exact(v: float) -> int | None:
    """``v * 2**_BITS`` as an exact integer, or None where that is not exact (tiny, or not finite)
    or would not fit the running sums (too large)."""
    if not math.isfinite(v) or not -_LIMIT < v < _LIMIT:
        return None
    n, d = v.as_integer_ratio()
    return n * (_ONE // d) if d <= _ONE else None


class SampleWindow:
    """Samples of one series, kept for ``horizon`` seconds; means over any shorter window.

    The samples live in flat arrays (40 bytes each) with room for ``capacity`` of them, set aside
    at once: a window that expects its samples (the horizon over the poll interval) takes all its
    memory when it starts, not a little more on every poll for the first hour (issue 17's soak).
    Samples past the horizon make room for new ones; more than ``capacity`` within the horizon
    double the room, once.
    """

    def __init__(self, horizon: float, capacity: int = 64) -> None:
        self.horizon = horizon
        size = max(capacity, 8)
        size += max(size // 4, 8)  # slack: the live samples move to the front once per that many polls
        self._times = array("d", bytes(8 * size))
        self._values = array("d", bytes(8 * size))
        # _sum_lo/_sum_hi[i]: the exact sum of the values before slot i, modulo 2**128; _odd[i]: how
        # many of them have no exact integer form.  One slot more than the samples.
        self._sum_lo = array("Q", bytes(8 * (size + 1)))
        self._sum_hi = array("Q", bytes(8 * (size + 1)))
        self._odd = array("q", bytes(8 * (size + 1)))
        self._total = 0  # the sum at _end, modulo 2**128
        self._head = 0  # samples before it fell out of the horizon
        self._end = 0  # one past the newest sample
        self._ordered = True  # times never went backwards (a wall clock can step back)

    def add(self, t: float, value: float) -> None:
        end = self._end
        if end == len(self._times):
            self.trim(t)  # the samples that fall out now need no room
            end = self._make_room()
        if end and t < self._times[end - 1]:
            self._ordered = False
        x = _exact(value)
        self._times[end] = t
        self._values[end] = value
        self._total = (self._total + (x or 0)) % _MOD
        self._sum_lo[end + 1] = self._total & _WORD
        self._sum_hi[end + 1] = self._total >> 64
        self._odd[end + 1] = self._odd[end] + (x is None)
        self._end = end + 1
        self.trim(t)

    def _make_room(self) -> int:
        """Move the live samples to the front of the arrays, or into larger ones if they fill them."""
        head, end = self._head, self._end
        n = end - head
        if len(self._times) - n < max(len(self._times) // 8, 8):  # too little room would be left: double it
            size = 2 * len(self._times)
            for name in ("_times", "_values"):
                old = getattr(self, name)
                setattr(self, name, old[head:end] + array("d", bytes(8 * (size - n))))
            for name, code in (("_sum_lo", "Q"), ("_sum_hi", "Q"), ("_odd", "q")):
                old = getattr(self, name)
                setattr(self, name, old[head : end + 1] + array(code, bytes(8 * (size - n))))
        else:  # in place: memoryview copies without a temporary array
            for a, extra in ((self._times, 0), (self._values, 0), (self._sum_lo, 1), (self._sum_hi, 1),
                             (self._odd, 1)):  # fmt: skip
                with memoryview(a) as m:
                    m[: n + extra] = m[head : end + extra]
        self._head, self._end = 0, n
        if not self._ordered:
            live = self._times[:n]
            self._ordered = all(a <= b for a, b in itertools.pairwise(live))
        return n

    def trim(self, now: float) -> None:
        end = self._end
        if self._ordered:
            self._head = bisect.bisect_left(self._times, now - self.horizon, self._head, end)
        else:  # oldest first, as they came, up to the first one still inside
            while self._head < end and self._times[self._head] < now - self.horizon:
                self._head += 1

    def _sum(self, lo: int, hi: int) -> int:
        """The exact sum of the values in slots [lo, hi), all with an exact form."""
        high = (self._sum_hi[hi] << 64) | self._sum_lo[hi]
        low = (self._sum_hi[lo] << 64) | self._sum_lo[lo]
        s = (high - low) % _MOD
        return s - _MOD if s >= _MOD // 2 else s

    def mean(self, now: float, window: float) -> float | None:
        """Mean of the samples in (now - window, now]: the correctly rounded sum (as ``math.fsum``)
        over the count, as the shipped PromQL's ``sum_over_time / count_over_time``.  A plain ``sum``
        drifts: ``sum([0.1] * 60) / 60`` is 0.09999999999999999, below a 10% threshold."""
        head, end = self._head, self._end
        if not self._ordered:
            pairs = zip(self._times[head:end], self._values[head:end], strict=True)
            values = [v for t, v in pairs if now - window < t <= now]
            return math.fsum(values) / len(values) if values else None
        lo = bisect.bisect_right(self._times, now - window, head, end)
        hi = bisect.bisect_right(self._times, now, lo, end)
        if hi == lo:
            return None
        if self._odd[hi] != self._odd[lo] or hi - lo > _MAX_EXACT:
            return math.fsum(self._values[lo:hi]) / (hi - lo)
        return self._sum(lo, hi) / _ONE / (hi - lo)

    def span(self, now: float, window: float) -> tuple[int, float]:
        """How many samples (now - window, now] holds, and how far back the oldest of them lies."""
        head, end = self._head, self._end
        if not self._ordered:  # the clock stepped back: no bisecting
            times = [t for t in self._times[head:end] if now - window < t <= now]
            return len(times), (now - min(times)) if times else 0.0
        lo = bisect.bisect_right(self._times, now - window, head, end)
        hi = bisect.bisect_right(self._times, now, lo, end)
        return hi - lo, (now - self._times[lo]) if hi > lo else 0.0

    def __len__(self) -> int:
        return self._end - self._head


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
