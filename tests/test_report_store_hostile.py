"""A store that redirects, drips or floods (issue 38, item 2): the report's client never carries its
credentials or tenant header to another origin, never waits on one query past ``--prometheus.timeout``
in all, and never reads an answer past its bound.  Real HTTP servers on 127.0.0.1, in this process."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trustme

from gpu_exporter.report.client import ClientOptions, PromClient, QueryError
from tests import assert_mentions

VECTOR = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"gpu": "0"}, "value": [1, "42"]}]}}).encode()  # fmt: skip
TOKEN = "s3cret-token"
Behaviour = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def store(behave: Behaviour, tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A server whose every request ``behave`` answers; yields its URL and what each request carried."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length", 0) or 0)
            body = self.rfile.read(length).decode() if length else ""
            seen.append({"method": self.command, "path": self.path, "body": body,
                         "auth": self.headers.get("Authorization", ""),
                         "tenant": self.headers.get("X-Scope-OrgID", "")})  # fmt: skip
            # The client may hang up, as it is meant to when a store misbehaves.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
                behave(self)

        do_GET = do_POST = _any

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def answer(body: bytes = VECTOR, status: int = 200) -> Behaviour:
    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return behave


def redirect(code: int, location: str) -> Behaviour:
    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return behave


def client(url: str, **options: object) -> PromClient:
    opts = ClientOptions(url, headers=(("X-Scope-OrgID", "tenant-a"),), environ={
        "GPU_EXPORTER_PROMETHEUS_BEARER_TOKEN": TOKEN}, retries=0, **options)  # type: ignore[arg-type]  # fmt: skip
    return PromClient(opts, sleep=lambda s: None)


def refused(url: str, **options: object) -> str:
    with pytest.raises(QueryError) as e:
        client(url, **options).instant("up", 0)
    return str(e.value)


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_origin_carries_no_credentials_there(code: int) -> None:
    """urllib follows a 301, 302 or 303 to anywhere with Authorization and every other header on it."""
    with store(answer()) as (elsewhere, there), store(redirect(code, f"{elsewhere}/api/v1/query")) as (url, here):
        message = refused(url)
    assert len(here) == 1 and here[0]["auth"] == f"Bearer {TOKEN}"
    assert there == []  # nothing at all reached the other origin, let alone the token
    assert_mentions(message, str(code), "another origin", elsewhere.split("//")[1], "--prometheus.url")
    assert TOKEN not in message


def test_a_redirect_from_https_to_http_is_refused_as_a_downgrade(tmp_path: Path) -> None:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with store(answer()) as (plain, there), store(redirect(308, f"{plain}/api/v1/query"), tls=context) as (url, here):
        message = refused(url, ca_file=ca_file)
    assert len(here) == 1 and there == []
    assert_mentions(message, "308", "https", "plain http")


def test_a_redirect_within_the_store_is_followed_with_the_query() -> None:
    """A store behind a path prefix (``/prom``) that redirects there keeps working: same origin, so
    the query is asked again there, as the POST it was, with its credentials."""
    routes = {"/api/v1/query": redirect(307, "/prom/api/v1/query"), "/prom/api/v1/query": answer()}

    def behave(h: BaseHTTPRequestHandler) -> None:
        routes[h.path](h)

    with store(behave) as (url, seen):
        result = client(url).instant("gpu_up", 0)
    assert result == [({"gpu": "0"}, 42.0)]
    assert [s["path"] for s in seen] == ["/api/v1/query", "/prom/api/v1/query"]
    assert seen[1]["method"] == "POST" and "query=gpu_up" in seen[1]["body"]
    assert seen[1]["auth"] == f"Bearer {TOKEN}" and seen[1]["tenant"] == "tenant-a"


def test_a_userinfo_in_a_redirect_is_not_used_and_a_loop_ends() -> None:
    def behave(h: BaseHTTPRequestHandler) -> None:
        host = h.headers["Host"]
        redirect(302, f"http://mallory:pw@{host}/again{len(seen)}")(h)

    with store(behave) as (url, seen), pytest.raises(QueryError) as e:
        client(url).instant("up", 0)
    assert_mentions(str(e.value), "more than 3 redirects")
    assert len(seen) == 4 and all(s["auth"] == f"Bearer {TOKEN}" for s in seen)


def dripping(headers_too: bool, stop: threading.Event) -> Behaviour:
    """A byte every 0.2 s: every read returns well within any socket timeout, and the whole answer
    would take some 40 s (more for the headers)."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(VECTOR)}\r\n"
                "X-Padding: " + "x" * 100 + "\r\n\r\n").encode()  # fmt: skip
        if not headers_too:
            h.wfile.write(head)
            h.wfile.flush()
            head = b""
        for byte in head + VECTOR:
            if stop.wait(0.2):
                return
            h.wfile.write(bytes([byte]))
            h.wfile.flush()

    return behave


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_dripping_store_is_given_the_timeout_in_all_not_per_read(headers_too: bool) -> None:
    """Issue 38: a byte every 0.5 s kept the report waiting past 90 s with a short timeout.  The
    outcome shows it: the answer would be whole and valid had the client waited for it."""
    stop = threading.Event()
    with store(dripping(headers_too, stop)) as (url, _):
        try:
            with pytest.raises(QueryError) as e:
                client(url, timeout=1.0).instant("up", 0)
        finally:
            stop.set()
    assert_mentions(str(e.value), "no answer within 1 s", "--prometheus.timeout")


