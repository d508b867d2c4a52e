"""One client socket, from accept to close: what the HTTP handler reads from and writes to.

- **Reading.** At most ``limit`` bytes of request are buffered (reading pauses beyond); the
  handler waits for a request, for a head up to its empty line, or drops a body, each within a
  deadline.
- **Writing.** A response goes to the transport 256 KiB at a time, waiting while 64 KiB are
  unsent (smaller pieces cost 40 ms of delayed ACKs per TLS scrape); a connection that waits on a
  client that does not read tells the table, which bounds how many may.
- **TLS.** The first bytes of a TLS client are kept and the socket paused until the table gives
  it a handshake slot; once the handshake is done, a client certificate whose names the web config
  does not allow (``client_allowed_sans``) closes the connection before any request is read.
  With the table's ``public_tls`` nothing is read before the handshake: the socket is paused and
  a slot asked for at once, since ``loop.start_tls`` cannot be given bytes already read.
- **Closing.** What is written is flushed; a client that does not take it is cut off 2 s later.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from .tls_context import ServerTls

WRITE_CHUNK = 256 * 1024
_WRITE_HIGH = 64 * 1024
_FIRST_TLS_BYTES = 4096
CLOSE_GRACE = 2.0

# Connection states.  SILENT ones are closed first to make room; BUSY (a request being answered,
# bounded by the request slots) never.
TLS_WAIT, TLS_QUEUED, HANDSHAKE, IDLE, READING, BUSY, WRITING = (
    "tls_wait", "tls_queued", "handshake", "idle", "reading", "busy", "writing")  # fmt: skip
SILENT = frozenset({TLS_WAIT, IDLE})


class HeadTooLarge(Exception):
    pass


class ClientGone(ConnectionError):
    """The client closed its side, or the connection is lost: the handler stops and closes."""


class Table(Protocol):
    """What a connection asks of the table that holds it (``table.ConnectionTable``): named here so
    that the table imports the connection and not the other way round."""

    limit: int  # the longest request head, in bytes
    public_tls: bool
    scratch: memoryview  # one read buffer for every connection: the loop is one thread

    def admit(self, conn: Connection) -> None: ...
    def refuse(self, conn: Connection) -> None: ...
    def request_handshake(self, conn: Connection) -> None: ...
    def set_state(self, conn: Connection, state: str) -> None: ...
    def opened(self, conn: Connection) -> None: ...
    def forget(self, conn: Connection) -> None: ...
    def stalled(self, conn: Connection, waiting: bool) -> None: ...


class Connection(asyncio.BufferedProtocol):
    """One client socket, from accept to close.  The HTTP handler reads and writes through it."""

    def __init__(self, table: Table, tls: ServerTls | None) -> None:
        self._table = table
        self.tls = tls
        self.raw: asyncio.Transport | None = None  # TCP
        self.transport: asyncio.Transport | None = None  # what HTTP uses: TCP, or TLS over it
        self.state = TLS_WAIT if tls is not None else IDLE
        self.spoke = False  # sent a request, or completed a TLS handshake
        self.since = self.accepted_at = time.monotonic()
        self.early = b""  # the start of the ClientHello, read before the handshake began
        self._buf = bytearray()
        self._eof = False
        self.lost = False
        self._reading_paused = False
        self._write_paused = False
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._abort_handle: asyncio.TimerHandle | None = None
        self.refused = False  # a client certificate without an allowed name

    # -- asyncio protocol callbacks -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self.raw is None:
            self.raw = transport
            self._table.admit(self)
            if self.tls is not None and self._table.public_tls:
                transport.pause_reading()  # until the handshake starts: its first bytes are the TLS layer's
                self._table.request_handshake(self)
                return
            if self.tls is not None:
                return  # wait for the ClientHello before spending a handshake slot on it
        elif self.tls is not None and not self.tls.admits(transport.get_extra_info("peercert")):
            # The handshake is done and nothing of the request read yet: Go's exporter-toolkit fails
            # the handshake itself; Python's ssl has no hook there, so the connection ends here.
            self.refused = True
            self._table.refuse(self)
            return
        self._open(transport)  # plain TCP at once, or TLS once the handshake is done

    def _open(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        if len(self._buf) >= self._table.limit:  # read before there was a transport to pause
            self._reading_paused = True
            transport.pause_reading()
        self._table.set_state(self, IDLE)
        self._table.opened(self)

    @property
    def peer(self) -> str:
        """The client's IP address ("" if the socket has none, e.g. already gone)."""
        name = self.raw.get_extra_info("peername") if self.raw is not None else None
        return str(name[0]) if isinstance(name, tuple) and name else ""

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.transport is None:
            return self._table.scratch[:_FIRST_TLS_BYTES]
        room = self._table.limit - len(self._buf)
        return self._table.scratch[: max(room, 256)]  # never empty: TLS would take that for EOF

    def buffer_updated(self, nbytes: int) -> None:
        data = self._table.scratch[:nbytes]
        if self.transport is None:  # the first bytes of a TLS client
            if self.state == TLS_WAIT and self.raw is not None:
                self.early = bytes(data)
                self.raw.pause_reading()
                self._table.request_handshake(self)
            elif self.tls is not None and self._table.public_tls:
                # A request that came with the handshake's last flight: loop.start_tls hands it on
                # before it returns the TLS transport (one read's worth, kept for when it does).
                self._buf += data
            return
        self._buf += data
        if len(self._buf) >= self._table.limit and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        # Keep a half-closed TCP connection open to answer its last request; TLS cannot.
        return self.tls is None and self.transport is not None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._eof = True
        self._wake_reader()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if self._abort_handle is not None:
            self._abort_handle.cancel()
        self._table.forget(self)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # -- reading --------------------------------------------------------------------------------------
    def _wake_reader(self) -> None:
        if self._read_waiter is not None and not self._read_waiter.done():
            self._read_waiter.set_result(None)

    async def _more(self) -> None:
        if self._eof:
            raise ClientGone
        self._read_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._read_waiter
        finally:
            self._read_waiter = None

    def _consumed(self, n: int) -> bytes:
        out = bytes(self._buf[:n])
        del self._buf[:n]
        if self._reading_paused and len(self._buf) < self._table.limit and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return out

    def buffered(self) -> int:
        return len(self._buf)

    async def wait_for_request(self, timeout: float) -> bool:
        """Wait for the first byte of a request; False if the client closed the connection."""
        async with asyncio.timeout(timeout):
            while not self._buf:
                if self._eof:
                    return False
                await self._more()
        return True

    async def read_until(self, separator: bytes, timeout: float) -> bytes:
        """Everything up to and including ``separator``, which must come within ``limit`` bytes."""
        async with asyncio.timeout(timeout):
            while True:
                end = self._buf.find(separator)
                if end >= 0:
                    return self._consumed(end + len(separator))
                if len(self._buf) >= self._table.limit:
                    raise HeadTooLarge
                await self._more()

    async def discard(self, n: int, timeout: float) -> None:
        """Read and drop ``n`` bytes (a request body nobody needs)."""
        async with asyncio.timeout(timeout):
            while n > 0:
                if not self._buf:
                    await self._more()
                take = min(n, len(self._buf))
                self._consumed(take)
                n -= take

    # -- writing --------------------------------------------------------------------------------------
    async def send(self, head: bytes, body: bytes, timeout: float) -> None:
        """Write a response in pieces, so that little of it waits in memory for a slow client."""
        transport = self.transport
        assert transport is not None
        async with asyncio.timeout(timeout):
            view = memoryview(body)
            first = max(WRITE_CHUNK - len(head), 0)
            chunks: list[bytes | memoryview] = [head + view[:first]]
            chunks += (view[i : i + WRITE_CHUNK] for i in range(first, len(view), WRITE_CHUNK))
            for chunk in chunks:  # the head goes with the start of the body: one packet for small answers
                if self.lost:
                    raise ClientGone
                transport.write(chunk)
                if self._write_paused and not self.lost:
                    self._table.stalled(self, True)
                    try:
                        while self._write_paused and not self.lost:
                            self._drain_waiter = asyncio.get_running_loop().create_future()
                            await self._drain_waiter
                    finally:
                        self._table.stalled(self, False)
            if self.lost:
                raise ClientGone

    # -- closing --------------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush what is written and close; a client that does not take it is cut off soon after."""
        if self.lost:
            return
        if self.transport is not None:
            self.transport.close()
        elif self.raw is not None:
            self.raw.close()
        if self._abort_handle is None:
            self._abort_handle = asyncio.get_running_loop().call_later(CLOSE_GRACE, self.abort)

    def abort(self) -> None:
        """Close at once, dropping anything unsent (a TLS connection without its close_notify)."""
        if not self.lost and self.raw is not None:
            self.raw.abort()
