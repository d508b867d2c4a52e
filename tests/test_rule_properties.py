"""What an operator relies on from every rule, stated once and checked for each of them.

Each rule is described by a reading that makes its condition hold and one that clears it; the
properties below (``for`` is waited out, a firing alert stays firing while its condition holds and
resolves when it clears, the alerts page shows the measured value) are then checked rule by rule.
The rest pins the branches a mutation run found unguarded: a link degraded in width alone, an idle
GPU that runs processes, readings a GPU does not report, a GPU that leaves the snapshot, and
windows at exactly one window old.  Time is the snapshots' own; nothing sleeps.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest

from gpu_exporter.alerting.engine import FIRING, PENDING, RESOLVED, Alert, RuleEngine, holding_now, node_name
from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.serving.alerts_page import alerts_json
from gpu_exporter.snapshot import Activity, FabricReading, GpuReading, PodRef, ProcessReading
from tests import assert_mentions
from tests.test_rules import GEN5_X16, GIB, IDLE_CARD, STEP, T0, fast_rules, gpu, snap

LOST = GpuReading(index=0, uuid="GPU-0", up=False, error="GPU is lost")
RECOVERY = ("gpu_recovery_action", "")  # the driver's verdict, field value 230
HOT = MappingProxyType({"gpu_idle": False, "hw_thermal": True, "sw_thermal": False})
SW_HOT = MappingProxyType({"gpu_idle": False, "hw_thermal": False, "sw_thermal": True})


@dataclass(frozen=True)
class RuleCase:
    alertname: str
    severity: str
    holds: GpuReading  # the condition holds on this reading (from the first poll it is seen)
    clears: GpuReading | None  # the clear condition holds at once on this reading (None: it ages out)
    value: float  # what the alerts page shows as the alert's value while ``holds`` repeats
    settings: dict[str, Any]  # the rule's settings besides ``for``
    before: tuple[GpuReading, ...] = ()  # readings before the condition starts (a counter's baseline)
    labels: tuple[tuple[str, str], ...] = ()  # labels of the rule's own

    @property
    def id(self) -> str:
        return f"{self.alertname}/{self.severity}"


ROUTE = "route_unhealthy"
CASES = [
    RuleCase("GpuUnderutilized", "warning", gpu(utilization_ratio=0.02),
             clears=gpu(utilization_ratio=0.02, processes=()),  # the job freed its memory
             value=0.02, settings={}),
    RuleCase("GpuLowSmActivity", "warning", gpu(utilization_ratio=0.95, activity=Activity(sm=0.15)),
             clears=gpu(utilization_ratio=0.95, activity=Activity(sm=0.95)), value=0.15, settings={"window": "30s"}),
    RuleCase("GpuIdle", "info", gpu(**IDLE_CARD),
             clears=gpu(**{**IDLE_CARD, "processes": (ProcessReading(7, "python3", None),)}),
             value=0.0, settings={"enabled": True}),
    RuleCase("GpuMemoryHigh", "warning", gpu(memory_used_bytes=int(0.95 * 80 * GIB)), clears=gpu(),
             value=0.95, settings={}),
    RuleCase("GpuMemoryHigh", "critical", gpu(memory_used_bytes=int(0.99 * 80 * GIB)),
             clears=gpu(memory_used_bytes=int(0.9 * 80 * GIB)), value=0.99, settings={}),
    RuleCase("GpuPcieBottleneck", "warning", gpu(utilization_ratio=0.3, pcie_rx_bytes_per_second=0.9 * GEN5_X16),
             clears=gpu(utilization_ratio=0.3), value=0.9, settings={}),
    RuleCase("GpuPcieLinkDegraded", "warning", gpu(pcie_link_generation=4), clears=gpu(), value=4.0, settings={}),
    RuleCase("GpuLost", "critical", LOST, clears=gpu(), value=0.0, settings={}),
    RuleCase("GpuXidError", "critical", gpu(xid_errors_total=MappingProxyType({79: 1})), clears=None,
             value=79.0, settings={}, labels=(("xid", "79"),)),
    RuleCase("GpuThermalThrottling", "warning",
             gpu(clock_event_active=HOT, temperature_celsius=MappingProxyType({"gpu": 91.0})), clears=gpu(),
             value=91.0, settings={}),
    RuleCase("GpuEccUncorrectable", "critical",
             gpu(ecc_errors_total=MappingProxyType({"corrected": 0, "uncorrected": 4})), clears=None, value=4.0,
             settings={}, before=(gpu(ecc_errors_total=MappingProxyType({"corrected": 0, "uncorrected": 3})),)),
    RuleCase("GpuRowRemapFailure", "critical", gpu(row_remap_failure=True), clears=gpu(), value=1.0, settings={}),
    RuleCase("GpuRowRemapPending", "warning", gpu(row_remap_pending=True), clears=gpu(), value=1.0, settings={}),
    RuleCase("GpuRecoveryRequired", "critical", gpu(field_values=MappingProxyType({RECOVERY: 4.0})),
             clears=gpu(field_values=MappingProxyType({RECOVERY: 0.0})), value=4.0, settings={}),
    RuleCase("GpuResetRequired", "critical", gpu(reset_required=True), clears=gpu(), value=1.0, settings={}),
    RuleCase("GpuFabricUnhealthy", "critical", gpu(fabric=FabricReading(3, 1, MappingProxyType({ROUTE: True}))),
             clears=gpu(fabric=FabricReading(3, 1, MappingProxyType({ROUTE: False}))), value=1.0,
             settings={}, labels=(("issue", ROUTE),)),
    RuleCase("GpuFabricNotReady", "critical", gpu(fabric=FabricReading(state=2)), clears=gpu(fabric=FabricReading(3)),
             value=2.0, settings={}),
]  # fmt: skip
IDS = [c.id for c in CASES]


def rules_for(case: RuleCase, for_seconds: float) -> RulesSettings:
    return fast_rules(**{case.alertname: {**case.settings, "for": f"{for_seconds}s"}})


def mine(case: RuleCase, alerts: list[Alert]) -> list[Alert]:
    return [a for a in alerts if a.label_dict["alertname"] == case.alertname
            and a.label_dict["severity"] == case.severity
            and all(a.label_dict.get(k) == v for k, v in case.labels)]  # fmt: skip


class Poller:
    """One engine, polled every STEP seconds from T0 on; readings before T0 come from ``case.before``."""

    def __init__(self, case: RuleCase, rules: RulesSettings) -> None:
        self.case = case
        self.engine = RuleEngine(rules, "node-a", resend_interval=3600, resolved_retention=3600)
        self.t = T0 - STEP * len(case.before)
        for g in case.before:
            assert self.poll(g) == []

    def poll(self, g: GpuReading) -> list[Alert]:
        sent = mine(self.case, self.engine.evaluate(snap(self.t, g)).to_send)
        self.t += STEP
        return sent

    def state(self) -> str | None:
        active = mine(self.case, self.engine.active())
        assert len(active) <= 1
        return active[0].state if active else None


# -- for, firing and resolving, rule by rule -------------------------------------------------------
@pytest.mark.parametrize("for_seconds", [0, 1, 45, 120])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_stays_pending_for_its_for_then_fires(case: RuleCase, for_seconds: int) -> None:
    p = Poller(case, rules_for(case, for_seconds))
    fires_at = next(t for t in range(0, 10_000, int(STEP)) if t >= for_seconds)  # the first poll past ``for``
    for i in range(int(for_seconds / STEP) + 3):
        elapsed = i * STEP
        sent = p.poll(case.holds)
        if elapsed < for_seconds:
            assert (p.state(), sent) == (PENDING, []), f"{elapsed} s into a for of {for_seconds} s"
        elif elapsed == fires_at:
            assert p.state() == FIRING, f"not firing {elapsed} s into a for of {for_seconds} s"
            assert [(a.state, a.active_at, a.starts_at) for a in sent] == [(FIRING, T0, T0 + fires_at)]
        else:
            assert (p.state(), sent) == (FIRING, [])  # sent once; next at the resend interval


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_firing_alert_stays_firing_while_its_condition_holds_and_resolves_when_it_clears(case: RuleCase) -> None:
    p = Poller(case, rules_for(case, 0))
    assert [a.state for a in p.poll(case.holds)] == [FIRING]
    for _ in range(10):
        assert p.poll(case.holds) == []
        assert p.state() == FIRING
    if case.clears is None:
        return  # it ages out of its window: see the window tests below
    resolved_at = p.t
    (sent,) = p.poll(case.clears)
    assert (sent.state, sent.resolved_at, sent.starts_at) == (RESOLVED, resolved_at, T0)
    assert p.state() is None


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_alerts_page_shows_the_measured_value_and_says_what_is_wrong(case: RuleCase) -> None:
    p = Poller(case, rules_for(case, 600))
    p.poll(case.holds)
    (pending,) = json.loads(alerts_json(mine(case, p.engine.active())))["data"]["alerts"]
    assert pending["state"] == PENDING
    assert float(pending["value"]) == pytest.approx(case.value, rel=1e-5)
    summary = pending["annotations"]["summary"]
    assert summary.startswith("GPU 0") and pending["annotations"]["description"]


# -- conditions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("generation", [4, 5])
@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("utilization", [0.1, 0.95])
def test_link_degraded_fires_on_generation_or_width_alone_under_load(
    generation: int, width: int, utilization: float
) -> None:
    """The card supports Gen5 x16; a link trained down in either respect loses bandwidth."""
    engine = RuleEngine(fast_rules(GpuPcieLinkDegraded={"for": "0s"}), "n")
    reading = gpu(pcie_link_generation=generation, pcie_link_width=width, utilization_ratio=utilization)
    sent = engine.evaluate(snap(T0, reading)).to_send
    degraded = generation < 5 or width < 16
    assert [a.label_dict["alertname"] for a in sent if a.label_dict["alertname"] == "GpuPcieLinkDegraded"] == (
        ["GpuPcieLinkDegraded"] if degraded and utilization >= 0.2 else []
    )


def test_link_degraded_resolves_when_the_load_goes_though_the_link_stays_degraded() -> None:
    case = next(c for c in CASES if c.alertname == "GpuPcieLinkDegraded")
    p = Poller(case, rules_for(case, 0))
    assert [a.state for a in p.poll(case.holds)] == [FIRING]
    assert [a.state for a in p.poll(gpu(pcie_link_generation=4, utilization_ratio=0.05))] == [RESOLVED]


@pytest.mark.parametrize(
    "processes", [(), (ProcessReading(7, "python3", 2 * GIB),), (ProcessReading(8, "xorg", None),)]
)
@pytest.mark.parametrize("utilization", [0.0, 0.005, 0.01, 0.5])
def test_gpu_idle_only_on_a_gpu_without_processes_and_below_the_threshold(
    processes: tuple[ProcessReading, ...], utilization: float
) -> None:
    engine = RuleEngine(fast_rules(GpuIdle={"enabled": True, "for": "0s"}), "n")
    reading = gpu(**{**IDLE_CARD, "processes": processes, "utilization_ratio": utilization})
    sent = engine.evaluate(snap(T0, reading)).to_send
    idle = [a for a in sent if a.label_dict["alertname"] == "GpuIdle"]
    assert bool(idle) == (not processes and utilization < 0.01)


def test_underutilized_keeps_firing_between_its_thresholds_and_resolves_above_the_clear_threshold() -> None:
    rules = fast_rules(GpuUnderutilized={"for": "0s", "window": "15s"})  # the mean of the last poll alone
    engine = RuleEngine(rules, "n", resend_interval=3600)

    def sent(t: float, util: float) -> list[str]:
        alerts = engine.evaluate(snap(T0 + t, gpu(utilization_ratio=util))).to_send
        return [a.state for a in alerts if a.label_dict["alertname"] == "GpuUnderutilized"]

    assert sent(0, 0.05) == [FIRING]
    assert sent(15, 0.12) == []  # above the 10% threshold, not above the 15% clear threshold
    assert sent(30, 0.15) == []  # at the clear threshold: not above it
    assert sent(45, 0.16) == [RESOLVED]
    assert sent(60, 0.10) == []  # at the threshold: not below it


def test_underutilized_needs_memory_held_by_a_process_not_just_a_process() -> None:
    engine = RuleEngine(fast_rules(GpuUnderutilized={"for": "0s"}), "n")
    no_memory = (ProcessReading(7, "python3", 0), ProcessReading(8, "nvidia-smi", None))
    sent = engine.evaluate(snap(T0, gpu(utilization_ratio=0.0, processes=no_memory))).to_send
    assert "GpuUnderutilized" not in {a.label_dict["alertname"] for a in sent}
    one_byte = (*no_memory, ProcessReading(9, "python3", 1))
    sent = engine.evaluate(snap(T0 + 15, gpu(utilization_ratio=0.0, processes=one_byte))).to_send
    assert "GpuUnderutilized" in {a.label_dict["alertname"] for a in sent}


def test_pcie_bottleneck_fires_on_either_direction_at_its_threshold_and_only_while_the_gpu_starves() -> None:
    engine = RuleEngine(fast_rules(GpuPcieBottleneck={"for": "0s"}), "n", resend_interval=3600)
    cap = 8e9  # a Gen2 x16 link: 5 GT/s x 8/10 / 8 bits x 16 lanes, exact in binary, as is 80% of it

    def states(t: float, **kw: Any) -> list[str]:
        alerts = engine.evaluate(snap(T0 + t, gpu(pcie_link_generation=2, **kw))).to_send
        return [a.state for a in alerts if a.label_dict["alertname"] == "GpuPcieBottleneck"]

    at = 0.8 * cap
    assert states(0, utilization_ratio=0.3, pcie_tx_bytes_per_second=at, pcie_rx_bytes_per_second=None) == [FIRING]
    assert states(15, utilization_ratio=0.3, pcie_tx_bytes_per_second=0.7 * cap) == []  # at the clear: not below
    assert states(30, utilization_ratio=0.5, pcie_tx_bytes_per_second=at) == [RESOLVED]  # the GPU is busy enough
    assert states(45, utilization_ratio=0.49, pcie_tx_bytes_per_second=None, pcie_rx_bytes_per_second=at) == [FIRING]
    assert states(60, utilization_ratio=0.49, pcie_rx_bytes_per_second=0.69 * cap) == [RESOLVED]


def test_memory_high_is_above_its_level_not_at_it_and_clears_below_its_clear_level() -> None:
    engine = RuleEngine(fast_rules(GpuMemoryHigh={"for": "0s"}), "n", resend_interval=3600)
    total = 1000 * GIB

    def states(t: float, used: float) -> list[str]:
        alerts = engine.evaluate(snap(T0 + t, gpu(memory_total_bytes=total, memory_used_bytes=int(used * total))))
        return [a.state for a in alerts.to_send if a.label_dict["severity"] == "warning"]

    assert states(0, 0.90) == []
    assert states(15, 0.901) == [FIRING]
    assert states(30, 0.85) == []  # at the clear level: not below it
    assert states(45, 0.849) == [RESOLVED]


def test_sw_thermal_slowdown_alone_is_thermal_throttling() -> None:
    engine = RuleEngine(fast_rules(GpuThermalThrottling={"for": "0s"}), "n")
    sent = engine.evaluate(snap(T0, gpu(clock_event_active=SW_HOT))).to_send
    assert [a.label_dict["alertname"] for a in sent] == ["GpuThermalThrottling"]


# -- readings a GPU does not report ----------------------------------------------------------------------
ALL_AT_ONCE = {name: {"for": "0s"} for name in RulesSettings.model_fields} | {"GpuIdle": {"enabled": True, "for": "0s"}}
ABSENT = {
    "nothing but its identity": GpuReading(index=0, uuid="GPU-0", up=True),
    "no utilization": gpu(**{**IDLE_CARD, "utilization_ratio": None, "pcie_link_width": 8,
                             "processes": (ProcessReading(1, "p", GIB),)}),
    "no PCIe throughput": gpu(utilization_ratio=0.3, pcie_tx_bytes_per_second=None, pcie_rx_bytes_per_second=None),
    "no PCIe link": gpu(utilization_ratio=0.3, pcie_link_generation=None, pcie_link_width=None,
                        pcie_rx_bytes_per_second=0.9 * GEN5_X16),
    "no maximum link": gpu(static=None, pcie_link_generation=1),
    "no memory total": gpu(memory_total_bytes=None, memory_used_bytes=80 * GIB),
    "no clock event reasons": gpu(clock_event_active=MappingProxyType({})),
}  # fmt: skip


@pytest.mark.parametrize("reading", ABSENT.values(), ids=ABSENT.keys())
def test_a_value_the_gpu_does_not_report_raises_no_alert(reading: GpuReading) -> None:
    engine = RuleEngine(fast_rules(**ALL_AT_ONCE), "n")
    sent = [a for t in range(0, 600, 15) for a in engine.evaluate(snap(T0 + t, reading)).to_send]
    assert sent == []
    assert engine.active() == []


@pytest.mark.parametrize(
    ("alertname", "firing", "unreported"),
    [
        ("GpuMemoryHigh", dict(memory_used_bytes=int(0.99 * 80 * GIB)), dict(memory_used_bytes=None)),
        ("GpuPcieBottleneck", dict(utilization_ratio=0.3, pcie_rx_bytes_per_second=0.9 * GEN5_X16),
         dict(utilization_ratio=0.3, pcie_rx_bytes_per_second=None, pcie_tx_bytes_per_second=None)),
        ("GpuPcieLinkDegraded", dict(pcie_link_generation=3), dict(pcie_link_generation=None)),
        ("GpuThermalThrottling", dict(clock_event_active=HOT), dict(clock_event_active=MappingProxyType({}))),
    ],
)  # fmt: skip
def test_a_firing_alert_whose_reading_stops_being_reported_resolves(
    alertname: str, firing: dict[str, Any], unreported: dict[str, Any]
) -> None:
    """As in Prometheus, where the alert's series disappears: no stale alert fires on forever."""
    engine = RuleEngine(fast_rules(**ALL_AT_ONCE), "n", resend_interval=3600)
    assert alertname in {a.label_dict["alertname"] for a in engine.evaluate(snap(T0, gpu(**firing))).to_send}
    sent = engine.evaluate(snap(T0 + 15, gpu(**unreported))).to_send
    assert {a.label_dict["alertname"]: a.state for a in sent}.get(alertname) == RESOLVED
    assert alertname not in {a.label_dict["alertname"] for a in engine.active()}


