"""The server's sockets (gpu_exporter/web/connection.py, table.py) with stand-in transports: who is
closed to make room, what waits, what is buffered, how an answer is written.

The same rules are tested with real sockets and real attackers in test_web_hostile.py; here each
one is pinned at its edge, in milliseconds, with the clock in the test's hands.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_exporter.web import connection as connection_module
from gpu_exporter.web.connection import (
    BUSY,
    HANDSHAKE,
    IDLE,
    READING,
    TLS_QUEUED,
    TLS_WAIT,
    WRITE_CHUNK,
    WRITING,
    Connection,
    HeadTooLarge,
)  # fmt: skip
from gpu_exporter.web.table import ConnectionTable


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The modules' own view of time (the event loop keeps the real one)."""
    c = Clock()
    fake = SimpleNamespace(monotonic=c.monotonic)
    monkeypatch.setattr("gpu_exporter.web.table.time", fake)
    monkeypatch.setattr("gpu_exporter.web.connection.time", fake)
    return c


class Transport(asyncio.Transport):
    """A socket's transport as asyncio gives it, recording what the connection does with it."""

    def __init__(self, protocol: asyncio.BaseProtocol | None = None, peer: Any = ("192.0.2.1", 5555),
                 extra: dict[str, Any] | None = None) -> None:  # fmt: skip
        super().__init__()
        self.protocol = protocol
        self.written: list[bytes] = []
        self.events: list[str] = []
        self.limits: dict[str, int | None] = {}
        self._extra = {"peername": peer, **(extra or {})}

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = {"high": high, "low": low}

    def pause_reading(self) -> None:
        self.events.append("pause")

    def resume_reading(self) -> None:
        self.events.append("resume")

    def close(self) -> None:
        self.events.append("close")

    def abort(self) -> None:
        self.events.append("abort")

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol


class Stub:
    """What the table needs of a connection, without a socket."""

    def __init__(self, table: ConnectionTable, state: str = IDLE, spoke: bool = False, name: str = "") -> None:
        self.state, self.spoke, self.name = state, spoke, name
        self.since = self.accepted_at = 0.0
        self.lost = False
        self.aborted = 0
        self.raw = None
        self.transport = None
        self.refused = False
        self.forgets = True
        self._table = table

    def abort(self) -> None:
        self.aborted += 1
        if self.forgets:
            self._table.forget(self)  # type: ignore[arg-type]  # as connection_lost does, later

    def __repr__(self) -> str:
        return self.name


def make_table(handler: Callable[[Connection], Coroutine[Any, Any, None]] | None = None, **kw: Any) -> ConnectionTable:
    async def nothing(conn: Connection) -> None:
        pass

    kw.setdefault("max_connections", 8)
    kw.setdefault("limit", 1024)
    kw.setdefault("read_timeout", 10.0)
    return ConnectionTable(handler or nothing, **kw)


def admit(table: ConnectionTable, state: str, spoke: bool = False, name: str = "") -> Stub:
    stub = Stub(table, state, spoke, name)
    table.admit(stub)  # type: ignore[arg-type]
    return stub


# -- places and who makes room ---------------------------------------------------------------------------
def test_a_full_table_closes_the_oldest_that_never_spoke_while_they_hold_half(clock: Clock) -> None:
    table = make_table(max_connections=4)
    mute1, mute2 = admit(table, IDLE, name="mute1"), admit(table, IDLE, name="mute2")
    silent, busy = admit(table, IDLE, spoke=True, name="silent"), admit(table, BUSY, spoke=True, name="busy")
    newcomer = admit(table, IDLE, name="new")
    assert (mute1.aborted, mute2.aborted, silent.aborted, busy.aborted) == (1, 0, 0, 0)
    assert len(table) == 4 and table.counts == {"evicted_idle": 1} and table.accepted == 5
    # Now the mute hold half exactly: still first to go, oldest first.
    admit(table, IDLE, name="new2")
    assert mute2.aborted == 1 and newcomer.aborted == 0 and silent.aborted == 0


def test_below_half_the_silent_that_spoke_go_first_then_the_active_then_the_mute(clock: Clock) -> None:
    table = make_table(max_connections=4)
    mute = admit(table, TLS_WAIT, name="mute")
    silent = admit(table, IDLE, spoke=True, name="silent")
    reading, writing = admit(table, READING, name="reading"), admit(table, WRITING, spoke=True, name="writing")
    assert reading.spoke is True  # admitted while reading: it has spoken
    admit(table, BUSY, name="busy1")
    assert silent.aborted == 1 and mute.aborted == reading.aborted == 0
    admit(table, BUSY, name="busy2")
    assert reading.aborted == 1 and writing.aborted == 0  # the active one unchanged longest
    admit(table, BUSY, name="busy3")
    assert writing.aborted == 1 and mute.aborted == 0
    admit(table, BUSY, name="busy4")
    assert mute.aborted == 1
    assert table.counts == {"evicted_idle": 1, "evicted_reading": 1, "evicted_writing": 1, "evicted_tls_wait": 1}


