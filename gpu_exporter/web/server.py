"""The HTTP server: an asyncio loop in its own thread, serving the pages it is given.

Idle and slow clients cost a socket, not a thread.  What a client can hold is bounded in ``table``
and ``connection`` (places, idle time, TLS handshakes, buffers); here, what a request can hold:
- the request head must arrive within ``read_timeout`` and fit in ``max_header_bytes``;
- an idle keep-alive connection is closed after ``idle_timeout`` (seconds, under pressure);
- at most ``max_requests`` requests are being answered at once, and the rest get 503 at once; a
  request holds its slot while it is answered, not while a slow client takes the response;
- at most ``max_pipelined`` requests in a row are answered on a connection whose client sends the
  next before reading the last; then the connection is closed;
- with ``rate_limit`` in the web config, requests beyond it get 429 (the probes excepted);
- a password is checked in the bounded queue of ``auth.PasswordGate``; more get 429 at once;
- only GET and HEAD are served;
- anything malformed gets a short 4xx and the connection is closed, never a traceback.

TLS, mTLS, basic auth, headers and the rate limit come from the exporter-toolkit web config
(``watcher``), read for each new connection: new certificates apply as soon as the watcher sees them.
On a Python whose asyncio the TLS adapter (``tls``) does not fit, TLS goes through public asyncio
API instead, with what that loses said once at start (``tls_adapter_fallback``).

The pages are the wiring's: a mapping from a path to a function that is given the request's
headers (names lower-cased) and returns the status, body, content type and extra headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping

import structlog

from .. import __version__
from .address import parse_listen_address
from .auth import PasswordGate, Passwords, host_key
from .config import WebConfig
from .connection import BUSY, IDLE, READING, WRITING, Connection, HeadTooLarge
from .fds import connection_cap
from .http import BadRequest, Request, body_length, keep_alive, parse_head, response_head
from .pacing import Pacer
from .rate_limit import TokenBucket, retry_after
from .table import ConnectionTable
from .tls import FALLBACK_LOSES, AdapterError, check_runtime
from .watcher import WebConfigWatcher

log = structlog.get_logger(__name__)

Answer = tuple[int, bytes, str, Mapping[str, str]]  # status, body, content type, extra headers
Page = Callable[[Mapping[str, str]], Answer]

# Probes stay reachable without credentials and outside the rate limit: the kubelet cannot send
# credentials, would restart a daemon it got 429 from, and they reveal nothing but "alive" and "ready".
PROBES = frozenset({"/healthz", "/readyz"})
TEXT = "text/plain; charset=utf-8"
_BACKLOG = 1024
# asyncio accepts up to its backlog argument in one go, before it reads from any of them: a burst
# of 1,000 new sockets would each close an older one to make room, a scraper's included, before
# the scraper's request is even read.  A few per turn of the loop leaves the rest in the kernel.
_ACCEPT_BATCH = 64


def _public_tls_needed() -> bool:
    """Whether TLS must go through public asyncio API: this Python's sslproto lacks what the adapter
    uses.  Said once, at start, with what the check found and what the fallback costs."""
    try:
        check_runtime()
    except AdapterError as e:
        log.warning("tls_adapter_fallback", python=".".join(map(str, sys.version_info[:3])), found=str(e),
                    using="loop.start_tls", lost=FALLBACK_LOSES)  # fmt: skip
        return True
    return False


class HttpServer:
    def __init__(
        self,
        address: str,
        pages: Mapping[str, Page],
        *,
        web: WebConfigWatcher | None = None,
        passwords: Passwords | None = None,
        pacer: Pacer | None = None,
        open_paths: frozenset[str] = PROBES,
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
        public_tls = _public_tls_needed()
        host, port = parse_listen_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=_BACKLOG)
        self._pages = dict(pages)
        self._open_paths = open_paths
        self.web = web or WebConfigWatcher(None)
        self._max_requests = max_requests
        self._read_timeout = read_timeout
        self._idle_timeout = idle_timeout
        self._write_timeout = write_timeout
        self._max_header_bytes = max_header_bytes
        self._max_pipelined = max_pipelined
        self._active_requests = 0
        self._server_name = f"gpu-exporter/{__version__}"
        # What a client can make the server log is paced (a flood of requests is no flood of logs).
        self._pacer = pacer or Pacer()
        self.passwords = passwords or Passwords(self._pacer)
        self._gate = PasswordGate(self.passwords, workers=auth_workers, queue=auth_queue, per_host=auth_per_host)
        self._bucket: TokenBucket | None = None
        self.connections = ConnectionTable(
            self._serve, max_connections=connection_cap(max_connections), limit=max_header_bytes,
            read_timeout=read_timeout, pressure_idle_timeout=pressure_idle_timeout, max_handshakes=max_handshakes,
            handshake_timeout=handshake_timeout, max_stalled=max_stalled_writers, public_tls=public_tls,
        )  # fmt: skip
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None  # why the loop could not start serving
        # A daemon thread: a process that ends without stop() (an exception in main) must not hang on it.
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start(self) -> None:
        """Serve from now on; raises what kept the loop from serving (the port stays closed then)."""
        self._thread.start()
        self._started.wait()  # _run sets it on every path: no timeout for a busy machine to run into
        if self._failure is not None:
            self._thread.join()  # it has nothing left to do but close the loop
            self.stop()
            raise self._failure

    def stop(self) -> None:
        """Stop accepting, close the connections in progress, and end the loop (which closes itself)."""

        async def _shutdown() -> None:
            try:
                if self._server is not None:
                    self._server.close()
                self.connections.abort_all()
                # Again until none is left: a connection accepted in the loop's last turns starts
                # its task while the others end, and a task left pending dies with the closed loop.
                while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                # From inside, once the tasks have ended: a loop held up by a page that hangs runs
                # this when the page returns, then stops and closes, instead of stopping before it.
                # call_soon: this task's result must still reach stop(), in the loop's last turn.
                loop = asyncio.get_running_loop()
                loop.call_soon(loop.stop)

        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # held up: the daemon's shutdown goes on without it
                asyncio.run_coroutine_threadsafe(_shutdown(), self._loop).result(2)
            self._thread.join(2)
        elif self._thread.ident is None:  # never started
            self._loop.close()
        self._gate.shutdown()
        if not self._thread.is_alive():  # else the loop's server.close() closes it when the loop is free
            self._sock.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            try:
                self._server = self._loop.run_until_complete(
                    self._loop.create_server(self._accept, sock=self._sock, backlog=_ACCEPT_BATCH)
                )
                self._sock.listen(_BACKLOG)  # the kernel's queue stays long
                self._loop.create_task(self.connections.sweep_forever())
            except BaseException as e:
                self._failure = e
                return
            finally:
                self._started.set()
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _accept(self) -> Connection:
        # The TLS settings of the moment: a changed certificate applies to the next connection.
        return Connection(self.connections, self.web.current().tls)

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
                    request = parse_head(head, self._max_header_bytes)
                    length = body_length(request.headers)
                    if length:
                        await conn.discard(length, self._read_timeout)
                except HeadTooLarge:
                    await self._send(conn, 431, b"request head too large\n", close=True)
                    return
                except BadRequest as e:
                    await self._send(conn, e.status, (str(e) + "\n").encode(), close=True)
                    return
                # A client that sends the next request before reading this answer is pipelining.
                pipelined = pipelined + 1 if conn.buffered() else 0
                keep = keep_alive(request) and pipelined < self._max_pipelined
                table.set_state(conn, BUSY)
                keep = await self._answer(conn, request, keep)
                if not keep:
                    return
                first = False
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
            pass  # a client that stalls or drops: just close
        except Exception:  # never a traceback to the client, never a dead server
            held = self._pacer.ready("http_connection_failed")
            if held is not None:
                log.exception("http_connection_failed", held_back=held)
        finally:
            conn.close()

    async def _answer(self, conn: Connection, request: Request, keep: bool) -> bool:
        """Answer one request; whether the connection stays open."""
        config = self.web.current()
        if request.method not in ("GET", "HEAD"):
            await self._send(conn, 405, b"method not allowed; use GET or HEAD\n", close=not keep,
                             extra={"Allow": "GET, HEAD"}, config=config)  # fmt: skip
            return keep
        if self._active_requests >= self._max_requests:
            await self._send(conn, 503, b"too many concurrent requests\n", close=True, config=config)
            return False
        self._active_requests += 1
        try:
            refused = await self._admit(conn, request, config)
            if refused is None:
                answer = self._route(request)
            else:
                answer, close = refused
                keep = keep and not close
        finally:
            self._active_requests -= 1
        status, body, ctype, extra = answer
        # The slot is free again: a client slow to take its answer holds only its own connection.
        self.connections.set_state(conn, WRITING)
        await self._send(conn, status, body, close=not keep, ctype=ctype, extra=extra, config=config,
                         body=request.method == "GET")  # fmt: skip
        return keep

    async def _admit(self, conn: Connection, request: Request, config: WebConfig) -> tuple[Answer, bool] | None:
        """None if the request may be answered; else the answer that refuses it (429, 401), and
        whether to close the connection after it."""
        if request.path in self._open_paths:
            return None
        if config.rate_limit is not None:
            now = time.monotonic()
            if self._bucket is None or self._bucket.limit != config.rate_limit:
                self._bucket = TokenBucket(config.rate_limit, now)
            wait = self._bucket.take(now)
            if wait:
                return (429, b"too many requests (rate_limit in the web config)\n", TEXT,
                        {"Retry-After": retry_after(wait)}), False  # fmt: skip
        if not config.auth_required:
            return None
        ok = await self._gate.authenticate(config, request.headers.get("authorization"), host_key(conn.peer))
        if ok is None:
            return (429, b"too many password checks at once; retry later\n", TEXT, {"Retry-After": "1"}), True
        if not ok:
            return (401, b"unauthorized\n", TEXT,
                    {"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'}), False  # fmt: skip
        return None

    def _route(self, request: Request) -> Answer:
        page = self._pages.get(request.path)
        if page is None:
            return 404, f"not found; the pages are {', '.join(sorted(self._pages))}\n".encode(), TEXT, {}
        return page(request.headers)

    async def _send(self, conn: Connection, status: int, payload: bytes, *, close: bool, ctype: str = TEXT,
                    extra: Mapping[str, str] | None = None, config: WebConfig | None = None,
                    body: bool = True) -> None:  # fmt: skip
        headers = {**(config.headers if config else {}), **(extra or {})}
        head = response_head(status, ctype, len(payload), close=close, server=self._server_name, headers=headers)
        await conn.send(head, payload if body else b"", self._write_timeout)
