"""The web server's own rules (gpu_exporter/web/server.py), one request at a time over a real socket:
what it answers to each method and path, what a connection may hold, and what it does with the
pages it is given.  Fast; the attacks at scale are in test_web_hostile.py."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter import __version__
from gpu_exporter.web.auth import Passwords
from gpu_exporter.web.config import WebConfig
from gpu_exporter.web.fds import connection_cap
from gpu_exporter.web.server import HttpServer
from gpu_exporter.web.watcher import WebConfigWatcher
from tests.timing import NEVER_S, wait_until
from tests.web_helpers import basic, hashed

pytestmark = pytest.mark.integration

OK = (200, b"hello\n", "text/plain; charset=utf-8", {"X-Page": "1"})


def big_size() -> int:
    """More than the server's socket buffer can take (the client's is made small): four times the
    most Linux lets a send buffer grow to here, and at least 16 MiB."""
    try:
        wmem_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        wmem_max = 4 << 20
    return max(16 << 20, 4 * wmem_max)


BIG = big_size()
PAGES: dict[str, Any] = {
    "/hello": lambda headers: OK,
    "/healthz": lambda headers: (200, b"ok\n", "text/plain", {}),
    "/echo": lambda headers: (200, repr(sorted(headers.items())).encode(), "text/plain", {}),
    "/json": lambda headers: (200, b"{}", "application/json", {}),
    "/big": lambda headers: (200, b"x" * BIG, "application/octet-stream", {}),
}


@contextmanager
def serving(tmp_path: Path | None = None, web: Mapping[str, Any] | None = None, **kw: Any) -> Iterator[HttpServer]:
    path = None
    if web is not None:
        assert tmp_path is not None
        path = tmp_path / "web.yml"
        path.write_text(yaml.safe_dump(dict(web)))
    srv = HttpServer("127.0.0.1:0", PAGES, web=WebConfigWatcher(path), **kw)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def answers(port: int, data: bytes, n: int = 1, timeout: float = 10) -> tuple[list[bytes], bool]:
    """Send ``data``; read ``n`` answers (head and body); and whether the server then closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        got: list[bytes] = []
        buf = b""
        for _ in range(n):
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    return got, True
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = int(next(x for x in head.split(b"\r\n") if x.startswith(b"Content-Length:")).split(b":")[1])
            is_head = data.startswith(b"HEAD") and len(got) == 0
            while not is_head and len(buf) < length:
                buf += recv_some(s)
            body = b"" if is_head else buf[:length]
            buf = buf if is_head else buf[length:]
            got.append(head + b"\r\n\r\n" + body)
        s.settimeout(0.5)
        try:
            closed = s.recv(1) == b""
        except TimeoutError:
            closed = False
        return got, closed


def recv_some(s: socket.socket) -> bytes:
    """The next bytes; a close where more was due fails the test at once (a loop on b"" would spin)."""
    chunk = s.recv(65536)
    if not chunk:
        raise AssertionError("the server closed the connection in the middle of an answer")
    return chunk


def until_hello(s: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"hello\n"):
        data += recv_some(s)
    return data


def header(answer: bytes, name: bytes) -> bytes | None:
    for line in answer.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b": ")
        if key.lower() == name.lower():
            return value
    return None


GET = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_page_is_served_with_its_headers_and_the_servers() -> None:
    with serving() as srv:
        [answer], closed = answers(srv.port, GET)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nhello\n") and not closed
    assert header(answer, b"Server") == f"gpu-exporter/{__version__}".encode()
    assert header(answer, b"Content-Type") == b"text/plain; charset=utf-8" and header(answer, b"X-Page") == b"1"
    assert header(answer, b"Content-Length") == b"6" and header(answer, b"Connection") == b"keep-alive"


def test_a_page_is_given_the_requests_headers() -> None:
    with serving() as srv:
        [answer], _ = answers(srv.port, b"GET /echo?q=1 HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\n\r\n")
    assert answer.endswith(b"[('accept-encoding', 'gzip'), ('host', 'h')]")


