"""``rate_limit``: exporter-toolkit's token bucket (golang.org/x/time/rate), Go's durations, and the
server's 429 with the probes left out."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from gpu_exporter.web.rate_limit import RateLimit, TokenBucket, parse_go_duration, retry_after
from tests.exporter_helpers import wait_for
from tests.web_helpers import get, server


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("100ms", 0.1), ("1m30s", 90.0), ("1h", 3600.0), ("1.5h", 5400.0), (".5s", 0.5), ("2h45m", 9900.0),
     ("250us", 250e-6), ("250\u00b5s", 250e-6), ("250\u03bcs", 250e-6), ("10ns", 1e-8), ("+1s", 1.0), ("1s500ms", 1.5),
     ("0", 0.0), (0, 0.0), (0.0, 0.0), (" 2s ", 2.0), ("1.s", 1.0)],
)  # fmt: skip
def test_go_durations(text: str | int | float, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "words"),
    [("soon", "not a Go duration"), ("1", "not a Go duration"), ("1d", "not a Go duration"),
     ("s", "not a Go duration"), ("1s 2s", "not a Go duration"), ("", "not a Go duration"),
     ("+", "not a Go duration"), ("-1s", "cannot be negative"), (5, "no unit"), (0.5, "no unit")],
)  # fmt: skip
def test_what_is_not_a_go_duration(text: str | int | float, words: str) -> None:
    with pytest.raises(ValueError, match=words) as e:
        parse_go_duration(text)
    assert repr(text) in str(e.value)


def test_other_types_are_left_to_the_field() -> None:
    assert parse_go_duration(None) is None and parse_go_duration(True) is True


def test_the_bucket_starts_full_and_gains_a_token_each_interval() -> None:
    bucket = TokenBucket(RateLimit(interval=2.0, burst=3), now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(100.0) == pytest.approx(2.0)  # empty: the next token in one interval
    assert bucket.take(101.5) == pytest.approx(0.5)  # three quarters of it have come
    assert bucket.take(102.0) == 0.0
    assert bucket.take(102.0) == pytest.approx(2.0)


def test_the_bucket_never_holds_more_than_burst() -> None:
    bucket = TokenBucket(RateLimit(interval=1.0, burst=2), now=0.0)
    assert bucket.take(1000.0) == 0.0 and bucket.take(1000.0) == 0.0
    assert bucket.take(1000.0) == pytest.approx(1.0)


def test_a_clock_that_does_not_move_gives_no_token() -> None:
    bucket = TokenBucket(RateLimit(interval=1.0, burst=1), now=5.0)
    assert bucket.take(5.0) == 0.0
    assert bucket.take(4.0) == pytest.approx(1.0)  # a clock behind the last look adds nothing
    assert bucket.take(5.0) == pytest.approx(1.0)


@pytest.mark.parametrize(("wait", "header"), [(0.001, "1"), (1.0, "1"), (1.2, "2"), (59.5, "60")])
def test_retry_after_is_whole_seconds_rounded_up(wait: float, header: str) -> None:
    assert retry_after(wait) == header


def test_beyond_the_burst_a_request_gets_429_and_the_probes_do_not_count(tmp_path: Path) -> None:
    with server(tmp_path, {"rate_limit": {"interval": "1h", "burst": 2}}) as srv:
        assert [get(srv.port)[0] for _ in range(2)] == [200, 200]
        status, headers, body = get(srv.port)
        assert status == 429 and b"rate_limit" in body and 3500 <= int(headers["Retry-After"]) <= 3600
        assert get(srv.port, "/api/v1/alerts")[0] == 429  # every page but the probes
        assert [get(srv.port, p)[0] for p in ("/healthz", "/readyz") * 5] == [200] * 10


def test_a_429_from_the_rate_limit_keeps_the_connection(tmp_path: Path) -> None:
    with (
        server(tmp_path, {"rate_limit": {"interval": "1h", "burst": 1}}) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s,
    ):
        for expected in (b"200", b"429", b"429"):
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(1) or pytest.fail(f"closed after {head!r}")
            assert head.startswith(b"HTTP/1.1 " + expected) and b"Connection: keep-alive" in head, head
            length = int(next(x for x in head.split(b"\r\n") if x.startswith(b"Content-Length:")).split(b":")[1])
            while length:
                length -= len(s.recv(length) or pytest.fail("closed in the middle of the body"))


def test_a_changed_rate_limit_applies_at_the_reload(tmp_path: Path) -> None:
    with server(tmp_path, {"rate_limit": {"interval": "1h", "burst": 1}}) as srv:
        assert [get(srv.port)[0] for _ in range(2)] == [200, 429]
        (tmp_path / "web.yml").write_text(yaml.safe_dump({"rate_limit": {"interval": "1h", "burst": 3}}))
        wait_for(lambda: get(srv.port)[0] == 200, what="the new limit: a full bucket")
        (tmp_path / "web.yml").write_text(yaml.safe_dump({}))
        wait_for(lambda: srv.web.current().rate_limit is None, what="no limit")
        assert [get(srv.port)[0] for _ in range(10)] == [200] * 10
