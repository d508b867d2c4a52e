"""The HTTP endpoints: /metrics (cached exposition), /healthz, /readyz, the alerts and a landing page.

Nothing here touches NVML; a scrape only copies bytes rendered at the last poll.

The server is an asyncio loop in its own thread, so idle and slow clients cost a socket, not a
thread. It is built to survive bad clients:
- the request head must arrive within ``read_timeout`` and fit in ``max_header_bytes``;
- an idle keep-alive connection is closed after ``idle_timeout``;
- at most ``max_requests`` requests are served at once, and the rest get 503 at once;
- only GET and HEAD are served;
- anything malformed gets a short 4xx and the connection is closed, never a traceback.

TLS, mTLS, basic auth and extra headers come from the exporter-toolkit web config (web_config.py).
A new TLS context applies to new connections as soon as the file or certificates change.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import html
import socket
import ssl
import threading
from collections.abc import Callable

import structlog

from .. import __version__
from ..alerting.engine import Alert
from .alerts_page import alerts_html, alerts_json
from .exposition import CONTENT_TYPE, Exposition
from .web_config import WebConfig, WebConfigWatcher

log = structlog.get_logger(__name__)

Readiness = Callable[[], tuple[bool, str]]
ActiveAlerts = Callable[[], list[Alert]]

# Probes stay reachable without credentials: the kubelet cannot send them, and they reveal
# nothing but "alive" and "ready" (see README, "Securing the endpoint").
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz"})
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 413: "Content Too Large", 431: "Request Header Fields Too Large",
            501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}  # fmt: skip
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_MAX_BODY = 64 * 1024


def parse_listen_address(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all interfaces) or ``[v6]:PORT``, as Prometheus exporters take it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(
            f"listen address {address!r} must be HOST:PORT with a port from 0 to 65535 (0: any free port), e.g. :9445"
        )
    host = host.strip("[]")
    return host or "0.0.0.0", int(port)


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer:
    def __init__(
        self,
        address: str,
        exposition: Exposition,
        readiness: Readiness,
        active_alerts: ActiveAlerts = list,
        *,
        web: WebConfigWatcher | None = None,
        max_requests: int = 40,
        max_connections: int = 1024,
        read_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        write_timeout: float = 30.0,
        max_header_bytes: int = 16 * 1024,
    ) -> None:
        host, port = parse_listen_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=256)
        self._exposition = exposition
        self._readiness = readiness
        self._alerts = active_alerts
        self._web = web or WebConfigWatcher(None)
        self._max_requests = max_requests
        self._max_connections = max_connections
        self._read_timeout = read_timeout
        self._idle_timeout = idle_timeout
        self._write_timeout = write_timeout
        self._max_header_bytes = max_header_bytes
        self._active_requests = 0
        self._connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._serving_config: WebConfig | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        self._started.wait(5)

    def stop(self) -> None:
        """Stop accepting, cancel the connections in progress, and close the loop."""

        async def _shutdown() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_shutdown(), self._loop).result(2)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(2)
            if not self._thread.is_alive():
                self._loop.close()
        self._sock.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve(self._web.current()))
        self._started.set()
        self._loop.create_task(self._follow_config())
        self._loop.run_forever()

    async def _serve(self, config: WebConfig) -> None:
        """(Re)start accepting with ``config``'s TLS context.  Each asyncio server gets its own
        duplicate of the listening socket, so the old one can stop accepting while connections it
        already accepted finish, and no connection attempt is refused in between."""
        old = self._server
        self._server = await asyncio.start_server(
            self._client,
            sock=self._sock.dup(),
            limit=self._max_header_bytes,
            ssl=config.ssl_context,
            ssl_handshake_timeout=self._read_timeout if config.ssl_context is not None else None,
        )
        self._serving_config = config
        if old is not None:
            old.close()

    async def _follow_config(self) -> None:
        """New certificates take effect for new connections once the web config watcher sees them."""
        while True:
            await asyncio.sleep(1.0)
            try:
                config = self._web.current()
                if config is not self._serving_config:
                    await self._serve(config)
            except Exception:
                log.exception("http_reconfigure_failed")

    # -- one connection ---------------------------------------------------------------------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            if self._connections > self._max_connections:
                return  # refuse at once; a scraper retries, a flood does not get a slot
            config = self._web.current()
            first = True
            while await self._one_request(reader, writer, config, first):
                first = False
        except (TimeoutError, ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, OSError):
            pass  # a client that stalls, drops or fails the handshake: just close
        except Exception:  # never a traceback to the client, never a dead server
            log.exception("http_connection_failed")
        finally:
            self._connections -= 1
            writer.close()
            with contextlib.suppress(TimeoutError, ConnectionError, ssl.SSLError, OSError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, config: WebConfig,
                           first: bool) -> bool:  # fmt: skip
        """Serve one request; True to keep the connection for the next."""
        # Waiting for a request to start may take the idle timeout; once it starts, the whole head
        # must arrive within the read timeout (the slow-client defence).
        start = await asyncio.wait_for(reader.readexactly(1), self._read_timeout if first else self._idle_timeout)
        try:
            head = start + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._read_timeout)
        except asyncio.LimitOverrunError:
            await self._reply(writer, 431, b"request head too large\n", close=True)
            return False
        except asyncio.IncompleteReadError:
            return False
        try:
            method, path, version, headers = _parse_head(head, self._max_header_bytes)
            await self._discard_body(reader, headers)
        except _BadRequest as e:
            await self._reply(writer, e.status, (str(e) + "\n").encode(), close=True)
            return False
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        keep = keep or (version == "HTTP/1.0" and headers.get("connection", "").lower() == "keep-alive")
        if method not in ("GET", "HEAD"):
            await self._reply(writer, 405, b"method not allowed; use GET or HEAD\n", close=not keep,
                              extra={"Allow": "GET, HEAD"}, config=config)  # fmt: skip
            return keep
        if self._active_requests >= self._max_requests:
            await self._reply(writer, 503, b"too many concurrent requests\n", close=True, config=config)
            return False
        self._active_requests += 1
        try:
            if config.auth_required and path not in UNAUTHENTICATED_PATHS:
                loop = asyncio.get_running_loop()
                ok = await loop.run_in_executor(None, self._web.check_basic_auth, config, headers.get("authorization"))
                if not ok:
                    await self._reply(writer, 401, b"unauthorized\n", close=not keep, config=config,
                                      extra={"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'},
                                      body=method == "GET")  # fmt: skip
                    return keep
            status, body, ctype, extra = self._route(path, headers)
            await self._reply(writer, status, body, close=not keep, ctype=ctype, extra=extra, config=config,
                              body=method == "GET")  # fmt: skip
        finally:
            self._active_requests -= 1
        return keep

    async def _discard_body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> None:
        if "transfer-encoding" in headers:
            raise _BadRequest(501, "transfer-encoding is not supported")
        length = headers.get("content-length")
        if length is None:
            return
        if not length.isdigit():
            raise _BadRequest(400, "bad content-length")
        if int(length) > _MAX_BODY:
            raise _BadRequest(413, "request body too large")
        if int(length):
            await asyncio.wait_for(reader.readexactly(int(length)), self._read_timeout)

    def _route(self, path: str, headers: dict[str, str]) -> tuple[int, bytes, str, dict[str, str]]:
        text = "text/plain; charset=utf-8"
        if path == "/metrics":
            gz = "gzip" in headers.get("accept-encoding", "")
            body = self._exposition.body(gzipped=gz)
            return 200, body, CONTENT_TYPE, {"Content-Encoding": "gzip"} if gz else {}
        if path == "/healthz":
            return 200, b"ok\n", text, {}
        if path == "/readyz":
            ok, why = self._readiness()
            return (200 if ok else 503), (why + "\n").encode(), text, {}
        if path == "/api/v1/alerts":
            return 200, alerts_json(self._alerts()), "application/json", {}
        if path == "/alerts":
            return 200, alerts_html(self._alerts()), "text/html; charset=utf-8", {}
        if path == "/":
            return 200, _landing_page(), "text/html; charset=utf-8", {}
        return 404, b"not found; try /metrics\n", text, {}

    async def _reply(self, writer: asyncio.StreamWriter, status: int, payload: bytes, *, close: bool,
                     ctype: str = "text/plain; charset=utf-8", extra: dict[str, str] | None = None,
                     config: WebConfig | None = None, body: bool = True) -> None:  # fmt: skip
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
            f"Server: gpu-exporter/{__version__}",
            f"Date: {email.utils.formatdate(usegmt=True)}",
            f"Content-Type: {ctype}",
            f"Content-Length: {len(payload)}",
            f"Connection: {'close' if close else 'keep-alive'}",
        ]
        for k, v in {**(dict(config.headers) if config else {}), **(extra or {})}.items():
            lines.append(f"{k}: {v}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (payload if body else b""))
        await asyncio.wait_for(writer.drain(), self._write_timeout)


def _parse_head(head: bytes, limit: int) -> tuple[str, str, str, dict[str, str]]:
    """Method, path, version and lower-cased headers of a request head, or _BadRequest."""
    if len(head) > limit:
        raise _BadRequest(431, "request head too large")
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not all(c in _TOKEN for c in parts[0]):
        raise _BadRequest(400, "malformed request line")
    method, target, version = (p.decode("latin-1") for p in parts)
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    if not target.startswith("/") or any(c < 0x21 or c > 0x7E for c in parts[1]):
        raise _BadRequest(400, "malformed request target")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or not all(c in _TOKEN for c in name):
            raise _BadRequest(400, "malformed header")
        headers[name.decode("latin-1").lower()] = value.strip(b" \t").decode("latin-1")
    return method, target.split("?", 1)[0], version, headers


def _landing_page() -> bytes:
    return (
        "<!doctype html><html><head><title>gpu-exporter</title></head><body>"
        f"<h1>gpu-exporter {html.escape(__version__)}</h1>"
        "<ul><li><a href='/metrics'>metrics</a></li><li><a href='/alerts'>alerts</a></li>"
        "<li><a href='/api/v1/alerts'>alerts (JSON)</a></li><li><a href='/healthz'>healthz</a></li>"
        "<li><a href='/readyz'>readyz</a></li></ul></body></html>\n"
    ).encode()