# -- GPUs that come and go ------------------------------------------------------------------------------
def test_a_gpu_that_leaves_the_snapshot_resolves_its_firing_alerts_and_drops_its_pending_ones() -> None:
    rules = fast_rules(GpuMemoryHigh={"for": "0s"}, GpuThermalThrottling={"for": "300s"})
    engine = RuleEngine(rules, "n", resend_interval=3600)
    full = gpu(memory_used_bytes=int(0.95 * 80 * GIB))
    one = gpu(index=1, uuid="GPU-1", memory_used_bytes=int(0.95 * 80 * GIB), clock_event_active=HOT)
    first = engine.evaluate(snap(T0, full, one)).to_send
    assert {(a.label_dict["gpu"], a.state) for a in first} == {("0", FIRING), ("1", FIRING)}
    sent = engine.evaluate(snap(T0 + 15, full)).to_send  # GPU 1 fell off the bus, or was unplugged
    assert [(a.label_dict["gpu"], a.label_dict["alertname"], a.state, a.resolved_at) for a in sent] == [
        ("1", "GpuMemoryHigh", RESOLVED, T0 + 15)]  # fmt: skip
    assert {(a.label_dict["gpu"], a.state) for a in engine.active()} == {("0", FIRING)}
    # And it does not come back later from a stale state.
    later = [a for t in range(30, 600, 15) for a in engine.evaluate(snap(T0 + t, full)).to_send]
    assert [(a.label_dict["gpu"], a.state) for a in later] == [("1", RESOLVED)] * len(later)
    assert len(later) <= 1


