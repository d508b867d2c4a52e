"""The alert state machine: inactive -> pending -> firing -> resolved, evaluated on every snapshot.

Like Prometheus: an alert is pending while its condition holds for less than ``for``; it fires
after that; a pending alert whose condition stops holding is dropped. Unlike a bare threshold,
a firing alert resolves only when its separate clear condition holds.

An alert is *identified* by its name, severity, node, GPU and its rule's own labels (``xid``); the
GPU by its UUID, or its index while its UUID was never read.  Not by index alone: after a driver
reload the driver may number the GPUs afresh, a missing GPU's index going to the GPU after it, and
the missing GPU's ``GpuLost`` must go on beside that GPU's alerts, not be resolved by them.
The GPU's index and its holders' labels (the pod labels, ``hpc_job``, ``container_name``: those
whose attribution is on; without pods, ``user`` for the Unix users holding it as themselves) are
carried along with their latest values: a change of the pod, job, container or user holding a GPU,
of its index, or a UUID read late, neither restarts ``for`` nor resolves the alert.  What is sent never holds an
empty label value (Prometheus and Alertmanager drop those), so the label set, and the fingerprint
computed from it, are the same here, in Alertmanager and in Prometheus.  When
the labels of a firing alert change, receivers get the old label set resolved and the new one
firing from the same start, because to them a label set *is* the alert.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ..snapshot import GpuReading, HolderLabels, NodeSnapshot
from .rules import RULES, Check, GpuHistory, is_enabled
from .settings import RulesSettings
from .window import SampleWindow

PENDING, FIRING, RESOLVED = "pending", "firing", "resolved"

Labels = tuple[tuple[str, str], ...]  # sorted by name, no empty values

# Prometheus's label-set fingerprint (prometheus/common model.LabelSet.Fingerprint): FNV-1a 64 over
# each name and value, each followed by the byte 0xff, in name order.  Alertmanager shows it as
# ``fingerprint`` in webhooks, so the direct webhook's fingerprints equal Alertmanager's.
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF
_MASK = (1 << 64) - 1


def fingerprint(labels: Labels) -> str:
    h = _FNV_OFFSET
    for name, value in sorted(labels):
        for part in (name, value):
            for byte in part.encode():
                h = ((h ^ byte) * _FNV_PRIME) & _MASK
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & _MASK
    return f"{h:016x}"


def sendable(labels: dict[str, str]) -> Labels:
    """Labels as they are sent: sorted, without empty values."""
    return tuple(sorted((k, v) for k, v in labels.items() if v))


@dataclass(frozen=True)
class Alert:
    labels: Labels
    annotations: tuple[tuple[str, str], ...]
    state: str
    active_at: float  # when the condition started to hold (the wall clock then: shown, never subtracted)
    fired_at: float | None = None
    resolved_at: float | None = None
    value: float | None = None

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)

    @property
    def starts_at(self) -> float:
        """``startsAt`` as Prometheus sends it: when the alert fired."""
        return self.fired_at if self.fired_at is not None else self.active_at


@dataclass
class _Tracked:
    """An alert with its times on the steady clock, which decide ``for``, re-sends and retention.

    The alert's own times are wall-clock readings taken at each transition, for what people and
    receivers see; a wall-clock step changes neither kind after the fact."""

    alert: Alert
    active_since: float  # steady
    last_sent: float | None = None  # steady
    resolved_since: float | None = None  # steady


def node_name(configured: str | None) -> str:
    return configured or os.environ.get("NODE_NAME") or socket.gethostname()


@dataclass
class Transitions:
    """What changed in one evaluation, for the notifiers."""

    to_send: list[Alert] = field(default_factory=list)


Identity = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Now:
    """One evaluation's time: ``steady`` for every interval, ``wall`` for the times alerts show."""

    steady: float
    wall: float


# The rules that average over a window of samples the engine keeps.
WINDOWED = ("GpuUnderutilized", "GpuIdle", "GpuLowSmActivity")


