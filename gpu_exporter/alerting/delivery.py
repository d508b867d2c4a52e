"""Delivery of alerts to Alertmanager (API v2) and to webhooks (Alertmanager's payload, v4).

Each receiver has its own thread, so a slow or dead receiver never blocks polling, scraping or
the other receivers.  Neither holds history, only the current state of each alert:

* An Alertmanager receiver keeps, per label set, the latest firing state and the latest
  resolution not yet delivered.  A send carries all of them, with ``endsAt`` computed when the
  request is made, so whatever arrives after an outage is the current state: a firing alert is
  never delivered with an ``endsAt`` that passed during the outage (which Alertmanager would read
  as resolved), and a resolution that happened during it is delivered.  The queue is bounded by
  the number of alerts, not by the length of the outage.
* A webhook receiver routes alerts as an Alertmanager route would (``routing``).  Its thread only
  plans: each notification goes out on a thread of its own, so one group's slow request holds back
  neither the other groups nor its retries.  A group has one notification in flight at a time (its
  resolution never overtakes its firing), and a receiver at most ``max_concurrent_requests``, one
  of which only a group with a firing critical alert may take: a ``GpuLost`` never waits behind
  warnings that a slow receiver holds.

Any failure of a send (refused or reset connection, timeout, TLS error, a 5xx or 429, a reply that
is not HTTP or is cut short) is counted as ``retried`` and tried again with exponential backoff,
with the state of that moment.  A reply the receiver means (another 4xx) is counted as ``rejected``
and logged; an Alertmanager receiver drops what it rejected, a webhook tries the group again at its
next ``group_interval``, as Alertmanager does; each webhook group backs off on its own.  The
delivery thread survives anything a send raises.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from ..settings.redaction import redact_text
from .engine import FIRING, RESOLVED, Alert, Labels
from .routing import Notification, Route, rfc3339
from .settings import AlertingSettings, ReceiverSettings, WebhookSettings

log = structlog.get_logger(__name__)

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
REPLY_LIMIT = 64 * 1024  # read at most this much of a reply; it is not used

OUTCOMES = ("sent", "retried", "rejected", "dropped")
# (receiver, outcome) -> count: sent, retried, rejected, dropped
Outcome = Callable[[str, str], None]

__all__ = ["OUTCOMES", "AlertmanagerReceiver", "Notifier", "Receiver", "ReceiverHooks", "WebhookReceiver",
           "alertmanager_alert", "rfc3339"]  # fmt: skip


def alertmanager_alert(a: Alert, now: float, valid_for: float, generator_url: str) -> dict[str, Any]:
    """One alert as Prometheus posts it: firing ones expire ``valid_for`` after ``now`` unless re-sent."""
    ends = now + valid_for if a.state == FIRING else (a.resolved_at or now)
    return {
        "labels": a.label_dict,
        "annotations": dict(a.annotations),
        "startsAt": rfc3339(a.starts_at),
        "endsAt": rfc3339(ends),
        "generatorURL": generator_url,
    }


class Receiver:
    """One destination with its own delivery thread; subclasses say what is due and send it."""

    def __init__(self, settings: ReceiverSettings, outcome: Outcome, clock: Callable[[], float] = time.time,
                 steady: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.settings = settings
        self.name = settings.label
        self.url = settings.url
        self._outcome = outcome
        self._clock = clock  # the wall clock: endsAt and the times receivers see
        # Waits, flushes and retries are planned on a clock that never steps, so a wall-clock step
        # neither holds a notification back for hours nor sends a batch early.  A test that makes
        # time up passes both clocks.
        self._steady = steady
        self._cond = threading.Condition()
        self._stop = False
        # Without a CA file, the system's CAs: what urllib would use for https anyway (http ignores it).
        self._ssl = ssl.create_default_context(cafile=settings.ca_file)
        self._thread = threading.Thread(target=self._run, name=f"notify-{self.name}", daemon=True)
        self.min_backoff, self.max_backoff = MIN_BACKOFF_S, MAX_BACKOFF_S  # a test may set them before start()
        self._backoff: float  # set by start()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._backoff = self.min_backoff
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop sending, waiting at most ``timeout`` in all for requests in flight (a receiver that
        never answers holds no shutdown for longer)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for thread in self._threads():
            if thread.ident is not None:  # a receiver that never started has no thread to wait for
                thread.join(max(0.0, deadline - time.monotonic()))
        left = len(self)
        if left:
            # Firing alerts are re-sent by the next daemon, and Alertmanager expires the rest by
            # their endsAt; still, say what did not go out.
            log.warning("notifications_undelivered_at_shutdown", receiver=self.name, alerts=left,
                        **self._shutdown_detail())  # fmt: skip

    def _threads(self) -> list[threading.Thread]:
        """The threads a stop waits for."""
        return [self._thread]

    def _shutdown_detail(self) -> dict[str, int]:
        return {}

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __len__(self) -> int:
        """Alerts waiting to be delivered."""
        raise NotImplementedError

    def submit(self, alerts: list[Alert], now: float) -> None:
        raise NotImplementedError

    # -- the thread -------------------------------------------------------------------------------
    def _wait_s(self, now: float) -> float | None:
        """Seconds until something is due (0 or less: now); None if nothing is waiting. Under the lock."""
        raise NotImplementedError

    def _deliver(self) -> bool:
        """Send what is due; False if something must be tried again after a backoff."""
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stop:
                        return
                    wait = self._wait_s(self._steady())
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
            try:
                ok = self._deliver()
            except Exception:  # a bug, not the receiver's fault: say so, and go on all the same
                log.exception("notification_failed", receiver=self.name, will_retry=True)
                self._count("retried")
                ok = False
            if ok:
                self._backoff = self.min_backoff
                continue
            with self._cond:
                if self._cond.wait_for(lambda: self._stop, timeout=self._backoff):
                    return
            self._backoff = min(self._backoff * 2, self.max_backoff)

    def _count(self, outcome: str) -> None:
        try:
            self._outcome(self.name, outcome)
        except Exception:  # a metrics callback must not stop delivery
            log.exception("notification_outcome_callback_failed", receiver=self.name)

    # -- one request ------------------------------------------------------------------------------
    def _post(self, doc: Any) -> str:
        """POST ``doc`` as JSON; "sent", "retry" or "rejected", whatever happens on the way."""
        headers = {"Content-Type": "application/json", "User-Agent": "gpu-exporter"}
        s = self.settings
        if s.bearer_token:
            headers["Authorization"] = f"Bearer {s.bearer_token.get_secret_value()}"
        elif s.basic_auth_username is not None:
            password = s.basic_auth_password.get_secret_value() if s.basic_auth_password else ""
            token = base64.b64encode(f"{s.basic_auth_username}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        try:
            body = json.dumps(doc).encode()
            req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=s.timeout, context=self._ssl) as r:
                reply = r.read(REPLY_LIMIT)
                if r.length and len(reply) < REPLY_LIMIT:  # the connection closed before the body ended
                    raise http.client.IncompleteRead(reply, r.length)
            return "sent"
        except urllib.error.HTTPError as e:
            if e.code >= 500 or e.code == 429:
                log.warning("notification_failed", receiver=self.name, status=e.code, will_retry=True)
                return "retry"
            detail = _reply_excerpt(e)
            log.error("notification_rejected", receiver=self.name, status=e.code, body=detail)
            return "rejected"
        except (OSError, http.client.HTTPException, ValueError) as e:
            # OSError: refused, reset, timeout, TLS, DNS.  HTTPException: a status line that is
            # not HTTP, a body cut short, a closed connection.  ValueError: what urllib raises
            # for a URL it cannot use.
            log.warning("notification_failed", receiver=self.name, error=redact_text(f"{type(e).__name__}: {e}"),
                        will_retry=True)  # fmt: skip
            return "retry"


def _reply_excerpt(e: urllib.error.HTTPError) -> str:
    try:
        return e.read(500).decode(errors="replace")
    except Exception as read_error:  # the body of a rejection can be as broken as any other reply
        return f"(unreadable: {type(read_error).__name__})"


class AlertmanagerReceiver(Receiver):
    """Posts to an Alertmanager's ``/api/v2/alerts`` the current state of every alert not yet delivered."""

    def __init__(self, settings: ReceiverSettings, outcome: Outcome, *, queue_size: int, valid_for: float,
                 generator_url: Callable[[], str], clock: Callable[[], float] = time.time,
                 steady: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        super().__init__(settings, outcome, clock, steady)
        self.url = settings.url.rstrip("/") + "/api/v2/alerts"
        self.valid_for = valid_for
        self._generator_url = generator_url
        self._queue_size = queue_size
        # label set -> latest state; a resolution is kept apart from a later firing of the same
        # labels, so that both arrive, the resolution first.
        self._resolved: dict[Labels, Alert] = {}
        self._firing: dict[Labels, Alert] = {}

    def __len__(self) -> int:
        with self._cond:
            return len(self._resolved) + len(self._firing)

    def submit(self, alerts: list[Alert], now: float) -> None:
        with self._cond:
            for a in alerts:
                if a.state == RESOLVED:
                    firing = self._firing.get(a.labels)
                    if firing is not None and firing.starts_at == a.starts_at:
                        del self._firing[a.labels]  # that alert's firing state is superseded
                    self._resolved.pop(a.labels, None)
                    self._resolved[a.labels] = a
                else:
                    self._firing.pop(a.labels, None)
                    self._firing[a.labels] = a
            self._bound()
            self._cond.notify()

    def _bound(self) -> None:
        while len(self._resolved) + len(self._firing) > self._queue_size:
            # A resolution goes first (Alertmanager ends that alert by its endsAt anyway), then the
            # oldest firing alert (the daemon re-sends it every resend_interval).
            queue = self._resolved if self._resolved else self._firing
            labels = next(iter(queue))
            del queue[labels]
            self._count("dropped")
            log.error("notification_dropped", receiver=self.name, queue_size=self._queue_size,
                      alert=dict(labels), reason="more alerts waiting than queue_size")  # fmt: skip

    def _wait_s(self, now: float) -> float | None:
        return 0.0 if self._resolved or self._firing else None

    def _deliver(self) -> bool:
        with self._cond:
            # Not empty: the thread delivers when _wait_s saw something queued, and only it dequeues.
            batch = [*self._resolved.values(), *self._firing.values()]
        now = self._clock()  # endsAt counts from the moment of sending, not of queueing
        url = self._generator_url()
        result = self._post([alertmanager_alert(a, now, self.valid_for, url) for a in batch])
        if result == "retry":
            self._count("retried")
            return False
        with self._cond:
            for a in batch:
                queue = self._resolved if a.state == RESOLVED else self._firing
                if queue.get(a.labels) is a:  # unless a newer state came in meanwhile
                    del queue[a.labels]
        self._count(result)
        return True


class WebhookReceiver(Receiver):
    """A webhook fed directly, with Alertmanager's routing semantics (see ``routing``)."""

    def __init__(self, settings: WebhookSettings, outcome: Outcome, *, generator_url: Callable[[], str],
                 clock: Callable[[], float] = time.time,
                 steady: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        super().__init__(settings, outcome, clock, steady)
        self.route = Route(settings)
        self._generator_url = generator_url
        self.max_concurrent = settings.max_concurrent_requests
        # Past one place, one is kept for a group with a firing critical alert: warnings that a
        # slow receiver holds never make a GpuLost wait for one of them to be answered.
        self._reserved = 1 if self.max_concurrent > 1 else 0
        self._senders: set[threading.Thread] = set()  # one per request in flight

    def __len__(self) -> int:
        with self._cond:
            return self.route.waiting()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return len(self._senders)

    def _threads(self) -> list[threading.Thread]:
        with self._cond:
            return [self._thread, *self._senders]

    def _shutdown_detail(self) -> dict[str, int]:
        return {"in_flight": self.in_flight}

    def submit(self, alerts: list[Alert], now: float) -> None:
        with self._cond:
            self.route.insert(alerts, self._steady(), wall=self._clock())
            self._cond.notify_all()

    def _free(self) -> int:
        return self.max_concurrent - len(self._senders)

    def _wait_s(self, now: float) -> float | None:
        due = self.route.next_due(self._free(), self._reserved)
        return None if due is None else due - now

    def _deliver(self) -> bool:
        """Start a request for each group due, as many as there are free places; never waits for one."""
        with self._cond:
            if self._stop:  # stop() waits for the senders it saw: no new one after it
                return True
            for n in self.route.due(self._steady(), self._free(), self._reserved):
                sender = threading.Thread(target=self._send, args=(n,), name=f"notify-{self.name}-send", daemon=True)
                self._senders.add(sender)
                try:
                    sender.start()
                except RuntimeError:  # no thread to be had: the group is tried again, as after a failure
                    self._senders.discard(sender)
                    self._settle(n, "retry")
                    log.exception("notification_failed", receiver=self.name, will_retry=True)
                    self._count("retried")
        return True

    def _send(self, n: Notification) -> None:
        """One group's notification, on its own thread: its outcome decides the group's next send."""
        result, counted = "retry", True  # a notification with nothing to send is not counted
        try:
            url = self._generator_url()
            with self._cond:
                doc = self.route.payload(n, external_url=url.rsplit("/", 1)[0], generator_url=url)
            counted = doc is not None
            result = "sent" if doc is None else self._post(doc)
        except Exception:  # a bug, not the receiver's fault: say so, and try the group again
            log.exception("notification_failed", receiver=self.name, will_retry=True)
            result, counted = "retry", True
        finally:  # whatever happened, the place is freed and the group has a next send
            with self._cond:
                self._senders.discard(threading.current_thread())
                self._settle(n, result)
                self._cond.notify_all()  # a place is free, and the group may be due again
        if counted:
            self._count("retried" if result == "retry" else result)

    def _settle(self, n: Notification, result: str) -> None:
        """The group's state after ``n``'s outcome; a failure backs the group off on its own,
        doubling from ``min_backoff`` to ``max_backoff``, and a success starts it again.  Under the lock."""
        g, now = n.group, self._steady()
        if result == "retry":
            g.backoff = min(max(2 * g.backoff, self.min_backoff), self.max_backoff)
            self.route.failed(n, now + g.backoff)
            return
        g.backoff = 0.0
        if result == "sent":
            self.route.delivered(n, now)
        else:
            self.route.rejected(n)


@dataclass(frozen=True)
class ReceiverHooks:
    """What receivers need from the daemon: where outcomes are counted, the link alerts carry back,
    and the series each receiver has from its start (and loses when a reload removes it)."""

    outcome: Outcome
    generator_url: Callable[[], str]
    watch: Callable[[str], None] = lambda name: None
    forget: Callable[[str], None] = lambda name: None


class Notifier:
    """Fans evaluated alerts out to every receiver, and keeps the receivers the alerting settings
    ask for: those a reload leaves as they were keep running, queue and all."""

    def __init__(self, receivers: list[Receiver], hooks: ReceiverHooks | None = None, *,
                 poll_interval: float = 0.0, queue_size: int | None = None) -> None:  # fmt: skip
        self.receivers = receivers
        self._hooks = hooks
        self._poll_interval = poll_interval  # needs a restart: fixed for the Notifier's life
        self._queue_size = queue_size
        self._swap = threading.Lock()  # a batch goes to one set of receivers, the old or the new

    @classmethod
    def for_settings(cls, alerting: AlertingSettings, hooks: ReceiverHooks, poll_interval: float) -> Notifier:
        n = cls([], hooks, poll_interval=poll_interval)
        n.receivers = n._plan(alerting)
        n._queue_size = alerting.queue_size
        return n

    def _plan(self, alerting: AlertingSettings) -> list[Receiver]:
        """Receivers for ``alerting``; those already running with the same settings are kept."""
        assert self._hooks is not None, "a Notifier made of given receivers cannot be re-planned"
        hooks = self._hooks
        # Like Prometheus: a firing alert stays valid for four resend intervals (or evaluation
        # intervals, if longer); if the daemon dies, Alertmanager resolves it by itself.
        valid_for = 4 * max(alerting.resend_interval, self._poll_interval)
        out: list[Receiver] = []
        spare = list(self.receivers)
        for r in alerting.alertmanagers:
            kept = next((x for x in spare if isinstance(x, AlertmanagerReceiver) and x.settings == r), None)
            if kept is not None and alerting.queue_size == self._queue_size:
                spare.remove(kept)
                kept.valid_for = valid_for  # read when each batch is sent
                out.append(kept)
            else:
                out.append(AlertmanagerReceiver(r, hooks.outcome, queue_size=alerting.queue_size, valid_for=valid_for,
                                                generator_url=hooks.generator_url))  # fmt: skip
        for w in alerting.webhooks:
            same = next((x for x in spare if isinstance(x, WebhookReceiver) and x.settings == w), None)
            if same is not None:
                spare.remove(same)
                out.append(same)
            else:
                out.append(WebhookReceiver(w, hooks.outcome, generator_url=hooks.generator_url))
        for x in out:
            hooks.watch(x.name)
        return out

    def apply(self, alerting: AlertingSettings) -> list[Receiver]:
        """Re-read alerting settings: new receivers start, removed ones stop (each says what it could
        not deliver) and their series end; the receivers now in force are returned."""
        assert self._hooks is not None
        old = self.receivers
        new = self._plan(alerting)  # may refuse before anything has changed
        with self._swap:
            self.receivers, self._queue_size = new, alerting.queue_size
        for r in new:
            if r not in old:
                r.start()
        for r in old:
            if r not in new:
                r.stop()
                if all(x.name != r.name for x in new):
                    self._hooks.forget(r.name)
        return new

    def start(self) -> None:
        for r in self.receivers:
            r.start()

    def stop(self) -> None:
        for r in self.receivers:
            r.stop()

    def send(self, alerts: list[Alert], now: float) -> None:
        if not alerts:
            return
        with self._swap:
            for r in self.receivers:
                r.submit(alerts, now)