def test_a_pending_alert_does_not_hold_back_the_alerts_after_it() -> None:
    rules = fast_rules(GpuMemoryHigh={"for": "300s"}, GpuLost={"for": "0s"})
    engine = RuleEngine(rules, "n", resend_interval=60)
    pending = gpu(memory_used_bytes=int(0.95 * 80 * GIB))  # GPU 0, evaluated first, pending for 5 min
    lost = GpuReading(index=1, uuid="GPU-1", up=False, error="GPU is lost")
    sends = []
    for t in range(0, 181, 15):
        sent = engine.evaluate(snap(T0 + t, pending, lost)).to_send
        sends.append([(a.label_dict["alertname"], a.label_dict["gpu"]) for a in sent])
    assert sends == [[("GpuLost", "1")] if t % 60 == 0 else [] for t in range(0, 181, 15)]
    assert {(a.label_dict["alertname"], a.state) for a in engine.active()} >= {
        ("GpuMemoryHigh", PENDING), ("GpuLost", FIRING)}  # fmt: skip


def test_every_resolution_is_sent_and_resent_whatever_resolved_before_it() -> None:
    rules = fast_rules(GpuLost={"for": "0s"})
    engine = RuleEngine(rules, "n", resend_interval=60, resolved_retention=120)
    lost = [GpuReading(index=i, uuid=f"GPU-{i}", up=False, error="lost") for i in range(3)]
    ok = [gpu(index=i, uuid=f"GPU-{i}") for i in range(3)]
    engine.evaluate(snap(T0, *lost))
    # GPU 0 recovers first, GPUs 1 and 2 fifteen seconds later.
    assert [(a.label_dict["gpu"], a.state) for a in engine.evaluate(snap(T0 + 15, ok[0], *lost[1:])).to_send] == [
        ("0", RESOLVED)]  # fmt: skip
    resolved = {}
    for t in range(30, 301, 15):
        resolved[t] = sorted(a.label_dict["gpu"] for a in engine.evaluate(snap(T0 + t, *ok)).to_send)
    assert resolved[30] == ["1", "2"]
    assert resolved[75] == ["0"] and resolved[90] == ["1", "2"]  # each re-sent a resend interval after its last send
    assert [t for t, r in resolved.items() if r] == [30, 75, 90, 135, 150]  # then forgotten after the retention


