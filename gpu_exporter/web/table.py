"""Every open connection of the HTTP server: places, who is closed to make room, TLS handshake slots.

What one client can take from the others is bounded here, whatever it does:

- **Places.** Every accepted socket takes a place in a table of ``max_connections`` (kept below the
  file descriptor limit, so ``accept`` never fails for want of one).  When the table is full, one
  is closed to make room, the one unchanged longest of: those that never sent a request or a
  ClientHello, while they hold half the table or more; else the silent ones that did (keep-alive,
  or idle after the handshake, which would cost a new handshake); else those making progress.  A
  request being answered is never closed.  So an attacker's idle or keep-alive sockets go before a
  scraper that just arrived, and a flood of new silent sockets cannot push out everything else,
  nor take less than half the table: a newcomer has a moment to speak.
- **Idle time under pressure.** While the table is more than half full, a connection waiting for a
  request (or for its TLS ClientHello) is closed after ``pressure_idle_timeout`` instead of the
  usual idle timeout.
- **TLS.** A handshake starts only once the client has sent its first bytes, at most
  ``max_handshakes`` at once, each within ``handshake_timeout``; while others wait for a slot, a
  handshake whose client has sent nothing for ``handshake_preempt`` is cut off.  Waiting clients
  are taken newest first: under a flood, the old ones time out and a client that just came is
  served at once.  Each TLS connection reads through a 16 KiB buffer instead of asyncio's 256 KiB
  one (0.04 instead of 0.28 MiB per idle connection; ``tls``).  With ``public_tls`` (a Python whose
  asyncio the ``tls`` adapter does not fit) a handshake is asked for as soon as a TLS client
  connects, through ``loop.start_tls``, and reads through asyncio's 256 KiB; slots, the deadline
  and preemption stay, a handshake counting as quiet from its start.
- **Stalled writers.** At most ``max_stalled`` connections may wait on clients that do not read;
  one more closes the one that has waited longest.  So a client that does not read stalls only
  itself, and all of them together hold at most ~20 MiB.
- **Memory back.** After every 256 closed connections (or 64 fewer open than at the peak), their
  reference cycles are collected, and at most every 5 s glibc is asked to return free memory to the
  system (``malloc_trim``): without both, RSS climbs under churn and stays at its peak after.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import select
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from .connection import BUSY, CLOSE_GRACE, HANDSHAKE, IDLE, READING, SILENT, TLS_QUEUED, TLS_WAIT, Connection
from .tls import Handshake, PublicHandshake

log = structlog.get_logger(__name__)

_SWEEP_EVERY = 0.5
_COLLECT_AFTER = 256  # connections closed before their reference cycles are collected
_COLLECT_AFTER_DROP = 64  # or this many fewer open than at the peak
_TRIM_EVERY = 5.0


class ConnectionTable:
    """Every open connection, which to close when room is needed, and the TLS handshake slots."""

    def __init__(
        self,
        handler: Callable[[Connection], Coroutine[Any, Any, None]],
        *,
        max_connections: int,
        limit: int,
        read_timeout: float,
        pressure_idle_timeout: float = 5.0,
        max_handshakes: int = 128,
        handshake_timeout: float = 5.0,
        handshake_preempt: float = 1.0,
        max_stalled: int = 64,
        public_tls: bool = False,
    ) -> None:
        self._handler = handler
        self.max_connections = max_connections
        self.limit = limit
        self.read_timeout = read_timeout
        self.pressure_idle_timeout = pressure_idle_timeout
        self.max_handshakes = max_handshakes
        self.handshake_timeout = handshake_timeout
        self.handshake_preempt = handshake_preempt
        self.max_stalled = max_stalled
        self.public_tls = public_tls  # TLS through public asyncio API only: see ``tls.PublicHandshake``
        self._stalled: OrderedDict[Connection, None] = OrderedDict()  # waiting longest first
        self.scratch = memoryview(bytearray(64 * 1024))  # one read at a time: the loop is one thread
        self._open: set[Connection] = set()
        # Closed to make room, longest unchanged first: the silent ones that never spoke, the other
        # silent ones, then the rest.
        self._mute: OrderedDict[Connection, None] = OrderedDict()
        self._silent: OrderedDict[Connection, None] = OrderedDict()
        self._active: OrderedDict[Connection, None] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handshaking: dict[Connection, Handshake | PublicHandshake] = {}
        self._handshake_queue: deque[Connection] = deque()
        self.counts: dict[str, int] = {}  # why connections were cut off, for the debug log
        self.accepted = 0
        self._peak = 0
        self._closed_at_collect = 0
        self._trim_due = False
        self._trimmed_at = 0.0
        self._libc = _libc()

    def __len__(self) -> int:
        return len(self._open)

    @property
    def under_pressure(self) -> bool:
        return len(self._open) * 2 > self.max_connections

    def idle_timeout(self, normal: float) -> float:
        return min(normal, self.pressure_idle_timeout) if self.under_pressure else normal

    # -- membership -------------------------------------------------------------------------------------
    def admit(self, conn: Connection) -> None:
        while len(self._open) >= self.max_connections and (oldest := self._victim()) is not None:
            self.forget(oldest)
            self._count(f"evicted_{oldest.state}")
            oldest.abort()
        self._open.add(conn)
        self.accepted += 1
        self._peak = max(self._peak, len(self._open))
        self.set_state(conn, conn.state)

    def _victim(self) -> Connection | None:
        first = self._mute if len(self._mute) * 2 >= self.max_connections else self._silent
        for tier in (first, self._silent, self._active, self._mute):
            if tier:
                return next(iter(tier))
        return None

    def set_state(self, conn: Connection, state: str) -> None:
        conn.state = state
        conn.since = time.monotonic()
        if conn not in self._open:
            return
        if state in (HANDSHAKE, READING):
            conn.spoke = True
        self._mute.pop(conn, None)
        self._silent.pop(conn, None)
        self._active.pop(conn, None)
        if state in SILENT:
            (self._silent if conn.spoke else self._mute)[conn] = None
        elif state != BUSY:
            self._active[conn] = None

    def stalled(self, conn: Connection, waiting: bool) -> None:
        """A connection waits for its client to take the response, or no longer does."""
        if not waiting:
            self._stalled.pop(conn, None)
            return
        self._stalled[conn] = None
        while len(self._stalled) > self.max_stalled:
            oldest, _ = self._stalled.popitem(last=False)
            self._count("stalled_writer")
            oldest.abort()

    def forget(self, conn: Connection) -> None:
        self._stalled.pop(conn, None)
        self._open.discard(conn)
        self._mute.pop(conn, None)
        self._silent.pop(conn, None)
        self._active.pop(conn, None)
        if self._handshaking.pop(conn, None) is not None:
            self._next_handshake()

    def opened(self, conn: Connection) -> None:
        task = asyncio.get_running_loop().create_task(self._handler(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def abort_all(self) -> None:
        for conn in list(self._open):
            conn.abort()
        for task in list(self._tasks):
            task.cancel()

    # -- TLS ----------------------------------------------------------------------------------------------
    def request_handshake(self, conn: Connection) -> None:
        if len(self._handshaking) < self.max_handshakes:
            self._start_tls(conn)
        else:
            self.set_state(conn, TLS_QUEUED)
            self._handshake_queue.append(conn)
            self._preempt()

    def _next_handshake(self) -> None:
        while self._handshake_queue and len(self._handshaking) < self.max_handshakes:
            conn = self._handshake_queue.pop()  # newest first
            if not conn.lost and conn in self._open:
                self._start_tls(conn)

    def _preempt(self) -> None:
        """With clients waiting for a slot, handshakes whose clients went quiet give theirs up."""
        if not self._handshake_queue:
            return
        now = time.monotonic()
        for conn, handshake in list(self._handshaking.items()):
            # Quiet as far as we know; but a busy loop may not have read what has arrived.
            if now - handshake.heard_at >= self.handshake_preempt and not _pending_input(conn.raw):
                self._count("handshake_preempted")
                conn.abort()

    def _start_tls(self, conn: Connection) -> None:
        raw, tls = conn.raw, conn.tls
        assert raw is not None and tls is not None
        kind = PublicHandshake if self.public_tls else Handshake
        handshake = kind(conn, raw, tls.context, handshake_timeout=self.handshake_timeout,
                         shutdown_timeout=CLOSE_GRACE, done=lambda fut: self._handshake_done(conn, fut))  # fmt: skip
        self._handshaking[conn] = handshake
        self.set_state(conn, HANDSHAKE)
        early, conn.early = conn.early, b""
        handshake.start(early)

    def _handshake_done(self, conn: Connection, fut: asyncio.Future[None]) -> None:
        failed = fut.cancelled() or fut.exception() is not None or conn.transport is None
        if self._handshaking.pop(conn, None) is not None:
            self._next_handshake()
        if failed:
            # Before the handshake completes, the TLS layer does not report the loss to us.
            if not conn.refused:
                self._count("handshake_failed")
            conn.abort()
            self.forget(conn)

    def refuse(self, conn: Connection) -> None:
        """A client whose certificate names no allowed SAN: closed before it is served."""
        self._count("client_san_refused")
        conn.abort()

    # -- housekeeping -------------------------------------------------------------------------------------
    def _count(self, why: str) -> None:
        self.counts[why] = self.counts.get(why, 0) + 1

    async def sweep_forever(self) -> None:
        said = time.monotonic()
        while True:
            await asyncio.sleep(_SWEEP_EVERY)
            try:
                self.sweep(time.monotonic())
                await self._give_memory_back()
                if time.monotonic() - said >= 10 and self.counts:
                    said = time.monotonic()
                    log.debug("http_connections", open=len(self._open), silent=len(self._mute) + len(self._silent),
                              handshaking=len(self._handshaking), waiting=len(self._handshake_queue),
                              accepted=self.accepted, **self.counts)  # fmt: skip
            except Exception:
                log.exception("http_sweep_failed")

    def sweep(self, now: float) -> None:
        """Close what has waited too long: idle connections under pressure, silent TLS clients."""
        pressure = self.under_pressure
        for conn in [*self._mute, *self._silent, *self._active]:
            waited = now - conn.since
            if conn.state in (TLS_WAIT, TLS_QUEUED):
                if now - conn.accepted_at > self.read_timeout or (pressure and waited > self.pressure_idle_timeout):
                    self._count(f"timed_out_{conn.state}")
                    conn.abort()
            elif conn.state == IDLE and pressure and waited > self.pressure_idle_timeout:
                self._count("idle_under_pressure")
                conn.abort()
        self._preempt()

    async def _give_memory_back(self) -> None:
        # asyncio's transports and TLS protocols sit in reference cycles (a transport holds its own
        # bound methods), so a closed connection, with OpenSSL's buffers, is freed only by a full
        # collection; under a steady churn of connections that comes too seldom, and RSS climbs.
        # glibc then keeps what was freed for reuse unless asked.  Measured: 1,000 closed TLS
        # connections left RSS at its peak with either step alone, and back near the base with both.
        closed = self.accepted - len(self._open)
        dropped = self._peak - len(self._open) >= _COLLECT_AFTER_DROP
        if closed - self._closed_at_collect >= _COLLECT_AFTER or (dropped and closed > self._closed_at_collect):
            self._closed_at_collect = closed
            self._peak = len(self._open)
            gc.collect()
            self._trim_due = True
        now = time.monotonic()
        if self._trim_due and self._libc is not None and now - self._trimmed_at >= _TRIM_EVERY:
            self._trim_due = False
            self._trimmed_at = now
            await asyncio.get_running_loop().run_in_executor(None, self._libc.malloc_trim, 0)


def _pending_input(transport: asyncio.Transport | None) -> bool:
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        poller = select.poll()  # not select(): descriptors may be above 1024
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return False


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
