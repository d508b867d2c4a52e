"""Request heads read and answer heads written (gpu_exporter/web/http.py), byte by byte, without a socket.

The server tests (test_web_security.py) send these over real sockets; here every rule is pinned
at its edge, fast enough to run against each mutant of the module.
"""

from __future__ import annotations

import email.utils
import time

import pytest

from gpu_exporter.web.http import MAX_BODY, BadRequest, Request, body_length, keep_alive, parse_head, response_head

LIMIT = 16 * 1024


def parse(head: bytes, limit: int = LIMIT) -> Request:
    return parse_head(head, limit)


def refused(head: bytes, status: int, words: str, limit: int = LIMIT) -> None:
    with pytest.raises(BadRequest) as e:
        parse_head(head, limit)
    assert (e.value.status, str(e.value)) == (status, words)  # the whole sentence: it is the answer's body


def test_a_request_is_read_with_its_headers_lower_cased_and_trimmed() -> None:
    r = parse(b"GET /metrics?x=1&y=2 HTTP/1.1\r\nHost: node:9445\r\nAccept-Encoding: \t gzip \t\r\n"
              b"X-Empty:\r\nX-Colon: a:b: c\r\n\r\n")  # fmt: skip
    headers = {"host": "node:9445", "accept-encoding": "gzip", "x-empty": "", "x-colon": "a:b: c"}
    assert r == Request("GET", "/metrics", "HTTP/1.1", headers)


def test_a_request_without_headers_and_http_1_0() -> None:
    assert parse(b"HEAD / HTTP/1.0\r\n\r\n") == Request("HEAD", "/", "HTTP/1.0", {})


def test_latin_1_bytes_in_a_value_are_kept_as_they_came() -> None:
    assert parse(b"GET / HTTP/1.0\r\nX: caf\xe9\r\n\r\n").headers == {"x": "caf\xe9"}


def test_only_spaces_and_tabs_around_a_value_are_dropped() -> None:
    # RFC 9110 5.6.3: optional whitespace is SP and HTAB; a form feed or vertical tab is part of the value.
    headers = parse(b"GET / HTTP/1.0\r\nA: \x0cv\x0b\r\nB: XvX\r\nC: \t x \t\r\n\r\n").headers
    assert headers == {"a": "\x0cv\x0b", "b": "XvX", "c": "x"}


def test_the_path_ends_at_the_first_question_mark() -> None:
    assert parse(b"GET /metrics?a=1?b=2 HTTP/1.0\r\n\r\n").path == "/metrics"


def test_a_head_at_the_limit_is_read_and_one_byte_more_is_431() -> None:
    head = b"GET / HTTP/1.0\r\nX: "
    head += b"a" * (100 - len(head) - 4) + b"\r\n\r\n"
    assert len(head) == 100
    assert parse(head, limit=100).headers["x"] == "a" * 77
    refused(head[:-4] + b"a\r\n\r\n", 431, "request head too large", limit=100)


@pytest.mark.parametrize(
    "line",
    [b"GARBAGE", b"GET /", b"GET  / HTTP/1.1", b"GET / HTTP/1.1 x", b" / HTTP/1.1", b"G\x00T / HTTP/1.1",
     b"GET\t/ HTTP/1.1", b"G(T / HTTP/1.1", b"G\x80T / HTTP/1.1"],
)  # fmt: skip
def test_a_malformed_request_line_is_400(line: bytes) -> None:
    refused(line + b"\r\n\r\n", 400, "malformed request line")


@pytest.mark.parametrize("method", [b"OPTIONS", b"M-SEARCH", b"X!#$%&'*+.^_`|~9z"])
def test_any_token_is_a_method(method: bytes) -> None:
    assert parse(method + b" / HTTP/1.1\r\nHost: x\r\n\r\n").method == method.decode()


@pytest.mark.parametrize(("version", "status"), [(b"HTTP/2", 505), (b"HTTP/0.9", 505), (b"HTTP/1.2", 505),
                                                 (b"http/1.1", 400), (b"HTTPS/1.1", 400), (b"1.1", 400)])  # fmt: skip
def test_other_versions_are_refused(version: bytes, status: int) -> None:
    refused(b"GET / " + version + b"\r\n\r\n", status, "unsupported HTTP version")


@pytest.mark.parametrize("target", [b"metrics", b"*", b"http://x/metrics", b"/a\x7fb", b"/a\x00", b"/\xe9", b"/a\x01"])
def test_a_target_that_is_not_an_absolute_path_of_visible_ascii_is_400(target: bytes) -> None:
    refused(b"GET " + target + b" HTTP/1.1\r\n\r\n", 400, "malformed request target")


def test_the_visible_ascii_edges_are_a_valid_target() -> None:
    assert parse(b"GET /!~ HTTP/1.0\r\n\r\n").path == "/!~"


@pytest.mark.parametrize(
    "header",
    [b"No colon", b": empty name", b"Bad Name: x", b"Bad\tName: x", b"Name\x00: x", b"N\xe9: x", b" Folded: x"],
)
def test_a_malformed_header_is_400(header: bytes) -> None:
    refused(b"GET / HTTP/1.1\r\n" + header + b"\r\n\r\n", 400, "malformed header")


