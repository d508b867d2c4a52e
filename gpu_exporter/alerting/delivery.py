"""Delivery of alerts to Alertmanager (API v2) and to webhooks (Alertmanager's payload, v4).

Each receiver has its own bounded queue and thread, so a slow or dead receiver never blocks
polling, scraping or the other receivers.  A batch that fails for a reason that may pass
(connection refused, timeout, 5xx, 429) is retried with exponential backoff until it is
delivered, in order, so an outage loses nothing; one the receiver rejects (other 4xx) is counted
and logged.  If the queue ever overflows, the oldest batch goes, counted and logged.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from .engine import FIRING, Alert
from .settings import ReceiverSettings

log = structlog.get_logger(__name__)

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0

# (receiver, outcome) -> count: sent, retried, rejected, dropped
Outcome = Callable[[str, str], None]


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alertmanager_alert(a: Alert, now: float, valid_for: float, generator_url: str) -> dict[str, Any]:
    """One alert as Prometheus posts it: firing ones expire ``valid_for`` ahead unless re-sent."""
    ends = now + valid_for if a.state == FIRING else (a.resolved_at or now)
    return {
        "labels": a.label_dict,
        "annotations": dict(a.annotations),
        "startsAt": rfc3339(a.fired_at or a.active_at),
        "endsAt": rfc3339(ends),
        "generatorURL": generator_url,
    }


def webhook_payload(alerts: list[Alert], now: float, valid_for: float, generator_url: str, receiver: str,
                    external_url: str) -> dict[str, Any]:  # fmt: skip
    """Alertmanager's webhook body (version 4), for setups without an Alertmanager."""
    items = []
    for a in alerts:
        item = alertmanager_alert(a, now, valid_for, generator_url)
        item["status"] = "firing" if a.state == FIRING else "resolved"
        if a.state == FIRING:
            item["endsAt"] = "0001-01-01T00:00:00Z"  # what Alertmanager sends for an open alert
        item["fingerprint"] = a.fingerprint
        items.append(item)
    labels = [a.label_dict for a in alerts]
    common_labels = {k: v for k, v in labels[0].items() if all(x.get(k) == v for x in labels)} if labels else {}
    annotations = [dict(a.annotations) for a in alerts]
    common_annotations = (
        {k: v for k, v in annotations[0].items() if all(x.get(k) == v for x in annotations)} if annotations else {}
    )
    return {
        "version": "4",
        "groupKey": "{}:" + json.dumps(common_labels, sort_keys=True),
        "truncatedAlerts": 0,
        "status": "firing" if any(a.state == FIRING for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": common_labels,
        "commonAnnotations": common_annotations,
        "externalURL": external_url,
        "alerts": items,
    }


class Receiver:
    """One destination with its own queue and delivery thread."""

    def __init__(self, settings: ReceiverSettings, kind: str, queue_size: int, outcome: Outcome,
                 sleep: Callable[[float], bool] | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.kind = kind  # "alertmanager" or "webhook"
        self.name = settings.label
        self.url = settings.url.rstrip("/") + "/api/v2/alerts" if kind == "alertmanager" else settings.url
        self._queue: deque[bytes] = deque()
        self._queue_size = queue_size
        self._cond = threading.Condition()
        self._stop = False
        self._outcome = outcome
        self._ssl = ssl.create_default_context(cafile=settings.ca_file) if settings.ca_file else None
        self._thread = threading.Thread(target=self._run, name=f"notify-{self.name}", daemon=True)
        self._sleep = sleep or self._interruptible_sleep

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            left = len(self._queue)
        self._thread.join(timeout)
        if left:
            # Firing alerts are re-sent by the next daemon, and Alertmanager expires the rest by
            # their endsAt; still, say what did not go out.
            log.warning("notifications_undelivered_at_shutdown", receiver=self.name, count=left)

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def submit(self, body: bytes) -> None:
        with self._cond:
            if len(self._queue) >= self._queue_size:
                self._queue.popleft()
                self._outcome(self.name, "dropped")
                log.error("notification_dropped", receiver=self.name, queue_size=self._queue_size,
                          reason="queue full while the receiver is unreachable")  # fmt: skip
            self._queue.append(body)
            self._cond.notify()

    def _interruptible_sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True if stopping."""
        with self._cond:
            self._cond.wait_for(lambda: self._stop, timeout=seconds)
            return self._stop

    def _run(self) -> None:
        backoff = MIN_BACKOFF_S
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or bool(self._queue))
                if self._stop:
                    return
                body = self._queue[0]
            result = self._post(body)
            if result == "retry":
                self._outcome(self.name, "retried")
                if self._sleep(backoff):
                    return
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff = MIN_BACKOFF_S
            with self._cond:
                if self._queue and self._queue[0] is body:
                    self._queue.popleft()
            self._outcome(self.name, result)

    def _post(self, body: bytes) -> str:
        headers = {"Content-Type": "application/json", "User-Agent": "gpu-exporter"}
        s = self.settings
        if s.bearer_token:
            headers["Authorization"] = f"Bearer {s.bearer_token}"
        elif s.basic_auth_username is not None:
            token = base64.b64encode(f"{s.basic_auth_username}:{s.basic_auth_password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=s.timeout, context=self._ssl) as r:
                r.read()
            return "sent"
        except urllib.error.HTTPError as e:
            if e.code >= 500 or e.code == 429:
                log.warning("notification_failed", receiver=self.name, status=e.code, will_retry=True)
                return "retry"
            log.error("notification_rejected", receiver=self.name, status=e.code,
                      body=e.read(500).decode(errors="replace"))  # fmt: skip
            return "rejected"
        except (OSError, TimeoutError) as e:
            log.warning("notification_failed", receiver=self.name, error=str(e), will_retry=True)
            return "retry"


class Notifier:
    """Fans evaluated alerts out to every receiver."""

    def __init__(self, receivers: list[Receiver], *, resend_interval: float, generator_url: Callable[[], str],
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.receivers = receivers
        self.resend_interval = resend_interval
        self._generator_url = generator_url
        self._clock = clock

    def start(self) -> None:
        for r in self.receivers:
            r.start()

    def stop(self) -> None:
        for r in self.receivers:
            r.stop()

    def send(self, alerts: list[Alert], now: float | None = None) -> None:
        if not alerts or not self.receivers:
            return
        now = self._clock() if now is None else now
        # Like Prometheus: a firing alert stays valid for four resend intervals; if the daemon
        # dies, Alertmanager resolves it by itself.
        valid_for = 4 * self.resend_interval
        url = self._generator_url()
        for r in self.receivers:
            if r.kind == "alertmanager":
                doc: Any = [alertmanager_alert(a, now, valid_for, url) for a in alerts]
            else:
                doc = webhook_payload(alerts, now, valid_for, url, r.name, url.rsplit("/", 1)[0])
            r.submit(json.dumps(doc).encode())
