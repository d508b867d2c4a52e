"""What a client can make the server write to its log, and requests that must be refused, not
crash (issue 28): a Content-Length of Unicode digits, a password longer than bcrypt reads, an
11 KB user name, ``Connection: keep-alive, close``, HTTP/1.1 without ``Host``.

Each case is sent as an attacker would, over a real socket, with the server's log captured.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from gpu_exporter.web.pacing import Pacer
from gpu_exporter.web.server import HttpServer
from tests.web_helpers import basic, get, hashed, raw, server


def test_a_content_length_of_unicode_digits_is_a_400_and_no_traceback(tmp_path: Path) -> None:
    # "\xb2" is "²" in Latin-1: str.isdigit() says yes, int() says no.  2,000 of them gave 2,000 tracebacks.
    with server(tmp_path) as srv, capture_logs() as logs:
        for length in (b"\xb2", b"\xb9", b"1\xb2", b"\xbc"):
            answer = raw(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and answer.endswith(
                b"\r\n\r\nbad content-length\n"
            )
        for _ in range(200):
            assert raw(srv.port, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n").startswith(
                b"HTTP/1.1 400"
            )
    assert logs == []


def test_connection_keep_alive_close_closes(tmp_path: Path) -> None:
    with server(tmp_path) as srv, socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):  # ends only if the server closes
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nConnection: close\r\n" in answer


def test_http_1_1_without_host_is_refused_and_http_1_0_is_served(tmp_path: Path) -> None:
    with server(tmp_path) as srv:
        answer = raw(srv.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and answer.endswith(b"missing host header\n")
        assert b"gpu_up" not in answer
        assert raw(srv.port, b"GET /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_password_longer_than_bcrypt_reads_is_wrong_without_a_check_or_a_log_line(tmp_path: Path) -> None:
    # bcrypt 5 raises on more than 72 bytes; that was logged at error level, with the user name the
    # client chose (11 KB of it: 22 MB of logs in 4.4 s).
    user = "u" * 11_000
    with server(tmp_path, {"basic_auth_users": {"prom": hashed("pw")}}) as srv, capture_logs() as logs:
        for name in (user, "prom"):
            for password in ("p" * 73, "\u00e9" * 37, "p" * 1000):
                status, headers, _ = get(srv.port, headers=basic(name, password))
                assert status == 401 and "WWW-Authenticate" in headers
        assert get(srv.port, headers=basic("prom", "pw"))[0] == 200
        assert srv.passwords.remembered(srv.web.current(), basic("prom", "p" * 73)["Authorization"]) is False
    assert logs == []


def test_a_password_of_exactly_72_bytes_is_checked(tmp_path: Path) -> None:
    password = "\u00e9" * 36  # 72 bytes in UTF-8
    with server(tmp_path, {"basic_auth_users": {"prom": hashed(password)}}) as srv:
        assert get(srv.port, headers=basic("prom", password))[0] == 200
        assert get(srv.port, headers=basic("prom", password[:-1] + "e"))[0] == 401


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def failing_page(_: Mapping[str, str]) -> Any:
    raise RuntimeError("a page that fails")


def test_failures_a_client_can_cause_are_logged_at_most_once_an_interval_with_a_count(tmp_path: Path) -> None:
    clock = Clock()
    srv = HttpServer("127.0.0.1:0", {"/boom": failing_page}, pacer=Pacer(10.0, clock))
    srv.start()
    try:
        with capture_logs() as logs:
            for _ in range(50):
                assert raw(srv.port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n") == b""  # closed, no traceback sent
            clock.now = 9.9
            raw(srv.port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
            clock.now = 10.0
            raw(srv.port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        srv.stop()
    failures = [line for line in logs if line["event"] == "http_connection_failed"]
    assert [line["held_back"] for line in failures] == [0, 50], failures
    assert all(line["log_level"] == "error" and "exc_info" in line for line in failures)


def test_the_pacer_holds_back_and_counts_each_event_on_its_own() -> None:
    clock = Clock()
    pacer = Pacer(5.0, clock)
    assert [pacer.ready("a"), pacer.ready("a"), pacer.ready("b"), pacer.ready("a")] == [0, None, 0, None]
    clock.now = 4.99
    assert pacer.ready("a") is None
    clock.now = 5.0
    assert [pacer.ready("a"), pacer.ready("a"), pacer.ready("b")] == [3, None, 0]
    clock.now = 20.0
    assert [pacer.ready("a"), pacer.ready("a")] == [1, None]


def test_the_servers_interval_is_the_documented_10_s() -> None:
    docs = " ".join((Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text().split())
    assert "then at most once every 10 s (60 s for the hash)" in docs
    clock = Clock()
    pacer = Pacer(clock=clock)  # as the server makes it
    assert pacer.ready("a") == 0
    clock.now = 9.99
    assert pacer.ready("a") is None
    clock.now = 10.0
    assert pacer.ready("a") == 1
