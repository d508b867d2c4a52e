"""A loopback webhook receiver and a real Alertmanager, started by tests on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.socket_helpers import serve_connections
from tests.timing import NEVER_S


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.time)  # when it arrived


@dataclass
class WebhookReceiver:
    """Records every POST; answers with ``status`` (a test can make it fail)."""

    port: int = 0
    requests: list[Received] = field(default_factory=list)
    status: int = 200
    lock: threading.Lock = field(default_factory=threading.Lock)

    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/hook"

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every webhook payload received, in order."""
        with self.lock:
            return [a for r in self.requests if isinstance(r.body, dict) for a in r.body.get("alerts", [])]


@contextmanager
def webhook_receiver(ssl_context: ssl.SSLContext | None = None) -> Iterator[WebhookReceiver]:
    rec = WebhookReceiver(scheme="https" if ssl_context else "http")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length)
            status = rec.status
            if status == 200:
                with rec.lock:
                    rec.requests.append(Received(self.path, dict(self.headers), json.loads(raw or b"null")))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if ssl_context is not None:
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True)
    rec.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Alertmanager:
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        assert binary, "Alertmanager is missing: apt-get install prometheus-alertmanager (bash .ci/setup does it)"
        log = open(self.workdir / "alertmanager.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.workdir / 'alertmanager.yml'}",
             f"--storage.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--cluster.listen-address="],
            stdout=log, stderr=log,
        )  # fmt: skip
        deadline = time.monotonic() + NEVER_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError((self.workdir / "alertmanager.log").read_text())
            time.sleep(0.1)
        raise AssertionError("Alertmanager did not become ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=NEVER_S)
        self.proc = None


# Every alert its own group: one notification per alert change.
EVERY_ALERT_ALONE = {"group_by": ["..."], "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"}


@contextmanager
def alertmanager(webhook_url: str, workdir: Path, route: dict[str, Any] | None = None,
                 receiver: str = "hook", send_resolved: bool = True) -> Iterator[Alertmanager]:  # fmt: skip
    """A real Alertmanager whose root route (``route``: group_by and the intervals) sends every
    alert to one webhook receiver named ``receiver``."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "route": {"receiver": receiver, **(route or EVERY_ALERT_ALONE)},
        "receivers": [{"name": receiver, "webhook_configs": [{"url": webhook_url, "send_resolved": send_resolved}]}],
    }
    (workdir / "alertmanager.yml").write_text(json.dumps(config))
    am = Alertmanager(free_port(), workdir)
    am.start()
    try:
        yield am
    finally:
        am.stop()


# -- receivers that speak garbage ------------------------------------------------------------------
GARBAGE_REPLIES: dict[str, bytes] = {
    # A status line that is not HTTP at all (http.client: BadStatusLine).
    "not-http": b"SSH-2.0-OpenSSH_9.2\r\n",
    # A 200 whose body is cut short (IncompleteRead).
    "truncated": b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: application/json\r\n\r\n{"stat',
    # The connection closed with no reply (RemoteDisconnected).
    "hang-up": b"",
    # A header line longer than http.client accepts (LineTooLong).
    "long-header": b"HTTP/1.1 200 OK\r\nX-Junk: " + b"x" * 70_000 + b"\r\n\r\n",
    # A status code that is not a number (BadStatusLine).
    "bad-status": b"HTTP/1.1 two hundred OK\r\n\r\n",
}


@dataclass
class RawReceiver:
    """A raw TCP server on 127.0.0.1 that answers each request as its script says.

    ``script`` lists the replies of the first requests (keys of GARBAGE_REPLIES, or ``http``);
    once it is used up, every request gets ``then``: ``http`` (a proper 200, the JSON body
    recorded) or ``proxy`` (forwarded to ``upstream`` and its reply relayed, e.g. to a real
    Alertmanager).
    """

    port: int = 0
    script: list[str] = field(default_factory=list)
    then: str = "http"
    upstream: str | None = None
    bodies: list[Any] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)  # what each request got, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def next_reply(self) -> str:
        with self.lock:
            mode = self.script.pop(0) if self.script else self.then
            self.replies.append(mode)
            return mode


def _read_request(conn: socket.socket) -> tuple[str, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return "", b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                   if k.strip().lower() == "content-length"), 0)  # fmt: skip
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return lines[0], body


@contextmanager
def raw_receiver(script: list[str], then: str = "http", upstream: str | None = None) -> Iterator[RawReceiver]:
    rec = RawReceiver(script=list(script), then=then, upstream=upstream)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    rec.port = listener.getsockname()[1]
    stopping = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                request_line, body = _read_request(conn)
                if not request_line:
                    return
                mode = rec.next_reply()
                if mode in GARBAGE_REPLIES:
                    conn.sendall(GARBAGE_REPLIES[mode])
                    return
                status, reply = 200, b""
                if mode == "proxy":
                    assert rec.upstream is not None
                    path = request_line.split(" ")[1]
                    req = urllib.request.Request(rec.upstream.rstrip("/") + path, data=body, method="POST",
                                                 headers={"Content-Type": "application/json"})  # fmt: skip
                    try:
                        with urllib.request.urlopen(req, timeout=NEVER_S) as r:
                            status, reply = r.status, r.read()
                    except urllib.error.HTTPError as e:
                        status, reply = e.code, e.read()
                else:
                    with rec.lock:
                        rec.bodies.append(json.loads(body or b"null"))
                conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (status, len(reply), reply))  # fmt: skip
            except OSError:
                pass

    thread = serve_connections(listener, handle, stopping)
    try:
        yield rec
    finally:
        stopping.set()
        thread.join(5)
        listener.close()


# -- a receiver that answers when the test says ---------------------------------------------------------
@dataclass
class HeldRequest:
    """One webhook request, held open until the test releases it (or NEVER_S passes)."""

    body: Any
    status: int = 200
    released: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)

    @property
    def group(self) -> str:
        return str(self.body["groupKey"])

    @property
    def alertnames(self) -> list[str]:
        return [a["labels"]["alertname"] for a in self.body["alerts"]]

    def release(self) -> None:
        self.released.set()


@dataclass
class HoldingReceiver:
    """Records every request when it arrives and answers each only once the test releases it (with
    ``status_for(body)``); counts the requests open at once, so a test can pin a bound on them."""

    port: int = 0
    hold: bool = True
    status_for: Any = None  # body -> status; 200 when None
    requests: list[HeldRequest] = field(default_factory=list)
    open: int = 0
    peak: int = 0  # the most requests open at one moment
    cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def arrived(self, n: int) -> list[HeldRequest]:
        """The first ``n`` requests, once they have arrived (fails after NEVER_S)."""
        with self.cond:
            came = self.cond.wait_for(lambda: len(self.requests) >= n, NEVER_S)
            assert came, f"{len(self.requests)} requests arrived, waited for {n}"
            return self.requests[:n]

    def release_all(self) -> None:
        with self.cond:
            self.hold = False
            for r in self.requests:
                r.release()


@contextmanager
def holding_receiver() -> Iterator[HoldingReceiver]:
    rec = HoldingReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            req = HeldRequest(body, 200 if rec.status_for is None else rec.status_for(body))
            with rec.cond:
                rec.requests.append(req)
                rec.open += 1
                rec.peak = max(rec.peak, rec.open)
                if not rec.hold:
                    req.release()
                rec.cond.notify_all()
            req.released.wait(NEVER_S)
            with rec.cond:
                rec.open -= 1  # before the answer: the client may send the next at once
            self.send_response(req.status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            req.answered.set()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield rec
    finally:
        rec.release_all()
        server.shutdown()
        server.server_close()
