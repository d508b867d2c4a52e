"""The HTTP endpoints: /metrics (cached exposition), /healthz, /readyz, the alerts and a landing page.

Nothing here touches NVML; a scrape only copies bytes rendered at the last poll.

The server is an asyncio loop in its own thread, so idle and slow clients cost a socket, not a
thread.  What a client can hold is bounded in ``connections`` (places, idle time, TLS handshakes,
buffers); here, what a request can hold:
- the request head must arrive within ``read_timeout`` and fit in ``max_header_bytes``;
- an idle keep-alive connection is closed after ``idle_timeout`` (seconds, under pressure);
- at most ``max_requests`` requests are being answered at once, and the rest get 503 at once; a
  request holds its slot while it is answered, not while a slow client takes the response;
- at most ``max_pipelined`` requests in a row are answered on a connection whose client sends the
  next before reading the last; then the connection is closed;
- a password is checked by bcrypt in ``auth_workers`` threads with at most ``auth_queue`` checks
  waiting, and at most ``auth_per_host`` of them (running or waiting) from one client address (an
  IPv6 /64); more get 429 at once.  After a failed check the worker rests as long as the check
  took, so wrong passwords get at most half a core per worker.  Checks that succeeded are
  remembered, so a scraper that got in once is not held up by a flood of wrong passwords; one whose
  password is not remembered yet (after a restart, or a new hash in the web config) still finds a
  place while the flood comes from fewer hosts than there are places;
- only GET and HEAD are served;
- anything malformed gets a short 4xx and the connection is closed, never a traceback.

TLS, mTLS, basic auth and extra headers come from the exporter-toolkit web config (web_config.py),
read for each new connection: new certificates apply as soon as the watcher sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import html
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import structlog

from .. import __version__
from ..alerting.engine import Alert
from .alerts_page import alerts_html, alerts_json
from .connections import BUSY, IDLE, READING, WRITING, Connection, ConnectionTable, HeadTooLarge, connection_cap
from .exposition import CONTENT_TYPE, Exposition
from .web_config import WebConfig, WebConfigWatcher

log = structlog.get_logger(__name__)

Readiness = Callable[[], tuple[bool, str]]
ActiveAlerts = Callable[[], list[Alert]]

# Probes stay reachable without credentials: the kubelet cannot send them, and they reveal
# nothing but "alive" and "ready" (see README, "Securing the endpoint").
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz"})
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 413: "Content Too Large", 429: "Too Many Requests",
            431: "Request Header Fields Too Large",
            501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}  # fmt: skip
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_MAX_BODY = 64 * 1024
_BACKLOG = 1024
# asyncio accepts up to its backlog argument in one go, before it reads from any of them: a burst
# of 1,000 new sockets would each close an older one to make room, a scraper's included, before
# the scraper's request is even read.  A few per turn of the loop leaves the rest in the kernel.
_ACCEPT_BATCH = 64
# Headers whose repetition makes a request ambiguous (request smuggling, RFC 9112 6.3).
_SINGLE = frozenset({"content-length", "transfer-encoding", "host", "authorization"})


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
        node: str = "",
        gpu_models: Callable[[], Mapping[str, str]] = dict,
        web: WebConfigWatcher | None = None,
        max_requests: int = 40,
        max_connections: int = 512,
        read_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        write_timeout: float = 30.0,
        max_header_bytes: int = 16 * 1024,
        pressure_idle_timeout: float = 5.0,
        max_handshakes: int = 128,
        handshake_timeout: float = 5.0,
        max_pipelined: int = 16,
        max_stalled_writers: int = 64,
        auth_workers: int = 1,
        auth_queue: int = 4,
        auth_per_host: int = 1,
    ) -> None:
        host, port = parse_listen_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=_BACKLOG)
        self._exposition = exposition
        self._readiness = readiness
        self._alerts = active_alerts
        self._node = node
        self._gpu_models = gpu_models
        self._web = web or WebConfigWatcher(None)
        self._max_requests = max_requests
        self._read_timeout = read_timeout
        self._idle_timeout = idle_timeout
        self._write_timeout = write_timeout
        self._max_header_bytes = max_header_bytes
        self._max_pipelined = max_pipelined
        self._active_requests = 0
        self._auth_pool = ThreadPoolExecutor(max_workers=auth_workers, thread_name_prefix="basic-auth")
        self._auth_pending = 0
        self._auth_limit = auth_workers + auth_queue
        self._auth_per_host = auth_per_host
        self._auth_by_host: dict[str, int] = {}
        self.connections = ConnectionTable(
            self._serve, max_connections=connection_cap(max_connections), limit=max_header_bytes,
            read_timeout=read_timeout, pressure_idle_timeout=pressure_idle_timeout, max_handshakes=max_handshakes,
            handshake_timeout=handshake_timeout, max_stalled=max_stalled_writers,
        )  # fmt: skip
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        self._started.wait(5)

    def stop(self) -> None:
        """Stop accepting, close the connections in progress, and close the loop."""

        async def _shutdown() -> None:
            if self._server is not None:
                self._server.close()
            self.connections.abort_all()
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
        self._auth_pool.shutdown(wait=False, cancel_futures=True)
        self._sock.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            self._loop.create_server(self._accept, sock=self._sock, backlog=_ACCEPT_BATCH)
        )
        self._sock.listen(_BACKLOG)  # the kernel's queue stays long
        self._loop.create_task(self.connections.sweep_forever())
        self._started.set()
        self._loop.run_forever()

    def _accept(self) -> Connection:
        # The TLS settings of the moment: a changed certificate applies to the next connection.
        return Connection(self.connections, self._web.current().ssl_context)

    # -- one connection ---------------------------------------------------------------------------
    async def _serve(self, conn: Connection) -> None:
        table = self.connections
        first = True
        pipelined = 0
        try:
            while True:
                table.set_state(conn, IDLE)
                # Waiting for a request may take the idle timeout; once it starts, the whole head
                # must arrive within the read timeout (the slow-client defence).
                wait = self._read_timeout if first else self._idle_timeout
                if not await conn.wait_for_request(table.idle_timeout(wait)):
                    return
                table.set_state(conn, READING)
                try:
                    head = await conn.read_until(b"\r\n\r\n", self._read_timeout)
                    method, path, version, headers = _parse_head(head, self._max_header_bytes)
                    await self._discard_body(conn, headers)
                except HeadTooLarge:
                    await self._send(conn, 431, b"request head too large\n", close=True)
                    return
                except _BadRequest as e:
                    await self._send(conn, e.status, (str(e) + "\n").encode(), close=True)
                    return
                connection = headers.get("connection", "").lower()
                keep = (version == "HTTP/1.1" and connection != "close") or (
                    version == "HTTP/1.0" and connection == "keep-alive"
                )
                # A client that sends the next request before reading this answer is pipelining.
                pipelined = pipelined + 1 if conn.buffered() else 0
                keep = keep and pipelined < self._max_pipelined
                table.set_state(conn, BUSY)
                keep = await self._answer(conn, method, path, headers, keep)
                if not keep:
                    return
                first = False
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
            pass  # a client that stalls or drops: just close
        except Exception:  # never a traceback to the client, never a dead server
            log.exception("http_connection_failed")
        finally:
            conn.close()

    async def _answer(self, conn: Connection, method: str, path: str, headers: dict[str, str], keep: bool) -> bool:
        """Answer one request; whether the connection stays open."""
        config = self._web.current()
        if method not in ("GET", "HEAD"):
            await self._send(conn, 405, b"method not allowed; use GET or HEAD\n", close=not keep,
                             extra={"Allow": "GET, HEAD"}, config=config)  # fmt: skip
            return keep
        if self._active_requests >= self._max_requests:
            await self._send(conn, 503, b"too many concurrent requests\n", close=True, config=config)
            return False
        self._active_requests += 1
        try:
            if config.auth_required and path not in UNAUTHENTICATED_PATHS:
                ok = await self._authenticate(config, headers.get("authorization"), host_key(conn.peer))
                if ok is None:
                    answer = (429, b"too many password checks at once; retry later\n", "text/plain; charset=utf-8",
                              {"Retry-After": "1"})  # fmt: skip
                    keep = False
                elif not ok:
                    answer = (401, b"unauthorized\n", "text/plain; charset=utf-8",
                              {"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'})  # fmt: skip
                else:
                    answer = self._route(path, headers)
            else:
                answer = self._route(path, headers)
        finally:
            self._active_requests -= 1
        status, body, ctype, extra = answer
        # The slot is free again: a client slow to take its answer holds only its own connection.
        self.connections.set_state(conn, WRITING)
        await self._send(conn, status, body, close=not keep, ctype=ctype, extra=extra, config=config,
                         body=method == "GET")  # fmt: skip
        return keep

    async def _authenticate(self, config: WebConfig, header: str | None, host: str) -> bool | None:
        """Whether the credentials are right; None when too many checks are already waiting, or
        this host already has its share of them."""
        known = self._web.remembered(config, header)
        if known is not None:
            return known
        held = self._auth_by_host.get(host, 0)
        # Without the share per host, one host's flood would take every place, and a scraper whose
        # password is not remembered yet would get nothing but 429 while it lasts.
        if self._auth_pending >= self._auth_limit or held >= self._auth_per_host:
            return None
        self._auth_pending += 1
        self._auth_by_host[host] = held + 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._auth_pool, self._check_paced, config, header)
        finally:
            self._auth_pending -= 1
            left = self._auth_by_host.pop(host) - 1
            if left:
                self._auth_by_host[host] = left

    def _check_paced(self, config: WebConfig, header: str | None) -> bool:
        """A bcrypt check; a failed one then rests as long as it took, so that a flood of wrong
        passwords gets at most half a core, whatever the cost of the hashes."""
        t0 = time.monotonic()
        ok = self._web.check_basic_auth(config, header)
        if not ok:
            time.sleep(time.monotonic() - t0)
        return ok

    async def _discard_body(self, conn: Connection, headers: dict[str, str]) -> None:
        if "transfer-encoding" in headers:
            if "content-length" in headers:  # two framings: the classic smuggling (RFC 9112, 6.3)
                raise _BadRequest(400, "both transfer-encoding and content-length")
            raise _BadRequest(501, "transfer-encoding is not supported")
        length = headers.get("content-length")
        if length is None:
            return
        if not length.isdigit():
            raise _BadRequest(400, "bad content-length")
        if int(length) > _MAX_BODY:
            raise _BadRequest(413, "request body too large")
        if int(length):
            await conn.discard(int(length), self._read_timeout)

    def _route(self, path: str, headers: dict[str, str]) -> tuple[int, bytes, str, dict[str, str]]:
        text = "text/plain; charset=utf-8"
        if path == "/metrics":
            gz = accepts_gzip(headers.get("accept-encoding", ""))
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
            return 200, alerts_html(self._alerts(), self._node, self._gpu_models()), "text/html; charset=utf-8", {}
        if path == "/":
            return 200, _landing_page(), "text/html; charset=utf-8", {}
        return 404, b"not found; try /metrics\n", text, {}

    async def _send(self, conn: Connection, status: int, payload: bytes, *, close: bool,
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
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        await conn.send(head, payload if body else b"", self._write_timeout)


def host_key(address: str) -> str:
    """What counts as one client host: an IPv4 address, or an IPv6 /64 (a host is commonly given a
    whole /64 and can pick any address in it).  IPv4-mapped IPv6 addresses count as IPv4."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header allows gzip: named with q > 0, or ``*`` with q > 0 and gzip
    not named (RFC 9110, 12.5.3)."""
    gzip_q: float | None = None
    any_q: float | None = None
    for item in accept_encoding.split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        if coding == "gzip":
            gzip_q = q
        elif coding == "*":
            any_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return any_q is not None and any_q > 0


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
        key = name.decode("latin-1").lower()
        if key in headers and key in _SINGLE:
            raise _BadRequest(400, f"more than one {key} header")
        headers[key] = value.strip(b" \t").decode("latin-1")
    return method, target.split("?", 1)[0], version, headers


def _landing_page() -> bytes:
    return (
        "<!doctype html><html><head><title>gpu-exporter</title></head><body>"
        f"<h1>gpu-exporter {html.escape(__version__)}</h1>"
        "<ul><li><a href='/metrics'>metrics</a></li><li><a href='/alerts'>alerts</a></li>"
        "<li><a href='/api/v1/alerts'>alerts (JSON)</a></li><li><a href='/healthz'>healthz</a></li>"
        "<li><a href='/readyz'>readyz</a></li></ul></body></html>\n"
    ).encode()