# -- windows ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [c for c in CASES if c.clears is None], ids=[c.id for c in CASES if c.clears is None])
def test_an_increase_exactly_one_window_old_still_counts_and_one_poll_later_it_does_not(case: RuleCase) -> None:
    p = Poller(case, fast_rules(**{case.alertname: {"for": "0s", "window": "60s"}}))
    states = []
    for _ in range(7):
        states.append([a.state for a in p.poll(case.holds)])
    # The counter rose at T0 (the first poll of ``holds``) and stays: the alert ends once the rise
    # is more than a window old, not at exactly one window.
    assert states == [[FIRING], [], [], [], [], [RESOLVED], []]


# -- the node label ---------------------------------------------------------------------------------
def test_the_node_label_is_the_configured_name_else_node_name_else_the_host_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "k8s-node-7")
    assert node_name("configured") == "configured"
    assert node_name(None) == "k8s-node-7"
    monkeypatch.delenv("NODE_NAME")
    assert node_name(None) == socket.gethostname()
    monkeypatch.setenv("NODE_NAME", "")
    assert node_name("") == socket.gethostname()


def test_the_same_alert_on_two_gpus_is_two_alerts() -> None:
    engine = RuleEngine(fast_rules(GpuMemoryHigh={"for": "30s"}), "n", resend_interval=3600)
    full = int(0.95 * 80 * GIB)
    gpus = (gpu(memory_used_bytes=full), gpu(index=1, uuid="GPU-1", memory_used_bytes=full))
    engine.evaluate(snap(T0, *gpus))
    sent = engine.evaluate(snap(T0 + 30, *gpus)).to_send
    assert sorted((a.label_dict["gpu"], a.state, a.active_at) for a in sent) == [("0", FIRING, T0), ("1", FIRING, T0)]


