"""Issue 49, point 6: profiling every 10 s and the slow reads every 30 s, as the docs say, not a poll late.

Paced by the time since the last read, a read slipped a poll whenever a GPU's reader reached it a few
milliseconds sooner after its poll began than the time before: with 5 s polls, profiling came every
10 or 15 s and the slow reads every 30 or 35 s.  Over a simulated hour of polls whose starts jitter by
tens of milliseconds (as apscheduler's and the readers' do), on the fake driver's clock moved on by
``advance_clock``, the reads are counted with the fake's call counter at each poll.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from gpu_exporter.sources.cadence import Cadence
from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.poller import Poller
from tests.exporter_helpers import ErrorLog
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm
from tests.fakenvml.runtime import advance_clock, call_count, driver_monotonic, driver_wall_clock

GIB = 2**30
HOUR_S = 3600.0
JITTER_S = 0.05  # how much later than planned a poll may start, and a GPU's reader reach a read
READS = {"profiling": "nvmlGpmSampleGet", "process utilization": "nvmlDeviceGetProcessUtilization",
         "slow": "nvmlDeviceGetRemappedRows"}  # fmt: skip


def jittered_polls(poll_s: float, seed: int) -> list[float]:
    """The planned start of each poll over an hour, each late by up to ``JITTER_S``."""
    rng = random.Random(seed)
    return [k * poll_s + rng.uniform(0, JITTER_S) for k in range(int(HOUR_S / poll_s) + 1)]


def reads_over_an_hour(poll_s: float, seed: int = 49) -> dict[str, list[float]]:
    """When (driver seconds since the first poll) each kind of read was made, polling an H100 with
    processes every ``poll_s`` seconds for an hour."""
    errors = ErrorLog()
    backend = NvmlBackend(errors, profiling_interval=10.0, slow_interval=30.0, poll_interval=poll_s,
                          monotonic=driver_monotonic, wall=driver_wall_clock)  # fmt: skip
    poller = Poller(backend, errors=errors, monotonic=driver_monotonic, wall_clock=driver_wall_clock)
    times: dict[str, list[float]] = {kind: [] for kind in READS}
    start = driver_monotonic()
    try:
        for planned in jittered_polls(poll_s, seed):
            advance_clock(max(0.0, planned - (driver_monotonic() - start)))  # on to the poll's start
            before = {kind: call_count(fn) for kind, fn in READS.items()}
            at = driver_monotonic() - start
            poller.poll()
            for kind, fn in READS.items():
                if call_count(fn) > before[kind]:
                    times[kind].append(at)
    finally:
        poller.close()
    return times


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.fixture
def busy_h100(scenario: Scenario) -> Scenario:
    scenario.driver(580)
    g = h100_sxm(scenario.add_gpu(), "cadence", 0, util=90, mem_used=40 * GIB, power_mw=500_000)
    g.add_process(4242, 30 * GIB, name="trainer", sm=70)
    scenario.write()
    return scenario


def test_with_5_s_polls_profiling_is_read_every_10_s_and_slow_values_every_30_s(busy_h100: Scenario, nvml: Any) -> None:
    times = reads_over_an_hour(5.0)
    # Every gap a whole period, give or take the jitter (never the 15 s or 35 s of a slipped poll).
    for kind, every in (("profiling", 10.0), ("process utilization", 10.0), ("slow", 30.0)):
        off = [round(g, 2) for g in gaps(times[kind]) if abs(g - every) > 2 * JITTER_S + 0.05]
        assert not off, f"{kind}: gaps other than {every:g} s: {off[:10]}"
        assert len(times[kind]) == pytest.approx(HOUR_S / every + 1, abs=1), kind


def test_with_polls_that_do_not_divide_the_period_each_read_is_at_the_poll_nearest_its_plan(
    busy_h100: Scenario, nvml: Any
) -> None:
    """7 s polls: profiling 7 or 14 s apart and the slow reads 28 or 35 s apart, each read within half a
    poll of a grid of 10 s (or 30 s) from the first, so an hour has 360 (120) of them: none drifts."""
    poll_s = 7.0
    times = reads_over_an_hour(poll_s)
    for kind, every in (("profiling", 10.0), ("process utilization", 10.0), ("slow", 30.0)):
        assert times[kind][0] < JITTER_S + 0.05, f"{kind}: not read at the first poll"
        late = [(round(t, 2), k) for k, t in enumerate(times[kind]) if abs(t - k * every) > poll_s / 2 + 0.1]
        assert not late, f"{kind}: reads off their {every:g} s grid: {late[:10]}"
        assert len(times[kind]) == pytest.approx(HOUR_S / every + 1, abs=1), kind


@pytest.mark.parametrize("poll_s", [5.0, 7.0, 3.0, 12.0])
def test_a_cadence_keeps_its_grid_over_an_hour_of_jittered_polls(poll_s: float) -> None:
    """The rule alone: each read within half a poll (or half a period, if the poll is longer) of its plan."""
    for every in (10.0, 30.0):
        cadence = Cadence.of(every, poll_s)
        planned: float | None = None
        reads = []
        for now in jittered_polls(poll_s, seed=int(poll_s * every)):
            if (following := cadence.take(planned, now)) is not None:
                planned = following
                reads.append(now)
        spacing = max(every, poll_s)
        for k, t in enumerate(reads):
            assert abs(t - reads[0] - k * spacing) <= max(poll_s, every) / 2 + JITTER_S, (every, k, t)


def test_a_read_that_fell_a_whole_period_behind_starts_the_grid_again() -> None:
    cadence = Cadence.of(10.0, 5.0)
    assert cadence.take(None, 100.0) == 110.0
    assert cadence.take(110.0, 105.0) is None
    assert cadence.take(110.0, 108.0) == 120.0  # within half a poll of its plan
    assert cadence.take(120.0, 161.0) == 171.0  # polls were missed: not four reads in a row to catch up
    assert Cadence.of(0.0, 5.0).take(100.0, 100.0) == 100.0  # 0: every poll


def test_the_daemons_backend_keeps_to_the_poll_interval_of_its_settings() -> None:
    from gpu_exporter.cli import make_backend
    from gpu_exporter.settings.config import load_settings

    backend = make_backend(load_settings({"poll_interval": 7}), lambda f, e: None)
    assert isinstance(backend, NvmlBackend)
    assert backend._readers.slow == Cadence(30.0, 3.5)  # half a 7 s poll of slack on the 30 s cadence
