"""A wall-clock step either way changes no alert and no counter, and stops no poll (issue 28, point 2).

Snapshots carry two times: ``taken_at`` (the wall clock, shown) and ``monotonic_at`` (for every
interval).  The traces below step the wall clock by hours while the monotonic clock moves on by
one poll interval at a time, as it does on a machine whose clock NTP or an operator sets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import apscheduler.schedulers.base as aps_base
import pytest
import structlog

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.alerting.delivery import WebhookReceiver
from gpu_exporter.alerting.engine import FIRING, PENDING, Alert, RuleEngine
from gpu_exporter.alerting.settings import WebhookSettings
from gpu_exporter.settings.config import load_settings
from gpu_exporter.snapshot import GpuReading, GpuStatic, NodeSnapshot, ProcessReading
from gpu_exporter.sources.schedule import PollSchedule
from tests.alerting_helpers import webhook_receiver
from tests.timing import wait_until

GIB = 1024**3
T0 = 1_800_000_000.0
STEP = 5.0
STATIC = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0")


def gpu(**kw: Any) -> GpuReading:
    """Memory 99% full and nearly idle: GpuMemoryHigh (for 10m) and GpuUnderutilized (for 1h) material."""
    base: dict[str, Any] = dict(
        index=0, uuid="GPU-0", up=True, static=STATIC, utilization_ratio=0.01, memory_total_bytes=80 * GIB,
        memory_used_bytes=int(79.5 * GIB), processes=(ProcessReading(100, "python3", 79 * GIB, user="alice"),),
        temperature_celsius=MappingProxyType({"gpu": 60.0}),
    )  # fmt: skip
    base.update(kw)
    return GpuReading(**base)


def snap(wall: float, steady: float, *gpus: GpuReading) -> NodeSnapshot:
    return NodeSnapshot(taken_at=wall, monotonic_at=steady, duration_seconds=0.01, nvml_up=True, gpus=gpus)


def walls(n: int, step_at: int, by: float) -> list[tuple[float, float]]:
    """(wall, steady) for ``n`` polls STEP apart; the wall clock jumps ``by`` seconds before poll ``step_at``."""
    return [(T0 + i * STEP + (by if i >= step_at else 0.0), 1000.0 + i * STEP) for i in range(n)]


@pytest.mark.parametrize("by", [7200.0, -3600.0])
def test_a_step_of_the_wall_clock_fires_no_alert_early_and_resolves_none(by: float) -> None:
    """Forward 2 h: GpuMemoryHigh (for 10m) and GpuUnderutilized (for 1h) fired after 16 s of real time."""
    engine = RuleEngine(load_settings().rules, "node-a", resend_interval=3600, poll_interval=STEP)
    states: list[dict[str, str]] = []
    for wall, steady in walls(8, step_at=3, by=by):  # 40 s of real time
        engine.evaluate(snap(wall, steady, gpu()))
        states.append({a.label_dict["alertname"]: a.state for a in engine.active()})
    assert FIRING not in {state for states_now in states for state in states_now.values()}, states
    assert states[-1]["GpuMemoryHigh"] == PENDING
    memory_high = next(a for a in engine.active() if a.label_dict["alertname"] == "GpuMemoryHigh")
    assert memory_high.active_at == T0  # shown as the wall clock read when it began


def test_for_counts_steady_time_across_a_backward_step() -> None:
    """Back 1 h: the alert still fires once its 10 minutes of steady time have passed."""
    engine = RuleEngine(load_settings().rules, "node-a", resend_interval=3600, poll_interval=STEP)
    sent = []
    for wall, steady in walls(int(600 / STEP) + 2, step_at=10, by=-3600.0):
        sent += engine.evaluate(snap(wall, steady, gpu())).to_send
    firing = [a for a in sent if a.label_dict["alertname"] == "GpuMemoryHigh" and a.state == FIRING]
    assert sorted(a.label_dict["severity"] for a in firing) == ["critical", "warning"]  # each fired once
    for_s = load_settings().rules.GpuMemoryHigh.for_
    for a in firing:
        assert a.fired_at == T0 + for_s - 3600  # after ``for`` of steady time, shown on the stepped clock


@pytest.mark.parametrize("by", [7200.0, -3600.0])
def test_accounting_counts_steady_time_and_no_counter_goes_back(by: float) -> None:
    """Forward 2 h dropped every holder (retention 1 h) and took a counter from 6.0 to 2.0; back 1 h
    stopped the books until the wall clock passed its last reading."""
    books = Accountant(threshold=0.1, holder_retention=3600.0, max_step=60.0)
    seen: list[float] = []
    for wall, steady in walls(10, step_at=4, by=by):
        books.observe(snap(wall, steady, gpu()))
        (account,) = books.view().gpus
        seen.append(sum(v for holder, _, v in account.seconds if holder.get("user") == "alice"))
    assert seen == [pytest.approx(i * STEP) for i in range(10)]  # every step counted once, never back


@pytest.mark.parametrize("step", ["before the hand-over", "while the group waits"])
def test_a_webhook_group_is_not_held_back_by_a_backward_step(step: str) -> None:
    """The route plans its flushes on the steady clock: set the wall clock back an hour, before the
    alert is handed over or while its group waits out group_wait, and the notification still goes
    out after group_wait (planned on the wall clock, it would wait an hour more)."""
    offset = {"wall": 0.0}
    settings = WebhookSettings(url="http://127.0.0.1:1/hook", group_wait=0.1, group_interval=5.0)
    with webhook_receiver() as rec:
        settings = settings.model_copy(update={"url": rec.url})
        receiver = WebhookReceiver(settings, lambda r, o: None, generator_url=lambda: "http://x/alerts",
                                   clock=lambda: time.time() + offset["wall"], steady=time.monotonic)  # fmt: skip
        receiver.start()
        try:
            now = time.time()
            alert = Alert((("alertname", "GpuLost"), ("gpu", "0"), ("severity", "critical")), (), FIRING,
                          active_at=now, fired_at=now)  # fmt: skip
            if step == "before the hand-over":
                offset["wall"] = -3600.0
            receiver.submit([alert], now=time.monotonic())
            offset["wall"] = -3600.0
            assert wait_until(lambda: rec.alerts()), "nothing delivered: the flush waited for the wall clock"
        finally:
            receiver.stop()


def test_an_alert_that_fired_long_ago_is_sent_without_waiting_group_wait() -> None:
    """As Alertmanager does: a new group whose alert started more than group_wait ago (on the wall
    clock, where alerts' times are) goes out at once.  The steady clock stands still here, so only
    that comparison can send it; against the steady clock's small numbers it never would."""
    wall, steady = T0, 100.0
    settings = WebhookSettings(url="http://127.0.0.1:1/hook", group_wait=30.0, group_interval=60.0)
    with webhook_receiver() as rec:
        settings = settings.model_copy(update={"url": rec.url})
        receiver = WebhookReceiver(settings, lambda r, o: None, generator_url=lambda: "http://x/alerts",
                                   clock=lambda: wall, steady=lambda: steady)  # fmt: skip
        receiver.start()
        try:
            alert = Alert((("alertname", "GpuLost"), ("gpu", "0"), ("severity", "critical")), (), FIRING,
                          active_at=T0 - 660, fired_at=T0 - 600)  # fmt: skip
            receiver.submit([alert], now=steady)
            assert wait_until(lambda: rec.alerts()), "held back for group_wait although it fired 10 minutes ago"
            (sent,) = rec.alerts()
            assert sent["labels"]["alertname"] == "GpuLost"
        finally:
            receiver.stop()


class _SteppedDatetime(datetime):
    """apscheduler's ``datetime``, with the wall clock set ``offset`` seconds away."""

    offset = 0.0

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) + timedelta(seconds=cls.offset)


