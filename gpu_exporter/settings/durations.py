"""Durations as people write them in flags and YAML: ``500ms``, ``15s``, ``5m``, ``1h``, ``7d``, ``2w`` or seconds."""

from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


def parse_duration(v: Any) -> Any:
    """Seconds from a string; numbers pass through for the field's own checks."""
    if isinstance(v, str):
        if v.strip().startswith("-"):
            raise ValueError(f"{v!r}: a duration cannot be negative")
        m = _DURATION.match(v)
        if not m:
            raise ValueError(f"{v!r} is not a duration; write seconds (e.g. 5) or a string like 500ms, 15s, 5m, 1h, 7d")
        return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    return v


def format_duration(seconds: float) -> str:
    """``seconds`` as a person would write it: the largest unit that holds it whole (300 -> ``5m``,
    0.5 -> ``500ms``), so that a default shown in help reads as the value one would type."""
    for unit in ("w", "d", "h", "m", "s", "ms"):
        count = seconds / _UNIT_SECONDS[unit]
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}{unit}"
    return f"{seconds:g}s"
