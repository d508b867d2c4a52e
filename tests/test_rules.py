"""The rule engine on scripted traces: each yields exactly the expected alerts and no others.

Time is the snapshots' own ``taken_at``; nothing sleeps.
"""

from __future__ import annotations

import gc
import math
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

import gpu_exporter
from gpu_exporter.alerting import window as window_module
from gpu_exporter.alerting.engine import FIRING, PENDING, RESOLVED, Alert, RuleEngine, fingerprint, holding_now
from gpu_exporter.alerting.rules import averaged
from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.alerting.window import IncreaseTracker, SampleWindow
from gpu_exporter.settings.config import load_settings
from gpu_exporter.snapshot import Activity, GpuReading, GpuStatic, NodeSnapshot, PodRef, ProcessReading
from tests import assert_mentions
from tests.memory_helpers import allocations

GIB = 1024**3
STEP = 15.0  # seconds between polls in the traces
T0 = 1_800_000_000.0

STATIC = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0",
                   pcie_max_generation=5, pcie_max_width=16)  # fmt: skip
GEN5_X16 = 32e9 * 128 / 130 / 8 * 16


def gpu(**kw: Any) -> GpuReading:
    """A healthy, busy GPU; keyword arguments override."""
    base: dict[str, Any] = dict(
        index=0, uuid="GPU-0", up=True, static=STATIC, utilization_ratio=0.95, memory_total_bytes=80 * GIB,
        memory_used_bytes=60 * GIB, pcie_tx_bytes_per_second=2e9, pcie_rx_bytes_per_second=4e9,
        pcie_link_generation=5, pcie_link_width=16,
        clock_event_active=MappingProxyType(dict.fromkeys(("gpu_idle", "hw_thermal", "sw_thermal"), False)),
        ecc_errors_total=MappingProxyType({"corrected": 0, "uncorrected": 0}), row_remap_pending=False,
        row_remap_failure=False, processes=(ProcessReading(100, "python3", 59 * GIB),),
        temperature_celsius=MappingProxyType({"gpu": 70.0}),
    )  # fmt: skip
    base.update(kw)
    return GpuReading(**base)


def snap(t: float, *gpus: GpuReading, nvml_up: bool = True) -> NodeSnapshot:
    return NodeSnapshot(taken_at=t, duration_seconds=0.05, nvml_up=nvml_up, gpus=gpus)


def run(trace: Iterable[GpuReading], rules: RulesSettings | None = None) -> tuple[RuleEngine, list[list[Alert]]]:
    """Feed one reading per poll; return the engine and what it sent after each poll."""
    engine = RuleEngine(rules or load_settings().rules, "node-a", resend_interval=3600)
    sent = [engine.evaluate(snap(T0 + i * STEP, g)).to_send for i, g in enumerate(trace)]
    return engine, sent


def fired(sent: list[list[Alert]]) -> set[str]:
    return {a.label_dict["alertname"] + "/" + a.label_dict["severity"] for batch in sent for a in batch
            if a.state == FIRING}  # fmt: skip


def minutes(n: float) -> int:
    return int(n * 60 / STEP)


def fast_rules(**overrides: dict[str, Any]) -> RulesSettings:
    return load_settings({"rules": overrides}).rules


# -- the labelled scenario suite ------------------------------------------------------------------
IDLE_CARD = dict(utilization_ratio=0.0, processes=(), memory_used_bytes=0, pcie_tx_bytes_per_second=0.0,
                 pcie_rx_bytes_per_second=0.0, pcie_link_generation=1)  # fmt: skip


def trace_idle_card() -> list[GpuReading]:
    return [gpu(**IDLE_CARD)] * minutes(90)


def trace_allocated_but_idle() -> list[GpuReading]:
    quiet = dict(pcie_tx_bytes_per_second=1e6, pcie_rx_bytes_per_second=1e6, pcie_link_generation=1)
    return [gpu(utilization_ratio=0.02, **quiet)] * minutes(70)


def trace_healthy_training() -> list[GpuReading]:
    return [gpu(utilization_ratio=0.9 + 0.01 * (i % 9)) for i in range(minutes(90))]


def trace_memory_creep() -> list[GpuReading]:
    n = minutes(40)
    return [gpu(memory_used_bytes=int((0.5 + 0.45 * i / n) * 80 * GIB)) for i in range(n)] + [
        gpu(memory_used_bytes=int(0.95 * 80 * GIB))
    ] * minutes(10)