def test_an_unknown_path_is_404_naming_the_pages() -> None:
    with serving() as srv:
        [answer], closed = answers(srv.port, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 404 Not Found\r\n") and not closed
    assert answer.endswith(b"\r\n\r\nnot found; the pages are /big, /echo, /healthz, /hello, /json\n")


def test_head_gets_the_length_and_no_body() -> None:
    with serving() as srv:
        [head, get], _ = answers(srv.port, b"HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n" + GET, n=2)
    assert (
        head.startswith(b"HTTP/1.1 200 OK\r\n")
        and head.endswith(b"\r\n\r\n")
        and header(head, b"Content-Length") == b"6"
    )
    assert get.startswith(b"HTTP/1.1 200 OK\r\n") and get.endswith(b"\r\n\r\nhello\n")  # nothing sent after HEAD's head


def test_a_page_gives_its_own_content_type() -> None:
    with serving() as srv:
        [answer], _ = answers(srv.port, b"GET /json HTTP/1.1\r\nHost: x\r\n\r\n")
    assert header(answer, b"Content-Type") == b"application/json" and answer.endswith(b"\r\n\r\n{}")


@pytest.mark.parametrize("method", [b"POST", b"PUT", b"DELETE", b"OPTIONS"])
def test_other_methods_get_405_and_the_connection_stays(method: bytes) -> None:
    with serving() as srv:
        [refused, served], closed = answers(
            srv.port, method + b" /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" + GET, n=2
        )
    assert refused.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and header(refused, b"Allow") == b"GET, HEAD"
    assert (
        refused.endswith(b"method not allowed; use GET or HEAD\n") and header(refused, b"Connection") == b"keep-alive"
    )
    assert served.endswith(b"hello\n") and not closed  # the body was dropped to the byte


def test_405_to_a_client_that_closes_closes() -> None:
    with serving() as srv:
        [refused], closed = answers(srv.port, b"POST /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 405 ") and header(refused, b"Connection") == b"close" and closed


def test_beyond_max_requests_503_and_closed() -> None:
    with serving(max_requests=0) as srv:
        [answer], closed = answers(srv.port, GET)
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and closed
    assert answer.endswith(b"too many concurrent requests\n") and header(answer, b"Connection") == b"close"


def test_the_web_configs_headers_go_on_every_answer(tmp_path: Path) -> None:
    with serving(tmp_path, {"http_server_config": {"headers": {"X-Frame-Options": "deny"}}}) as srv:
        got, _ = answers(
            srv.port, GET + b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\nPOST /hello HTTP/1.1\r\nHost: x\r\n\r\n", n=3
        )
    assert [header(a, b"X-Frame-Options") for a in got] == [b"deny"] * 3


def test_the_web_configs_headers_go_on_a_503_too(tmp_path: Path) -> None:
    with serving(tmp_path, {"http_server_config": {"headers": {"X-Frame-Options": "deny"}}}, max_requests=0) as srv:
        [answer], _ = answers(srv.port, GET)
    assert answer.startswith(b"HTTP/1.1 503 ") and header(answer, b"X-Frame-Options") == b"deny"


def test_beyond_the_rate_limit_a_429_says_why_and_keeps_the_connection(tmp_path: Path) -> None:
    with serving(tmp_path, {"rate_limit": {"interval": "1h", "burst": 1}}) as srv:
        [served, refused], closed = answers(srv.port, GET * 2, n=2)
    assert served.endswith(b"hello\n") and refused.startswith(b"HTTP/1.1 429 Too Many Requests\r\n") and not closed
    assert refused.endswith(b"\r\n\r\ntoo many requests (rate_limit in the web config)\n")
    # An hour for the next token, less the moment between the two requests, rounded up.
    assert header(refused, b"Connection") == b"keep-alive" and header(refused, b"Retry-After") in (b"3599", b"3600")


def test_a_bad_request_is_answered_and_closed() -> None:
    with serving() as srv:
        [answer], closed = answers(srv.port, b"GET /hello HTTP/1.1\r\nBad Header\r\n\r\n" + GET)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and answer.endswith(b"malformed header\n") and closed
    assert header(answer, b"Connection") == b"close"


@pytest.mark.parametrize(
    "data",
    [b"GET /hello HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 180,  # no end within the limit: not read further
     b"GET /hello HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 190 + b"\r\n\r\n"],  # ends, but past the limit
)  # fmt: skip
def test_a_head_too_large_is_431_and_closed(data: bytes) -> None:
    assert 200 < len(data) < 256  # read whole at once: the close is a FIN, not a reset that could eat the answer
    with serving(max_header_bytes=200) as srv:
        [answer], closed = answers(srv.port, data)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n") and closed
    assert header(answer, b"Connection") == b"close"
    assert answer.endswith(b"request head too large\n")


def test_pipelined_requests_are_answered_in_order_up_to_the_limit() -> None:
    with serving(max_pipelined=3) as srv:
        got, closed = answers(srv.port, GET * 5, n=3)
    assert len(got) == 3 and all(a.endswith(b"hello\n") for a in got) and closed
    assert [header(a, b"Connection") for a in got] == [b"keep-alive", b"keep-alive", b"close"]


def test_requests_one_after_the_other_are_not_pipelining() -> None:
    with serving(max_pipelined=1) as srv, socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        for _ in range(3):
            s.sendall(GET)
            data = until_hello(s)
            assert header(data, b"Connection") == b"keep-alive"


def test_a_client_silent_before_its_first_request_is_closed_after_the_read_timeout() -> None:
    with (
        serving(read_timeout=0.2, idle_timeout=60.0) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s,
    ):
        assert s.recv(1) == b""  # closed by the server, long before the idle timeout


def test_a_head_that_never_ends_is_closed_after_the_read_timeout() -> None:
    with serving(read_timeout=0.2) as srv, socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
        assert s.recv(65536) == b""


def test_a_keep_alive_connection_is_closed_after_the_idle_timeout() -> None:
    with (
        serving(read_timeout=60.0, idle_timeout=0.2) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s,
    ):
        s.sendall(GET)
        until_hello(s)
        assert s.recv(1) == b""  # after the answer, the idle timeout, not the read timeout


def test_probes_need_no_password_and_the_rest_does(tmp_path: Path) -> None:
    with serving(tmp_path, {"basic_auth_users": {"prom": hashed("pw")}}) as srv:
        [probe], _ = answers(srv.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        [refused], closed = answers(srv.port, GET)
        good = basic("prom", "pw")["Authorization"].encode()
        [served], _ = answers(srv.port, b"GET /hello HTTP/1.1\r\nHost: x\r\nAuthorization: " + good + b"\r\n\r\n")
    assert probe.startswith(b"HTTP/1.1 200 ")
    assert refused.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and refused.endswith(b"unauthorized\n") and not closed
    assert header(refused, b"WWW-Authenticate") == b'Basic realm="gpu-exporter", charset="UTF-8"'
    assert served.endswith(b"hello\n")


def test_open_paths_are_the_servers_choice(tmp_path: Path) -> None:
    with serving(tmp_path, {"basic_auth_users": {"prom": hashed("pw")}}, open_paths=frozenset({"/hello"})) as srv:
        [hello], _ = answers(srv.port, GET)
        [probe], _ = answers(srv.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert hello.startswith(b"HTTP/1.1 200 ") and probe.startswith(b"HTTP/1.1 401 ")


def test_stop_closes_what_is_open_and_stops_listening() -> None:
    srv = HttpServer("127.0.0.1:0", PAGES)
    srv.start()
    port = srv.port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as held:
        held.sendall(GET)
        until_hello(held)
        srv.stop()
        assert held.recv(1) == b""
        srv._thread.join(NEVER_S)  # stop() waits 2 s for the loop; a busy machine may take longer
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_ipv6_and_every_interface() -> None:
    try:  # only a host without IPv6 skips: the server failing on ::1 where a plain socket can bind it fails
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no ::1 here")
    srv = HttpServer("[::1]:0", PAGES)
    srv.start()
    try:
        with socket.create_connection(("::1", srv.port), timeout=10) as s:
            s.sendall(GET)
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        srv.stop()
    any_v4 = HttpServer(":0", PAGES)
    try:
        assert any_v4._sock.getsockname()[0] == "0.0.0.0"
    finally:
        any_v4.stop()


# -- requests that wait: password checks held by the test ---------------------------------------------
class HeldPasswords(Passwords):
    """Every check waits until the test lets it go, and then lets the user in: a request stays
    "being answered" for as long as the test wants, without any timing."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def remembered(self, config: WebConfig, header: str | None) -> bool | None:
        return None

    def check(self, config: WebConfig, header: str | None) -> bool:
        self.entered.release()
        self.release.wait(NEVER_S)
        return True


PROM = {"basic_auth_users": {"prom": hashed("pw")}}  # the one user AUTHED names
AUTHED = (
    b"GET /hello HTTP/1.1\r\nHost: x\r\nAuthorization: " + basic("prom", "pw")["Authorization"].encode() + b"\r\n\r\n"
)


def sent(port: int, data: bytes, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    s.sendall(data)
    return s


def answer_on(s: socket.socket) -> bytes:
    """One whole answer (head and Content-Length bytes of body) on a connection, which is then closed."""
    with s:
        data = b""
        while b"\r\n\r\n" not in data:
            data += recv_some(s)
        head = data.partition(b"\r\n\r\n")[0]
        length = int(next(x for x in head.split(b"\r\n") if x.startswith(b"Content-Length:")).split(b":")[1])
        while len(data) < len(head) + 4 + length:
            data += recv_some(s)
        return data


def other_host() -> str:
    """127.0.0.2: another client host on Linux (all of 127/8 is loopback); skip where it is not."""
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
    except OSError:
        pytest.skip("127.0.0.2 is not a local address here")
    return "127.0.0.2"


def test_requests_being_answered_are_counted_and_beyond_max_requests_get_503(tmp_path: Path) -> None:
    held = HeldPasswords()
    with serving(tmp_path, PROM, passwords=held, max_requests=2, auth_workers=3, auth_per_host=3) as srv:
        for _ in range(3):  # answered one after the other: each gives its slot back, no more, no less
            [probe], _ = answers(srv.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert probe.startswith(b"HTTP/1.1 200 ")
        first, second = sent(srv.port, AUTHED), sent(srv.port, AUTHED)
        assert held.entered.acquire(timeout=NEVER_S) and held.entered.acquire(timeout=NEVER_S)
        [refused], closed = answers(srv.port, AUTHED)  # at once, while the two are held
        held.release.set()
        assert answer_on(first).endswith(b"hello\n") and answer_on(second).endswith(b"hello\n")
        [after], _ = answers(srv.port, AUTHED)
    assert refused.startswith(b"HTTP/1.1 503 ") and closed
    assert after.endswith(b"hello\n")  # the slots given back


def test_each_client_host_has_its_own_share_of_password_checks(tmp_path: Path) -> None:
    held = HeldPasswords()
    with serving(tmp_path, PROM, passwords=held, auth_workers=2, auth_queue=2, auth_per_host=1) as srv:
        first = sent(srv.port, AUTHED)
        assert held.entered.acquire(timeout=NEVER_S)
        [refused], closed = answers(srv.port, AUTHED)  # the same host, while its check is held
        other = sent(srv.port, AUTHED, source=other_host())  # another host: a check of its own
        assert held.entered.acquire(timeout=NEVER_S)
        held.release.set()
        assert answer_on(first).endswith(b"hello\n") and answer_on(other).endswith(b"hello\n")
    assert refused.startswith(b"HTTP/1.1 429 Too Many Requests\r\n") and closed
    assert refused.endswith(b"\r\n\r\ntoo many password checks at once; retry later\n")
    assert header(refused, b"Retry-After") == b"1" and header(refused, b"Connection") == b"close"


def test_beyond_the_checks_waiting_a_password_gets_429(tmp_path: Path) -> None:
    held = HeldPasswords()
    with serving(tmp_path, PROM, passwords=held, auth_workers=1, auth_queue=1, auth_per_host=5) as srv:
        running = sent(srv.port, AUTHED)
        assert held.entered.acquire(timeout=NEVER_S)
        waiting = sent(srv.port, AUTHED)  # auth_per_host=5: the same host may wait
        # The one waiting must be in the queue before the next comes: its request has been read.
        assert wait_until(lambda: srv._gate._pending == 2)
        [refused], _ = answers(srv.port, AUTHED)
        held.release.set()
        assert answer_on(running).endswith(b"hello\n") and answer_on(waiting).endswith(b"hello\n")
    assert refused.startswith(b"HTTP/1.1 429 ")


def test_a_401_to_a_client_that_closes_closes(tmp_path: Path) -> None:
    with serving(tmp_path, {"basic_auth_users": {"prom": hashed("pw")}}) as srv:
        [refused], closed = answers(srv.port, b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 401 ") and header(refused, b"Connection") == b"close" and closed


def closed_to_make_room(srv: HttpServer) -> int:
    return sum(n for why, n in srv.connections.counts.items() if why.startswith("evicted_"))


def test_a_request_being_answered_is_never_closed_to_make_room(tmp_path: Path) -> None:
    held = HeldPasswords()
    with serving(tmp_path, PROM, passwords=held, max_connections=16, read_timeout=NEVER_S) as srv:
        busy = sent(srv.port, AUTHED)
        assert held.entered.acquire(timeout=NEVER_S)
        # Slow clients, each in the middle of its request head: each new one closes the oldest.
        slow = [sent(srv.port, b"GET /hello HTTP/1.1\r\n") for _ in range(24)]
        assert wait_until(lambda: srv.connections.accepted == 25)
        held.release.set()
        answer = answer_on(busy)
        evicted = closed_to_make_room(srv)
        for s in slow:
            s.close()
    assert answer.endswith(b"hello\n") and evicted >= 9  # the table was full, and the busy one kept


def test_a_client_that_spoke_outlasts_the_ones_that_never_did(tmp_path: Path) -> None:
    with (
        serving(max_connections=16, read_timeout=NEVER_S, pressure_idle_timeout=NEVER_S) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=10) as scraper,
    ):
        scraper.sendall(GET)
        until_hello(scraper)
        mute = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(24)]
        assert wait_until(lambda: srv.connections.accepted == 25)
        scraper.sendall(GET)
        data = until_hello(scraper)
        evicted = closed_to_make_room(srv)
        for s in mute:
            s.close()
    assert data.startswith(b"HTTP/1.1 200 ") and evicted >= 9


def test_a_body_that_never_comes_is_given_up_after_the_read_timeout() -> None:
    with (
        serving(read_timeout=0.2) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=NEVER_S) as s,
    ):
        s.sendall(b"POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        assert s.recv(65536) == b""  # closed, no answer: before NEVER_S, which a missing deadline would hit


def test_a_client_that_does_not_take_its_answer_is_closed_after_the_write_timeout() -> None:
    with serving(write_timeout=0.2) as srv, socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(NEVER_S)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_until(lambda: srv.connections.accepted == 1 and len(srv.connections) == 0)
        got = b""
        with contextlib.suppress(ConnectionResetError):  # the unsent rest is dropped with a reset
            while chunk := s.recv(1 << 20):
                got += chunk
    # The answer had started (no failed page, no refusal), and was cut off.
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and len(got) < BIG


# -- start and stop -----------------------------------------------------------------------------------
def test_a_loop_that_cannot_serve_fails_start_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    srv = HttpServer("127.0.0.1:0", PAGES)
    port = srv.port

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("no server for you")

    monkeypatch.setattr(srv._loop, "create_server", broken)
    with pytest.raises(OSError, match="no server for you"):
        srv.start()
    assert srv._loop.is_closed()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_stop_closes_the_loop() -> None:
    never_started = HttpServer("127.0.0.1:0", PAGES)
    never_started.stop()
    assert never_started._loop.is_closed()
    srv = HttpServer("127.0.0.1:0", PAGES)
    srv.start()
    assert answers(srv.port, GET)[0][0].endswith(b"hello\n")
    srv.stop()
    srv._thread.join(NEVER_S)  # stop() waits 2 s for the loop; a busy machine may take longer
    assert srv._loop.is_closed()


def test_stop_returns_while_a_page_hangs_and_the_loop_ends_when_it_does() -> None:
    release, entered = threading.Event(), threading.Event()

    def hangs(_: Mapping[str, str]) -> Any:
        entered.set()
        release.wait(NEVER_S)
        return OK

    srv = HttpServer("127.0.0.1:0", {**PAGES, "/hangs": hangs})
    srv.start()
    port = srv.port
    client = sent(port, b"GET /hangs HTTP/1.1\r\nHost: x\r\n\r\n")
    assert entered.wait(NEVER_S)
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            srv.stop()
        except BaseException as e:  # what stop() would raise to the daemon's shutdown
            errors.append(e)

    stopper = threading.Thread(target=stop)
    stopper.start()
    stopper.join(NEVER_S)
    returned = not stopper.is_alive()
    release.set()
    stopper.join(NEVER_S)
    srv._thread.join(NEVER_S)
    client.close()
    assert returned and errors == [] and not srv._thread.is_alive() and srv._loop.is_closed()
    with pytest.raises(OSError):  # the loop closed the listening socket on its way out
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_stop_returns_while_something_holds_the_loop_itself_and_it_ends_after() -> None:
    """The daemon's shutdown never waits on the web server's loop: where a callback holds the loop's
    own thread (a bug elsewhere, a library that blocks), stop() gives up on it after its bound, and
    the loop still stops and closes once it is let go."""
    release, entered = threading.Event(), threading.Event()

    def holds() -> None:
        entered.set()
        release.wait(NEVER_S)

    srv = HttpServer("127.0.0.1:0", PAGES)
    srv.start()
    srv._loop.call_soon_threadsafe(holds)
    assert entered.wait(NEVER_S)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    stopper.join(NEVER_S / 2)  # a deadline: stop() waits a few seconds at most, never for the loop
    returned = not stopper.is_alive()
    release.set()
    stopper.join(NEVER_S)
    srv._thread.join(NEVER_S)
    assert returned and not srv._thread.is_alive() and srv._loop.is_closed()


def test_a_process_that_ends_without_stop_is_not_held_by_the_server() -> None:
    code = (
        "from gpu_exporter.web.server import HttpServer\n"
        "srv = HttpServer('127.0.0.1:0', {}); srv.start(); print(srv.port, flush=True)\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=NEVER_S)
    assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stderr


# -- the bounds docs/security.md states are the ones the daemon's server enforces ---------------------
def documented_row(resource: str) -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    [row] = [line for line in text.splitlines() if line.startswith(f"| {resource} |")]
    return row


def test_the_documented_bounds_are_the_servers_own() -> None:
    # The daemon gives the server only max_requests (from --web.max-requests); every other bound is
    # the server's default, which is what the table promises.
    srv = HttpServer("127.0.0.1:0", PAGES)
    try:
        table, gate = srv.connections, srv._gate
        checks: list[tuple[str, str, object, object]] = [
            ("connections", "512 places (fewer if the file limit is low)", table.max_connections, connection_cap(512)),
            ("idle time", "10 s for the first request, 120 s between", (srv._read_timeout, srv._idle_timeout),
             (10.0, 120.0)),
            ("idle time", "over half the places taken: 5 s", table.pressure_idle_timeout, 5.0),
            ("request head", "16 KiB within 10 s", (srv._max_header_bytes, table.limit, table.read_timeout),
             (16384, 16384, 10.0)),
            ("requests being answered", "(40)", srv._max_requests, 40),
            ("a slow reader", "30 s to take it all", srv._write_timeout, 30.0),
            ("clients that do not read", "64 connections waiting", table.max_stalled, 64),
            ("pipelining", "16 requests in a row", srv._max_pipelined, 16),
            ("TLS handshakes", "128 at once, 5 s each", (table.max_handshakes, table.handshake_timeout), (128, 5.0)),
            ("password checks", "one bcrypt thread, 4 waiting, one running or waiting per client host",
             (gate._pool._max_workers, gate._limit, gate._per_host), (1, 1 + 4, 1)),
        ]  # fmt: skip
        for resource, words, actual, promised in checks:
            assert words in documented_row(resource), (resource, words)
            assert actual == promised, (resource, words, actual)
    finally:
        srv.stop()


def test_each_bound_given_is_the_one_its_part_enforces() -> None:
    srv = HttpServer("127.0.0.1:0", PAGES, max_connections=100, read_timeout=1.5, pressure_idle_timeout=2.5,
                     max_handshakes=7, handshake_timeout=3.5, max_stalled_writers=9, auth_workers=2, auth_queue=3,
                     auth_per_host=4, max_header_bytes=999)  # fmt: skip
    try:
        table, gate = srv.connections, srv._gate
        assert (table.max_connections, table.read_timeout, table.pressure_idle_timeout) == (100, 1.5, 2.5)
        assert (table.max_handshakes, table.handshake_timeout, table.max_stalled, table.limit) == (7, 3.5, 9, 999)
        assert (gate._pool._max_workers, gate._limit, gate._per_host) == (2, 2 + 3, 4)
    finally:
        srv.stop()
