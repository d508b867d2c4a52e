"""``rate_limit``: exporter-toolkit's token bucket over every request, and Go's durations.

As golang.org/x/time/rate's ``Limiter`` (``rate.Every(interval)``, ``burst``): a bucket of ``burst``
tokens, full at the start, that gains one token every ``interval``; a request takes one, or gets
429.  Unlike exporter-toolkit, the probes (``/healthz``, ``/readyz``) do not take tokens: a
kubelet that got 429 would restart a healthy daemon.  A changed limit applies at the next reload
(exporter-toolkit reads it only at start).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# Go's time.ParseDuration: one or more decimal numbers, each with a unit.
_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_go_duration(v: Any) -> Any:
    """Seconds from a Go duration (``1s``, ``1m30s``, ``250ms``); ``0`` is off.  ValueError says why."""
    if isinstance(v, bool):
        return v  # left to the field's own check
    if isinstance(v, int | float):
        if v == 0:
            return 0.0
        raise ValueError(f"{v!r} has no unit (exporter-toolkit would read nanoseconds); write e.g. 1s or 100ms")
    if not isinstance(v, str):
        return v
    text = v.strip()
    if text == "0":
        return 0.0
    if text.startswith("-"):
        raise ValueError(f"{v!r}: the interval cannot be negative")
    text = text.removeprefix("+")
    pos, total = 0, 0.0
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None:
            raise ValueError(f"{v!r} is not a Go duration; write e.g. 1s, 100ms or 1m30s")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not text:
        raise ValueError(f"{v!r} is not a Go duration; write e.g. 1s, 100ms or 1m30s")
    return total


@dataclass(frozen=True)
class RateLimit:
    interval: float  # seconds between two tokens, > 0
    burst: int  # tokens the bucket holds, >= 1


class TokenBucket:
    """Not thread-safe: the server's loop is its only user.  ``now`` is a monotonic clock, in seconds."""

    def __init__(self, limit: RateLimit, now: float) -> None:
        self.limit = limit
        self._tokens = float(limit.burst)
        self._at = now

    def take(self, now: float) -> float:
        """0 if a token was taken; else how many seconds until the next one."""
        if now > self._at:  # a clock behind the last look adds nothing
            self._tokens = min(float(self.limit.burst), self._tokens + (now - self._at) / self.limit.interval)
            self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) * self.limit.interval


def retry_after(wait: float) -> str:
    """A Retry-After value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait)))
