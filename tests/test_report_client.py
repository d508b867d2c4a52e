"""``gpu-exporter report`` as a client of a query API that demands credentials, speaks TLS, or
misbehaves: a real HTTP server on 127.0.0.1 stands in for Prometheus (or Thanos, Mimir...)."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import promql_parser as pp
import pytest
import trustme

EMPTY = {"query": {"resultType": "vector", "result": []}, "query_range": {"resultType": "matrix", "result": []}}
Answer = Callable[[BaseHTTPRequestHandler, str], tuple[int, bytes]]


def prometheus_like(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
    kind = path.rsplit("/", 1)[-1]
    return 200, json.dumps({"status": "success", "data": EMPTY[kind]}).encode()


@contextmanager
def api(
    answer: Answer = prometheus_like, tls: ssl.SSLContext | None = None
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            form = parse_qs(self.rfile.read(length).decode())
            seen.append({"path": self.path, "auth": self.headers.get("Authorization", ""),
                         "query": form.get("query", [""])[0]})  # fmt: skip
            self.prom_query = seen[-1]["query"]
            status, body = answer(self, self.path)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting, as it was meant to

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if tls else "http"
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--since", "1h", "--format", "json"]
    return subprocess.run([*cmd, "--quiet", *args], capture_output=True, text=True, timeout=60)


def aggregated(e: pp.Expr) -> bool:
    """Whether every path from the top of a query to a selector passes through an aggregation."""
    if isinstance(e, pp.AggregateExpr):
        return True
    if isinstance(e, (pp.VectorSelector, pp.MatrixSelector, pp.SubqueryExpr)):
        return False
    if isinstance(e, pp.BinaryExpr):
        return all(aggregated(x) or isinstance(x, pp.NumberLiteral) for x in (e.lhs, e.rhs))
    if isinstance(e, pp.ParenExpr):
        return aggregated(e.expr)
    if isinstance(e, pp.Call):
        return all(aggregated(a) for a in e.args if not isinstance(a, (pp.StringLiteral, pp.NumberLiteral)))
    return isinstance(e, pp.NumberLiteral)


def requiring(expected: str) -> Answer:
    def answer(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        if handler.headers.get("Authorization") != expected:
            return 401, b'{"status":"error","errorType":"unauthorized","error":"who are you?"}'
        return prometheus_like(handler, path)

    return answer


def test_it_posts_server_side_aggregations_only() -> None:
    with api() as (url, seen):
        out = report(url)
    assert out.returncode == 0, out.stderr
    assert {s["path"] for s in seen} == {"/api/v1/query", "/api/v1/query_range"}
    # Every metric selector is inside an aggregation: no query asks for a series as it is stored.
    for s in seen:
        assert aggregated(pp.parse(s["query"])), s["query"]
    assert json.loads(out.stdout)["gpus"] == []


def test_a_bearer_token_file_is_sent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with api(requiring("Bearer s3cret")) as (url, seen):
        assert report(url, "--prometheus.bearer-token-file", str(token)).returncode == 0
        denied = report(url)
    assert all(s["auth"] == "Bearer s3cret" for s in seen[:-1])
    assert denied.returncode == 1 and "401" in denied.stderr and "check the credentials" in denied.stderr


def test_basic_auth_reads_the_password_from_a_file(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("pa:ss\n")
    expected = "Basic " + base64.b64encode(b"alice:pa:ss").decode()
    with api(requiring(expected)) as (url, _):
        ok = report(url, "--prometheus.username", "alice", "--prometheus.password-file", str(password))
        wrong = report(url, "--prometheus.username", "bob", "--prometheus.password-file", str(password))
    assert ok.returncode == 0, ok.stderr
    assert wrong.returncode == 1 and "unauthorized: who are you?" in wrong.stderr


def test_tls_is_verified_against_the_ca_file(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with api(tls=context) as (url, _):
        trusted = report(url, "--prometheus.ca-file", str(ca_file))
        unknown = report(url)
        skipped = report(url, "--prometheus.insecure-skip-verify")
    assert trusted.returncode == 0, trusted.stderr
    assert unknown.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in unknown.stderr
    assert skipped.returncode == 0


def slow(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
    time.sleep(3)
    return prometheus_like(handler, path)


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        (lambda h, p: (200, b"<html>not an API</html>"), "did not answer with JSON"),
        (
            lambda h, p: (400, b'{"status":"error","errorType":"bad_data","error":"parse error"}'),
            "bad_data: parse error",
        ),
        (lambda h, p: (503, b"overloaded"), "503"),
        (lambda h, p: slow(h, p), "no answer within 1 s"),
    ],
    ids=["not JSON", "query refused", "server error", "too slow"],
)
def test_a_misbehaving_api_exits_1_naming_the_problem(answer: Answer, needle: str) -> None:
    with api(answer) as (url, _):
        out = report(url, "--prometheus.timeout", "1s")
    assert out.returncode == 1 and needle in out.stderr, out.stderr
    assert out.stdout == ""


def test_an_unreachable_api_and_a_bad_url() -> None:
    out = report("http://127.0.0.1:1")
    assert out.returncode == 1 and "cannot reach http://127.0.0.1:1/api/v1/query" in out.stderr
    out = report("ftp://prometheus")
    assert out.returncode == 2 and "must be an http:// or https:// URL" in out.stderr


def test_a_long_query_shows_progress_on_stderr() -> None:
    def peaks_take_long(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        if "quantile_over_time(0.98" in getattr(handler, "prom_query", ""):
            time.sleep(6)
        return prometheus_like(handler, path)

    with api(peaks_take_long) as (url, _):
        cmd = [sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--since", "1h"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0].startswith("gpu-exporter report: 7 queries to")
    assert [line for line in lines if "[" in line and "/7]" in line][-1].startswith("gpu-exporter report: [7/7]")
    assert any("still waiting for memory peaks (p98)" in line for line in lines), out.stderr
    assert "GPU cost and waste" in out.stdout and "still waiting" not in out.stdout
