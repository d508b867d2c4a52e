"""The one place that knows asyncio's private TLS protocol (``asyncio.sslproto.SSLProtocol``).

The server starts a TLS handshake only once the client has sent its first bytes, on a socket it
already holds, and reads through a 16 KiB buffer instead of asyncio's 256 KiB: neither is possible
through ``loop.start_tls`` or ``create_server(ssl=...)``.  So it subclasses the private class, and
what it relies on is listed here and checked when the server is made (``check_runtime``):

- the constructor ``SSLProtocol(loop, app_protocol, sslcontext, waiter, server_side=...,
  call_connection_made=..., ssl_handshake_timeout=..., ssl_shutdown_timeout=...)``;
- the class attribute ``max_size``, the size of the read buffer the constructor allocates;
- the buffered-protocol methods ``get_buffer`` and ``buffer_updated`` (3.11's rewrite of sslproto);
- the app protocol's ``connection_made`` called with the TLS transport once the handshake is done,
  after ``peercert`` is in its extra info, and before any application data is read.

CPython 3.11, 3.12 and 3.13 are known to keep all of it (``KNOWN_PYTHONS``);
``tests/test_web_tls_adapter.py`` fails on any other version until someone has checked it.

Where the check fails, the server still serves TLS, through ``PublicHandshake``: the public
``loop.start_tls`` on the TCP transport as soon as it is accepted.  What that loses is what the
private class was for (``FALLBACK_LOSES``): the handshake starts at accept, not once the client has
sent something, and each TLS connection reads through asyncio's own buffer (256 KiB).
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import sys
import time
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable

# Checked by hand against each version's Lib/asyncio/sslproto.py (see the module's docstring).
KNOWN_PYTHONS = ((3, 11), (3, 12), (3, 13))
READ_BUFFER = 16 * 1024  # one TLS record at most: a smaller buffer only means more reads
_CONSTRUCTOR = ("loop", "app_protocol", "sslcontext", "waiter", "server_side", "call_connection_made",
                "ssl_handshake_timeout", "ssl_shutdown_timeout")  # fmt: skip


# What a Python without the private class's internals costs, for the warning at start.
FALLBACK_LOSES = (
    "the handshake starts when a TLS client connects, not once it has sent something (a silent client "
    "holds a handshake slot until handshake_timeout); each TLS connection reads through asyncio's "
    "256 KiB buffer instead of 16 KiB; a handshake's client counts as quiet from its start"
)


class AdapterError(RuntimeError):
    pass


class _Protocol(SSLProtocol):
    # asyncio allocates (and touches) max_size bytes per TLS connection for reads.
    max_size = READ_BUFFER
    heard_at = 0.0  # when the client last sent something: a stalled handshake can be told apart

    def buffer_updated(self, nbytes: int) -> None:
        self.heard_at = time.monotonic()
        super().buffer_updated(nbytes)


class Handshake:
    """A server-side TLS handshake on a transport that has already read ``early`` bytes."""

    def __init__(self, app: asyncio.BaseProtocol, raw: asyncio.Transport, context: ssl.SSLContext, *,
                 handshake_timeout: float, shutdown_timeout: float,
                 done: Callable[[asyncio.Future[None]], None]) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._protocol = _Protocol(loop, app, context, waiter, server_side=True, call_connection_made=True,
                                   ssl_handshake_timeout=handshake_timeout,  # type: ignore[arg-type]
                                   ssl_shutdown_timeout=shutdown_timeout)  # fmt: skip
        self._protocol.heard_at = time.monotonic()
        self._raw = raw
        waiter.add_done_callback(done)

    @property
    def heard_at(self) -> float:
        return self._protocol.heard_at

    def start(self, early: bytes) -> None:
        """Put the TLS layer between the socket and the app protocol, feed it what was read, and read on."""
        self._raw.set_protocol(self._protocol)
        self._protocol.connection_made(self._raw)
        feed(self._protocol, early)
        self._raw.resume_reading()


class PublicHandshake:
    """The same handshake through public API only (``loop.start_tls``), for a Python whose sslproto
    the adapter does not fit.  It must start before anything is read from ``raw``: ``early`` is
    always empty, and the TLS layer reads the ClientHello itself."""

    def __init__(self, app: asyncio.BaseProtocol, raw: asyncio.Transport, context: ssl.SSLContext, *,
                 handshake_timeout: float, shutdown_timeout: float,
                 done: Callable[[asyncio.Future[None]], None]) -> None:  # fmt: skip
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiter.add_done_callback(done)
        self._app, self._raw, self._context = app, raw, context
        self._timeouts = handshake_timeout, shutdown_timeout
        # Nothing public says when the client last sent a byte: quiet since the handshake began.
        self.heard_at = time.monotonic()
        self._task: asyncio.Task[None] | None = None  # held: a task nobody holds may be collected

    def start(self, early: bytes) -> None:
        if early:  # start_tls cannot be given bytes already read: they would be lost
            raise ValueError("a public TLS handshake must start before anything is read")
        self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            transport = await self._loop.start_tls(
                self._raw, self._app, self._context, server_side=True,
                ssl_handshake_timeout=self._timeouts[0], ssl_shutdown_timeout=self._timeouts[1],
            )  # fmt: skip
        except asyncio.CancelledError:
            self._waiter.cancel()
            raise
        except Exception as e:  # the handshake failed or timed out: the waiter's callback closes
            self._waiter.set_exception(e)
            return
        if transport is None:  # the connection was lost the moment the handshake ended
            self._waiter.set_exception(ConnectionError("lost at the end of the TLS handshake"))
            return
        # As the private path does (call_connection_made): the app sees the TLS transport, its
        # peercert known, before anything is read through it.
        self._app.connection_made(transport)
        self._waiter.set_result(None)


def feed(protocol: asyncio.BufferedProtocol, data: bytes) -> None:
    """Hand bytes already read to a buffered protocol, as a transport would."""
    view = memoryview(data)
    while view:
        buf = memoryview(protocol.get_buffer(len(view)))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        protocol.buffer_updated(n)
        view = view[n:]


def check_runtime() -> None:
    """AdapterError saying what changed, if this Python's sslproto lacks what the adapter uses."""
    missing = []
    try:
        params = inspect.signature(SSLProtocol.__init__).parameters
    except (TypeError, ValueError):  # a constructor without a signature to read: none of it is known
        params = inspect.Signature().parameters
    missing += [f"the constructor's {name!r} parameter" for name in _CONSTRUCTOR if name not in params]
    if not isinstance(getattr(SSLProtocol, "max_size", None), int):
        missing.append("the class attribute max_size (its read buffer's size)")
    missing += [f"the method {m}()" for m in ("get_buffer", "buffer_updated") if not hasattr(SSLProtocol, m)]
    if missing:
        raise AdapterError(
            f"Python {sys.version_info[0]}.{sys.version_info[1]}: asyncio.sslproto.SSLProtocol lacks "
            + ", ".join(missing)
            + "; gpu_exporter/web/tls.py must be adapted (known to work on "
            + ", ".join(f"{a}.{b}" for a, b in KNOWN_PYTHONS)
            + ")"
        )