def trace_one_poll_spike() -> list[GpuReading]:
    return [gpu()] * minutes(5) + [gpu(memory_used_bytes=int(0.99 * 80 * GIB))] + [gpu()] * minutes(10)


def trace_memory_hovering() -> list[GpuReading]:
    # Above 90% long enough to fire, then wobbling between 88% and 91%: must stay one alert.
    above = [gpu(memory_used_bytes=int(0.91 * 80 * GIB))] * minutes(6)
    wobble = [gpu(memory_used_bytes=int((0.88 if i % 2 else 0.91) * 80 * GIB)) for i in range(minutes(30))]
    return above + wobble


def trace_pcie_starved() -> list[GpuReading]:
    return [gpu(utilization_ratio=0.3, pcie_rx_bytes_per_second=0.9 * GEN5_X16)] * minutes(10)


def trace_pcie_busy() -> list[GpuReading]:
    return [gpu(utilization_ratio=0.97, pcie_rx_bytes_per_second=0.9 * GEN5_X16)] * minutes(10)


def trace_degraded_link_under_load() -> list[GpuReading]:
    return [gpu(pcie_link_generation=1, pcie_link_width=8)] * minutes(10)


def trace_degraded_link_at_idle() -> list[GpuReading]:
    return [gpu(**{**IDLE_CARD, "pcie_link_width": 8})] * minutes(10)


def trace_lost_mid_run() -> list[GpuReading]:
    return [gpu()] * minutes(5) + [GpuReading(index=0, uuid="GPU-0", up=False, error="GPU is lost")] * minutes(5)


def trace_xid_79() -> list[GpuReading]:
    return [gpu()] * 4 + [gpu(xid_errors_total=MappingProxyType({79: 1}))] * 4


def trace_thermal() -> list[GpuReading]:
    hot = MappingProxyType({"gpu_idle": False, "hw_thermal": True, "sw_thermal": False})
    return [gpu()] * 4 + [gpu(clock_event_active=hot, temperature_celsius=MappingProxyType({"gpu": 91.0}))] * minutes(8)


SUITE: list[tuple[str, Callable[[], list[GpuReading]], set[str]]] = [
    ("idle card", trace_idle_card, set()),  # GpuIdle is off by default
    ("allocated but idle", trace_allocated_but_idle, {"GpuUnderutilized/warning"}),
    ("healthy training", trace_healthy_training, set()),
    ("memory creeping to 95%", trace_memory_creep, {"GpuMemoryHigh/warning"}),
    ("one-poll spike to 99%", trace_one_poll_spike, set()),
    ("memory hovering around 90%", trace_memory_hovering, {"GpuMemoryHigh/warning"}),
    ("PCIe saturated, GPU starving", trace_pcie_starved, {"GpuPcieBottleneck/warning"}),
    ("PCIe saturated, GPU busy", trace_pcie_busy, set()),
    ("degraded link under load", trace_degraded_link_under_load, {"GpuPcieLinkDegraded/warning"}),
    ("degraded link at idle", trace_degraded_link_at_idle, set()),
    ("GPU lost mid-run", trace_lost_mid_run, {"GpuLost/critical"}),
    ("XID 79", trace_xid_79, {"GpuXidError/critical"}),
    ("thermal throttling", trace_thermal, {"GpuThermalThrottling/warning"}),
]


@pytest.mark.parametrize(("name", "trace", "expected"), SUITE, ids=[s[0] for s in SUITE])
def test_scenario_yields_exactly_the_expected_alerts(
    name: str, trace: Callable[[], list[GpuReading]], expected: set[str]
) -> None:
    _, sent = run(trace())
    assert fired(sent) == expected


@pytest.mark.parametrize(
    "static",
    [replace(STATIC, pcie_max_width=None), replace(STATIC, pcie_max_generation=None)],
    ids=["generation only", "width only"],
)
def test_a_card_that_reports_only_half_its_pcie_capability_is_not_judged_degraded(static: GpuStatic) -> None:
    """NVML answers the maximum link generation and width by separate calls, and a card may support
    only one: with half the capability unknown the rule says nothing, and the other rules still run."""
    trace = [gpu(static=static, pcie_link_generation=1, pcie_link_width=8, memory_used_bytes=79 * GIB)] * minutes(10)
    _, sent = run(trace)
    assert fired(sent) == {"GpuMemoryHigh/warning", "GpuMemoryHigh/critical"}


def test_idle_card_with_gpu_idle_enabled() -> None:
    _, sent = run(trace_idle_card(), fast_rules(GpuIdle={"enabled": True}))
    assert fired(sent) == {"GpuIdle/info"}


