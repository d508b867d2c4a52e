"""``gpu-exporter report`` as a client of a query API that demands credentials or a tenant header,
speaks TLS, or misbehaves: a real HTTP server on 127.0.0.1 stands in for Prometheus (or Thanos, Mimir,
Cortex...). Secrets never appear in what the report prints."""

from __future__ import annotations

import base64
import json
import os
import re
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

from tests import assert_mentions

pytestmark = pytest.mark.integration

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
                         "query": form.get("query", [""])[0], "tenant": self.headers.get("X-Scope-OrgID", ""),
                         "time": form.get("time", [""])[0]})  # fmt: skip
            self.prom_query = seen[-1]["query"]
            status, body = answer(self, self.path)
            try:
                self.send_response(status)
                for name, value in getattr(self, "extra_headers", {}).items():
                    self.send_header(name, value)
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


NO_GPUS = 3  # the exit status of a report of no GPU (an empty store answers every query with nothing)


def report(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--since", "1h", "--format", "json"]
    return subprocess.run([*cmd, "--quiet", *args], capture_output=True, text=True, timeout=60,
                          env=None if env is None else {**os.environ, **env})  # fmt: skip


def aggregated(e: pp.Expr) -> bool:
    """Whether every path from the top of a query to a selector passes through an aggregation."""
    if isinstance(e, pp.AggregateExpr):
        return True
    if isinstance(e, pp.SubqueryExpr):  # the series of the aggregation it evaluates at each step
        return aggregated(e.expr)
    if isinstance(e, (pp.VectorSelector, pp.MatrixSelector)):
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
    assert out.returncode == NO_GPUS, out.stderr
    assert {s["path"] for s in seen} == {"/api/v1/query", "/api/v1/query_range"}
    # Every metric selector is inside an aggregation: no query asks for a series as it is stored.
    for s in seen:
        assert aggregated(pp.parse(s["query"])), s["query"]
    assert json.loads(out.stdout)["gpus"] == []


def test_a_bearer_token_file_is_sent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with api(requiring("Bearer s3cret")) as (url, seen):
        assert report(url, "--prometheus.bearer-token-file", str(token)).returncode == NO_GPUS
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
    assert ok.returncode == NO_GPUS, ok.stderr
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
    assert trusted.returncode == NO_GPUS, trusted.stderr
    assert unknown.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in unknown.stderr
    assert skipped.returncode == NO_GPUS


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
        (lambda h, p: retry_now(h, 503, b"overloaded"), "503 Service Unavailable (after 4 tries): overloaded"),
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
        if "quantile_over_time(0.95" in getattr(handler, "prom_query", ""):
            time.sleep(6)
        return prometheus_like(handler, path)

    with api(peaks_take_long) as (url, _):
        cmd = [sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--since", "1h"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == NO_GPUS, out.stderr
    lines = out.stderr.splitlines()
    # The first progress line counts the queries (after the line saying which series it reads).
    first = next(m for line in lines if (m := re.match(r"gpu-exporter report: (\d+) queries to ", line)))
    n = int(first.group(1))  # the queries asked, counted by the command (prices may add pieces)
    done = [line for line in lines if re.match(rf"gpu-exporter report: \[\d+/{n}\] ", line)]
    assert len(done) == n and done[-1].startswith(f"gpu-exporter report: [{n}/{n}]"), out.stderr
    # The query it waits for, by name:
    assert any("still waiting" in line and "activity while held (p95 of bursts)" in line for line in lines), out.stderr
    assert "GPU cost and waste" in out.stdout and "still waiting" not in out.stdout
    # The last line says how close the largest answer came to the bound, naming its query.
    largest = re.search(r"the largest answer \((.+)\) was (\d+) KiB of the 128 MiB", lines[-1])
    assert largest is not None and any(f"] {largest.group(1)}: " in line for line in done), out.stderr


def retry_now(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> tuple[int, bytes]:
    handler.extra_headers = {"Retry-After": "0"}  # type: ignore[attr-defined]
    return status, body


def test_a_tenant_header_reaches_every_query() -> None:
    """Issue 25: Mimir and Cortex need X-Scope-OrgID, and there was no way to send a header: a
    tenant-checking proxy answered 401. --prometheus.header NAME=VALUE, repeatable, goes with every query."""

    def tenant_proxy(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        if handler.headers.get("X-Scope-OrgID") != "team-a" or handler.headers.get("X-Extra") != "a=b":
            return 401, b"no org id"
        return prometheus_like(handler, path)

    with api(tenant_proxy) as (url, seen):
        denied = report(url)
        ok = report(url, "--prometheus.header", "X-Scope-OrgID=team-a", "--prometheus.header", "X-Extra=a=b")
    assert denied.returncode == 1 and "401" in denied.stderr
    assert ok.returncode == NO_GPUS, ok.stderr
    assert {s["tenant"] for s in seen[1:]} == {"team-a"} and len(seen) > 8


def test_a_header_read_from_a_file_is_sent_and_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("k3y-v4lue\n")
    with api(lambda h, p: (401, b"bad key") if h.headers.get("X-Api-Key") != "k3y-v4lue" else prometheus_like(h, p)) \
            as (url, _):  # fmt: skip
        ok = report(url, "--prometheus.header-file", f"X-Api-Key={secret}")
    assert ok.returncode == NO_GPUS and "k3y-v4lue" not in ok.stderr + ok.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--prometheus.header", "X-Scope-OrgID"),
         "--prometheus.header takes NAME=VALUE (got a value without '=' or a name)"),
        (("--prometheus.header", "Bad Name=x"), "--prometheus.header: 'Bad Name' is not a header name"),
        (("--prometheus.header", "Host=evil"), "--prometheus.header: the report sets Host itself"),
        (("--prometheus.header", "X-A=1\r\nX-B: 2"), "--prometheus.header: the value of X-A holds a line break"),
        (("--prometheus.header-file", "X-Api-Key=/nonexistent/key"),
         "cannot read the X-Api-Key header file /nonexistent/key: No such file or directory"),
        (("--prometheus.timeout", "0s"), "--prometheus.timeout must be more than 0 s (got '0s')"),
        (("--prometheus.timeout=-5s",), "--prometheus.timeout: '-5s': a duration cannot be negative"),
        (("--min-history", "0h"), "--min-history must be more than 0"),
        (("--min-saving-ratio", "2"), "--min-saving-ratio is a share of the cost, from 0 to 1 (got 2)"),
        (("--min-saving", "nan"), "--min-saving must be a number of 0 or more (got nan)"),
        (("--prometheus.max-answer-mib", "0"), "--prometheus.max-answer-mib must be from 1 to 65536 (got 0)"),
    ],
    ids=["no-equals", "bad-name", "own-header", "line-break", "unreadable-file", "zero-timeout", "negative-timeout",
         "zero-history", "ratio-over-1", "nan-saving", "zero-answer-size"],
)  # fmt: skip
def test_bad_client_options_exit_2_naming_them_before_any_query(args: tuple[str, ...], message: str) -> None:
    """Issue 25: --prometheus.timeout 0s gave "[Errno 115] Operation now in progress"."""
    with api() as (url, seen):
        out = report(url, *args)
    assert out.returncode == 2 and out.stderr == f"gpu-exporter report: {message}\n", out.stderr
    assert seen == [] and out.stdout == ""


def test_a_password_in_the_url_is_used_and_never_shown() -> None:
    """Issue 25: http://user:pw@host failed with the password printed in the error. The userinfo becomes
    basic auth; every message names the URL with the password starred out, failing or not."""
    expected = "Basic " + base64.b64encode(b"alice:pa ss@word").decode()
    with api(requiring(expected)) as (url, seen):
        host = url.removeprefix("http://")
        ok = report(f"http://alice:pa%20ss%40word@{host}", "--quiet")
        noisy = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url",
                                f"http://alice:pa%20ss%40word@{host}", "--since", "1h"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        denied = report(f"http://alice:wrong-secret@{host}")
    unreachable = report("http://bob:t0p-s3cret@127.0.0.1:1")
    assert ok.returncode == NO_GPUS and all(s["auth"] == expected for s in seen[: len(seen) - 1]), ok.stderr
    assert f"queries to http://alice:***@{host} over" in noisy.stderr, noisy.stderr
    assert denied.returncode == 1 and f"http://alice:***@{host}/api/v1/query: 401" in denied.stderr
    assert unreachable.returncode == 1 and "cannot reach http://bob:***@127.0.0.1:1/api/v1/query" in unreachable.stderr
    for out in (ok, noisy, denied, unreachable):
        for secret in ("pa ss@word", "pa%20ss%40word", "wrong-secret", "t0p-s3cret"):
            assert secret not in out.stderr + out.stdout


def test_credentials_from_the_environment_are_sent_and_never_shown() -> None:
    token = {"GPU_EXPORTER_PROMETHEUS_BEARER_TOKEN": "env-t0ken"}
    with api(requiring("Bearer env-t0ken")) as (url, _):
        ok = report(url, env=token)
    assert ok.returncode == NO_GPUS and "env-t0ken" not in ok.stderr
    basic = "Basic " + base64.b64encode(b"carol:env-passw0rd").decode()
    with api(requiring(basic)) as (url, _):
        ok = report(url, "--prometheus.username", "carol", env={"GPU_EXPORTER_PROMETHEUS_PASSWORD": "env-passw0rd"})
        both = report(url, "--prometheus.bearer-token-file", "/dev/null", env=token)
    assert ok.returncode == NO_GPUS and "env-passw0rd" not in ok.stderr
    assert both.returncode == 2
    assert_mentions(both.stderr, "--prometheus.bearer-token-file", "$GPU_EXPORTER_PROMETHEUS_BEARER_TOKEN", "give one")


def test_a_store_that_asks_to_come_back_later_is_retried_with_backoff() -> None:
    """Issue 25: a single 503 aborted the whole report. A 503 or a 429 is tried again, up to three more
    times, after the store's Retry-After (or 1, 2, 4 s): a store that recovers gives its report."""
    failures = {"left": 3}
    lock = threading.Lock()

    def flaky(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        with lock:
            if failures["left"] > 0:
                failures["left"] -= 1
                return retry_now(handler, 503 if failures["left"] % 2 else 429, b"busy")
        return prometheus_like(handler, path)

    with api(flaky) as (url, seen):
        out = report(url)
    assert out.returncode == NO_GPUS, out.stderr
    assert failures["left"] == 0 and len(seen) >= 3 + 9


def test_retries_wait_as_the_store_says_and_are_bounded() -> None:
    from gpu_exporter.report.client import ClientOptions, PromClient, QueryError

    waits: list[float] = []

    def down(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        handler.extra_headers = {"Retry-After": "2"}  # type: ignore[attr-defined]
        return 503, b"down"

    with api(down) as (url, seen):
        client = PromClient(ClientOptions(url), sleep=waits.append)
        with pytest.raises(QueryError, match="503 Service Unavailable \\(after 4 tries\\): down"):
            client.instant("vector(1)", 0)
    assert waits == [2.0, 2.0, 2.0] and len(seen) == 4
    waits.clear()
    with api(lambda h, p: (429, b"slow down")) as (url, seen), pytest.raises(QueryError, match="429"):
        PromClient(ClientOptions(url), sleep=waits.append).instant("vector(1)", 0)
    assert waits == [1.0, 2.0, 4.0]
    waits.clear()
    with api(lambda h, p: (400, b"bad query")) as (url, seen), pytest.raises(QueryError, match="400"):
        PromClient(ClientOptions(url), sleep=waits.append).instant("vector(1)", 0)
    assert waits == [] and len(seen) == 1  # a refused query is not asked again


def test_a_nan_or_infinite_answer_is_left_out_never_a_figure() -> None:
    """An exporter's broken gauge, or a 0/0 in a store's answer: the sample is no figure (JSON has no
    NaN, and a NaN price would make every sum it touches NaN)."""
    from gpu_exporter.report.client import ClientOptions, PromClient

    def nans(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        if path.endswith("query_range"):
            data = {"resultType": "matrix", "result": [{"metric": {"gpu": "0"}, "values": [
                [1, "NaN"], [2, "2.5"], [3, "+Inf"], [4, "-Inf"]]}]}  # fmt: skip
        else:
            data = {"resultType": "vector", "result": [{"metric": {"gpu": "0"}, "value": [1, "NaN"]},
                                                       {"metric": {"gpu": "1"}, "value": [1, "3"]}]}  # fmt: skip
        return 200, json.dumps({"status": "success", "data": data}).encode()

    with api(nans) as (url, _):
        client = PromClient(ClientOptions(url))
        assert client.instant("x", 1) == [({"gpu": "1"}, 3.0)]
        assert [(labels, list(points)) for labels, points in client.range("x", 1, 4, 1)] == [
            ({"gpu": "0"}, [(2.0, 2.5)])
        ]


# -- issue 38: a store that lies ---------------------------------------------------------------------------
def lying(value: object = "1", *, result: object = None, metric: object = None, twice: bool = False,
          error: bytes | None = None) -> Answer:  # fmt: skip
    """A store whose every sample is ``value`` (or whose result or labels are the given shape), for one
    GPU: the hours query and every other one get it alike."""

    def answer(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        if error is not None:
            return 400, error
        kind = path.rsplit("/", 1)[-1]
        labels = {"node": "n1", "gpu": "0", "uuid": "GPU-0", "state": "busy", "name": "NVIDIA L4"} \
            if metric is None else metric  # fmt: skip
        if (
            kind == "query"
            and result is None
            and metric is None
            and "count_over_time" in getattr(handler, "prom_query", "")
        ):
            probe = {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "60"]}]}  # as a store answers
            return 200, json.dumps({"status": "success", "data": probe}).encode()
        if kind == "query":
            rows = [{"metric": labels, "value": [1.0, value]}] * (2 if twice else 1)
            data = {"resultType": "vector", "result": rows if result is None else result}
        else:
            rows = [{"metric": labels, "values": [[1.0, value]]}] * (2 if twice else 1)
            data = {"resultType": "matrix", "result": rows if result is None else result}
        return 200, json.dumps({"status": "success", "data": data}).encode()

    return answer


def test_impossible_values_are_left_out_and_said_and_the_json_stays_json() -> None:
    """A negative value gave "Cost $-148"; 1e308 put Infinity, which is not JSON, into --format json."""
    for value in ("-148", "1e308"):
        with api(lying(value)) as (url, _):
            out = report(url, "--format", "json")
        # 3: nothing to show once the lies are left out; 4: GPUs seen but their prices were lies too
        assert out.returncode in (0, 3, 4), out.stderr
        json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
        assert "-148" not in out.stdout and "impossible" in out.stderr, out.stderr


def test_a_value_that_is_not_a_number_is_the_stores_fault_exit_1() -> None:
    with api(lying("abc")) as (url, _):
        out = report(url)
    assert out.returncode == 1 and "not a number" in out.stderr and "'abc'" in out.stderr, out.stderr


def test_a_series_answered_twice_is_counted_once() -> None:
    with api(lying("3600", twice=True)) as (url, _):
        twice = report(url, "--format", "json")
    with api(lying("3600")) as (url, _):
        once = report(url, "--format", "json")
    assert twice.returncode == once.returncode
    assert json.loads(twice.stdout)["totals"] == json.loads(once.stdout)["totals"]


@pytest.mark.parametrize(
    "answer",
    [lying(result={"a": 1}), lying(result=[1, 2]), lying(metric=["node"]), lying(metric={"node": 7}),
     lying(value=None), lying(value=[1, 2]), lying(result=[{"metric": {}}]), lying(result=[{"values": 3}]),
     lambda h, p: (200, b'{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}'),
     lambda h, p: (200, b'{"status":"success","data":[]}')],
    ids=["result-dict", "result-numbers", "metric-list", "label-number", "value-null", "value-list",
         "no-value", "values-number", "scalar", "data-list"],
)  # fmt: skip
def test_an_answer_of_the_wrong_shape_is_a_clear_error_not_a_traceback(answer: Answer) -> None:
    with api(answer) as (url, _):
        out = report(url)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("gpu-exporter report: "), out.stderr


def _every_query(series: list[dict[str, object]]) -> Answer:
    def answer(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        kind = "vector" if path.endswith("/query") else "matrix"
        return 200, json.dumps({"status": "success", "data": {"resultType": kind, "result": series}}).encode()

    return answer


@pytest.mark.parametrize(
    ("series", "wrong"),
    [([{"value": [1.0, "60"]}], "no 'metric' key"),
     ([{"metric": {"node": "n1", "gpu": str(i), "x": "y" * 200}, "value": [1.0, "1e-3"], "values": [[1.0, "1"]]}
       for i in range(3)], "one series without labels"),
     ([{"metric": {}, "value": [1.0, "0.001"]}], "whole number of at least 1")],
    ids=["no-metric-key", "one-huge-series-for-every-query", "a-fraction-of-a-sample"],
)  # fmt: skip
def test_a_malformed_answer_is_named_not_read_as_a_scrape_interval(series: list[dict[str, object]], wrong: str) -> None:
    """Issue 50, item 4: an answer without a ``metric`` key, or a store that answers every query with
    the same series, ended in "the range is 3600 s long, less than a step can be": the scrape
    interval's probe had taken a malformed answer for an interval.  Now the answer's shape is judged
    first, and the error names the query and what was wrong."""
    with api(_every_query(series)) as (url, _):
        out = report(url, "--since", "1h")
    assert out.returncode in (1, 2) and "Traceback" not in out.stderr, out.stderr
    assert "less than a step can be" not in out.stderr and wrong in out.stderr, out.stderr
    assert "probe" in out.stderr or "metric" in out.stderr, out.stderr


def test_a_stores_error_text_cannot_drive_the_terminal() -> None:
    with api(lying(error=b'{"status":"error","errorType":"bad_data","error":"\\u001b]0;pwned\\u0007\\u001b[2J"}')) \
            as (url, _):  # fmt: skip
        out = report(url)
    assert out.returncode == 1 and "\x1b" not in out.stderr and "\\x1b]0;pwned" in out.stderr, out.stderr


def test_a_store_limit_is_named_not_cut_off_behind_the_query() -> None:
    """Issue 53: VictoriaMetrics quotes the whole query before saying which of its limits refused it; the
    first 300 characters of that were all query.  The limit is named, with what to do."""
    query = 'sum by (node) (gpu_state_seconds_total{state=\\"busy\\"})' + " or vector(0)" * 400
    error = (f'error when executing query="{query}" on the time range (start=1, end=2, step=3600): cannot '
             "execute query: the number of unique timeseries exceeds 300000; either narrow down the search or "
             "increase -search.maxUniqueTimeseries command-line flag value")  # fmt: skip
    body = json.dumps({"status": "error", "errorType": "422", "error": error}).encode()
    with api(lying(error=body)) as (url, _):
        out = report(url)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "-search.maxUniqueTimeseries" in out.stderr and "300000" in out.stderr, out.stderr
    assert "raise it on the store" in out.stderr and "or vector(0)" not in out.stderr, out.stderr


def priced_in(currency: str) -> Answer:
    """One GPU, honest in everything but the currency label of its price series."""
    honest = lying("3600")

    def answer(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        status, body = honest(handler, path)
        if "price" not in getattr(handler, "prom_query", ""):
            return status, body
        doc = json.loads(body)
        for r in doc["data"]["result"]:
            r["metric"] = {**r["metric"], "currency": currency}
        return status, json.dumps(doc).encode()

    return answer


@pytest.mark.parametrize(
    "currency", ["=1+7", "{}", "\x1b[31mEUR", "U" * 11], ids=["formula", "braces", "escape", "long"]
)
@pytest.mark.parametrize("fmt", ["csv", "html", "table", "focus"])
def test_a_currency_label_the_exporter_never_writes_is_named_and_left_out(currency: str, fmt: str) -> None:
    """Issue 50, item 2: the currency label from the store became a live CSV formula, an IndexError in
    the HTML's format string, and a raw escape in the terminal.  Checked where it is read, it is named
    escaped, its series left out of the money, and the report still runs."""
    with api(priced_in(currency)) as (url, _):
        out = report(url, "--format", fmt)
    assert "Traceback" not in out.stderr and out.returncode not in (1, 2), out.stderr
    assert "\x1b" not in out.stdout + out.stderr and currency not in out.stdout
    assert "left out of the money" in out.stderr and repr(currency) in out.stderr, out.stderr  # named, escaped
    assert not any(cell.startswith("=") for line in out.stdout.splitlines() for cell in line.split(","))


def named(node: str, model: str) -> Answer:
    """One GPU whose node and model labels are what a hostile store sends, in every answer."""
    honest = lying("3600")

    def answer(handler: BaseHTTPRequestHandler, path: str) -> tuple[int, bytes]:
        status, body = honest(handler, path)
        doc = json.loads(body)
        for r in doc["data"]["result"]:
            if r["metric"]:
                r["metric"] = {**r["metric"], "node": node, "name": model}
        return status, json.dumps(doc).encode()

    return answer


@pytest.mark.parametrize("fmt", ["csv", "focus", "html", "table", "markdown", "json"])
def test_hostile_node_and_model_labels_reach_no_output_raw(fmt: str) -> None:
    """The other labels the report shows (node, model) from a store that lies: no formula, no escape, no
    markup, no format placeholder taken for one, and no traceback, in every format."""
    node, model = '=HYPERLINK("x")\x1b[2J', "{0}<script>alert(1)</script>\x07"
    with api(named(node, model)) as (url, _):
        out = report(url, "--format", fmt)
    assert "Traceback" not in out.stderr and out.returncode not in (1, 2), out.stderr
    assert "\x1b" not in out.stdout + out.stderr and "\x07" not in out.stdout
    if fmt in ("html", "markdown"):
        assert "<script>" not in out.stdout
    if fmt in ("csv", "focus"):
        assert not any(c.startswith(("=", '"=')) for line in out.stdout.splitlines() for c in line.split(","))
