"""Durations as people write them in flags and YAML: ``500ms``, ``15s``, ``5m``, ``1h``, ``7d``, ``2w`` or seconds."""

from __future__ import annotations

import math
import re
from fractions import Fraction
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


def bounded_pattern(low: float, high: float | None, *, low_exclusive: bool) -> str:
    """A regular expression for the duration strings ``parse_duration`` reads as ``low`` (or more
    than it, with ``low_exclusive``) to ``high`` seconds, for a JSON schema that must refuse what the
    settings would (the chart's values.schema.json).

    Exact to a thousandth of each unit (``0.5s``, ``9.999m``, ``0.166h`` for at most 600 s); a bound
    between two thousandths is moved inwards to the nearer one, so the pattern never lets through a
    value the settings refuse, at the cost of spellings finer than that (``0.1666h``), which a
    smaller unit writes.
    """
    alternatives = []
    for unit, factor in _UNIT_SECONDS.items():
        f = Fraction(repr(factor))
        lo = Fraction(repr(low)) / f
        hi = None if high is None else Fraction(repr(high)) / f
        number = _number_pattern(lo, hi, low_exclusive)
        if number:
            suffix = r"\s*" + unit if unit else ""
            alternatives.append(f"(?:{number}){suffix}")
    # RE2 (Helm's JSON schema library) has no lookahead: "[^\s\S]" is the pattern nothing matches.
    return r"^\s*(?:" + "|".join(alternatives) + r")\s*$" if alternatives else r"^[^\s\S]$"


FRACTION_DIGITS = 3  # a bound is exact to a thousandth of its unit: a millisecond in seconds


def _number_pattern(lo: Fraction, hi: Fraction | None, low_exclusive: bool) -> str:
    """Decimals ``\\d+(\\.\\d+)?`` (leading zeros allowed, as ``parse_duration`` allows them) in the
    bounds, with the bounds moved inwards to whole thousandths where they fall between them.

    A decimal is read as q thousandths (its first three fraction digits) and what follows them:
    it is in bounds where q is at least the low bound's thousandths, and below the high bound's, or
    equal to them with nothing but zeros after."""
    scale = 10**FRACTION_DIGITS
    low = math.floor(lo * scale) + 1 if low_exclusive else math.ceil(lo * scale)
    high = None if hi is None else math.floor(hi * scale)
    if high is not None and low > high:
        return ""
    first, a = divmod(low, scale)
    if high is None:
        return "|".join([_integers(first + 1, None) + r"(?:\.\d+)?", _integers(first, first) + _fraction(a, None)])
    last, b = divmod(high, scale)
    if first == last:
        return _integers(first, first) + _fraction(a, b)
    parts = [_integers(first, first) + _fraction(a, None), _integers(last, last) + _fraction(0, b)]
    if last - first > 1:
        parts.append(_integers(first + 1, last - 1) + r"(?:\.\d+)?")
    return "|".join(parts)


def _fraction(a: int, b: int | None) -> str:
    """The optional fraction of thousandths from ``a`` to ``b`` (to the next whole number where None)."""
    k = FRACTION_DIGITS
    alternatives = []
    for m in range(1, k):  # fewer digits than a thousandth: "5" is 500 thousandths
        step = 10 ** (k - m)
        lo, hi = -(-a // step), (10**m - 1 if b is None else b // step)
        if lo <= hi:
            alternatives.append(_same_length(str(lo).zfill(m), str(hi).zfill(m)))
    top = 10**k - 1 if b is None else b - 1
    if a <= top:
        alternatives.append(_same_length(str(a).zfill(k), str(top).zfill(k)) + r"\d*")
    if b is not None:
        alternatives.append(str(b).zfill(k) + "0*")
    fraction = r"\.(?:" + "|".join(alternatives) + ")"
    return f"(?:{fraction})?" if a == 0 else fraction


def _integers(low: int, high: int | None) -> str:
    """Whole numbers from ``low`` to ``high`` (no end where None), with any leading zeros."""
    low = max(low, 0)
    if high is None:
        digits = len(str(low))
        longer = rf"[1-9]\d{{{digits},}}"
        return rf"0*(?:{_same_length(str(low), '9' * digits)}|{longer})"
    spans = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        a = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        b = min(high, 10**digits - 1)
        if a <= b:
            spans.append(_same_length(str(a), str(b)))
    return "0*(?:" + "|".join(spans) + ")"


def _same_length(a: str, b: str) -> str:
    """Numbers of the same number of digits from ``a`` to ``b``."""
    if a == b:
        return a
    if len(a) == 1:
        return f"[{a}-{b}]"
    rest = len(a) - 1
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return f"[{a[0]}-{b[0]}]" + (rf"\d{{{rest}}}" if rest > 1 else r"\d")
    if a[0] == b[0]:
        return a[0] + "(?:" + _same_length(a[1:], b[1:]) + ")"
    parts = [a[0] + "(?:" + _same_length(a[1:], "9" * rest) + ")"]
    if int(b[0]) - int(a[0]) > 1:
        parts.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]" + (rf"\d{{{rest}}}" if rest > 1 else r"\d"))
    parts.append(b[0] + "(?:" + _same_length("0" * rest, b[1:]) + ")")
    return "(?:" + "|".join(parts) + ")"
