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
    params = inspect.signature(SSLProtocol.__init__).parameters
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
