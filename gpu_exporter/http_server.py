"""The HTTP endpoints: /metrics (cached exposition), /healthz, /readyz and a landing page.

Nothing here touches NVML; a scrape only copies bytes rendered at the last poll.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog

from . import __version__
from .alerts import Alert
from .alerts_page import alerts_html, alerts_json
from .exposition import CONTENT_TYPE, Exposition

log = structlog.get_logger(__name__)

Readiness = Callable[[], tuple[bool, str]]
ActiveAlerts = Callable[[], list[Alert]]


def parse_listen_address(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all interfaces) or ``[v6]:PORT``, as Prometheus exporters take it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(
            f"listen address {address!r} must be HOST:PORT with a port from 0 to 65535 (0: any free port), e.g. :9445"
        )
    host = host.strip("[]")
    return host or "0.0.0.0", int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    exposition: Exposition
    readiness: Readiness
    active_alerts: ActiveAlerts

    def __init__(self, address: tuple[str, int]) -> None:
        if ":" in address[0]:
            import socket

            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = f"gpu-exporter/{__version__}"
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, a small (gzipped) body waits ~40 ms
    # for the client's delayed ACK.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _not_allowed(self) -> None:
        self._reply(405, b"method not allowed; use GET or HEAD\n", "text/plain; charset=utf-8", True,
                    extra={"Allow": "GET, HEAD"})  # fmt: skip

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _serve(self, send_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            gz = "gzip" in self.headers.get("Accept-Encoding", "")
            body = self.server.exposition.body(gzipped=gz)
            self._reply(200, body, CONTENT_TYPE, send_body, extra={"Content-Encoding": "gzip"} if gz else None)
        elif path == "/healthz":
            self._reply(200, b"ok\n", "text/plain; charset=utf-8", send_body)
        elif path == "/readyz":
            ok, why = self.server.readiness()
            self._reply(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8", send_body)
        elif path == "/api/v1/alerts":
            self._reply(200, alerts_json(self.server.active_alerts()), "application/json", send_body)
        elif path == "/alerts":
            self._reply(200, alerts_html(self.server.active_alerts()), "text/html; charset=utf-8", send_body)
        elif path == "/":
            self._reply(200, _landing_page(), "text/html; charset=utf-8", send_body)
        else:
            self._reply(404, b"not found; try /metrics\n", "text/plain; charset=utf-8", send_body)

    def _reply(self, code: int, body: bytes, ctype: str, send_body: bool, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http_request", client=self.client_address[0], request=format % args)


def _landing_page() -> bytes:
    return (
        "<!doctype html><html><head><title>gpu-exporter</title></head><body>"
        f"<h1>gpu-exporter {html.escape(__version__)}</h1>"
        "<ul><li><a href='/metrics'>metrics</a></li><li><a href='/alerts'>alerts</a></li>"
        "<li><a href='/api/v1/alerts'>alerts (JSON)</a></li><li><a href='/healthz'>healthz</a></li>"
        "<li><a href='/readyz'>readyz</a></li></ul></body></html>\n"
    ).encode()


class HttpServer:
    def __init__(self, address: str, exposition: Exposition, readiness: Readiness,
                 active_alerts: ActiveAlerts = list) -> None:  # fmt: skip
        host, port = parse_listen_address(address)
        self._server = _Server((host, port))
        self._server.exposition = exposition
        self._server.readiness = readiness
        self._server.active_alerts = active_alerts
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