@pytest.fixture
def stepped_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_SteppedDatetime]]:
    """apscheduler's view of the wall clock, which a test can step (the machine's own clock stays put)."""
    _SteppedDatetime.offset = 0.0
    monkeypatch.setattr(aps_base, "datetime", _SteppedDatetime)
    yield _SteppedDatetime
    _SteppedDatetime.offset = 0.0


@pytest.mark.parametrize("by", [-3600.0, 7200.0])
def test_polling_goes_on_when_the_wall_clock_steps(stepped_clock: type[_SteppedDatetime], by: float) -> None:
    """Back 1 h froze polling (apscheduler slept on the wait it had computed from the wall clock),
    and setting the clock forward again did not wake it.  The watchdog starts the overdue poll and
    logs the step once."""
    polls: list[float] = []
    schedule = PollSchedule(lambda: polls.append(time.monotonic()), 0.05, stalled_after=30.0,
                            wall=lambda: time.time() + stepped_clock.offset)  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        schedule.start()
        try:
            assert wait_until(lambda: len(polls) >= 2)
            stepped_clock.offset = by
            stepped_at = len(polls)
            assert wait_until(lambda: len(polls) >= stepped_at + 5), "polling stopped after the step"
        finally:
            schedule.stop()
    steps = [e for e in logs if e["event"] == "wall_clock_stepped"]
    assert len(steps) == 1 and steps[0]["seconds"] == pytest.approx(by, abs=1.0)
    assert schedule.stalled() is None


def test_healthz_fails_once_polling_has_stalled() -> None:
    """A poll stuck for longer than its bound (here a blocked logging pipe would do it) makes the
    daemon unhealthy, so Kubernetes restarts it; during the freeze /healthz said 200."""
    release = threading.Event()
    steady = {"now": 0.0}

    def stuck() -> None:
        release.wait(60)

    schedule = PollSchedule(stuck, 1.0, stalled_after=20.0, steady=lambda: steady["now"])
    schedule.start()
    try:
        assert wait_until(lambda: schedule._running_since is not None)
        steady["now"] = 15.0
        assert schedule.stalled() is None  # within its bound
        steady["now"] = 25.0
        assert schedule.stalled() == pytest.approx(25.0)
    finally:
        release.set()
        schedule.stop()
