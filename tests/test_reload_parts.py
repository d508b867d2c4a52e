"""A reload (SIGHUP) hands each part its own new settings through one method of that part: the
receivers (``Notifier.apply``), the rules (``RuleEngine.apply``) and the books' idea of idle
(``Accountant.retune``).  What each promises, without a daemon; tests/test_reload.py drives the
whole daemon through real files and signals."""

from __future__ import annotations

from typing import Any

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.alerting.delivery import AlertmanagerReceiver, Notifier, ReceiverHooks, WebhookReceiver
from gpu_exporter.alerting.engine import RuleEngine
from gpu_exporter.alerting.settings import AlertingSettings
from gpu_exporter.settings.config import load_settings

# Nothing is sent in these tests (no alert is submitted): the URLs are never dialled.  Each its own
# host, so that each receiver has its own name (two of one host are numbered, by position).
AM1, AM2, HOOK = "http://127.0.0.1:9/am1", "http://127.0.0.2:9/am2", "http://127.0.0.3:9/hook"


def alerting(**kw: Any) -> AlertingSettings:
    return load_settings({"alerting": kw}).alerting


class Series:
    """The receivers' series, as SelfMetrics keeps them: which exist now."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.forgotten: list[str] = []

    def hooks(self) -> ReceiverHooks:
        return ReceiverHooks(lambda receiver, outcome: None, lambda: "http://node:9445/alerts",
                             watch=self.names.add, forget=self.forget)  # fmt: skip

    def forget(self, name: str) -> None:
        self.names.discard(name)
        self.forgotten.append(name)


def test_a_reload_keeps_the_receivers_it_leaves_alone_and_replaces_the_rest() -> None:
    series = Series()
    n = Notifier.for_settings(alerting(alertmanagers=[{"url": AM1}, {"url": AM2}], webhooks=[{"url": HOOK}]),
                              series.hooks(), poll_interval=30.0)  # fmt: skip
    n.start()
    try:
        am1, am2, hook = n.receivers
        assert isinstance(am1, AlertmanagerReceiver) and isinstance(hook, WebhookReceiver)
        assert am1.valid_for == 4 * 60.0  # four resend intervals (60 s), the poll interval (30 s) being shorter
        assert len(series.names) == 3
        # am2 goes; am1 and the webhook stay, queue and thread and all; the resend interval grows.
        now = n.apply(alerting(alertmanagers=[{"url": AM1}], webhooks=[{"url": HOOK}], resend_interval="5m"))
        assert now == n.receivers and now[0] is am1 and now[1] is hook and am1.alive and hook.alive
        assert am1.valid_for == 4 * 300.0  # read at the next send: the kept receiver follows the new interval
        assert not am2.alive and series.forgotten == [am2.name] and am2.name not in series.names
        # A new queue size cannot be given to a running queue: the Alertmanager receiver is new.
        (fresh, same_hook) = n.apply(alerting(alertmanagers=[{"url": AM1}], webhooks=[{"url": HOOK}], queue_size=5))
        assert fresh is not am1 and fresh.alive and not am1.alive and same_hook is hook
        assert am1.name in series.names  # the same name goes on counting: its series stay
        # Another Alertmanager in its place: a receiver of its own, never the old one sent elsewhere.
        (other,) = n.apply(alerting(alertmanagers=[{"url": AM2}], queue_size=5))
        assert other is not fresh and isinstance(other, AlertmanagerReceiver) and other.settings.url == AM2
        assert other.alive and not fresh.alive
    finally:
        n.stop()


def test_valid_for_follows_a_poll_interval_longer_than_the_resend_interval() -> None:
    n = Notifier.for_settings(alerting(alertmanagers=[{"url": AM1}]), Series().hooks(), poll_interval=120.0)
    (am,) = n.receivers
    assert isinstance(am, AlertmanagerReceiver) and am.valid_for == 4 * 120.0


def test_the_rule_windows_past_what_the_engine_keeps_are_pinned_and_named() -> None:
    start = load_settings({"rules": {"GpuLowSmActivity": {"window": "10m"}}}).rules
    engine = RuleEngine(start, "n", poll_interval=15.0)  # keeps samples for the longest window: 1 h
    longer = load_settings({"rules": {"GpuUnderutilized": {"window": "2h", "threshold": 0.2},
                                      "GpuLowSmActivity": {"window": "90m"},
                                      "GpuIdle": {"window": "30m"}}}).rules  # fmt: skip
    pinned = engine.apply(longer, resend_interval=120.0, resolved_retention=60.0)
    assert sorted(pinned) == ["rules.GpuLowSmActivity.window", "rules.GpuUnderutilized.window"]
    assert engine.rules.GpuUnderutilized.window == start.GpuUnderutilized.window  # the running length
    assert engine.rules.GpuLowSmActivity.window == 600.0
    assert engine.rules.GpuIdle.window == 1800.0  # within what is kept: taken as given
    assert engine.rules.GpuUnderutilized.threshold == 0.2  # the rest of a pinned rule is the new one
    assert (engine.resend_interval, engine.resolved_retention) == (120.0, 60.0)


def test_a_window_exactly_as_long_as_what_the_engine_keeps_is_taken_as_given() -> None:
    start = load_settings({}).rules
    engine = RuleEngine(start, "n", poll_interval=15.0)
    horizon = max(start.GpuUnderutilized.window, start.GpuIdle.window, start.GpuLowSmActivity.window)
    assert start.GpuLowSmActivity.window < horizon
    at_horizon = load_settings({"rules": {"GpuLowSmActivity": {"window": f"{horizon:g}s"}}}).rules
    assert engine.apply(at_horizon, resend_interval=60.0, resolved_retention=900.0) == []
    assert engine.rules.GpuLowSmActivity.window == horizon


def test_the_books_take_a_new_idle_threshold_and_signal() -> None:
    books = Accountant(threshold=0.1, signal="auto")
    books.retune(0.3, "sm_active")
    assert (books.threshold, books.signal) == (0.3, "sm_active")
