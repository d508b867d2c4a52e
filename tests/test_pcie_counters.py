"""The PCIe counter bookkeeping alone (sources/nvml/pcie.py), on readings handed to it: wraps, resets,
the width a counter has shown, and when the driver's sample is taken and believed."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpu_exporter.sources.nvml.pcie import FLOOR, PcieCounters, Sample

S = 1_000_000  # microseconds in a second: the driver's timestamps
G = 2**32


@dataclass
class Driver:
    """The driver's throughput sample, and how often it was taken."""

    rate: Sample = (1e9, 1e9)
    taken: list[Sample] = field(default_factory=list)

    def __call__(self) -> Sample:
        self.taken.append(self.rate)
        return self.rate


def test_a_wrap_of_a_counter_below_2_32_is_a_wrap_and_the_total_goes_on() -> None:
    c, d = PcieCounters(), Driver(rate=(20.0, 20.0))
    assert c.poll((G - 10, 0, 0, 64), d) == ((20.0, 20.0), (G - 10, 0))  # first poll: the sample
    rates, totals = c.poll((10, 20, S, 64), d)  # wrapped: 20 bytes in a second
    assert rates == (20.0, 20.0) and totals == (G + 10, 20)
    assert len(d.taken) == 1  # the first rate was checked against the first poll's sample


def test_a_64_bit_counter_going_back_was_reset() -> None:
    c, d = PcieCounters(), Driver(rate=(5.0, 5.0))
    c.poll((2**40, 2**40, 0, 64), d)
    c.poll((2**40 + 5, 2**40 + 5, S, 64), d)
    rates, totals = c.poll((100, 2**40 + 10, 2 * S, 64), d)
    assert rates == (5.0, 5.0) and totals == (100, 2**40 + 10)  # no rate across the reset: the sample
    assert len(d.taken) == 2
    assert c.poll((105, 2**40 + 15, 3 * S, 64), d) == ((5.0, 5.0), (105, 2**40 + 15))  # counting again


def test_a_narrow_counter_that_disagrees_with_the_sample_gives_way_to_it_until_the_next_check() -> None:
    c, d = PcieCounters(), Driver(rate=(20e9, 1e3))
    c.poll((0, 0, 0, 64), d)
    # 20 GB in a second on a 32-bit counter: it shows 20e9 mod 2^32.
    rates, totals = c.poll((int(20e9) % G, 1000, S, 64), d)
    assert rates == (20e9, 1e3) and totals is None
    rates, totals = c.poll((int(40e9) % G, 2000, 2 * S, 64), d)  # every poll: the sample, no counter
    assert rates == (20e9, 1e3) and totals is None and len(d.taken) == 3  # first, the check, this poll
    # The next static refresh checks again; the load has dropped within what the counter can count.
    c.recheck()
    d.rate = (1e9, 1e3)
    shown = 2 * (int(20e9) % G) + int(1e9)  # what the counter counted: its wraps within a poll are lost
    assert c.poll((int(40e9) % G + int(1e9), 3000, 3 * S, 64), d) == ((1e9, 1e3), (shown, 3000))


def test_a_counter_past_2_32_is_believed_whatever_the_sample_says() -> None:
    c, d = PcieCounters(), Driver(rate=(1.0, 1.0))  # a 20 ms glimpse of an idle moment
    c.poll((2**40, 2**40, 0, 64), d)
    assert c.poll((2**40 + int(7e9), 2**40 + int(7e9), S, 64), d) == ((7e9, 7e9), (2**40 + int(7e9),) * 2)


def test_a_narrow_counter_moving_more_than_half_its_range_is_checked_at_once() -> None:
    c, d = PcieCounters(), Driver(rate=(1e9, 0.0))
    c.poll((0, 0, 0, 64), d)
    assert c.poll((int(1e9), 0, S, 64), d)[0] == (1e9, 0.0)  # checked against the first poll's sample
    d.rate = (3e9, 0.0)
    taken = len(d.taken)
    rates, totals = c.poll((int(1e9) + int(3e9), 0, 2 * S, 64), d)  # 3e9 > 2^31 in one poll
    assert len(d.taken) == taken + 1  # a fresh sample, not the first poll's
    assert rates == (3e9, 0.0) and totals == (int(4e9), 0)  # it agrees: the counters stand


