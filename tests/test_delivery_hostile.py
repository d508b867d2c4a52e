"""Receivers that misbehave on purpose: what they answer must never hold up the alerts behind them,
nor keep the exporter from exiting."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpu_exporter.alerting.delivery import AlertmanagerReceiver
from gpu_exporter.alerting.settings import ReceiverSettings
from tests.alerting_helpers import webhook_receiver
from tests.exporter_helpers import wait_for
from tests.socket_helpers import serve_connections
from tests.test_alert_delivery import T0, Outcomes, alert
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = "http://node-a:9445/alerts"


def am(url: str, outcomes: Outcomes, timeout: float = 30.0) -> AlertmanagerReceiver:
    return AlertmanagerReceiver(ReceiverSettings(url=url, timeout=timeout), outcomes, queue_size=10, valid_for=60,
                                generator_url=lambda: GENERATOR)  # fmt: skip


@dataclass
class Streamer:
    """Answers its first request with ``head`` and then an endless body, the rest with an empty 200."""

    head: bytes
    port: int = 0
    requests: list[bytes] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def streamer(head: bytes) -> Iterator[Streamer]:
    s = Streamer(head)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    s.port = listener.getsockname()[1]

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            s.requests.append(data)
            if len(s.requests) > 1:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            conn.sendall(s.head)
            chunk = b"x" * 65536
            try:
                while not s.stop.is_set():  # until the client hangs up (or the test ends)
                    conn.sendall(chunk)
            except OSError:
                pass

    serve_connections(listener, handle, s.stop)
    try:
        yield s
    finally:
        s.stop.set()
        listener.close()


def test_an_endless_reply_to_a_delivered_alert_neither_holds_the_receiver_nor_repeats_the_alert() -> None:
    """A receiver (or something posing as one) that takes the alert and then streams a reply without
    end: the alert counts as delivered once, after a bounded read, and the next alert goes out too.
    Reading the whole reply would stall delivery for good and grow the exporter's memory."""
    outcomes = Outcomes()
    with streamer(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n") as hook:
        r = am(hook.url, outcomes)
        r.start()
        r.submit([alert(gpu="0")], T0)
        wait_for(lambda: outcomes.count("sent") == 1, timeout=15, what="the alert delivered despite the endless reply")
        r.submit([alert(gpu="1")], T0)
        wait_for(lambda: outcomes.count("sent") == 2, timeout=15, what="the next alert")
        r.stop()
    assert outcomes.count("retried") == 0
    assert len(hook.requests) == 2, "each alert was posted once"


def test_an_endless_rejection_is_logged_and_the_next_alert_still_goes_out() -> None:
    """A 400 whose body never ends: the rejection is counted at once (only the start of its body is
    logged), and the receiver goes on to the next alert instead of reading forever."""
    outcomes = Outcomes()
    with streamer(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\r\n") as hook:
        r = am(hook.url, outcomes)
        r.start()
        r.submit([alert(gpu="0")], T0)
        wait_for(lambda: outcomes.count("rejected") == 1, timeout=15, what="the rejection counted")
        r.submit([alert(gpu="1")], T0)
        wait_for(lambda: outcomes.count("sent") == 1, timeout=15, what="the next alert delivered")
        r.stop()


def test_notifications_say_they_come_from_gpu_exporter() -> None:
    """A receiver's access log (or a proxy's) tells the exporter's notifications from others by their User-Agent."""
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        r = am(hook.url, outcomes)
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: outcomes.count("sent") == 1, what="the notification")
        r.stop()
    (req,) = hook.requests
    assert {k.lower(): v for k, v in req.headers.items()}["user-agent"] == "gpu-exporter"


EXIT_WHILE_A_RECEIVER_HANGS = """
import sys, time
from gpu_exporter.alerting.delivery import AlertmanagerReceiver
from gpu_exporter.alerting.engine import Alert
from gpu_exporter.alerting.settings import ReceiverSettings
r = AlertmanagerReceiver(ReceiverSettings(url=sys.argv[1], timeout=300), lambda receiver, outcome: None,
                         queue_size=10, valid_for=60, generator_url=lambda: "http://node-a:9445/alerts")
r.start()
r.submit([Alert((("alertname", "GpuLost"),), (), "firing", active_at=time.time())], time.time())
sys.stdin.readline()  # the test says when the request is in flight; the receiver will not answer
r.stop()
print("stopped", flush=True)
"""


def test_the_exporter_exits_promptly_while_a_receiver_hangs_on_a_request() -> None:
    """Shutting down (systemctl stop, a pod deleted) must not wait out a receiver that accepted the
    connection and never answers: once the receivers are stopped, the process ends, whatever the
    receiver's timeout (300 s here: a process that waited it out would miss the NEVER_S given to it)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(NEVER_S)
    try:
        proc = subprocess.Popen([sys.executable, "-c", EXIT_WHILE_A_RECEIVER_HANGS,
                                 f"http://127.0.0.1:{listener.getsockname()[1]}"],
                                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        try:
            conn, _ = listener.accept()  # the request is in flight, and never answered
            with conn:
                stdout, stderr = proc.communicate("\n", timeout=NEVER_S)
        finally:
            proc.kill()
            proc.wait()
    finally:
        listener.close()
    assert "stopped" in stdout, stderr
    assert proc.returncode == 0, stderr
