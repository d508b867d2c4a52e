"""The chart's duration patterns (settings.durations.bounded_pattern) against the parser they stand
for: a string the pattern takes is one the settings take, and every duration written to a
thousandth of its unit within the bounds is taken (issue 38, item 8)."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_exporter.settings.durations import _UNIT_SECONDS, bounded_pattern, parse_duration
from tests.hypothesis_budget import examples

# (low, high, low exclusive): the shapes of the settings' own bounds.
BOUNDS = [(0.0, 3600.0, True), (0.0, 600.0, True), (0.1, 3600.0, False), (0.0, 86400.0, False),
          (0.0, None, True), (0.0, None, False), (300.0, 86400.0, False), (1.5, 90.0, True)]  # fmt: skip
UNITS = [u for u in _UNIT_SECONDS if u]


def in_bounds(seconds: Fraction, low: float, high: float | None, exclusive: bool) -> bool:
    lo = Fraction(repr(low))
    return (seconds > lo if exclusive else seconds >= lo) and (high is None or seconds <= Fraction(repr(high)))


def seconds_of(text: str) -> Fraction:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*", text)
    assert m is not None
    return Fraction(m.group(1)) * Fraction(repr(_UNIT_SECONDS[m.group(2)]))


spelling = st.builds(
    lambda zeros, whole, frac, space, unit: f"{'0' * zeros}{whole}{'.' + frac if frac else ''}{space}{unit}",
    st.integers(0, 2), st.integers(0, 200_000), st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=6)),
    st.sampled_from(["", " "]), st.sampled_from(["", *UNITS]),
)  # fmt: skip


@pytest.mark.parametrize("bounds", BOUNDS, ids=str)
@settings(max_examples=examples(300), deadline=None)
@given(text=spelling)
def test_what_the_pattern_takes_the_settings_take(bounds: tuple[float, float | None, bool], text: str) -> None:
    low, high, exclusive = bounds
    pattern = re.compile(bounded_pattern(low, high, low_exclusive=exclusive))
    exact = in_bounds(seconds_of(text), low, high, exclusive)
    assert float(parse_duration(text)) >= 0  # the parser reads every spelling drawn
    if pattern.match(text):
        assert exact, f"{text!r} passes the pattern but is out of bounds {bounds}"
    elif exact:
        # Refused only where it is finer than a thousandth of its unit.
        unit = text.rstrip().lstrip("0123456789. ") or "s"
        count = seconds_of(text) / Fraction(repr(_UNIT_SECONDS[unit]))
        assert (count * 1000).denominator != 1, f"{text!r} is in bounds {bounds} but the pattern refuses it"


@pytest.mark.parametrize(
    ("low", "high", "exclusive", "taken", "refused"),
    [
        (0.0, 3600.0, True, ["1h", "3600", "0.5s", "60m", "0.001s", "1ms", " 5 s "], ["0s", "0", "2h", "1.0001h"]),
        (0.0, 600.0, True, ["10m", "9.999m", "600s", "0.166h", "600000ms"], ["15m", "10.001m", "0.167h", "1h"]),
        (0.0, None, False, ["0s", "0", "9999w"], ["-1s"]),
    ],
)  # fmt: skip
def test_the_bounds_at_their_edges(
    low: float, high: float | None, exclusive: bool, taken: list[str], refused: list[str]
) -> None:
    pattern = re.compile(bounded_pattern(low, high, low_exclusive=exclusive))
    assert [t for t in taken if not pattern.match(t)] == []
    assert [r for r in refused if pattern.match(r)] == []


def test_bounds_that_admit_nothing_give_a_pattern_that_matches_nothing() -> None:
    pattern = re.compile(bounded_pattern(5.0, 5.0, low_exclusive=True))
    assert not any(pattern.match(t) for t in ("5", "5s", "5.0001s", "4.999s", ""))
