"""A loopback webhook receiver and a real Alertmanager, started by tests on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


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
        deadline = time.monotonic() + 30
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
            self.proc.wait(timeout=10)
        self.proc = None


@contextmanager
def alertmanager(webhook_url: str, workdir: Path) -> Iterator[Alertmanager]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "alertmanager.yml").write_text(
        "route:\n"
        "  receiver: hook\n"
        "  group_by: ['...']\n"  # every alert its own group: one notification per alert change
        "  group_wait: 0s\n"
        "  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: hook\n"
        "    webhook_configs:\n"
        f"      - url: {webhook_url}\n"
        "        send_resolved: true\n"
    )
    am = Alertmanager(free_port(), workdir)
    am.start()
    try:
        yield am
    finally:
        am.stop()
