"""PCIe throughput from the byte counters: the mean over the poll interval, no blocking driver sample.

The driver's own throughput query watches the link for 20 ms per direction (and costs 0.7 ms of
CPU on an H200); where the GPU has 64-bit byte counters, the rate is their difference over the
driver's timestamps instead, and the sample is only the fallback.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_exporter.sources.nvml import NvmlBackend, pcie
from gpu_exporter.sources.poller import Poller
from tests.exporter_helpers import ErrorLog, make_poller
from tests.fakenvml import Counter, Err, Scenario
from tests.fakenvml.runtime import advance_clock, call_count, driver_monotonic, driver_wall_clock, step_wall_clock

UUID = "GPU-00000000-0000-0000-0000-0000000000aa"
# The driver watches the link this long per direction before it answers (the blocking itself is
# proved in test_fakenvml_api.py); which polls wait for it, the fake's call counter tells.
SAMPLE_MS = 5


def one_gpu(scenario: Scenario, **pcie: Any) -> None:
    scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", UUID).pcie(sample_ms=SAMPLE_MS, **pcie)
    scenario.write()


def poll_apart(poller: Any, gap_s: float = 0.3) -> Any:
    advance_clock(gap_s)  # the rate needs driver time between two readings: the fake's clock moves on
    return poller.poll()


def test_the_rate_is_the_counters_mean_and_no_poll_after_the_first_waits_for_a_sample(
    scenario: Scenario, nvml: Any
) -> None:
    one_gpu(scenario, tx_kbps=2_000_000, rx_kbps=500_000)
    poller, _ = make_poller()
    calls = throughput_calls()
    first = poller.poll()
    # The first poll has no earlier reading: it takes the driver's sample, so the value is there at once.
    assert first.gpus[0].pcie_tx_bytes_per_second == 2_000_000 * 1024
    assert throughput_calls() == calls + 2, "the first poll did not take the driver's sample (tx and rx)"
    for _ in range(3):
        calls = throughput_calls()
        snap = poll_apart(poller)
        g = snap.gpus[0]
        assert g.pcie_tx_bytes_per_second == pytest.approx(2_000_000 * 1024, rel=0.01)
        assert g.pcie_rx_bytes_per_second == pytest.approx(500_000 * 1024, rel=0.01)
        assert throughput_calls() == calls, "a poll waited for the driver's sample"


def test_the_rate_follows_the_counter_not_the_drivers_sample(scenario: Scenario, nvml: Any) -> None:
    one_gpu(scenario, tx_kbps=1, rx_kbps=1, tx_bytes=Counter(10**12, 7_000_000_000), rx_bytes=Counter(0, 0))
    poller, _ = make_poller()
    poller.poll()
    g = poll_apart(poller).gpus[0]
    assert g.pcie_tx_bytes_per_second == pytest.approx(7e9, rel=0.01)
    assert g.pcie_rx_bytes_per_second == 0  # an idle direction is 0 B/s, not left out
    assert g.pcie_tx_bytes_total is not None and g.pcie_tx_bytes_total > 10**12


def test_a_wall_clock_stepped_back_an_hour_leaves_the_rate_true(scenario: Scenario, nvml: Any) -> None:
    """The rate's span is monotonic time between the two readings, not the field values' timestamps:
    those are wall time, and after NTP steps the clock back an hour a span taken from them is negative
    for that hour, so the rate froze at 1 GB/s while the link carried 10."""
    one_gpu(scenario, tx_kbps=1, rx_kbps=1, tx_bytes=Counter(2**40, 1e9), rx_bytes=Counter(2**40, 2e9))
    poller, _ = make_poller()
    poller.poll()
    g = poll_apart(poller).gpus[0]
    assert (g.pcie_tx_bytes_per_second, g.pcie_rx_bytes_per_second) == (pytest.approx(1e9, rel=0.01),
                                                                        pytest.approx(2e9, rel=0.01))  # fmt: skip
    step_wall_clock(-3600)
    try:
        # The load goes up tenfold (the counter starts higher still, so it only ever counts up).
        scenario.gpu(0).pcie(tx_bytes=Counter(2**41, 10e9), rx_bytes=Counter(2**41, 20e9))
        scenario.write()
        poll_apart(poller)  # the span of the change
        for _ in range(3):
            g = poll_apart(poller).gpus[0]
            assert g.pcie_tx_bytes_per_second == pytest.approx(10e9, rel=0.01)
            assert g.pcie_rx_bytes_per_second == pytest.approx(20e9, rel=0.01)
    finally:
        step_wall_clock(3600)  # the fake stays loaded for the tests after this one


def test_a_change_of_load_shows_within_two_polls(scenario: Scenario, nvml: Any) -> None:
    one_gpu(scenario, tx_kbps=100, rx_kbps=100)
    poller, _ = make_poller()
    poller.poll()
    poll_apart(poller)
    scenario.gpu(0).pcie(tx_kbps=3_000_000)
    scenario.write()
    # The interval that spans the change is partly old load; the next one is all new load.
    poll_apart(poller)
    g = poll_apart(poller).gpus[0]
    assert g.pcie_tx_bytes_per_second == pytest.approx(3_000_000 * 1024, rel=0.02)


def test_a_counter_that_goes_back_gives_the_drivers_sample_not_a_negative_or_huge_rate(
    scenario: Scenario, nvml: Any
) -> None:
    # Counters past 2^32, so 64 bits wide: going back can only be a reset (pcie.py).
    one_gpu(scenario, tx_kbps=40_000, rx_kbps=40_000, tx_bytes=Counter(5 * 10**12, 1e9), rx_bytes=Counter(2**40, 1e9))
    poller, _ = make_poller()
    poller.poll()
    poll_apart(poller)
    scenario.gpu(0).pcie(tx_bytes=Counter(1000, 1e9))  # wrapped, or reset by a driver reload
    scenario.write()
    snap = poll_apart(poller)
    assert snap.gpus[0].pcie_tx_bytes_per_second == 40_000 * 1024
    # Then counting resumes from the new reading.
    g = poll_apart(poller).gpus[0]
    assert g.pcie_tx_bytes_per_second == pytest.approx(1e9, rel=0.01)


def test_without_counters_every_poll_takes_the_drivers_sample(scenario: Scenario, nvml: Any) -> None:
    one_gpu(scenario, tx_kbps=95_000, rx_kbps=410_000, tx_bytes=Err("NOT_SUPPORTED"), rx_bytes=Err("NOT_SUPPORTED"))
    poller, _ = make_poller()
    for _ in range(2):
        calls = throughput_calls()
        snap = poll_apart(poller, 0)
        assert snap.gpus[0].pcie_tx_bytes_per_second == 95_000 * 1024
        assert snap.gpus[0].pcie_rx_bytes_per_second == 410_000 * 1024
        assert throughput_calls() == calls + 2, "a poll went without the driver's sample"


def test_polls_closer_than_the_shortest_span_keep_the_last_rate_and_the_older_reading(
    scenario: Scenario, nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past 2^32 from the start, so 64 bits wide: the counters are used whatever the sample says.
    one_gpu(scenario, tx_kbps=1, rx_kbps=1, tx_bytes=Counter(2**33, 2e9), rx_bytes=Counter(2**33, 2e9))
    poller, _ = make_poller()
    poller.poll()  # a driver sample: 1 KB/s
    assert poll_apart(poller).gpus[0].pcie_tx_bytes_per_second == pytest.approx(2e9, rel=0.01)
    scenario.gpu(0).pcie(tx_bytes=Counter(2**33, 6e9))  # counting on from where 2e9/s brought it
    scenario.write()
    # "Right after" is within the shortest span, here 10 s of driver time (a busy machine may take
    # long to poll again; the span is driver time, not the test's).
    monkeypatch.setattr(pcie, "MIN_SPAN_S", 10.0)
    # A poll right after: too close to divide by, so the last rate stands, without a driver sample...
    calls = throughput_calls()
    quick = poller.poll()
    assert quick.gpus[0].pcie_tx_bytes_per_second == pytest.approx(2e9, rel=0.01)
    assert throughput_calls() == calls, "the quick poll took the driver's sample"
    # ...and the next rate spans from the older reading, the quick poll's interval included.
    g = poll_apart(poller, 10.3).gpus[0]
    assert g.pcie_tx_bytes_per_second == pytest.approx(6e9, rel=0.1)


# -- counters that may be 32 bits wide (nvml.h: "Value can be wrapped") ---------------------------------
def throughput_calls() -> int:
    return call_count("nvmlDeviceGetPcieThroughput")


def l40s_like(scenario: Scenario, per_second: float, start: int) -> None:
    """Counters that wrap at 2^32 and still say "unsigned long long", as an L40S's seem to
    (dcgm-exporter #721); the driver's sample agrees with the rate they count at."""
    g = scenario.add_gpu().identity("NVIDIA L40S", UUID)
    g.pcie(sample_ms=5, tx_kbps=round(per_second / 1024), rx_kbps=1, counter_bits=32,
           tx_bytes=Counter(start, per_second), rx_bytes=Counter(0, 1024))  # fmt: skip
    scenario.write()


def test_a_32_bit_counter_that_wraps_between_polls_keeps_its_rate_and_its_total(scenario: Scenario, nvml: Any) -> None:
    l40s_like(scenario, 1e9, 2**32 - 700_000_000)  # wraps after 0.7 s at 1 GB/s
    poller, errors = make_poller()
    poller.poll()
    poll_apart(poller)  # the first counter rate, checked against the first poll's sample: they agree
    calls, totals = throughput_calls(), []
    for _ in range(5):  # across the wrap
        g = poll_apart(poller).gpus[0]
        assert g.pcie_tx_bytes_per_second == pytest.approx(1e9, rel=0.05)
        totals.append(g.pcie_tx_bytes_total)
    assert throughput_calls() == calls, "a poll took the driver's sample: the wrap was taken for a reset"
    assert all(t is not None for t in totals) and totals == sorted(totals), totals  # no false reset
    assert totals[-1] > 2**32
    assert {error for _, error in errors.counts} == {"not_supported"}  # what this bare card lacks, nothing else


def test_a_32_bit_counter_that_wraps_within_a_poll_gives_way_to_the_drivers_sample(
    scenario: Scenario, nvml: Any
) -> None:
    """20 GB/s moves 6 GB in a 0.3 s poll: more than 2^32, so the counter's difference comes out
    short by a multiple of 4 GiB.  The check against the driver's sample finds it, and the sample is
    used; the counter, short, is not exported."""
    l40s_like(scenario, 20e9, 0)
    poller, _ = make_poller()
    poller.poll()
    for _ in range(4):
        g = poll_apart(poller).gpus[0]
        assert g.pcie_tx_bytes_per_second == pytest.approx(20e9, rel=0.02)
        assert g.pcie_tx_bytes_total is None and g.pcie_rx_bytes_total is None


def daemon_like_poller() -> Poller:
    """The daemon's cadences: 5 s polls, the slow reads (and paced PCIe samples) every 30 s."""
    errors = ErrorLog()
    backend = NvmlBackend(errors, profiling_interval=10.0, slow_interval=30.0, poll_interval=5.0,
                          monotonic=driver_monotonic, wall=driver_wall_clock)  # fmt: skip
    return Poller(backend, errors=errors, monotonic=driver_monotonic, wall_clock=driver_wall_clock)


@pytest.mark.parametrize(
    ("per_second", "what"),
    [(20e9, "wraps several times a poll: the counter disagrees, the sample stands"),
     (600e6, "3 GB a poll, more than half its range: the counter stands, checked every 30 s")],
)  # fmt: skip
def test_a_busy_32_bit_counter_is_checked_at_the_slow_cadence_not_every_poll(
    scenario: Scenario, nvml: Any, per_second: float, what: str
) -> None:
    """Issue 49, point 7: a busy L40S moves more than half of its 32-bit counters' range in every 5 s
    poll, which made the exporter take the driver's blocking sample (two 20 ms waits, 1.4 ms of the
    driver's CPU) at every poll.  Now it is taken every 30 s, and the rate stays the link's."""
    l40s_like(scenario, per_second, 0)
    poller = daemon_like_poller()
    try:
        poller.poll()
        calls, polls = throughput_calls(), 24  # two minutes of 5 s polls
        for _ in range(polls):
            g = poll_apart(poller, 5.0).gpus[0]
            assert g.pcie_tx_bytes_per_second == pytest.approx(per_second, rel=0.05), what
        # Two directions per sample, one sample per 30 s: 8 in two minutes (48 at every poll).
        assert throughput_calls() - calls <= 2 * (polls * 5 / 30 + 1), what
    finally:
        poller.close()
