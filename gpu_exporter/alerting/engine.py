"""The alert state machine: inactive -> pending -> firing -> resolved, evaluated on every snapshot.

Like Prometheus: an alert is pending while its condition holds for less than ``for``; it fires
after that; a pending alert whose condition stops holding is dropped. Unlike a bare threshold,
a firing alert resolves only when its separate clear condition holds.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ..snapshot import GpuReading, NodeSnapshot, pod_label_values
from .rules import RULES, Check, GpuHistory, is_enabled
from .settings import RulesSettings
from .window import SampleWindow

PENDING, FIRING, RESOLVED = "pending", "firing", "resolved"


@dataclass(frozen=True)
class Alert:
    labels: tuple[tuple[str, str], ...]  # sorted
    annotations: tuple[tuple[str, str], ...]
    state: str
    active_at: float  # when the condition started to hold
    fired_at: float | None = None
    resolved_at: float | None = None
    value: float | None = None

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(repr(self.labels).encode()).hexdigest()[:16]


@dataclass
class _Tracked:
    alert: Alert
    last_sent: float | None = None


def node_name(configured: str | None) -> str:
    return configured or os.environ.get("NODE_NAME") or socket.gethostname()


@dataclass
class Transitions:
    """What changed in one evaluation, for the notifiers."""

    to_send: list[Alert] = field(default_factory=list)


class RuleEngine:
    def __init__(
        self,
        rules: RulesSettings,
        node: str,
        *,
        resend_interval: float = 60.0,
        resolved_retention: float = 900.0,
        pod_labels: tuple[str, str, str] | None = None,
    ) -> None:
        self.rules = rules
        self.pod_labels = pod_labels
        self.node = node
        self.resend_interval = resend_interval
        self.resolved_retention = resolved_retention
        horizon = max(rules.GpuUnderutilized.window, rules.GpuIdle.window, rules.GpuLowSmActivity.window)
        self._horizon = horizon
        self._history: dict[int, GpuHistory] = {}
        self._alerts: dict[tuple[tuple[str, str], ...], _Tracked] = {}
        self._lock = threading.Lock()

    # -- evaluation -----------------------------------------------------------------------------
    def checks(self, snapshot: NodeSnapshot) -> list[tuple[GpuReading, Check]]:
        """Every enabled rule's answer for every GPU, updating the windowed history first."""
        now = snapshot.taken_at
        out: list[tuple[GpuReading, Check]] = []
        for g in snapshot.gpus:
            h = self._history.setdefault(g.index, GpuHistory(SampleWindow(self._horizon), SampleWindow(self._horizon)))
            h.observe(g, now)
            for rule in RULES:
                for c in rule(g, h, now, self.rules):
                    if is_enabled(self.rules, c.alertname):
                        out.append((g, c))
        return out

    def evaluate(self, snapshot: NodeSnapshot) -> Transitions:
        """Advance every alert's state to this snapshot; return what should be sent now."""
        now = snapshot.taken_at
        with self._lock:
            if not snapshot.nvml_up:
                # Nothing is known about the GPUs: keep every alert as it is (the exporter's own
                # health metrics say why), rather than resolve them all and fire them again.
                return Transitions(self._due(now))
            seen = set()
            for g, c in self.checks(snapshot):
                key = self._labels(g, c)
                seen.add(key)
                self._step(key, g, c, now)
            for key, tracked in list(self._alerts.items()):
                if key not in seen and tracked.alert.state != RESOLVED:
                    self._leave(key, tracked, now)  # the GPU or its data went away
            return Transitions(self._due(now))

    def _labels(self, g: GpuReading, c: Check) -> tuple[tuple[str, str], ...]:
        labels = {"alertname": c.alertname, "severity": c.severity, "gpu": str(g.index), "uuid": g.uuid,
                  "node": self.node, **dict(c.extra_labels)}  # fmt: skip
        if self.pod_labels and g.pods:
            # Who holds the GPU is part of the alert's identity: a new pod on an idle card is a new alert.
            for name, value in zip(self.pod_labels, pod_label_values(g.pods), strict=True):
                if value:
                    labels[name] = value
        return tuple(sorted(labels.items()))

    def _step(self, key: tuple[tuple[str, str], ...], g: GpuReading, c: Check, now: float) -> None:
        tracked = self._alerts.get(key)
        current = tracked.alert if tracked else None
        annotations = (("description", c.description), ("summary", c.summary)) if c.summary else None
        if current is None or current.state == RESOLVED:
            if c.fire:
                state = FIRING if c.for_seconds <= 0 else PENDING
                alert = Alert(key, annotations or (), state, active_at=now,
                              fired_at=now if state == FIRING else None, value=c.value)  # fmt: skip
                self._alerts[key] = _Tracked(alert)
            return
        assert tracked is not None
        if current.state == PENDING:
            if not c.fire:
                del self._alerts[key]  # never fired: nothing to tell anyone
                return
            alert = replace(current, annotations=annotations or current.annotations, value=c.value)
            if now - current.active_at >= c.for_seconds:
                alert = replace(alert, state=FIRING, fired_at=now)
            tracked.alert = alert
            return
        # firing
        if c.clear:
            tracked.alert = replace(current, state=RESOLVED, resolved_at=now)
            tracked.last_sent = None  # the resolution goes out now
        else:
            tracked.alert = replace(current, annotations=annotations or current.annotations, value=c.value)

    def _leave(self, key: tuple[tuple[str, str], ...], tracked: _Tracked, now: float) -> None:
        if tracked.alert.state == PENDING:
            del self._alerts[key]
        else:
            tracked.alert = replace(tracked.alert, state=RESOLVED, resolved_at=now)
            tracked.last_sent = None

    def _due(self, now: float) -> list[Alert]:
        """Firing alerts not sent for a resend interval, and fresh resolutions (kept for a while,
        re-sent like Prometheus does, then forgotten)."""
        due = []
        for key, tracked in list(self._alerts.items()):
            a = tracked.alert
            if a.state == PENDING:
                continue
            if a.state == RESOLVED and a.resolved_at is not None and now - a.resolved_at > self.resolved_retention:
                del self._alerts[key]
                continue
            if tracked.last_sent is None or now - tracked.last_sent >= self.resend_interval:
                tracked.last_sent = now
                due.append(a)
        return due

    # -- reading --------------------------------------------------------------------------------
    def active(self) -> list[Alert]:
        """Pending and firing alerts, for the alerts page and the ALERTS-like metric."""
        with self._lock:
            return sorted((t.alert for t in self._alerts.values() if t.alert.state in (PENDING, FIRING)),
                          key=lambda a: a.labels)  # fmt: skip


def holding_now(engine: RuleEngine, snapshot: NodeSnapshot) -> Iterable[tuple[GpuReading, Check]]:
    """Conditions that hold in this snapshot, ignoring ``for`` (for ``--once``)."""
    return [(g, c) for g, c in engine.checks(snapshot) if c.fire]