def test_a_request_being_answered_is_never_closed_to_make_room(clock: Clock) -> None:
    table = make_table(max_connections=2)
    busy = [admit(table, BUSY) for _ in range(2)]
    admit(table, IDLE)
    assert [b.aborted for b in busy] == [0, 0] and len(table) == 3


def test_a_change_of_state_makes_a_connection_the_newest_of_its_tier(clock: Clock) -> None:
    table = make_table(max_connections=3)
    a, b, c = (admit(table, IDLE, spoke=True, name=n) for n in "abc")
    table.set_state(a, IDLE)  # type: ignore[arg-type]  # a keep-alive connection back to idle: newest
    admit(table, IDLE, spoke=True)
    assert (a.aborted, b.aborted, c.aborted) == (0, 1, 0)


def test_set_state_records_when_and_who_spoke(clock: Clock) -> None:
    table = make_table()
    for state, spoke in ((TLS_WAIT, False), (IDLE, False), (WRITING, False), (HANDSHAKE, True), (READING, True)):
        stub = admit(table, IDLE)
        clock.now += 1
        table.set_state(stub, state)  # type: ignore[arg-type]
        assert (stub.state, stub.since, stub.spoke) == (state, clock.now, spoke)
    gone = Stub(table)
    table.set_state(gone, READING)  # type: ignore[arg-type]  # not in the table: state kept, nothing else
    assert gone.state == READING and gone.spoke is False and len(table) == 5


@pytest.mark.parametrize(("open_", "pressure"), [(3, False), (4, False), (5, True)])
def test_pressure_is_more_than_half_the_places(clock: Clock, open_: int, pressure: bool) -> None:
    table = make_table(max_connections=8, pressure_idle_timeout=5.0)
    for _ in range(open_):
        admit(table, BUSY)
    assert table.under_pressure is pressure
    assert table.idle_timeout(120.0) == (5.0 if pressure else 120.0)
    assert table.idle_timeout(2.0) == 2.0


# -- the sweep ---------------------------------------------------------------------------------------------------
def test_the_sweep_closes_tls_clients_silent_past_the_read_timeout(clock: Clock) -> None:
    table = make_table(max_connections=8, read_timeout=10.0, pressure_idle_timeout=5.0)
    waiting, queued, idle = admit(table, TLS_WAIT), admit(table, TLS_QUEUED), admit(table, IDLE, spoke=True)
    for s in (waiting, queued, idle):
        s.accepted_at = s.since = 100.0
    table.sweep(110.0)  # exactly the read timeout: kept
    assert (waiting.aborted, queued.aborted, idle.aborted) == (0, 0, 0)
    table.sweep(110.5)
    assert (waiting.aborted, queued.aborted, idle.aborted) == (1, 1, 0)  # without pressure, idle waits on
    assert table.counts == {"timed_out_tls_wait": 1, "timed_out_tls_queued": 1}


def test_under_pressure_the_sweep_closes_silent_ones_after_the_shorter_wait(clock: Clock) -> None:
    table = make_table(max_connections=4, read_timeout=10.0, pressure_idle_timeout=5.0)
    idle, tls_wait = admit(table, IDLE, spoke=True), admit(table, TLS_WAIT)
    reading, busy = admit(table, READING), admit(table, BUSY)
    for s in (idle, tls_wait, reading, busy):
        s.accepted_at = s.since = 100.0
    table.sweep(105.0)  # the wait, not past it
    assert [s.aborted for s in (idle, tls_wait, reading, busy)] == [0, 0, 0, 0]
    admit(table, BUSY)  # 5 of 4 places (none could be closed to make room... but idle could)
    assert idle.aborted == 1  # made room
    table.sweep(105.5)
    assert [s.aborted for s in (tls_wait, reading, busy)] == [1, 0, 0]
    assert table.counts["timed_out_tls_wait"] == 1


def test_under_pressure_the_sweep_closes_idle_keep_alive(clock: Clock) -> None:
    table = make_table(max_connections=4, pressure_idle_timeout=5.0)
    idle = admit(table, IDLE, spoke=True)
    others = [admit(table, BUSY) for _ in range(2)]
    idle.since = 100.0
    table.sweep(105.5)
    assert idle.aborted == 1 and table.counts == {"idle_under_pressure": 1}
    assert [o.aborted for o in others] == [0, 0]