@pytest.mark.parametrize("name", [b"Content-Length", b"Transfer-Encoding", b"Host", b"Authorization"])
def test_a_repeated_framing_or_auth_header_is_400_in_any_case(name: bytes) -> None:
    refused(
        b"GET / HTTP/1.1\r\n" + name + b": 1\r\n" + name.upper() + b": 1\r\n\r\n",
        400,
        f"more than one {name.decode().lower()} header",
    )


def test_other_repeated_headers_keep_the_last() -> None:
    assert parse(b"GET / HTTP/1.1\r\nHost: x\r\nAccept: a\r\naccept: b\r\n\r\n").headers == {"host": "x", "accept": "b"}


def test_http_1_1_without_host_is_400_and_http_1_0_needs_none() -> None:
    # RFC 9112, 3.2: a server MUST answer 400 to an HTTP/1.1 request without a Host header.
    refused(b"GET /metrics HTTP/1.1\r\nAccept: */*\r\n\r\n", 400, "missing host header")
    assert parse(b"GET /metrics HTTP/1.1\r\nHost:\r\n\r\n").headers == {"host": ""}  # empty is allowed
    assert parse(b"GET /metrics HTTP/1.0\r\n\r\n").headers == {}


@pytest.mark.parametrize(("headers", "length"), [({}, 0), ({"content-length": "0"}, 0), ({"content-length": "5"}, 5),
                                                 ({"content-length": str(MAX_BODY)}, MAX_BODY)])  # fmt: skip
def test_the_body_length(headers: dict[str, str], length: int) -> None:
    assert body_length(headers) == length


@pytest.mark.parametrize(
    ("headers", "status", "words"),
    [({"content-length": str(MAX_BODY + 1)}, 413, "request body too large"),
     ({"content-length": "-1"}, 400, "bad content-length"), ({"content-length": "1e3"}, 400, "bad content-length"),
     ({"content-length": ""}, 400, "bad content-length"), ({"content-length": "+5"}, 400, "bad content-length"),
     # Digits to str.isdigit(), which int() refuses ("\u00b2") or reads (Arabic-Indic one): a 400, never a traceback.
     ({"content-length": "\u00b2"}, 400, "bad content-length"),
     ({"content-length": "\u0661"}, 400, "bad content-length"),
     ({"content-length": "1 "}, 400, "bad content-length"), ({"content-length": "5\n"}, 400, "bad content-length"),
     ({"transfer-encoding": "chunked"}, 501, "transfer-encoding is not supported"),
     ({"transfer-encoding": "chunked", "content-length": "0"}, 400, "both transfer-encoding and content-length")],
)  # fmt: skip
def test_bodies_that_are_refused(headers: dict[str, str], status: int, words: str) -> None:
    with pytest.raises(BadRequest) as e:
        body_length(headers)
    assert (e.value.status, str(e.value)) == (status, words)


@pytest.mark.parametrize(
    ("version", "connection", "keep"),
    [("HTTP/1.1", None, True), ("HTTP/1.1", "keep-alive", True), ("HTTP/1.1", "close", False),
     ("HTTP/1.1", "Close", False), ("HTTP/1.0", None, False), ("HTTP/1.0", "keep-alive", True),
     ("HTTP/1.0", "Keep-Alive", True), ("HTTP/1.0", "close", False),
     # A list of options (RFC 9110, 7.6.1): "close" anywhere in it closes.
     ("HTTP/1.1", "keep-alive, close", False), ("HTTP/1.1", "Upgrade,CLOSE", False), ("HTTP/1.1", " close ,", False),
     ("HTTP/1.0", "keep-alive, close", False), ("HTTP/1.0", "close, keep-alive", False),
     ("HTTP/1.0", "TE, Keep-Alive", True), ("HTTP/1.1", "closed", True), ("HTTP/1.0", "keep-alives", False)],
)  # fmt: skip
def test_keep_alive(version: str, connection: str | None, keep: bool) -> None:
    headers = {} if connection is None else {"connection": connection}
    assert keep_alive(Request("GET", "/", version, headers)) is keep


def test_an_answers_head() -> None:
    before = time.time()
    head = response_head(404, "text/plain; charset=utf-8", 12, close=True, server="gpu-exporter/1.2",
                         headers={"X-Frame-Options": "deny", "Retry-After": "1"})  # fmt: skip
    lines = head.decode("latin-1").split("\r\n")
    assert head.endswith(b"\r\n\r\n") and lines[-2:] == ["", ""]
    assert lines[0] == "HTTP/1.1 404 Not Found"
    date = email.utils.parsedate_to_datetime(lines[2].removeprefix("Date: "))
    assert lines[2].endswith(" GMT") and before - 1 <= date.timestamp() <= time.time() + 1
    assert lines[:2] + lines[3:-2] == ["HTTP/1.1 404 Not Found", "Server: gpu-exporter/1.2",
                                       "Content-Type: text/plain; charset=utf-8", "Content-Length: 12",
                                       "Connection: close", "X-Frame-Options: deny", "Retry-After: 1"]  # fmt: skip


@pytest.mark.parametrize(("status", "reason"), [(200, "OK"), (429, "Too Many Requests"), (599, "Error")])
def test_each_status_has_its_reason_and_keep_alive_is_said(status: int, reason: str) -> None:
    head = response_head(status, "x", 0, close=False, server="s", headers={})
    assert head.startswith(f"HTTP/1.1 {status} {reason}\r\n".encode()) and b"\r\nConnection: keep-alive\r\n" in head