def test_hovering_memory_does_not_flap() -> None:
    _, sent = run(trace_memory_hovering())
    transitions = [(a.state, i) for i, batch in enumerate(sent) for a in batch
                   if a.label_dict["alertname"] == "GpuMemoryHigh"]  # fmt: skip
    assert [s for s, _ in transitions] == [FIRING]  # fired once, never resolved and re-fired


def test_memory_high_critical_level() -> None:
    _, sent = run([gpu(memory_used_bytes=int(0.99 * 80 * GIB))] * minutes(6))
    assert fired(sent) == {"GpuMemoryHigh/warning", "GpuMemoryHigh/critical"}


# -- the state machine ---------------------------------------------------------------------------
def test_pending_then_firing_after_for_then_resolved_on_clear() -> None:
    rules = fast_rules(GpuMemoryHigh={"for": "60s"})
    engine = RuleEngine(rules, "node-a", resend_interval=3600, resolved_retention=5000)
    full, ok = gpu(memory_used_bytes=int(0.95 * 80 * GIB)), gpu(memory_used_bytes=int(0.5 * 80 * GIB))

    def state(t: float, g: GpuReading) -> tuple[str | None, list[str]]:
        sent = engine.evaluate(snap(T0 + t, g)).to_send
        warn = [a for a in engine.active() if a.label_dict["severity"] == "warning"]
        return (warn[0].state if warn else None), [a.state for a in sent]

    assert state(0, full) == (PENDING, [])
    assert state(30, full) == (PENDING, [])
    assert state(60, full) == (FIRING, [FIRING])
    assert state(90, full) == (FIRING, [])  # not re-sent before the resend interval
    assert state(120, gpu(memory_used_bytes=int(0.87 * 80 * GIB))) == (FIRING, [])  # below 90%, above the clear
    assert state(150, ok) == (None, [RESOLVED])
    resolved = engine.evaluate(snap(T0 + 150 + 3600, ok)).to_send
    assert [a.state for a in resolved] == [RESOLVED]  # re-sent once more within the retention
    assert engine.evaluate(snap(T0 + 150 + 7200, ok)).to_send == []  # then forgotten


def test_pending_alert_that_stops_holding_is_dropped_silently() -> None:
    engine = RuleEngine(fast_rules(), "n", resend_interval=3600)
    engine.evaluate(snap(T0, gpu(memory_used_bytes=int(0.95 * 80 * GIB))))
    assert [a.state for a in engine.active()] == [PENDING]
    assert engine.evaluate(snap(T0 + 15, gpu())).to_send == []
    assert engine.active() == []


def test_firing_alerts_are_resent_every_interval() -> None:
    engine = RuleEngine(fast_rules(GpuLost={"for": "0s"}), "n", resend_interval=60)
    lost = GpuReading(index=0, uuid="GPU-0", up=False, error="lost")
    sends = [len(engine.evaluate(snap(T0 + t, lost)).to_send) for t in range(0, 181, 15)]
    assert sends == [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]


def test_labels_and_annotations() -> None:
    _, sent = run(trace_pcie_starved())
    alert = next(a for batch in sent for a in batch)
    assert alert.label_dict == {"alertname": "GpuPcieBottleneck", "severity": "warning", "gpu": "0",
                                "uuid": "GPU-0", "node": "node-a"}  # fmt: skip
    ann = dict(alert.annotations)
    assert "GPU 0 (NVIDIA H100 80GB HBM3)" in ann["summary"]
    assert "90%" in ann["description"] and "threshold 80%" in ann["description"] and "30%" in ann["description"]


def test_nvml_down_keeps_alerts_as_they_are() -> None:
    engine = RuleEngine(fast_rules(GpuMemoryHigh={"for": "0s"}), "n", resend_interval=3600)
    engine.evaluate(snap(T0, gpu(memory_used_bytes=int(0.95 * 80 * GIB))))
    before = engine.active()
    assert engine.evaluate(snap(T0 + 15, nvml_up=False)).to_send == []
    assert engine.active() == before


def test_disabled_rule_never_fires() -> None:
    _, sent = run(trace_pcie_starved(), fast_rules(GpuPcieBottleneck={"enabled": False}))
    assert fired(sent) == set()


def test_xid_outside_the_critical_list_does_not_fire_and_the_alert_ages_out() -> None:
    rules = fast_rules(GpuXidError={"window": "2m"})
    trace = [gpu()] * 2 + [gpu(xid_errors_total=MappingProxyType({13: 1, 79: 1}))] * minutes(5)
    _, sent = run(trace, rules)
    states = [(a.label_dict["xid"], a.state) for batch in sent for a in batch]
    assert states == [("79", FIRING), ("79", RESOLVED)]