class RuleEngine:
    def __init__(
        self,
        rules: RulesSettings,
        node: str,
        *,
        resend_interval: float = 60.0,
        resolved_retention: float = 900.0,
        pod_labels: tuple[str, str, str] | None = None,
        poll_interval: float | None = None,
        jobs: bool = False,
        containers: bool = False,
    ) -> None:
        self.rules = rules
        # The holder labels of every alert; without pods, the Unix users holding a GPU are named too.
        self.holders = HolderLabels(pod_labels, jobs, containers, users=pod_labels is None)
        self.node = node
        self.resend_interval = resend_interval
        self.resolved_retention = resolved_retention
        horizon = max(getattr(rules, name).window for name in WINDOWED)
        self._horizon = horizon
        # The samples a GPU's windows will hold, set aside when the GPU is first seen: memory stays
        # flat while the windows fill (for an hour, by default) instead of growing every poll.
        self._capacity = math.ceil(horizon / poll_interval) + 2 if poll_interval else 64
        self._history: dict[tuple[str, str], GpuHistory] = {}  # by _device
        self._active: dict[Identity, _Tracked] = {}  # pending and firing, by identity
        self._resolved: dict[Labels, _Tracked] = {}  # resolved, re-sent for the retention, by label set
        self._lock = threading.Lock()

    def apply(self, rules: RulesSettings, *, resend_interval: float, resolved_retention: float) -> list[str]:
        """Re-read rules and intervals, in force from the next evaluation.  A window longer than the
        engine keeps samples for (the longest it started with) keeps its running length, since it
        would silently average over less than it says; the settings so pinned are returned, named as
        in the config file."""
        pinned = []
        for name in WINDOWED:
            rule = getattr(rules, name)
            if rule.window > self._horizon:
                kept = rule.model_copy(update={"window": getattr(self.rules, name).window})
                rules = rules.model_copy(update={name: kept})
                pinned.append(f"rules.{name}.window")
        with self._lock:
            self.rules = rules
            self.resend_interval = resend_interval
            self.resolved_retention = resolved_retention
        return pinned

    # -- evaluation -----------------------------------------------------------------------------
    def checks(self, snapshot: NodeSnapshot) -> list[tuple[GpuReading, Check]]:
        """Every enabled rule's answer for every GPU, updating the windowed history first."""
        now = snapshot.steady_at  # windows span steady time: a wall-clock step neither fills nor empties them
        out: list[tuple[GpuReading, Check]] = []
        for g in snapshot.gpus:
            h = self._history.get(_device(g))
            if h is None:
                utilization = SampleWindow(self._horizon, self._capacity)
                h = self._history[_device(g)] = GpuHistory(utilization, SampleWindow(self._horizon, self._capacity))
            h.observe(g, now)
            for rule in RULES:
                for c in rule(g, h, now, self.rules):
                    if is_enabled(self.rules, c.alertname):
                        out.append((g, c))
        return out

    def evaluate(self, snapshot: NodeSnapshot) -> Transitions:
        """Advance every alert's state to this snapshot; return what should be sent now."""
        now = _Now(snapshot.steady_at, snapshot.taken_at)
        with self._lock:
            if not snapshot.nvml_up:
                # Nothing is known about the GPUs: keep every alert as it is (the exporter's own
                # health metrics say why), rather than resolve them all and fire them again.
                return Transitions(self._due(now.steady))
            seen = set()
            for g, c in self.checks(snapshot):
                identity = self._identity(g, c)
                if identity not in self._active and g.uuid:
                    # Its UUID read late: the alert it had by its index goes on, relabelled.
                    by_index = _identity(("gpu", str(g.index)), c)
                    if by_index in self._active:
                        self._active[identity] = self._active.pop(by_index)
                seen.add(identity)
                self._step(identity, self._labels(g, c), g, c, now)
            for identity, tracked in list(self._active.items()):
                if identity not in seen:  # the GPU or its data went away
                    del self._active[identity]
                    if tracked.alert.state == FIRING:
                        self._resolve(tracked, now)
            return Transitions(self._due(now.steady))

    def _identity(self, g: GpuReading, c: Check) -> Identity:
        return _identity(_device(g), c)

    def _labels(self, g: GpuReading, c: Check) -> Labels:
        labels = {"alertname": c.alertname, "severity": c.severity, "gpu": str(g.index), "uuid": g.uuid,
                  "node": self.node, **dict(c.extra_labels)}  # fmt: skip
        for name, value in zip(self.holders.names, self.holders.of(g), strict=True):
            labels[name] = value  # an empty one (nobody of that kind holds it) is not sent
        return sendable(labels)

    def _step(self, identity: Identity, labels: Labels, g: GpuReading, c: Check, now: _Now) -> None:
        tracked = self._active.get(identity)
        annotations = (("description", c.description), ("summary", c.summary)) if c.summary else None
        if tracked is None:
            if c.fire:
                state = FIRING if c.for_seconds <= 0 else PENDING
                alert = Alert(labels, annotations or (), state, active_at=now.wall,
                              fired_at=now.wall if state == FIRING else None, value=c.value)  # fmt: skip
                # A new alert replaces a resolved one of the same labels, as in Prometheus: the
                # resolution was sent already, and re-sending it now would end the new alert.
                self._resolved.pop(labels, None)
                self._active[identity] = _Tracked(alert, active_since=now.steady)
            return
        current = tracked.alert
        if current.state == PENDING:
            if not c.fire:
                del self._active[identity]  # never fired: nothing to tell anyone
                return
            alert = replace(current, labels=labels, annotations=annotations or current.annotations, value=c.value)
            if now.steady - tracked.active_since >= c.for_seconds:
                alert = replace(alert, state=FIRING, fired_at=now.wall)
                self._resolved.pop(labels, None)
            tracked.alert = alert
            return
        # firing
        if c.clear:
            del self._active[identity]
            self._resolve(tracked, now)
            return
        if labels != current.labels:
            # Who holds the GPU changed (or its UUID became known): the alert goes on, but to a
            # receiver the old label set ends here and the new one fires from the same start.
            self._resolve(tracked, now)
            self._resolved.pop(labels, None)
            tracked.last_sent = None
        tracked.alert = replace(current, labels=labels, annotations=annotations or current.annotations,
                                value=c.value)  # fmt: skip

    def _resolve(self, tracked: _Tracked, now: _Now) -> None:
        alert = replace(tracked.alert, state=RESOLVED, resolved_at=now.wall)
        self._resolved[alert.labels] = _Tracked(alert, active_since=tracked.active_since, resolved_since=now.steady)

    def _due(self, now: float) -> list[Alert]:
        """Fresh resolutions, re-sent every resend interval for the retention as Prometheus does,
        then firing alerts not sent for a resend interval.  Resolutions go first, so a label set
        that ended is resolved before the one that replaces it fires."""
        due = []
        for labels, tracked in list(self._resolved.items()):
            resolved_at = tracked.resolved_since
            if resolved_at is not None and now - resolved_at > self.resolved_retention:
                del self._resolved[labels]
            elif tracked.last_sent is None or now - tracked.last_sent >= self.resend_interval:
                tracked.last_sent = now
                due.append(tracked.alert)
        for tracked in self._active.values():
            if tracked.alert.state != FIRING:
                continue
            if tracked.last_sent is None or now - tracked.last_sent >= self.resend_interval:
                tracked.last_sent = now
                due.append(tracked.alert)
        return due

    # -- reading --------------------------------------------------------------------------------
    def active(self) -> list[Alert]:
        """Pending and firing alerts, for the alerts page and the ALERTS-like metric."""
        with self._lock:
            return sorted((t.alert for t in self._active.values()), key=lambda a: a.labels)


def _device(g: GpuReading) -> tuple[str, str]:
    """Which GPU a reading is of, for alerts and windows: its UUID, else (never read) its index."""
    return ("uuid", g.uuid) if g.uuid else ("gpu", str(g.index))


def _identity(device: tuple[str, str], c: Check) -> Identity:
    return (("alertname", c.alertname), ("severity", c.severity), device, *c.extra_labels)


def holding_now(engine: RuleEngine, snapshot: NodeSnapshot) -> Iterable[tuple[GpuReading, Check]]:
    """Conditions that hold in this snapshot, ignoring ``for`` (for ``--once``)."""
    return [(g, c) for g, c in engine.checks(snapshot) if c.fire]