def test_an_idle_link_agrees_within_the_floor() -> None:
    c, d = PcieCounters(), Driver(rate=(0.0, 0.0))
    c.poll((0, 0, 0, 64), d)
    small = FLOOR // 2
    assert c.poll((small, small, S, 64), d) == ((small, small), (small, small))


def test_one_direction_without_a_counter_takes_the_sample_and_shows_the_other_total() -> None:
    c, d = PcieCounters(), Driver(rate=(7.0, 8.0))
    assert c.poll((100, None, 0, 64), d) == ((7.0, 8.0), (100, None))
    assert c.poll((200, None, S, 64), d) == ((7.0, 8.0), (200, None))
    assert len(d.taken) == 2


def test_no_counters_at_all_is_the_sample_every_poll() -> None:
    c, d = PcieCounters(), Driver(rate=(7.0, 8.0))
    assert c.poll(None, d) == ((7.0, 8.0), None)
    assert c.poll(None, d) == ((7.0, 8.0), None)


def test_polls_closer_than_the_shortest_span_keep_the_last_rate_without_a_sample() -> None:
    c, d = PcieCounters(), Driver(rate=(10.0, 10.0))
    c.poll((2**40, 2**40, 0, 64), d)
    c.poll((2**40 + 10, 2**40 + 10, S, 64), d)
    taken = len(d.taken)
    assert c.poll((2**40 + 11, 2**40 + 11, S + 50_000, 64), d)[0] == (10.0, 10.0)
    assert len(d.taken) == taken
    rates, _ = c.poll((2**40 + 30, 2**40 + 30, 2 * S, 64), d)  # the span runs from the older reading
    assert rates == (20.0, 20.0)


@pytest.mark.parametrize("bits", [16, 32])
def test_a_counter_of_a_narrow_type_wraps_at_its_width(bits: int) -> None:
    c, d = PcieCounters(), Driver(rate=(20.0, 20.0))
    top = 2**bits
    c.poll((top - 10, 0, 0, bits), d)
    assert c.poll((10, 20, S, bits), d) == ((20.0, 20.0), (top + 10, 20))


@dataclass
class Paced:
    """The slow cadence's sample: taken only when ``due``, else the last one."""

    driver: Driver
    due: bool = False
    last: Sample = None

    def __call__(self) -> tuple[Sample, bool]:
        if not self.due:
            return self.last, False
        self.due, self.last = False, self.driver()
        return self.last, True


def test_an_untrusted_counter_shows_the_paced_sample_and_is_used_again_once_one_agrees() -> None:
    d = Driver(rate=(20e9, 1e3))
    c, paced = PcieCounters(), Paced(d, last=(19e9, 1e3))
    c.poll((0, 0, 0, 64), d, paced)
    tx = int(20e9) % G
    # The first check (a sample now: the counter jumped): short by lost wraps.
    assert c.poll((tx, 1000, S, 64), d, paced) == ((20e9, 1e3), None)
    for k in range(2, 6):  # between the slow cadence's samples: its last one, and no call
        tx += int(20e9)
        assert c.poll((tx % G, 1000 * k, k * S, 64), d, paced) == ((19e9, 1e3), None)
    assert len(d.taken) == 2
    d.rate, paced.due = (1e9, 1e3), True  # the load dropped within what the counter can count
    tx += int(1e9)
    rates, totals = c.poll((tx % G, 6000, 6 * S, 64), d, paced)
    assert rates == (1e9, 1e3) and totals is not None and len(d.taken) == 3


def test_a_trusted_counter_that_jumps_is_checked_only_when_the_slow_cadence_samples() -> None:
    d = Driver(rate=(3e9, 0.0))
    c, paced = PcieCounters(), Paced(d)
    c.poll((0, 0, 0, 64), d, paced)
    assert c.poll((int(3e9), 0, S, 64), d, paced)[0] == (3e9, 0.0)  # checked against a sample now
    for k in range(2, 8):  # 3e9 > 2^31 in every poll: the counter stands without a sample
        assert c.poll((k * int(3e9) % G, 0, k * S, 64), d, paced)[0] == (3e9, 0.0)
    assert len(d.taken) == 2
    d.rate, paced.due = (7e9, 0.0), True  # the next check finds it short (by a wrap): the sample takes over
    assert c.poll(((7 * int(3e9) + int(7e9)) % G, 0, 8 * S, 64), d, paced) == ((7e9, 0.0), None)
