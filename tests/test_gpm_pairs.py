"""GPM sample pairing on an injected clock: which samples are diffed, when, and what is freed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from gpu_exporter.snapshot import Activity
from gpu_exporter.sources.gpm import METRIC_FIELDS, MIN_INTERVAL_S, MetricAnswer, SamplePair, activity_of
from tests.timing import LATE_S, NEVER_S

NOT_SUPPORTED = 3
UNKNOWN = 999


@dataclass
class Buffer:
    """A sample buffer: what was sampled into it, and when."""

    id: int
    reading: float | None = None
    at: float | None = None


@dataclass
class FakeCalls:
    """The driver's GPM calls, recording what the pairing asks of them."""

    live: dict[int, Buffer] = field(default_factory=dict)
    freed: list[int] = field(default_factory=list)
    pairs: list[tuple[float | None, float | None]] = field(default_factory=list)  # (older.at, newer.at)
    next_id: int = 0
    answer: dict[int, tuple[int, float]] = field(default_factory=dict)

    def alloc(self) -> Buffer:
        self.next_id += 1
        b = self.live[self.next_id] = Buffer(self.next_id)
        return b

    def free(self, sample: Buffer) -> None:
        assert sample.id in self.live, "double free"
        del self.live[sample.id]
        self.freed.append(sample.id)

    def metrics(self, older: Buffer, newer: Buffer, ids: tuple[int, ...]) -> dict[int, tuple[int, float]]:
        assert older.id != newer.id and older.id in self.live and newer.id in self.live
        self.pairs.append((older.at, newer.at))
        return {i: self.answer.get(i, (0, float(newer.reading or 0))) for i in ids}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def sampler(clock: Clock, reading: float) -> Callable[[Buffer], None]:
    def fill(b: Buffer) -> None:
        b.reading, b.at = reading, clock.t

    return fill


def test_the_first_sample_is_no_pair_and_later_ones_diff_the_previous_poll() -> None:
    calls, clock = FakeCalls(), Clock()
    pair = SamplePair(calls, clock)
    assert len(calls.live) == 2
    assert pair.take(sampler(clock, 40), (2,)) == (None, False)
    clock.t += 5
    answers, fresh = pair.take(sampler(clock, 40), (2,))
    assert fresh and answers == {2: MetricAnswer(0.40)}
    clock.t += 5
    pair.take(sampler(clock, 70), (2,))
    assert calls.pairs == [(100.0, 105.0), (105.0, 110.0)], "each poll is diffed against the one before"


def test_a_pair_under_100_ms_is_never_diffed_and_the_last_answers_are_repeated() -> None:
    calls, clock = FakeCalls(), Clock()
    pair = SamplePair(calls, clock)
    pair.take(sampler(clock, 40), (2,))
    clock.t += 1
    first, _ = pair.take(sampler(clock, 40), (2,))
    clock.t += MIN_INTERVAL_S / 2
    again, fresh = pair.take(sampler(clock, 90), (2,))
    assert again == first and not fresh
    clock.t += MIN_INTERVAL_S / 2 + 0.01  # now over 100 ms since the kept sample at 101
    newer, fresh = pair.take(sampler(clock, 90), (2,))
    assert fresh and newer == {2: MetricAnswer(0.90)}
    assert calls.pairs == [(100.0, 101.0), (101.0, clock.t)], "the short pair was skipped, not diffed"


def test_exactly_100_ms_apart_is_a_valid_pair() -> None:
    calls, clock = FakeCalls(), Clock()
    clock.t = 0.0  # so that the interval is exactly MIN_INTERVAL_S in floating point
    pair = SamplePair(calls, clock)
    pair.take(sampler(clock, 40), (2,))
    clock.t += MIN_INTERVAL_S
    assert pair.take(sampler(clock, 40), (2,))[1]


def test_a_failed_sample_keeps_the_previous_one() -> None:
    calls, clock = FakeCalls(), Clock()
    pair = SamplePair(calls, clock)
    pair.take(sampler(clock, 40), (2,))

    def broken(b: Buffer) -> None:
        raise RuntimeError("driver error")

    clock.t += 1
    with pytest.raises(RuntimeError):
        pair.take(broken, (2,))
    clock.t += 1
    pair.take(sampler(clock, 40), (2,))
    assert calls.pairs == [(100.0, 102.0)]


def test_close_frees_both_buffers_once_and_a_closed_pair_samples_nothing() -> None:
    calls, clock = FakeCalls(), Clock()
    pair = SamplePair(calls, clock)
    assert pair.close() and calls.live == {} and len(calls.freed) == 2
    assert pair.closed
    assert pair.close()  # again: nothing to free, no double free
    assert pair.take(sampler(clock, 40), (2,)) == (None, False)