@pytest.mark.parametrize(
    ("alertname", "holds", "unreported"),
    [
        ("GpuUnderutilized", dict(utilization_ratio=0.02), dict(utilization_ratio=None)),
        ("GpuLowSmActivity", dict(utilization_ratio=0.95, activity=Activity(sm=0.15)),
         dict(utilization_ratio=0.95, activity=None)),
    ],
)  # fmt: skip
def test_a_windowed_alert_whose_signal_stops_being_reported_resolves_once_its_window_has_drained(
    alertname: str, holds: dict[str, Any], unreported: dict[str, Any]
) -> None:
    rules = fast_rules(**{alertname: {"for": "0s", "window": "60s"}})
    engine = RuleEngine(rules, "n", resend_interval=3600)
    states = []
    for t, reading in [(0, holds), (15, holds), *((t, unreported) for t in range(30, 151, 15))]:
        sent = engine.evaluate(snap(T0 + t, gpu(**reading))).to_send
        states.append([a.state for a in sent if a.label_dict["alertname"] == alertname])
    # The last sample (t = 15) is out of the window (now - 60 s, now] at t = 75: no data, so the
    # alert resolves then, as the PromQL rule's series would vanish.
    assert states == [[FIRING], [], [], [], [], [RESOLVED], [], [], [], [], []]


WINDOWED = [c for c in CASES if c.alertname in ("GpuUnderutilized", "GpuLowSmActivity", "GpuIdle")]