def test_ecc_uncorrectable_fires_on_increase_not_on_a_lifetime_count() -> None:
    old = gpu(ecc_errors_total=MappingProxyType({"corrected": 0, "uncorrected": 3}))
    new = gpu(ecc_errors_total=MappingProxyType({"corrected": 0, "uncorrected": 4}))
    _, sent = run([old] * 10)
    assert fired(sent) == set()  # three errors from before the exporter started: a baseline
    _, sent = run([old] * 3 + [new] * 3)
    assert fired(sent) == {"GpuEccUncorrectable/critical"}


def test_row_remap_alerts() -> None:
    _, sent = run([gpu(row_remap_pending=True, row_remap_failure=True)] * 2)
    assert fired(sent) == {"GpuRowRemapPending/warning", "GpuRowRemapFailure/critical"}
    # The fix, as an admin types it: let go of NVML first (a held handle refuses the reset), then reset.
    (pending,) = {dict(a.annotations)["description"] for batch in sent for a in batch
                  if a.label_dict["alertname"] == "GpuRowRemapPending" and a.state == FIRING}  # fmt: skip
    assert_mentions(
        pending, "row remap is pending", "reset the GPU", "SIGUSR1 to gpu-exporter", "nvidia-smi -r -i <gpu>"
    )


def test_a_lost_gpu_resolves_its_other_alerts() -> None:
    trace = [gpu(memory_used_bytes=int(0.95 * 80 * GIB))] * minutes(6) + [
        GpuReading(index=0, uuid="GPU-0", up=False, error="lost")
    ] * 2
    _, sent = run(trace, fast_rules(GpuLost={"for": "0s"}))
    states = {(a.label_dict["alertname"], a.state) for batch in sent for a in batch}
    assert ("GpuMemoryHigh", RESOLVED) in states and ("GpuLost", FIRING) in states


def test_holding_now_ignores_for() -> None:
    engine = RuleEngine(fast_rules(), "n")
    found = holding_now(engine, snap(T0, gpu(utilization_ratio=0.3, pcie_rx_bytes_per_second=0.9 * GEN5_X16)))
    assert {c.alertname for _, c in found} == {"GpuPcieBottleneck"}


# -- windowed statistics ---------------------------------------------------------------------------
def test_sample_window_mean_and_trim() -> None:
    w = SampleWindow(horizon=60)
    for t, v in ((0, 1.0), (10, 0.0), (20, 0.5), (70, 0.0)):
        w.add(t, v)
    assert len(w) == 3  # the sample at t=0 fell out of the 60 s horizon
    assert w.mean(70, 61) == pytest.approx((0.0 + 0.5 + 0.0) / 3)
    assert w.mean(70, 60) == pytest.approx(0.25)  # (now - window, now], as Prometheus 3 ranges
    assert w.mean(200, 60) is None


def test_sample_window_means_are_those_of_a_plain_scan() -> None:
    """The running exact sums give what scanning every sample with math.fsum gave, also when the
    wall clock steps back, for NaN and for values too small for the integer form; what a window
    covers (how many samples, how far back: the "over the last ..." of a description) is the scan's
    too, also after a gap with nothing reported."""

    class Scan:
        def __init__(self, horizon: float) -> None:
            self.horizon, self.samples = horizon, deque[tuple[float, float]]()

        def add(self, t: float, v: float) -> None:
            self.samples.append((t, v))
            self.trim(t)

        def trim(self, now: float) -> None:
            while self.samples and self.samples[0][0] < now - self.horizon:
                self.samples.popleft()

        def span(self, now: float, window: float) -> tuple[int, float]:
            times = [t for t, _ in self.samples if now - window < t <= now]
            return len(times), (now - min(times) if times else 0.0)

        def mean(self, now: float, window: float) -> float | None:
            vals = [v for t, v in self.samples if now - window < t <= now]
            return math.fsum(vals) / len(vals) if vals else None

    rng = random.Random(17)
    for _ in range(60):
        horizon = rng.choice([5, 60, 600])
        w, ref, t = SampleWindow(horizon), Scan(horizon), 0.0
        for _ in range(rng.randint(1, 1500)):
            r = rng.random()
            t += 1 if r < 0.7 else 0.5 if r < 0.85 else 0 if r < 0.97 else -3
            v = rng.choice([0.1, 0.94, rng.random(), 1e-40, 0.0, 1.0, rng.randint(0, 100) / 100,
                            math.nan if rng.random() < 0.01 else 0.3])  # fmt: skip
            w.add(t, v)
            ref.add(t, v)
            if rng.random() < 0.01:  # a gap: nothing reported for longer than the horizon
                t += 2 * horizon
                w.trim(t)
                ref.trim(t)
            assert len(w) == len(ref.samples)
            if rng.random() < 0.1:
                for window in (1, 5, 30, 600, 1e9):
                    now = t + rng.choice([0, 0, 2, -1])
                    got, want = w.mean(now, window), ref.mean(now, window)
                    assert got == want or (got != got and want != want), (now, window, got, want)
                    assert w.span(now, window) == ref.span(now, window), (now, window)