# -- clients that do not read ---------------------------------------------------------------------------------
def test_beyond_max_stalled_the_writer_waiting_longest_is_closed(clock: Clock) -> None:
    table = make_table(max_stalled=2)
    a, b, c = (admit(table, WRITING, name=n) for n in "abc")
    table.stalled(a, True)  # type: ignore[arg-type]
    table.stalled(b, True)  # type: ignore[arg-type]
    table.stalled(a, False)  # type: ignore[arg-type]  # a's client took its answer
    table.stalled(c, True)  # type: ignore[arg-type]
    assert (a.aborted, b.aborted, c.aborted) == (0, 0, 0)
    table.stalled(a, True)  # type: ignore[arg-type]
    assert (a.aborted, b.aborted, c.aborted) == (0, 1, 0) and table.counts == {"stalled_writer": 1}
    table.forget(c)  # type: ignore[arg-type]
    table.stalled(b, True)  # type: ignore[arg-type]
    assert c.aborted == 0 and a.aborted == 0


# -- TLS handshake slots -----------------------------------------------------------------------------------------
class Handshakes:
    def __init__(self, table: ConnectionTable) -> None:
        self.started: list[Stub] = []
        self.table = table

    def __call__(self, conn: Stub) -> None:  # stands in for ConnectionTable._start_tls
        self.started.append(conn)
        self.table._handshaking[conn] = SimpleNamespace(heard_at=conn.heard_at)  # type: ignore[index,attr-defined,assignment]
        self.table.set_state(conn, HANDSHAKE)  # type: ignore[arg-type]


def tls_stub(table: ConnectionTable, name: str, heard_at: float = 1000.0) -> Stub:
    stub = admit(table, TLS_WAIT, name=name)
    stub.heard_at = heard_at  # type: ignore[attr-defined]
    return stub