def test_close_does_not_free_buffers_a_stuck_call_still_uses() -> None:
    calls, clock = FakeCalls(), Clock()
    pair = SamplePair(calls, clock)
    inside, release = threading.Event(), threading.Event()

    def stuck(b: Buffer) -> None:
        inside.set()
        release.wait(NEVER_S)  # stuck until the test lets go, however slow the machine

    worker = threading.Thread(target=pair.take, args=(stuck, (2,)))
    worker.start()
    assert inside.wait(NEVER_S)
    assert not pair.close(timeout=0.05), "freeing a buffer the driver writes to would be worse than a leak"
    assert len(calls.live) == 2
    assert pair.take(sampler(clock, 1), (2,)) == (None, False), "a second caller does not wait on the stuck one"
    release.set()
    worker.join(NEVER_S)
    assert pair.close() and calls.live == {}


def test_a_failing_allocation_leaves_nothing_allocated() -> None:
    calls, clock = FakeCalls(), Clock()

    class OneOnly(FakeCalls):
        def alloc(self) -> Buffer:
            if self.live:
                raise MemoryError("no second buffer")
            return super().alloc()

    calls = OneOnly()
    with pytest.raises(MemoryError):
        SamplePair(calls, clock)
    assert calls.live == {}


@pytest.mark.parametrize(
    ("code", "percent", "ratio"),
    [(0, 0.0, 0.0), (0, 62.0, 0.62), (0, 100.0, 1.0), (0, 101.5, 1.0), (0, 102.0, 1.0), (0, 102.01, None),
     (0, 103.0, None), (0, -0.5, None), (0, float("nan"), None), (NOT_SUPPORTED, 50.0, None), (UNKNOWN, 50.0, None)],
)  # fmt: skip
def test_answers_are_ratios_and_garbage_is_unavailable(code: int, percent: float, ratio: float | None) -> None:
    calls, clock = FakeCalls(), Clock()
    calls.answer = {2: (code, percent)}
    pair = SamplePair(calls, clock)
    pair.take(sampler(clock, 0), (2,))
    clock.t += 1
    answers, _ = pair.take(sampler(clock, 0), (2,))
    assert answers is not None
    assert answers[2].ratio == ratio and answers[2].error == code


def test_activity_names_every_metric_and_is_none_when_nothing_answered() -> None:
    answers = {i: MetricAnswer(n / 100) for n, i in enumerate(METRIC_FIELDS, start=1)}
    activity = activity_of(answers)
    assert activity == Activity(graphics=0.01, sm=0.02, sm_occupancy=0.03, tensor=0.04, dram=0.05, fp64=0.06,
                                fp32=0.07, fp16=0.08)  # fmt: skip
    assert activity_of({2: MetricAnswer(None, NOT_SUPPORTED)}) is None
    assert activity_of({}) is None
    assert activity_of({2: MetricAnswer(0.0)}) == Activity(sm=0.0), "an idle GPU is 0, not absent"


def test_a_poll_before_the_interval_has_passed_makes_no_driver_call() -> None:
    calls, clock = FakeCalls(), Clock()
    pair = SamplePair(calls, clock, interval=10.0)
    filled: list[float] = []

    def fill(b: Buffer) -> None:
        filled.append(clock.t)
        sampler(clock, 40)(b)

    pair.take(fill, (2,))
    clock.t += 10
    assert pair.take(fill, (2,)) == ({2: MetricAnswer(0.40)}, True)
    for _ in range(4):  # polls every 2 s: within the 10 s interval, the last answers and no sample taken
        clock.t += 2
        assert pair.take(fill, (2,)) == ({2: MetricAnswer(0.40)}, False)
    clock.t += 2
    assert pair.take(fill, (2,)) == ({2: MetricAnswer(0.40)}, True)
    assert filled == [100.0, 110.0, 120.0]
    assert calls.pairs == [(100.0, 110.0), (110.0, 120.0)]


def test_a_caller_does_not_wait_for_another_stuck_in_the_driver() -> None:
    calls, clock = FakeCalls(), Clock()
    pair = SamplePair(calls, clock)
    inside, release = threading.Event(), threading.Event()

    def stuck(b: Buffer) -> None:
        inside.set()
        release.wait(NEVER_S)  # far longer than the LATE_S the other caller may take

    worker = threading.Thread(target=pair.take, args=(stuck, (2,)))
    worker.start()
    try:
        assert inside.wait(NEVER_S)
        started = time.monotonic()
        assert pair.take(sampler(clock, 1), (2,)) == (None, False)
        assert time.monotonic() - started < LATE_S, "the poll waited on a GPU stuck in the driver"
    finally:
        release.set()
        worker.join(NEVER_S)