@pytest.mark.parametrize("case", WINDOWED, ids=[c.alertname for c in WINDOWED])
def test_a_windowed_alert_of_a_gpu_that_stops_answering_resolves_though_its_window_still_holds_samples(
    case: RuleCase,
) -> None:
    """A lost GPU is GpuLost; what its last minutes looked like says nothing about it any more."""
    p = Poller(case, fast_rules(**{case.alertname: {**case.settings, "for": "0s"}}, GpuLost={"for": "0s"}))
    assert [a.state for a in p.poll(case.holds)] == [FIRING]
    assert [a.state for a in p.poll(LOST)] == [RESOLVED]
    assert "GpuLost" in {a.label_dict["alertname"] for a in p.engine.active()}


# -- thresholds exactly met --------------------------------------------------------------------------
def sent_states(engine: RuleEngine, t: float, alertname: str, **kw: Any) -> list[str]:
    return [a.state for a in engine.evaluate(snap(T0 + t, gpu(**kw))).to_send if a.label_dict["alertname"] == alertname]


def test_low_sm_activity_thresholds_at_their_exact_values() -> None:
    # A 15 s window holds one poll, so each mean is exactly the value given.
    engine = RuleEngine(fast_rules(GpuLowSmActivity={"for": "0s", "window": "15s"}), "n", resend_interval=3600)

    def states(t: float, util: float, sm: float) -> list[str]:
        return sent_states(engine, t, "GpuLowSmActivity", utilization_ratio=util, activity=Activity(sm=sm))

    assert states(0, 0.80, 0.2) == [FIRING]  # utilization at least 80%: at 80% it counts
    assert states(15, 0.75, 0.2) == []  # the clear needs utilization below 75%
    assert states(30, 0.80, 0.30) == []  # ... or SM activity above 30%
    assert states(45, 0.74, 0.2) == [RESOLVED]
    assert states(60, 0.80, 0.25) == []  # SM activity below 25% to fire: at 25% it does not
    assert states(75, 0.80, 0.2) == [FIRING]
    assert states(90, 0.9, 0.31) == [RESOLVED]


def test_pcie_bottleneck_needs_the_gpu_below_its_utilization_bound_to_fire() -> None:
    engine = RuleEngine(fast_rules(GpuPcieBottleneck={"for": "0s"}), "n", resend_interval=3600)
    starved = dict(pcie_link_generation=2, pcie_rx_bytes_per_second=0.9 * 8e9)
    assert sent_states(engine, 0, "GpuPcieBottleneck", utilization_ratio=0.5, **starved) == []
    assert sent_states(engine, 15, "GpuPcieBottleneck", utilization_ratio=0.49, **starved) == [FIRING]


def test_link_degraded_counts_a_gpu_at_exactly_its_load_threshold_as_loaded() -> None:
    engine = RuleEngine(fast_rules(GpuPcieLinkDegraded={"for": "0s"}), "n", resend_interval=3600)
    assert sent_states(engine, 0, "GpuPcieLinkDegraded", pcie_link_width=8, utilization_ratio=0.19) == []
    assert sent_states(engine, 15, "GpuPcieLinkDegraded", pcie_link_width=8, utilization_ratio=0.2) == [FIRING]


def test_thermal_throttling_without_a_temperature_reading_still_fires_and_says_so() -> None:
    engine = RuleEngine(fast_rules(GpuThermalThrottling={"for": "0s"}), "n")
    (a,) = engine.evaluate(snap(T0, gpu(clock_event_active=HOT, temperature_celsius=MappingProxyType({})))).to_send
    assert a.label_dict["alertname"] == "GpuThermalThrottling" and a.value is None
    assert_mentions(dict(a.annotations)["description"], "Thermal slowdown", "hw_thermal", "n/a")
    engine = RuleEngine(fast_rules(GpuThermalThrottling={"for": "0s"}), "n")
    (a,) = engine.evaluate(snap(T0, gpu(clock_event_active=SW_HOT))).to_send
    assert_mentions(dict(a.annotations)["description"], "Thermal slowdown", "sw_thermal", "70 C")


def test_gpu_idle_resolves_once_its_utilization_is_no_longer_reported_for_a_window() -> None:
    engine = RuleEngine(fast_rules(GpuIdle={"enabled": True, "for": "0s", "window": "60s"}), "n", resend_interval=3600)
    unreported = {**IDLE_CARD, "utilization_ratio": None}
    states = [sent_states(engine, 0, "GpuIdle", **IDLE_CARD)]
    states += [sent_states(engine, t, "GpuIdle", **unreported) for t in range(15, 91, 15)]
    assert states == [[FIRING], [], [], [], [RESOLVED], [], []]