@pytest.mark.parametrize(
    "values",
    [[-5.0] * 10, [-0.1, 0.3, -250.5, 17.25], [-255.9] * 40, [255.9] * 40, [300.0, 700.0, 450.5],
     [8.0e10, 1.6e10, 3.3e9], [1e300, -1e300, 1.0], [1e-300, 2.0, -1e-300]],
    ids=["negative", "mixed-signs", "just-above-minus-256", "just-below-256", "watts", "bytes", "huge", "tiny"],
)  # fmt: skip
def test_a_window_averages_values_of_any_size_and_sign_as_math_fsum(values: list[float]) -> None:
    """Watts, bytes, negative figures (a delta, a derived value), 1e300: a window's mean is the
    correctly rounded sum over the count, as math.fsum gives it, whatever the size or sign."""
    w = SampleWindow(horizon=600)
    for i, v in enumerate(values):
        w.add(float(i), v)
    now = float(len(values) - 1)
    assert w.mean(now, 600) == math.fsum(values) / len(values)
    assert w.mean(now, 2) == math.fsum(values[-2:]) / 2
    assert w.span(now, 600) == (len(values), now)


def test_a_clock_that_steps_back_less_than_one_poll_is_still_noticed() -> None:
    """The wall clock steps back 5 s between polls 10 s apart: the window then holds 0, 10, 20, 15
    and 25 out of order, and a mean or span over (10, 25] still counts 15, 20 and 25."""
    w = SampleWindow(horizon=600)
    for t, v in ((0.0, 1.0), (10.0, 0.0), (20.0, 0.5), (15.0, 0.25), (25.0, 0.75)):
        w.add(t, v)
    assert w.mean(25.0, 15) == (0.5 + 0.25 + 0.75) / 3
    assert w.span(25.0, 15) == (3, 10.0)
    assert w.mean(20.0, 6) == (0.5 + 0.25) / 2  # (14, 20]: 20 and 15, not 25
    assert w.span(20.0, 6) == (2, 5.0)


def test_a_gpu_idle_at_zero_for_hours_averages_exactly_zero() -> None:
    """Hours of 0% (the window compacted many times on the way) average 0%, not a hair above it."""
    w = SampleWindow(horizon=60)
    for t in range(4 * 3600):
        w.add(float(t), 0.0)
        if t % 600 == 0:
            assert w.mean(float(t), 60) == 0.0, t
    assert w.mean(4 * 3600 - 1, 60) == 0.0 and w.span(4 * 3600 - 1, 60) == (60, 59.0)


@pytest.mark.slow  # a memory soak: the whole suite runs it, --fast leaves it out
def test_a_window_holds_memory_for_its_horizon_only() -> None:
    """A daemon polls for months: a window of a minute must not keep every sample it was ever given."""
    w = SampleWindow(horizon=60)
    with allocations(window_module) as mem:
        for t in range(5000):
            w.add(float(t), 0.5)
        settled = mem.held()
        for t in range(5000, 100_000):
            w.add(float(t), 0.5)
        grown = mem.held()
    assert grown - settled < 1_000_000, f"{(grown - settled) / 1e6:.1f} MB more after 95,000 more polls"
    assert len(w) == 61


