"""Alertmanager's routing, for a webhook the daemon feeds directly (no Alertmanager in between).

One ``Route`` per webhook does what one Alertmanager route with a webhook receiver does (as of
Alertmanager 0.25, dispatch/dispatch.go and notify/notify.go):

* alerts are grouped by the values of ``group_by`` (default ``[alertname, node]``); a label an
  alert lacks is left out of its group's labels, and ``...`` groups by every label;
* a new group waits ``group_wait`` before its first notification (at once if its alert started
  longer ago than that), then is looked at every ``group_interval``;
* a notification carries every alert of the group, firing and resolved, and is sent only when
  something changed since the last one delivered (an alert started firing, or, with
  ``send_resolved``, one resolved), or when ``repeat_interval`` has passed since it;
* a resolved alert leaves its group once a notification carrying it has been delivered, so a
  resolution is sent once, and again at every tick until a send succeeds;
* the payload is Alertmanager's webhook body, version 4, with its ``groupKey``
  (``{}:{alertname="GpuLost", node="n1"}``), ``groupLabels``, ``commonLabels``, the receiver's
  name, alerts ordered and fingerprinted as Alertmanager orders and fingerprints them, and the
  ``endsAt`` of a firing alert left at the zero time as Alertmanager leaves it;
* each group is notified on its own schedule, one notification of a group at a time (Alertmanager's
  aggregation groups each flush in their own goroutine), so a group's resolution never overtakes
  its firing notification.  Unlike Alertmanager, the caller may bound how many are sent at once
  (``due``'s ``free``): then groups with a firing critical alert go first, and may be given a place
  that the others may not take (``reserved``).

It is pure state: the caller gives the time, so tests drive it with a made-up clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .engine import FIRING, RESOLVED, Alert, Labels
from .settings import WebhookSettings

ZERO_TIME = "0001-01-01T00:00:00Z"  # what Alertmanager shows as the endsAt of a firing alert
# Notification-log entries of groups that are gone are kept this long (Alertmanager's
# --data.retention default), so a group that comes back is not notified again without a change.
LOG_RETENTION_S = 120 * 3600.0


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_GO_ESCAPES = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v",
               "\\": "\\\\", '"': '\\"'}  # fmt: skip


def go_quote(s: str) -> str:
    """A string quoted as Go's strconv.Quote quotes it (for label values in a group key)."""
    out = []
    for ch in s:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif not ch.isprintable():
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def label_set_string(labels: dict[str, str]) -> str:
    """Prometheus's LabelSet.String(): ``{a="1", b="2"}``, sorted by name."""
    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in sorted(labels.items())) + "}"


def group_key(group_labels: dict[str, str]) -> str:
    """The group key of Alertmanager's root route: its matchers (none: ``{}``), then the group's labels."""
    return "{}:" + label_set_string(group_labels)


def _before(a: Labels, b: Labels) -> bool:
    """Prometheus's LabelSet.Before: fewer labels first, then by the first differing name or value."""
    if len(a) != len(b):
        return len(a) < len(b)
    da, db = dict(a), dict(b)
    for name in sorted(set(da) | set(db)):
        if name not in da:
            return True
        if name not in db:
            return False
        if da[name] != db[name]:
            return da[name] < db[name]
    return False


class _OrderKey:
    """Alertmanager's order of the alerts in a notification (types.AlertSlice): by ``job``, then
    ``instance`` (an alert with the label before one without), then by label set."""

    def __init__(self, alert: Alert) -> None:
        self.labels = alert.labels
        self.d = alert.label_dict

    def __lt__(self, other: _OrderKey) -> bool:
        for key in ("job", "instance"):
            mine, theirs = self.d.get(key), other.d.get(key)
            if mine is None and theirs is None:
                continue
            if mine is None:
                return False
            if theirs is None:
                return True
            if mine != theirs:
                return mine < theirs
        return _before(self.labels, other.labels)


@dataclass(frozen=True)
class LogEntry:
    """What the last delivered notification of a group held (Alertmanager's notification log)."""

    firing: frozenset[str]  # fingerprints
    resolved: frozenset[str]
    at: float