def test_each_level_rule_names_the_tuned_limit_its_value_is_compared_with() -> None:
    """``--once`` reports each finding's threshold from the check itself, so a tuned limit shows."""
    rules = fast_rules(GpuUnderutilized={"threshold": 0.2}, GpuLowSmActivity={"sm_active_below": 0.3, "window": "15s"},
                       GpuIdle={"enabled": True, "threshold": 0.03, "window": "15s"},
                       GpuMemoryHigh={"warning": 0.8, "critical": 0.97},
                       GpuPcieBottleneck={"threshold": 0.7})  # fmt: skip
    readings = [gpu(utilization_ratio=0.02), gpu(utilization_ratio=0.95, activity=Activity(sm=0.15)), gpu(**IDLE_CARD),
                gpu(memory_used_bytes=int(0.99 * 80 * GIB)),
                gpu(utilization_ratio=0.3, pcie_rx_bytes_per_second=0.9 * GEN5_X16), gpu(pcie_link_generation=4),
                LOST]  # fmt: skip
    found = {
        (c.alertname, c.severity): c.threshold
        for r in readings
        for _, c in holding_now(RuleEngine(rules, "n"), snap(T0, r))
    }
    assert found == {("GpuUnderutilized", "warning"): 0.2, ("GpuLowSmActivity", "warning"): 0.3,
                     ("GpuIdle", "info"): 0.03, ("GpuMemoryHigh", "warning"): 0.8, ("GpuMemoryHigh", "critical"): 0.97,
                     ("GpuPcieBottleneck", "warning"): 0.7,
                     ("GpuPcieLinkDegraded", "warning"): 5.0,  # the card's own generation, not a setting
                     ("GpuLost", "critical"): None}  # a state, not a level  # fmt: skip


@pytest.mark.parametrize(("code", "says"), [(1, "reset the GPU"), (2, "reboot the node"), (3, "drain peer-to-peer"),
                                           (4, "then reset the GPU"), (5, "IMEX domain"), (6, "PCIe bus"),
                                           (7, "reboot the system"), (9, "unknown to this exporter")])  # fmt: skip
def test_a_recovery_alert_says_what_the_driver_asks_for(code: int, says: str) -> None:
    engine = RuleEngine(fast_rules(), "n")
    (a,) = [a for a in engine.evaluate(snap(T0, gpu(field_values=MappingProxyType({RECOVERY: float(code)})))).to_send
            if a.label_dict["alertname"] == "GpuRecoveryRequired"]  # fmt: skip
    annotations = dict(a.annotations)
    assert_mentions(annotations["summary"], "GPU 0", says)
    assert_mentions(annotations["description"], f"recovery action {code}", "GPU-0", says)
    assert a.value == code


def test_no_recovery_alert_where_the_driver_gives_no_verdict() -> None:
    """An older driver (no field 230) or a card that does not report it: no alert, and no value."""
    engine = RuleEngine(fast_rules(), "n")
    for reading in (gpu(), gpu(field_values=MappingProxyType({RECOVERY: 0.0})), LOST):
        assert [c for _, c in holding_now(engine, snap(T0, reading)) if c.alertname == "GpuRecoveryRequired"] == []


@pytest.mark.parametrize(("code", "fires", "says"), [(79, True, "reboot the node"), (119, True, "reset the GPU"),
                                                    (48, True, "drain and reset"), (63, False, ""), (13, False, ""),
                                                    (94, False, "")])  # fmt: skip
def test_an_xid_alerts_as_nvidia_s_catalogue_says_and_says_what_to_do(code: int, fires: bool, says: str) -> None:
    """By default GpuXidError follows the catalogue's Immediate Action: 79 (off the bus) is RESTART_BM,
    119 (GSP RPC timeout) RESET_GPU, 48 (DBE) its own workflow; 63 is IGNORE, 13 and 94 RESTART_APP."""
    engine = RuleEngine(fast_rules(), "n")
    engine.evaluate(snap(T0, gpu()))
    sent = [a for a in engine.evaluate(snap(T0 + STEP, gpu(xid_errors_total=MappingProxyType({code: 1})))).to_send
            if a.label_dict["alertname"] == "GpuXidError"]  # fmt: skip
    assert bool(sent) is fires
    if fires:
        assert_mentions(dict(sent[0].annotations)["summary"], f"XID {code}", says)
        assert_mentions(dict(sent[0].annotations)["description"], f"XID {code}", "1 since the exporter started",
                        says)  # fmt: skip


# -- what an alert carries while it goes on ------------------------------------------------------------
def pods_engine(**rules: dict[str, Any]) -> RuleEngine:
    return RuleEngine(fast_rules(**rules), "node-a", resend_interval=15, resolved_retention=900,
                      pod_labels=("namespace", "pod", "container"))  # fmt: skip


def test_an_alert_fires_with_the_labels_numbers_and_value_of_the_poll_it_fires_at() -> None:
    engine = pods_engine(GpuMemoryHigh={"for": "30s"})
    a, b = (PodRef("ml", "a", "main"),), (PodRef("ml", "b", "main"),)
    engine.evaluate(snap(T0, gpu(memory_used_bytes=int(0.91 * 80 * GIB), pods=a)))
    engine.evaluate(snap(T0 + 15, gpu(memory_used_bytes=int(0.93 * 80 * GIB), pods=b)))
    (pending,) = [x for x in engine.active() if x.label_dict["severity"] == "warning"]
    assert (pending.state, pending.label_dict["pod"]) == (PENDING, "b") and pending.value == pytest.approx(0.93)
    assert "93% full" in dict(pending.annotations)["summary"]
    sent = engine.evaluate(snap(T0 + 30, gpu(memory_used_bytes=int(0.95 * 80 * GIB), pods=b))).to_send
    (fired,) = [x for x in sent if x.label_dict["severity"] == "warning"]
    assert (fired.state, fired.label_dict["pod"]) == (FIRING, "b") and fired.value == pytest.approx(0.95)
    assert "95% full" in dict(fired.annotations)["summary"]
    # Re-sent while firing: with the numbers of the poll it is re-sent at.
    sent = engine.evaluate(snap(T0 + 45, gpu(memory_used_bytes=int(0.97 * 80 * GIB), pods=b))).to_send
    (again,) = [x for x in sent if x.label_dict["severity"] == "warning"]
    assert (again.state, again.starts_at) == (FIRING, T0 + 30) and again.value == pytest.approx(0.97)
    assert "97% full" in dict(again.annotations)["summary"]