@pytest.mark.slow  # a memory soak: the whole suite runs it, --fast leaves it out
def test_rule_history_memory_is_flat_under_a_soak() -> None:
    """Issue 17: the daemon's memory stays flat over a 30-minute soak.  The windowed rules keep an
    hour of samples per GPU; told the poll interval, the engine sets their room aside at once, so
    30 minutes of 1 s polls (utilization and SM activity) add nothing.  Before, each sample cost
    ~100 B as Python objects: +0.7 MiB over these 30 minutes for 2 GPUs (+3 MiB for 8)."""
    engine = RuleEngine(load_settings().rules, "n", resend_interval=3600, poll_interval=1.0)
    rng = random.Random(5)

    def poll(t: float) -> None:
        readings = [gpu(index=i, uuid=f"GPU-{i}", utilization_ratio=rng.randint(0, 100) / 100,
                        activity=Activity(sm=rng.random())) for i in range(2)]  # fmt: skip
        engine.evaluate(snap(t, *readings))

    with allocations(gpu_exporter) as mem:
        for i in range(30):  # every GPU's history exists, the rules have run
            poll(T0 + i)
        gc.collect()
        before = mem.held()
        for i in range(30, 30 + 30 * 60):
            poll(T0 + i)
        gc.collect()
        grown = mem.held() - before
    assert grown < 64 * 1024, f"{grown / 1024:.0f} KiB more after 30 minutes of polls"


@pytest.mark.slow  # a memory soak: the whole suite runs it, --fast leaves it out
@pytest.mark.parametrize("poll", [5.0, 2.0])
def test_a_gpus_windows_set_aside_an_hour_of_polls_at_the_poll_interval(poll: float) -> None:
    """Told a 5 s poll, an hour of a GPU's samples is 720, and that is the room its two windows set
    aside (about 2 x 900 x 40 B), not the 18,000 samples' worth of an hour x 5; told 2 s, 1,800.  And
    an hour and a half of polls adds nothing (issue 17's flat RSS)."""
    engine = RuleEngine(load_settings().rules, "n", resend_interval=3600, poll_interval=poll)
    rng = random.Random(7)

    def poll_at(t: float) -> None:
        engine.evaluate(snap(t, gpu(utilization_ratio=rng.randint(0, 100) / 100, activity=Activity(sm=rng.random()))))

    with allocations(gpu_exporter) as mem:
        poll_at(T0)
        gc.collect()
        first = mem.held()
        for i in range(1, int(1.5 * 3600 / poll)):
            poll_at(T0 + i * poll)
        gc.collect()
        grown = mem.held() - first
    hour = 3600 / poll
    assert 2 * hour * 40 < first < 2 * 1.5 * hour * 40 + 64 * 1024, first
    assert grown < 64 * 1024, f"{grown / 1024:.0f} KiB more after 1.5 hours of polls"


def test_sample_window_memory_stays_bounded_past_its_horizon() -> None:
    """Past the horizon, old samples make room for new ones: ten horizons of samples take no more
    memory than the first, also at twice the expected rate (the room grows once, then holds)."""

    def fill(capacity: int, step: float) -> tuple[SampleWindow, int, int]:
        w = SampleWindow(60, capacity=capacity)
        with allocations(window_module, alone=True) as mem:
            for i in range(400):
                w.add(i * step, (i % 7) / 10)
            settled, traced = mem.held(), mem.traced()
            mem.reset_peak()
            for i in range(400, 4000):
                w.add(i * step, (i % 7) / 10)
            peak = mem.peak_since_reset(traced)  # before held(): a snapshot takes memory of its own
            return w, mem.held() - settled, peak

    for capacity, step in ((60, 1.0), (60, 0.5), (8, 1.0)):
        # The peak is the process's: a thread left by an earlier test can only raise it, so the
        # lowest of three fills is this window's (a window that copied would peak every time).
        fills = [fill(capacity, step) for _ in range(3)]
        w, grown, _ = fills[0]
        peak = min(p for _, _, p in fills)
        assert len(w) == int(60 / step) + 1
        inside = [(i % 7) / 10 for i in range(4000 - int(60 / step), 4000)]  # (now - 60, now]
        assert w.mean(3999 * step, 60) == math.fsum(inside) / len(inside)
        # A few loose ints and floats (the loop's, the running sum) at most; making room moves the
        # samples without copying them (no peak of a second copy).
        assert max(g for _, g, _ in fills) <= 512 and peak <= 2048, (capacity, step, grown, peak)


def test_a_window_polled_twice_as_often_as_expected_ends_up_as_one_set_up_for_it() -> None:
    """A window set up for a 1 s poll and fed every 0.5 s holds twice the samples it expected: its
    room doubles, once, to what a window set up for 0.5 s polls holds, and no more."""

    def held(capacity: int) -> int:
        with allocations(window_module) as mem:
            w = SampleWindow(60, capacity=capacity)
            for i in range(12_000):
                w.add(i * 0.5, (i % 7) / 10)
            assert len(w) == 121
            return mem.held()

    expected_rate, twice_the_rate = held(120), held(60)
    assert twice_the_rate <= 1.1 * expected_rate, (twice_the_rate, expected_rate)


