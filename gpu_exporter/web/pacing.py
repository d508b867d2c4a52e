"""Log lines a client can cause, paced: at most one per event every ``every`` seconds.

A client decides how often a request fails; if each failure wrote a line (a traceback, a user name
it chose), a flood of requests would become a flood of logs.  So such a line is written the first
time, then at most once an interval, with the number held back since the last one
(``held_back``).  What is held back after the last line is lost with the process; the count comes
with the next line if there is one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Pacer:
    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def ready(self, event: str) -> int | None:
        """None: hold this line back (it is counted); else write it, saying how many were held back."""
        now = self._clock()
        with self._lock:
            last = self._last.get(event)
            if last is not None and now - last < self.every:
                self._held[event] = self._held.get(event, 0) + 1
                return None
            self._last[event] = now
            return self._held.pop(event, 0)
