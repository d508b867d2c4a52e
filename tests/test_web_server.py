"""The web server's own rules (gpu_exporter/web/server.py), one request at a time over a real socket:
what it answers to each method and path, what a connection may hold, and what it does with the
pages it is given.  Fast; the attacks at scale are in test_web_hostile.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter import __version__
from gpu_exporter.web.server import HttpServer
from gpu_exporter.web.tls import AdapterError
from gpu_exporter.web.watcher import WebConfigWatcher
from tests.web_helpers import basic, hashed

OK = (200, b"hello\n", "text/plain; charset=utf-8", {"X-Page": "1"})
PAGES: dict[str, Any] = {
    "/hello": lambda headers: OK,
    "/healthz": lambda headers: (200, b"ok\n", "text/plain", {}),
    "/echo": lambda headers: (200, repr(sorted(headers.items())).encode(), "text/plain", {}),
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
    assert answer.endswith(b"\r\n\r\nnot found; the pages are /echo, /healthz, /hello\n")


def test_head_gets_the_length_and_no_body() -> None:
    with serving() as srv:
        [head, get], _ = answers(srv.port, b"HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n" + GET, n=2)
    assert (
        head.startswith(b"HTTP/1.1 200 OK\r\n")
        and head.endswith(b"\r\n\r\n")
        and header(head, b"Content-Length") == b"6"
    )
    assert get.endswith(b"hello\n")


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
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_ipv6_and_every_interface() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        srv = HttpServer("[::1]:0", PAGES)
    except OSError:
        pytest.skip("no ::1 here")
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


def test_a_python_whose_asyncio_changed_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed() -> None:
        raise AdapterError("Python 3.99: asyncio.sslproto.SSLProtocol lacks ...")

    monkeypatch.setattr("gpu_exporter.web.server.check_runtime", changed)
    with pytest.raises(AdapterError, match=r"3\.99"):
        HttpServer("127.0.0.1:0", PAGES)