def test_increase_tracker() -> None:
    t = IncreaseTracker()
    t.observe(0, 5)
    assert t.last_increase_at is None  # a baseline
    t.observe(10, 5)
    t.observe(20, 6)
    assert t.increased_within(30, 15) and not t.increased_within(40, 15)
    t.observe(30, 0)  # a reset is not an increase
    assert t.last_increase_at == 20
    z = IncreaseTracker(from_zero=True)
    z.observe(0, 1)
    assert z.last_increase_at == 0


def test_underutilized_needs_the_window_average_not_one_sample() -> None:
    # Busy for 25 minutes, then idle for 10: the 30-minute average is still far above 10%.
    trace = [gpu(utilization_ratio=0.9)] * minutes(25) + [gpu(utilization_ratio=0.0)] * minutes(10)
    _, sent = run(trace)
    assert "GpuUnderutilized/warning" not in fired(sent)


def test_rule_engine_is_deterministic_for_a_trace() -> None:
    a = run(trace_memory_creep())[1]
    b = run(trace_memory_creep())[1]
    assert [[replace(x) for x in batch] for batch in a] == b


# -- identity and labels ---------------------------------------------------------------------------
def test_fingerprints_are_prometheus_label_set_fingerprints() -> None:
    # prometheus/common model: TestLabelsToSignature's vectors (the same hash as LabelSet.Fingerprint).
    assert int(fingerprint((("fear", "love is not enough"), ("name", "garland, briggs"))), 16) == 5799056148416392346
    assert int(fingerprint(()), 16) == 14695981039346656037


def test_empty_label_values_are_never_sent() -> None:
    engine = RuleEngine(fast_rules(GpuLost={"for": "0s"}), "node-a", resend_interval=3600)
    lost_unread = GpuReading(index=3, uuid="", up=False, error="GPU is lost")  # lost before its UUID was read
    (sent,) = engine.evaluate(snap(T0, lost_unread)).to_send
    assert sent.label_dict == {"alertname": "GpuLost", "severity": "critical", "gpu": "3", "node": "node-a"}
    assert sent.fingerprint == fingerprint(tuple(sorted(sent.label_dict.items())))
    assert [a.labels for a in engine.active()] == [sent.labels]
    assert "uuid unknown" in dict(sent.annotations)["description"]


def pods_engine(**rules: dict[str, Any]) -> RuleEngine:
    return RuleEngine(fast_rules(**rules), "node-a", resend_interval=3600, pod_labels=("namespace", "pod", "container"))


FULL = int(0.95 * 80 * GIB)


def test_a_new_holder_of_a_firing_alert_keeps_its_state_and_start() -> None:
    engine = pods_engine(GpuMemoryHigh={"for": "60s"})
    a, b = (PodRef("ml", "train-a", "main"),), (PodRef("ml", "train-b", "main"),)
    engine.evaluate(snap(T0, gpu(memory_used_bytes=FULL, pods=a)))
    (fired,) = [x for x in engine.evaluate(snap(T0 + 60, gpu(memory_used_bytes=FULL, pods=a))).to_send
                if x.label_dict["severity"] == "warning"]  # fmt: skip
    assert fired.state == FIRING and fired.label_dict["pod"] == "train-a"
    sent = [x for x in engine.evaluate(snap(T0 + 75, gpu(memory_used_bytes=FULL, pods=b))).to_send
            if x.label_dict["severity"] == "warning"]  # fmt: skip
    # To a receiver the label set is the alert: the old one ends, the new one fires from the same start.
    assert [(x.state, x.label_dict["pod"], x.starts_at) for x in sent] == [
        (RESOLVED, "train-a", T0 + 60), (FIRING, "train-b", T0 + 60)]  # fmt: skip
    assert sent[0].resolved_at == T0 + 75
    (active,) = [x for x in engine.active() if x.label_dict["severity"] == "warning"]
    assert active.state == FIRING and active.active_at == T0 and active.label_dict["pod"] == "train-b"
    # Unchanged holders: nothing more until the resend interval.
    assert engine.evaluate(snap(T0 + 90, gpu(memory_used_bytes=FULL, pods=b))).to_send == []