def flood(say_length: bool, size: int, sent: list[int]) -> Behaviour:
    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        if say_length:
            h.send_header("Content-Length", str(size))
        h.send_header("Connection", "close")
        h.end_headers()
        chunk = b" " * 65536
        for _ in range(size // len(chunk)):
            h.wfile.write(chunk)
            sent[0] += len(chunk)

    return behave


@pytest.mark.parametrize("say_length", [True, False], ids=["content-length", "until-close"])
def test_an_answer_past_the_bound_is_refused_saying_how_to_narrow_the_report(say_length: bool) -> None:
    sent = [0]
    with store(flood(say_length, 64 * 1048576, sent)) as (url, _), pytest.raises(QueryError) as e:
        client(url, max_answer_bytes=1048576).instant("up", 0)
    assert_mentions(str(e.value), "more than 1 MiB", "--since", "--selector", "--prometheus.max-answer-mib")
    assert sent[0] < 32 * 1048576  # the client stopped reading long before the 64 MiB were sent


def test_an_answer_within_the_bound_is_read_whole() -> None:
    body = VECTOR + b" " * (1048576 - len(VECTOR))  # exactly at the bound: JSON allows the padding
    with store(answer(body)) as (url, _):
        assert client(url, max_answer_bytes=1048576).instant("up", 0) == [({"gpu": "0"}, 42.0)]
    with store(answer(body + b" ")) as (url, _), pytest.raises(QueryError, match="more than 1 MiB"):
        client(url, max_answer_bytes=1048576).instant("up", 0)


def test_the_client_keeps_the_largest_answer_and_what_it_answered() -> None:
    """How close a report came to the bound: the size of its largest answer and the query's name."""
    padded = VECTOR + b" " * 5000
    bodies = iter([padded, VECTOR])
    with store(lambda h: answer(next(bodies))(h)) as (url, _):
        c = client(url)
        assert c.largest == (0, "")
        c.instant("up", 0, "memory sizes")
        assert c.largest == (len(padded), "memory sizes")
        c.instant("up", 0, "prices")  # a smaller answer: the largest stays
        assert c.largest == (len(padded), "memory sizes")


def test_a_refusal_with_a_huge_body_is_read_in_part_and_said_briefly() -> None:
    body = b'{"status":"error","errorType":"bad_data","error":"' + b"x" * (8 * 1048576) + b'"}'
    with store(answer(body, status=400)) as (url, _), pytest.raises(QueryError) as e:
        client(url).instant("up", 0)
    assert_mentions(str(e.value), "400")
    assert len(str(e.value)) < 600