@dataclass
class Group:
    key: str
    labels: dict[str, str]
    next_flush: float
    alerts: dict[Labels, Alert] = field(default_factory=dict)
    has_flushed: bool = False
    retry_at: float | None = None  # a failed send is tried again then, before the next tick
    changed: bool = True  # holds something not yet delivered
    version: int = 0  # counts changes, so a delivery does not clear one that came in meanwhile
    sending: bool = False  # a notification of it is in flight: the next waits for its outcome
    backoff: float = 0.0  # the wait before the last retry (the sender doubles it); 0 once delivered

    @property
    def critical(self) -> bool:
        """Holds a firing alert of severity critical: its notification goes before the others'."""
        return any(a.state == FIRING and ("severity", "critical") in a.labels for a in self.alerts.values())

    @property
    def due_at(self) -> float:
        return self.retry_at if self.retry_at is not None and self.retry_at < self.next_flush else self.next_flush


@dataclass(frozen=True)
class Notification:
    group: Group
    alerts: tuple[Alert, ...]  # the group's alerts when it was built, in Alertmanager's order
    firing: frozenset[str]
    resolved: frozenset[str]
    version: int


class Route:
    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings
        self.groups: dict[str, Group] = {}
        self.log: dict[str, LogEntry] = {}

    # -- alerts in --------------------------------------------------------------------------------
    def group_labels(self, alert: Alert) -> dict[str, str]:
        by = self.settings.group_by
        if by == ["..."]:
            return alert.label_dict
        return {k: v for k, v in alert.labels if k in by}

    def insert(self, alerts: list[Alert], now: float, wall: float | None = None) -> None:
        """Take the latest state of each alert, as Alertmanager's dispatcher does.

        ``now`` is the steady clock every flush is planned on; ``wall`` the wall clock that alerts'
        own times come from (the same clock where a test makes time up)."""
        s = self.settings
        wall = now if wall is None else wall
        for a in alerts:
            labels = self.group_labels(a)
            key = group_key(labels)
            g = self.groups.get(key)
            if g is None:
                g = self.groups[key] = Group(key, labels, next_flush=now + s.group_wait)
            old = g.alerts.get(a.labels)
            if old is None or old.state != a.state or old.starts_at != a.starts_at:
                g.changed = True
                g.version += 1
            g.alerts[a.labels] = a
            # The alert has waited long enough already (it started earlier): flush now.
            if not g.has_flushed and a.starts_at + s.group_wait < wall:
                g.next_flush = min(g.next_flush, now)

    # -- timing -----------------------------------------------------------------------------------
    def next_due(self, free: int | None = None, reserved: int = 0) -> float | None:
        """When the next group that could be notified now is due: none in flight, and, with ``free``
        places for requests, none that ``due`` would have to leave waiting for a place."""
        times = [g.due_at for g in self.groups.values() if not g.sending and _admits(g, free, reserved)]
        return min(times) if times else None

    def waiting(self) -> int:
        """Alerts in groups with something not yet delivered."""
        return sum(len(g.alerts) for g in self.groups.values() if g.changed)

    # -- notifications out -----------------------------------------------------------------------
    def due(self, now: float, free: int | None = None, reserved: int = 0) -> list[Notification]:
        """The notifications to send now, one per group whose time has come and that needs one.

        A group with a notification in flight waits for its outcome (``delivered``, ``failed`` or
        ``rejected``).  With ``free`` places for requests, at most that many are returned, groups
        with a firing critical alert first, then the longest due; ``reserved`` of the places are
        for the critical ones alone.  A group left without a place stays due, as it was, and is
        looked at again when a place frees.

        A group's tick moves on by ``group_interval`` whether or not it sends; a group that needs
        nothing drops its delivered resolutions, as Alertmanager does after a successful flush.
        """
        out = []
        ready = [g for g in self.groups.values() if not g.sending and now >= g.due_at]
        ready.sort(key=lambda g: (not g.critical, g.due_at))  # stable: equals keep their order
        for g in ready:
            firing = frozenset(a.fingerprint for a in g.alerts.values() if a.state == FIRING)
            resolved = frozenset(a.fingerprint for a in g.alerts.values() if a.state == RESOLVED)
            needs = self._needs_update(self.log.get(g.key), firing, resolved, now)
            if needs and not _admits(g, free, reserved):
                continue
            if now >= g.next_flush:
                g.has_flushed = True
                g.next_flush = now + self.settings.group_interval
            g.retry_at = None
            if needs:
                alerts = tuple(sorted(g.alerts.values(), key=_OrderKey))
                out.append(Notification(g, alerts, firing, resolved, g.version))
                g.sending = True
                if free is not None:
                    free -= 1
            else:
                self._forget_resolved(g, g.alerts.values(), g.version)
        self._gc(now)
        return out

    def _needs_update(self, entry: LogEntry | None, firing: frozenset[str], resolved: frozenset[str],
                      now: float) -> bool:  # fmt: skip
        """Alertmanager's DedupStage.needsUpdate."""
        if entry is None:
            return bool(firing)  # nothing was sent yet: only firing alerts are news
        if not firing <= entry.firing:
            return True
        if not firing:
            # Everything resolved: say so if the last notification had firing alerts (even
            # without send_resolved, so that the log forgets them).
            return bool(entry.firing)
        if self.settings.send_resolved and not resolved <= entry.resolved:
            return True
        return entry.at < now - self.settings.repeat_interval

    def payload(self, n: Notification, external_url: str, generator_url: str) -> dict[str, Any] | None:
        """Alertmanager's webhook body for ``n``; None if nothing is left to send (only
        resolutions, and ``send_resolved`` is off)."""
        alerts = [a for a in n.alerts if a.state == FIRING or self.settings.send_resolved]
        if not alerts:
            return None
        items = []
        for a in alerts:
            items.append({
                "status": FIRING if a.state == FIRING else RESOLVED,
                "labels": a.label_dict,
                "annotations": dict(a.annotations),
                "startsAt": rfc3339(a.starts_at),
                "endsAt": ZERO_TIME if a.state == FIRING else rfc3339(a.resolved_at or a.starts_at),
                "generatorURL": generator_url,
                "fingerprint": a.fingerprint,
            })  # fmt: skip
        return {
            "receiver": self.settings.receiver,
            "status": FIRING if any(a.state == FIRING for a in alerts) else RESOLVED,
            "alerts": items,
            "groupLabels": dict(n.group.labels),
            "commonLabels": _common([a.label_dict for a in alerts]),
            "commonAnnotations": _common([dict(a.annotations) for a in alerts]),
            "externalURL": external_url,
            "version": "4",
            "groupKey": n.group.key,
            "truncatedAlerts": 0,
        }

    def delivered(self, n: Notification, now: float) -> None:
        """``n`` went through (or was not for this receiver): log it and drop its resolutions."""
        n.group.sending = False
        self.log[n.group.key] = LogEntry(n.firing, n.resolved, now)
        self._forget_resolved(n.group, n.alerts, n.version)

    def failed(self, n: Notification, retry_at: float) -> None:
        """``n`` may go through later: try the group again at ``retry_at`` with its state then."""
        g = n.group
        g.sending = False
        if self.groups.get(g.key) is g:
            g.retry_at = retry_at

    def rejected(self, n: Notification) -> None:
        """The receiver refused ``n``: the group is tried again at its next tick, as Alertmanager does."""
        n.group.sending = False

    def _forget_resolved(self, g: Group, alerts: Iterable[Alert], version: int) -> None:
        for a in list(alerts):
            if a.state == RESOLVED and g.alerts.get(a.labels) is a:
                del g.alerts[a.labels]
        if g.version == version:
            g.changed = False
        if not g.alerts and self.groups.get(g.key) is g:
            del self.groups[g.key]

    def _gc(self, now: float) -> None:
        for key, entry in list(self.log.items()):
            if key not in self.groups and entry.at < now - max(LOG_RETENTION_S, self.settings.repeat_interval):
                del self.log[key]


def _admits(g: Group, free: int | None, reserved: int) -> bool:
    """Whether one of ``free`` places may go to ``g``: any to a critical group, all but ``reserved``
    to another; no bound where ``free`` is None."""
    return free is None or free > (0 if g.critical else reserved)


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}