def test_a_holder_change_while_pending_does_not_restart_for() -> None:
    engine = pods_engine(GpuMemoryHigh={"for": "60s"})
    a = (PodRef("ml", "train-a", "main"),)
    engine.evaluate(snap(T0, gpu(memory_used_bytes=FULL, pods=a)))
    engine.evaluate(snap(T0 + 30, gpu(memory_used_bytes=FULL)))  # the pod labels went away
    sent = engine.evaluate(snap(T0 + 60, gpu(memory_used_bytes=FULL, pods=a))).to_send
    assert {(x.state, x.label_dict.get("pod")) for x in sent} == {(FIRING, "train-a")}
    assert all(x.active_at == T0 for x in engine.active())


def test_a_uuid_read_late_relabels_the_alert_without_restarting_it() -> None:
    engine = RuleEngine(fast_rules(GpuLost={"for": "30s"}), "node-a", resend_interval=3600)
    engine.evaluate(snap(T0, GpuReading(index=0, uuid="", up=False, error="lost")))
    (fired,) = engine.evaluate(snap(T0 + 30, GpuReading(index=0, uuid="", up=False, error="lost"))).to_send
    assert "uuid" not in fired.label_dict
    sent = engine.evaluate(snap(T0 + 45, GpuReading(index=0, uuid="GPU-0", up=False, error="lost"))).to_send
    assert [(x.state, x.label_dict.get("uuid"), x.starts_at) for x in sent] == [
        (RESOLVED, None, T0 + 30), (FIRING, "GPU-0", T0 + 30)]  # fmt: skip


def test_a_new_alert_replaces_the_resolution_of_the_same_labels() -> None:
    engine = RuleEngine(fast_rules(GpuLost={"for": "0s"}), "n", resend_interval=15, resolved_retention=900)
    lost = GpuReading(index=0, uuid="GPU-0", up=False, error="lost")
    assert [a.state for a in engine.evaluate(snap(T0, lost)).to_send] == [FIRING]
    assert [a.state for a in engine.evaluate(snap(T0 + 15, gpu())).to_send] == [RESOLVED]
    assert [a.state for a in engine.evaluate(snap(T0 + 30, gpu())).to_send] == [RESOLVED]  # re-sent, as Prometheus
    # It fires again: from now on only the new alert is sent, never the old resolution, which
    # would end the new alert at a receiver that merges by label set.
    for t in (45, 60, 75):
        assert [(a.state, a.starts_at) for a in engine.evaluate(snap(T0 + t, lost)).to_send] == [(FIRING, T0 + 45)]


def test_a_windowed_description_says_what_its_samples_cover() -> None:
    """A mean of one look (``--once``) or of a daemon's first minutes is not "over the last 30 min"."""
    w = SampleWindow(3600)
    w.add(1000.0, 0.05)
    assert averaged(w, 1000.0, 1800) == ("was", "in a single look")
    for t in range(1005, 1065, 5):
        w.add(float(t), 0.05)
    assert averaged(w, 1060.0, 1800) == ("averaged", "over the last 60 s")
    for t in range(1065, 2805, 5):
        w.add(float(t), 0.05)
    assert averaged(w, 2800.0, 1800) == ("averaged", "over the last 30 min")


def test_an_xid_of_a_gpu_that_stopped_answering_names_its_model() -> None:
    """XID 119 (GSP timeout) often comes with the GPU lost: no static reading, yet the alert names the
    model read while it answered, as /alerts does, never a placeholder."""
    xid = MappingProxyType({119: 1})
    down = GpuReading(index=0, uuid="GPU-0", up=False, error="lost", xid_errors_total=xid)
    _, sent = run([gpu(), down], fast_rules(GpuXidError={"for": "0s"}))
    (summary,) = {dict(a.annotations)["summary"] for batch in sent for a in batch
                  if a.label_dict["alertname"] == "GpuXidError"}  # fmt: skip
    assert summary.startswith("GPU 0 (NVIDIA H100 80GB HBM3) reported XID 119: "), summary
    # Never read (lost from the start): the index alone, no "(GPU)".
    _, sent = run([down], fast_rules(GpuXidError={"for": "0s"}))
    (summary,) = {dict(a.annotations)["summary"] for batch in sent for a in batch
                  if a.label_dict["alertname"] == "GpuXidError"}  # fmt: skip
    assert summary.startswith("GPU 0 reported XID 119: "), summary
    # Another card in its index since: not the old one's model.
    other = GpuReading(index=0, uuid="GPU-9", up=False, error="lost", xid_errors_total=xid)
    _, sent = run([gpu(), other], fast_rules(GpuXidError={"for": "0s"}))
    (summary,) = {dict(a.annotations)["summary"] for batch in sent for a in batch
                  if a.label_dict["alertname"] == "GpuXidError"}  # fmt: skip
    assert summary.startswith("GPU 0 reported XID 119: "), summary
