"""Windowed statistics over snapshots, for rules that instantaneous values cannot express.

Time comes from the snapshots themselves (``taken_at``), so tests drive it with made-up
snapshots and never sleep.
"""

from __future__ import annotations

import math
from collections import deque


class SampleWindow:
    """Samples of one series, kept for ``horizon`` seconds; means over any shorter window."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, t: float, value: float) -> None:
        self._samples.append((t, value))
        self.trim(t)

    def trim(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.horizon:
            self._samples.popleft()

    def mean(self, now: float, window: float) -> float | None:
        """Mean of the samples in (now - window, now]: the correctly rounded sum (``math.fsum``) over
        the count, as the shipped PromQL's ``sum_over_time / count_over_time``.  A plain ``sum``
        drifts: ``sum([0.1] * 60) / 60`` is 0.09999999999999999, below a 10% threshold."""
        values = [v for t, v in self._samples if now - window < t <= now]
        return math.fsum(values) / len(values) if values else None

    def span(self, now: float, window: float) -> tuple[int, float]:
        """How many samples (now - window, now] holds, and how far back the oldest of them lies."""
        times = [t for t, _ in self._samples if now - window < t <= now]
        return len(times), (now - times[0]) if times else 0.0

    def __len__(self) -> int:
        return len(self._samples)


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
