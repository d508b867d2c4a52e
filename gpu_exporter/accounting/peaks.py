"""The highest value over a sliding window, in O(1) amortized per sample."""

from __future__ import annotations

from collections import deque


class WindowMax:
    """Max of the samples in (now - window, now]: a deque of decreasing values, each the max of those
    after it, so every sample is pushed and popped once."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._q: deque[tuple[float, float]] = deque()

    def add(self, t: float, value: float) -> None:
        while self._q and self._q[-1][1] <= value:
            self._q.pop()
        self._q.append((t, value))

    def max(self, now: float) -> float | None:
        while self._q and self._q[0][0] <= now - self.window:
            self._q.popleft()
        return self._q[0][1] if self._q else None