def test_handshakes_beyond_the_slots_wait_and_are_taken_newest_first(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = make_table(max_handshakes=2)
    started = Handshakes(table)
    monkeypatch.setattr(table, "_start_tls", started)
    a, b, c, d, e = (tls_stub(table, n) for n in "abcde")
    for s in (a, b, c, d, e):
        table.request_handshake(s)  # type: ignore[arg-type]
    assert started.started == [a, b] and [s.state for s in (c, d, e)] == [TLS_QUEUED] * 3
    d.lost = True  # gone while it waited: skipped
    table.forget(a)  # type: ignore[arg-type]
    assert started.started == [a, b, e]
    b.transport = "the TLS transport"  # type: ignore[assignment]  # as the handshake leaves it
    table._handshake_done(b, _done())  # type: ignore[arg-type]
    assert b.aborted == 0 and started.started == [a, b, e, c] and "handshake_failed" not in table.counts
    c.transport = "the TLS transport"  # type: ignore[assignment]
    table._handshake_done(c, _done(failed=True))  # type: ignore[arg-type]
    assert c.aborted == 1 and table.counts == {"handshake_failed": 1}


def test_a_refused_client_certificate_is_counted_once(clock: Clock) -> None:
    table = make_table()
    stub = tls_stub(table, "x")
    table.refuse(stub)  # type: ignore[arg-type]
    stub.refused = True
    table._handshake_done(stub, _done())  # type: ignore[arg-type]  # the handshake ended, but no transport
    assert table.counts == {"client_san_refused": 1} and stub.aborted == 2


def _done(failed: bool = False) -> asyncio.Future[None]:
    loop = asyncio.new_event_loop()
    try:
        fut: asyncio.Future[None] = loop.create_future()
        if failed:
            fut.set_exception(ConnectionError("handshake failed"))
            fut.exception()
        else:
            fut.set_result(None)
        return fut
    finally:
        loop.close()


def test_with_clients_waiting_a_quiet_handshake_gives_its_slot_up(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = make_table(max_handshakes=2, handshake_preempt=1.0)
    started = Handshakes(table)
    monkeypatch.setattr(table, "_start_tls", started)
    quiet, talking = tls_stub(table, "quiet", heard_at=998.9), tls_stub(table, "talking", heard_at=999.5)
    table.request_handshake(quiet)  # type: ignore[arg-type]
    table.request_handshake(talking)  # type: ignore[arg-type]
    table.sweep(clock.now)  # nobody waits: nobody gives up
    assert quiet.aborted == 0
    waiting = tls_stub(table, "waiting")
    table.request_handshake(waiting)  # type: ignore[arg-type]
    assert quiet.aborted == 1 and talking.aborted == 0 and table.counts == {"handshake_preempted": 1}
    assert started.started == [quiet, talking, waiting]  # the freed slot went to the one waiting


def test_a_handshake_quiet_for_exactly_the_preempt_time_gives_up(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    table = make_table(max_handshakes=1, handshake_preempt=1.0)
    monkeypatch.setattr(table, "_start_tls", Handshakes(table))
    quiet = tls_stub(table, "quiet", heard_at=999.0)
    table.request_handshake(quiet)  # type: ignore[arg-type]
    table.request_handshake(tls_stub(table, "next"))  # type: ignore[arg-type]
    assert quiet.aborted == 1


# -- memory back ------------------------------------------------------------------------------------------------
class Libc:
    def __init__(self) -> None:
        self.trims: list[int] = []

    def malloc_trim(self, pad: int) -> int:
        self.trims.append(pad)
        return 1


def test_memory_is_collected_after_256_closes_and_trimmed_at_most_every_5_s(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    collects: list[int] = []
    monkeypatch.setattr("gpu_exporter.web.table.gc", SimpleNamespace(collect=lambda: collects.append(1)))
    table = make_table(max_connections=1000)
    libc = Libc()
    table._libc = libc

    async def churn(n: int) -> None:
        for _ in range(n):
            admit(table, IDLE).abort()
        await table._give_memory_back()

    asyncio.run(churn(255))
    assert collects == [] and libc.trims == []
    asyncio.run(churn(1))
    assert collects == [1] and libc.trims == [0]
    asyncio.run(churn(256))
    assert collects == [1, 1] and libc.trims == [0]  # collected, but the trim waits for its 5 s
    clock.now += 4.9
    asyncio.run(churn(0))
    assert libc.trims == [0]
    clock.now += 0.1
    asyncio.run(churn(0))
    assert libc.trims == [0, 0]
    asyncio.run(churn(0))
    assert libc.trims == [0, 0]  # nothing new collected: nothing to trim


def test_memory_is_collected_when_64_fewer_are_open_than_at_the_peak(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    collects: list[int] = []
    monkeypatch.setattr("gpu_exporter.web.table.gc", SimpleNamespace(collect=lambda: collects.append(1)))
    table = make_table(max_connections=1000)
    table._libc = None  # not glibc: collected, never trimmed
    stubs = [admit(table, IDLE) for _ in range(100)]
    for s in stubs[:63]:
        s.abort()
    asyncio.run(table._give_memory_back())
    assert collects == []
    stubs[63].abort()
    asyncio.run(table._give_memory_back())
    assert collects == [1]
    asyncio.run(table._give_memory_back())
    assert collects == [1]  # the peak is now what is open


# -- one connection ------------------------------------------------------------------------------------------------
def run(scene: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scene(), 10))


def plain(table: ConnectionTable) -> tuple[Connection, Transport]:
    conn = Connection(table, None)
    transport = Transport(conn)
    conn.connection_made(transport)
    return conn, transport


def feed(conn: Connection, data: bytes) -> None:
    while data:
        buf = conn.get_buffer(len(data))
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        conn.buffer_updated(n)
        data = data[n:]


def test_a_plain_connection_is_served_at_once(clock: Clock) -> None:
    served: list[Connection] = []

    async def handler(conn: Connection) -> None:
        served.append(conn)

    async def scene() -> None:
        table = make_table(handler)
        conn, transport = plain(table)
        await asyncio.sleep(0)
        assert served == [conn] and conn.state == IDLE and len(table) == 1
        assert transport.limits == {"high": 64 * 1024, "low": None} and conn.peer == "192.0.2.1"

    run(scene)


@pytest.mark.parametrize(("peer", "address"), [(("::1", 1, 0, 0), "::1"), (None, ""), ("", ""), ((), "")])
def test_the_peer_address(clock: Clock, peer: Any, address: str) -> None:
    async def scene() -> None:
        conn = Connection(make_table(), None)
        assert conn.peer == ""
        conn.connection_made(Transport(conn, peer=peer))
        assert conn.peer == address

    run(scene)


def test_reading_pauses_at_the_limit_and_resumes_below_it(clock: Clock) -> None:
    async def scene() -> None:
        table = make_table(limit=1000)
        conn, transport = plain(table)
        assert len(conn.get_buffer(-1)) == 1000
        feed(conn, b"x" * 700)
        assert len(conn.get_buffer(-1)) == 300
        feed(conn, b"x" * 100)
        assert len(conn.get_buffer(-1)) == 256  # never empty, however full
        feed(conn, b"GET / HTTP/1.1\r\n\r\n" + b"y" * 181)
        assert conn.buffered() == 999 and transport.events == []
        feed(conn, b"y")
        assert conn.buffered() == 1000 and transport.events == ["pause"]
        feed(conn, b"z")
        assert transport.events == ["pause"]  # paused once
        with pytest.raises(HeadTooLarge):
            await conn.read_until(b"\r\n\r\n\r\n", 1)
        assert await conn.read_until(b"\r\n\r\n", 1) == b"x" * 800 + b"GET / HTTP/1.1\r\n\r\n"
        assert transport.events == ["pause", "resume"] and conn.buffered() == 183
        await conn.discard(183, 1)
        assert transport.events == ["pause", "resume"] and conn.buffered() == 0

    run(scene)


def test_waiting_for_a_request_and_a_head_that_comes_in_pieces(clock: Clock) -> None:
    async def scene() -> None:
        conn, _ = plain(make_table())
        loop = asyncio.get_running_loop()
        for i, piece in enumerate((b"GET / HT", b"TP/1.1\r\n", b"\r", b"\n", b"next")):
            loop.call_later(0.01 * (i + 1), feed, conn, piece)
        assert await conn.wait_for_request(5) is True
        assert await conn.read_until(b"\r\n\r\n", 5) == b"GET / HTTP/1.1\r\n\r\n"
        assert await conn.wait_for_request(5) is True and conn.buffered() == 4
        with pytest.raises(TimeoutError):
            await conn.read_until(b"\r\n\r\n", 0.05)
        loop.call_later(0.01, conn.eof_received)
        with pytest.raises(ConnectionError):
            await conn.read_until(b"\r\n\r\n", 5)

    run(scene)


def test_a_client_that_closes_before_a_request(clock: Clock) -> None:
    async def scene() -> None:
        conn, _ = plain(make_table())
        with pytest.raises(TimeoutError):
            await conn.wait_for_request(0.02)
        asyncio.get_running_loop().call_later(0.01, conn.eof_received)
        assert await conn.wait_for_request(5) is False
        assert await conn.wait_for_request(5) is False

    run(scene)


def test_a_body_is_dropped_across_pieces(clock: Clock) -> None:
    async def scene() -> None:
        conn, _ = plain(make_table())
        feed(conn, b"abc")
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, feed, conn, b"defg")
        loop.call_later(0.02, feed, conn, b"hiNEXT")
        await conn.discard(9, 5)
        assert await conn.read_until(b"NEXT", 1) == b"NEXT"
        await conn.discard(0, 1)

    run(scene)


def test_half_closed_plain_tcp_stays_open_to_be_answered_and_tls_does_not(clock: Clock) -> None:
    async def scene() -> None:
        table = make_table()
        conn, _ = plain(table)
        assert conn.eof_received() is True
        tls = Connection(table, SimpleNamespace(admits=lambda cert: True))  # type: ignore[arg-type]
        assert tls.eof_received() is False
        tls.connection_made(Transport(tls))
        assert tls.eof_received() is False
        before = Connection(table, None)
        assert before.eof_received() is False  # no transport yet

    run(scene)


def test_an_answer_goes_out_in_pieces_with_the_head_in_the_first(clock: Clock) -> None:
    async def scene() -> None:
        conn, transport = plain(make_table())
        body = bytes(range(256)) * (WRITE_CHUNK * 2 // 256 + 10)
        await conn.send(b"HEAD", body, 5)
        assert b"".join(transport.written) == b"HEAD" + body
        assert [len(w) for w in transport.written] == [WRITE_CHUNK, WRITE_CHUNK, len(body) + 4 - 2 * WRITE_CHUNK]
        transport.written.clear()
        await conn.send(b"H" * (WRITE_CHUNK + 1), b"tiny", 5)
        assert transport.written == [b"H" * (WRITE_CHUNK + 1), b"tiny"]
        transport.written.clear()
        await conn.send(b"HEAD", b"", 5)
        assert transport.written == [b"HEAD"]

    run(scene)


def test_a_client_that_does_not_read_stalls_only_its_own_answer(clock: Clock) -> None:
    async def scene() -> None:
        table = make_table()
        conn, transport = plain(table)
        conn.pause_writing()
        sending = asyncio.create_task(conn.send(b"H", b"x" * (WRITE_CHUNK * 2), 5))
        await asyncio.sleep(0.02)
        assert len(transport.written) == 1 and list(table._stalled) == [conn]
        conn.pause_writing()
        conn.resume_writing()
        await asyncio.wait_for(sending, 5)
        assert len(transport.written) == 3 and list(table._stalled) == []
        # Gone while stalled: the wait ends, and so does the answer.
        conn.pause_writing()
        sending = asyncio.create_task(conn.send(b"H", b"x" * (WRITE_CHUNK * 2), 5))
        await asyncio.sleep(0.02)
        conn.connection_lost(None)
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(sending, 5)
        assert list(table._stalled) == [] and len(table) == 0
        with pytest.raises(ConnectionError):
            await conn.send(b"H", b"", 5)

    run(scene)


def test_an_answer_to_a_client_that_is_gone_is_not_written(clock: Clock) -> None:
    async def scene() -> None:
        conn, transport = plain(make_table())
        conn.connection_lost(None)
        with pytest.raises(ConnectionError):
            await conn.send(b"H", b"body", 5)
        assert transport.written == []

    run(scene)


def test_a_stalled_answer_times_out(clock: Clock) -> None:
    async def scene() -> None:
        table = make_table()
        conn, _ = plain(table)
        conn.pause_writing()
        with pytest.raises(TimeoutError):
            await conn.send(b"H", b"x" * (WRITE_CHUNK * 2), 0.05)
        assert list(table._stalled) == []

    run(scene)


def test_close_flushes_and_aborts_after_the_grace(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module, "CLOSE_GRACE", 0.05)

    async def scene() -> None:
        table = make_table()
        conn, transport = plain(table)
        conn.close()
        assert transport.events == ["close"]
        await asyncio.sleep(0.1)
        assert transport.events == ["close", "abort"]
        # One that is gone before the grace ends is not aborted.
        other, other_transport = plain(table)
        other.close()
        other.connection_lost(None)
        await asyncio.sleep(0.1)
        assert other_transport.events == ["close"]
        other.close()
        other.abort()
        assert other_transport.events == ["close"]
        # Before TLS, the raw socket is what is closed.
        tls = Connection(table, SimpleNamespace(admits=lambda cert: True))  # type: ignore[arg-type]
        raw = Transport(tls)
        tls.connection_made(raw)
        tls.close()
        assert raw.events == ["close"]

    run(scene)


def test_connection_lost_forgets_and_wakes_the_reader(clock: Clock) -> None:
    async def scene() -> None:
        table = make_table()
        conn, _ = plain(table)
        reading = asyncio.create_task(conn.read_until(b"\r\n\r\n", 5))
        await asyncio.sleep(0.01)
        conn.connection_lost(None)
        with pytest.raises(ConnectionError):
            await reading
        assert len(table) == 0 and conn.lost

    run(scene)


# -- a TLS connection ---------------------------------------------------------------------------------------------
def test_a_tls_client_waits_for_its_first_bytes_before_a_handshake_slot(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[Connection] = []

    async def handler(conn: Connection) -> None:
        served.append(conn)

    async def scene() -> None:
        table = make_table(handler)
        asked: list[Connection] = []
        monkeypatch.setattr(table, "request_handshake", asked.append)
        tls = SimpleNamespace(admits=lambda cert: cert == {"ok": True})
        conn = Connection(table, tls)  # type: ignore[arg-type]
        raw = Transport(conn)
        conn.connection_made(raw)
        await asyncio.sleep(0)
        assert conn.state == TLS_WAIT and served == [] and len(table) == 1 and asked == []
        assert len(conn.get_buffer(-1)) == 4096
        feed(conn, b"\x16\x03\x01hello")
        assert conn.early == b"\x16\x03\x01hello" and raw.events == ["pause"] and asked == [conn]
        conn.state = HANDSHAKE
        feed(conn, b"more")  # read by the TLS layer from now on, not by us
        assert conn.early == b"\x16\x03\x01hello" and asked == [conn]
        # The handshake is done: a certificate with an allowed name is served ...
        conn.connection_made(Transport(conn, extra={"peercert": {"ok": True}}))
        await asyncio.sleep(0)
        assert served == [conn] and conn.state == IDLE and not conn.refused
        # ... and one without is closed before anything is read.
        other = Connection(table, tls)  # type: ignore[arg-type]
        other_raw = Transport(other)
        other.connection_made(other_raw)
        other.connection_made(Transport(other, extra={"peercert": {"ok": False}}))
        await asyncio.sleep(0)
        assert other.refused and served == [conn] and other_raw.events == ["abort"]
        assert table.counts == {"client_san_refused": 1}

    run(scene)


# -- more edges -----------------------------------------------------------------------------------------------------
def test_the_tables_defaults() -> None:
    table = make_table()
    assert (table.pressure_idle_timeout, table.max_handshakes, table.handshake_timeout, table.handshake_preempt,
            table.max_stalled) == (5.0, 128, 5.0, 1.0, 64)  # fmt: skip
    assert len(table.scratch) == 64 * 1024  # one read at a time, shared by every connection
    assert table._libc is not None and table._libc.malloc_trim.argtypes == [ctypes.c_size_t]


def test_eviction_forgets_at_once_whatever_the_socket_does_later(clock: Clock) -> None:
    table = make_table(max_connections=2)
    old = admit(table, IDLE)
    old.forgets = False  # a real socket reports its loss later
    admit(table, IDLE)
    admit(table, IDLE)
    assert old.aborted == 1 and len(table) == 2 and table.counts == {"evicted_idle": 1}
    admit(table, IDLE)
    assert table.counts == {"evicted_idle": 2}


def test_with_two_of_five_never_speaking_the_silent_that_spoke_go_first(clock: Clock) -> None:
    table = make_table(max_connections=5)
    mute = [admit(table, IDLE, name=f"mute{i}") for i in range(2)]
    silent = admit(table, IDLE, spoke=True, name="silent")
    others = [admit(table, BUSY) for _ in range(2)]
    admit(table, BUSY)
    assert silent.aborted == 1 and [m.aborted for m in mute] == [0, 0] and [o.aborted for o in others] == [0, 0]


def test_a_connection_leaves_its_old_tier_when_it_changes_state(clock: Clock) -> None:
    table = make_table(max_connections=3)
    a = admit(table, IDLE, name="a")  # never spoke
    b = admit(table, READING, name="b")  # active
    table.set_state(a, READING)  # type: ignore[arg-type]
    table.set_state(a, BUSY)  # type: ignore[arg-type]
    table.set_state(b, BUSY)  # type: ignore[arg-type]
    c = admit(table, IDLE, name="c")
    admit(table, IDLE, name="d")  # room is made: neither busy one may go
    assert (a.aborted, b.aborted, c.aborted) == (0, 0, 1)
    assert len(table) == 3


def test_a_failed_handshake_is_forgotten_at_once(clock: Clock) -> None:
    table = make_table()
    stub = tls_stub(table, "x")
    stub.forgets = False
    table._handshake_done(stub, _done(failed=True))  # type: ignore[arg-type]
    assert len(table) == 0 and stub.aborted == 1


def test_a_quiet_handshake_with_bytes_not_yet_read_keeps_its_slot(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    table = make_table(max_handshakes=1, handshake_preempt=1.0)
    monkeypatch.setattr(table, "_start_tls", Handshakes(table))
    a, b = socket.socketpair()
    try:
        quiet = tls_stub(table, "quiet", heard_at=900.0)
        quiet.raw = Transport(extra={"socket": a})  # type: ignore[assignment]
        b.sendall(b"the rest of the handshake")  # arrived, but the busy loop has not read it yet
        table.request_handshake(quiet)  # type: ignore[arg-type]
        table.request_handshake(tls_stub(table, "next"))  # type: ignore[arg-type]
        assert quiet.aborted == 0 and table.counts == {}
    finally:
        a.close()
        b.close()


def test_pending_input() -> None:
    import socket

    from gpu_exporter.web.table import _pending_input

    a, b = socket.socketpair()
    try:
        assert _pending_input(Transport(extra={"socket": a})) is False
        b.sendall(b"x")
        assert _pending_input(Transport(extra={"socket": a})) is True
        assert _pending_input(None) is False and _pending_input(Transport()) is False
        a.close()
        assert _pending_input(Transport(extra={"socket": a})) is False  # closed: fileno() is -1
    finally:
        a.close()
        b.close()


def test_the_trim_is_not_repeated_without_new_garbage(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    collects: list[int] = []
    monkeypatch.setattr("gpu_exporter.web.table.gc", SimpleNamespace(collect=lambda: collects.append(1)))
    table = make_table(max_connections=1000)
    libc = Libc()
    table._libc = libc
    for _ in range(200):
        admit(table, IDLE)  # open, none closed: nothing to collect
    asyncio.run(table._give_memory_back())
    assert collects == []
    for stub in list(table._open)[:56]:
        stub.abort()  # 256 accepted - 144 open = 56 closed, 56 below the peak: still nothing
    asyncio.run(table._give_memory_back())
    assert collects == []
    for _ in range(256):
        admit(table, IDLE).abort()
    asyncio.run(table._give_memory_back())
    assert collects == [1] and libc.trims == [0]
    for step in (5.0, 5.0, 10.0):
        clock.now += step
        asyncio.run(table._give_memory_back())
    assert collects == [1] and libc.trims == [0]


def test_a_finished_handler_leaves_no_task_and_abort_all_ends_the_others(clock: Clock) -> None:
    async def scene() -> None:
        forever = asyncio.Event()
        done: list[str] = []

        async def handler(conn: Connection) -> None:
            if conn.peer == "192.0.2.1":
                return
            try:
                await forever.wait()
            except asyncio.CancelledError:
                done.append("cancelled")
                raise

        table = make_table(handler)
        plain(table)
        conn = Connection(table, None)
        transport = Transport(conn, peer=("192.0.2.2", 1))
        conn.connection_made(transport)
        await asyncio.sleep(0.01)
        assert len(table._tasks) == 1  # the first handler ended and was dropped; the second runs
        table.abort_all()
        await asyncio.sleep(0.01)
        assert done == ["cancelled"] and transport.events == ["abort"] and len(table._tasks) == 0

    run(scene)


def test_the_sweep_runs_twice_a_second_and_says_what_it_cut(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    from structlog.testing import capture_logs

    async def scene() -> list[Any]:
        table = make_table(read_timeout=10.0)
        stale = admit(table, TLS_WAIT)
        stale.accepted_at = clock.now - 11
        with capture_logs() as logs:
            sweeping = asyncio.create_task(table.sweep_forever())
            await asyncio.sleep(0.7)
            assert stale.aborted == 1
            clock.now += 10.0
            await asyncio.sleep(0.6)
            clock.now += 5.0  # half the interval: no line
            await asyncio.sleep(0.6)
            clock.now += 5.0
            await asyncio.sleep(0.6)
            sweeping.cancel()
        return logs

    logs = run(scene)
    lines = [line for line in logs if line["event"] == "http_connections"]
    assert len(lines) == 2 and lines[0]["timed_out_tls_wait"] == 1 and lines[0]["accepted"] == 1, logs
    assert [line for line in logs if line["event"] != "http_connections"] == []


def test_reading_stops_at_exactly_the_limit(clock: Clock) -> None:
    async def scene() -> None:
        conn, _ = plain(make_table(limit=1000))
        feed(conn, b"x" * 1000)
        with pytest.raises(HeadTooLarge):
            await conn.read_until(b"\r\n\r\n", 5)

    run(scene)


def test_a_head_ends_at_the_first_empty_line_and_a_pipelined_one_waits(clock: Clock) -> None:
    async def scene() -> None:
        conn, _ = plain(make_table())
        feed(conn, b"A\r\n\r\nB\r\n\r\n")
        assert await conn.read_until(b"\r\n\r\n", 1) == b"A\r\n\r\n"
        assert await conn.read_until(b"\r\n\r\n", 1) == b"B\r\n\r\n"

    run(scene)


def test_bytes_after_a_read_that_waited_wake_nobody_and_break_nothing(clock: Clock) -> None:
    async def scene() -> None:
        conn, _ = plain(make_table())
        asyncio.get_running_loop().call_later(0.01, feed, conn, b"GET")
        assert await conn.wait_for_request(5) is True
        feed(conn, b" / HTTP/1.0\r\n\r\n")  # no reader waits now
        conn.resume_writing()  # and no writer
        assert await conn.read_until(b"\r\n\r\n", 1) == b"GET / HTTP/1.0\r\n\r\n"

    run(scene)


def test_a_body_that_does_not_come_times_out_and_is_dropped_to_the_byte(clock: Clock) -> None:
    async def scene() -> None:
        conn, _ = plain(make_table())
        feed(conn, b"12345")
        with pytest.raises(TimeoutError):
            await conn.discard(6, 0.05)
        feed(conn, b"6789")
        await conn.discard(2, 1)
        assert conn.buffered() == 2

    run(scene)


def test_an_answer_that_is_not_held_up_does_not_count_as_stalled(clock: Clock) -> None:
    async def scene() -> None:
        table = make_table(max_stalled=1)
        waiting, _ = plain(table)
        waiting.pause_writing()
        stalled = asyncio.create_task(waiting.send(b"H", b"x" * (WRITE_CHUNK * 2), 5))
        await asyncio.sleep(0.02)
        other, _ = plain(table)
        await other.send(b"H", b"x" * (WRITE_CHUNK * 2), 5)  # its client reads: never stalled
        assert list(table._stalled) == [waiting] and table.counts == {}
        waiting.resume_writing()
        await stalled

    run(scene)


def test_a_new_connection_has_not_spoken_and_is_timed_from_its_accept(clock: Clock) -> None:
    async def scene() -> None:
        table = make_table()
        conn = Connection(table, SimpleNamespace(admits=lambda cert: True))  # type: ignore[arg-type]
        conn.connection_made(Transport(conn))
        assert (conn.state, conn.spoke, conn.accepted_at, conn.since) == (TLS_WAIT, False, clock.now, clock.now)
        plain_conn, _ = plain(table)
        assert (plain_conn.state, plain_conn.spoke) == (IDLE, False)

    run(scene)


def test_reading_resumes_only_below_the_limit(clock: Clock) -> None:
    async def scene() -> None:
        conn, transport = plain(make_table(limit=1000))
        feed(conn, b"\r\n\r\n" + b"x" * 1000)  # one read past the limit: paused
        assert transport.events == ["pause"]
        assert await conn.read_until(b"\r\n\r\n", 1) == b"\r\n\r\n"
        assert conn.buffered() == 1000 and transport.events == ["pause"]  # at the limit: still paused
        await conn.discard(1, 1)
        assert transport.events == ["pause", "resume"]

    run(scene)