def test_an_old_resolution_of_the_same_labels_never_follows_the_alert_that_fires_again() -> None:
    """Receivers merge by label set: a resolution sent after the new firing would end it."""
    engine = pods_engine(GpuMemoryHigh={"for": "30s"})
    a, b = (PodRef("ml", "a", "main"),), (PodRef("ml", "b", "main"),)
    full, ok = int(0.95 * 80 * GIB), int(0.5 * 80 * GIB)
    trace = [(0, full, b), (30, full, b), (45, ok, b),  # fires with pod b, resolves
             (60, full, a), (75, full, b), (90, full, b),  # pending with pod a, then b: fires with b
             *((t, full, b) for t in range(105, 400, 15))]  # fmt: skip
    sent = []
    for t, used, pods in trace:
        for x in engine.evaluate(snap(T0 + t, gpu(memory_used_bytes=used, pods=pods))).to_send:
            if x.label_dict["severity"] == "warning":
                sent.append((t, x.state, x.label_dict["pod"]))
    refired = sent.index((90, FIRING, "b"))
    assert [s for s in sent[refired:] if s[1] == RESOLVED] == []


def test_an_old_resolution_never_follows_an_alert_whose_holder_came_back() -> None:
    engine = pods_engine(GpuMemoryHigh={"for": "0s"})
    a, b = (PodRef("ml", "a", "main"),), (PodRef("ml", "b", "main"),)
    full = int(0.95 * 80 * GIB)
    sent = []
    for t, pods in [(0, a), (15, b), (30, a), *((t, a) for t in range(45, 400, 15))]:
        for x in engine.evaluate(snap(T0 + t, gpu(memory_used_bytes=full, pods=pods))).to_send:
            if x.label_dict["severity"] == "warning":
                sent.append((t, x.state, x.label_dict["pod"]))
    assert (30, FIRING, "a") in sent
    assert [s for s in sent if s[0] > 30 and s[1:] == (RESOLVED, "a")] == []


# -- each window its own, each GPU its own ------------------------------------------------------------
LONG_WINDOW = [
    ("GpuUnderutilized", gpu(utilization_ratio=0.9), gpu(utilization_ratio=0.02)),
    ("GpuIdle", gpu(**{**IDLE_CARD, "utilization_ratio": 0.5}), gpu(**IDLE_CARD)),
    ("GpuLowSmActivity", gpu(utilization_ratio=0.95, activity=Activity(sm=0.9)),
     gpu(utilization_ratio=0.95, activity=Activity(sm=0.1))),
]  # fmt: skip


@pytest.mark.parametrize(("alertname", "busy", "holding"), LONG_WINDOW, ids=[w[0] for w in LONG_WINDOW])
def test_a_rule_averages_over_its_whole_window_when_it_is_the_longest(
    alertname: str, busy: GpuReading, holding: GpuReading
) -> None:
    """Two hours of history are kept for a two-hour window, though every other rule looks back 10 minutes."""
    short = {"window": "10m", "for": "0s"}
    rules = {name: dict(short) for name in ("GpuUnderutilized", "GpuIdle", "GpuLowSmActivity")}
    rules[alertname] = {"window": "2h", "for": "0s"}
    rules["GpuIdle"]["enabled"] = True  # type: ignore[assignment]
    engine = RuleEngine(fast_rules(**rules), "n", resend_interval=3600)
    trace = [busy] * 240 + [holding] * 240  # an hour busy, then an hour holding: the 2 h mean is in between
    fired = [a for i, g in enumerate(trace) for a in engine.evaluate(snap(T0 + i * STEP, g)).to_send
             if a.label_dict["alertname"] == alertname]  # fmt: skip
    assert fired == []


def test_each_gpus_windows_are_its_own() -> None:
    engine = RuleEngine(fast_rules(GpuUnderutilized={"for": "0s"}), "n", resend_interval=3600)
    idle, busy = gpu(utilization_ratio=0.02), gpu(index=1, uuid="GPU-1", utilization_ratio=0.9)
    sent = [a for t in range(0, 300, 15) for a in engine.evaluate(snap(T0 + t, idle, busy)).to_send]
    assert [(a.label_dict["alertname"], a.label_dict["gpu"], a.state) for a in sent] == [
        ("GpuUnderutilized", "0", FIRING)]  # fmt: skip
    assert [(a.label_dict["gpu"], a.state) for a in engine.active()] == [("0", FIRING)]
