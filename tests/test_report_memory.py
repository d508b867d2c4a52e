"""The report's memory is bounded by what it reads, not only by bytes (issue 50, item 3): an answer is
decoded as it arrives, a series at a time, into a compact form, and the series kept from all answers
together are bounded, past which the report stops naming the query and the bound.  A store on
127.0.0.1 in this process serves the answers; the report runs as the real command where its peak
memory is the outcome checked."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from gpu_exporter.report import client as client_module
from gpu_exporter.report.client import ClientOptions, Points, PromClient, QueryError
from tests import assert_mentions

Answer = Callable[[str, dict[str, str]], bytes]  # (path, form) -> body
PEAK_LIMIT_MIB = 256  # issue 50's bound on the report's peak memory


@contextmanager
def store(answer: Answer) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
            body = answer(self.path, {k: v[0] for k, v in form.items()})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the report may stop reading
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def success(kind: str, result: list[dict[str, Any]]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}).encode()


def gpu(g: int) -> dict[str, str]:
    node = g // 8
    return {"node": f"node-{node:05d}", "instance": f"10.1.{node // 250}.{node % 250}:9400", "gpu": str(g % 8),
            "uuid": f"GPU-{g:08x}-5e1f-4a2b-9c3d-0123456789ab"}  # fmt: skip


def fleet(series: int, pods_per_gpu: int) -> Answer:
    """A store whose hours query (GPU-hours by GPU, holder and state) answers ``series`` small series, a
    pod each, as a fleet whose pods change hourly answers it; each GPU priced on every step of
    ``--since 1h`` (720 of 5 s); every other query answers nothing."""
    gpus = -(-series // pods_per_gpu)

    def holder(i: int) -> dict[str, str]:
        return {**gpu(i // pods_per_gpu), "namespace": f"team-{i % 40}", "pod": f"train-{i:07d}-x7k2q",
                "state": ("busy", "allocated_idle")[i % 2]}  # fmt: skip

    priced = [{**gpu(g), "currency": "USD"} for g in range(gpus)]
    hours = success("vector", [{"metric": holder(i), "value": [0, "0.5"]} for i in range(series)])
    steps = success("vector", [{"metric": labels, "value": [0, "720"]} for labels in priced])

    def answer(path: str, form: dict[str, str]) -> bytes:
        query, matrix = form.get("query", ""), path.endswith("query_range")
        if query.startswith("sum by (node, instance, gpu, uuid, ") and "gpu_state_seconds_total" in query:
            return hours
        if matrix and query.startswith("(max by (node, instance, gpu, uuid, currency)"):
            start = float(form["start"])
            return success("matrix", [{"metric": labels, "values": [[start, "2.5"]]} for labels in priced])
        if query.startswith("count_over_time((max by (node, instance, gpu, uuid, currency) ("):  # steps priced
            return steps
        return success("matrix" if matrix else "vector", [])

    return answer


# The report's own peak, VmHWM, read as it exits: a child's ru_maxrss also holds the high-water mark of
# the process it was forked from (Linux keeps it across fork and exec), and this one holds the answers.
PEAK = """
import atexit, os, runpy, sys
def peak():
    with open("/proc/self/status") as f:
        hwm = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["REPORT_PEAK_FILE"], "w") as out:
        out.write(hwm)
atexit.register(peak)
sys.argv[0] = "gpu_exporter"
runpy.run_module("gpu_exporter", run_name="__main__", alter_sys=True)
"""


def report(url: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """The real ``gpu-exporter report``, JSON to a file; its result and its peak RSS in MiB."""
    peak = tmp_path / "peak"
    cmd = [sys.executable, "-c", PEAK, "report", "--prometheus.url", url, "--since", "1h", "--format", "json",
           "--output", str(tmp_path / "report.json")]  # fmt: skip
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "REPORT_PEAK_FILE": str(peak)}
    )
    return out, int(peak.read_text()) / 1024


@pytest.mark.integration
def test_300000_small_series_within_the_byte_bound_stop_the_report_naming_the_query_and_the_series_bound(
    tmp_path: Path,
) -> None:
    """Issue 50: 200,000 series in a 47 MB answer took 815 MiB, 300,000 took 1.2 GiB, all within the
    128 MiB answer bound.  The report now stops once the series it holds pass their own bound, within
    256 MiB, saying which query, the bound, and how to narrow the report."""
    answer = fleet(300_000, pods_per_gpu=300)  # on 1,000 GPUs: the hours answer passes the bound
    hours = answer("/api/v1/query", {"query": "sum by (node, instance, gpu, uuid, x) (gpu_state_seconds_total)"})
    assert len(hours) < client_module.MAX_ANSWER_BYTES  # within the byte bound: some 60 MB
    with store(answer) as url:
        out, peak_mib = report(url, tmp_path)
    assert out.returncode == 1, out.stderr[-2000:]
    assert_mentions(out.stderr, "more series than the report holds in memory", "32,768 series", "--selector",
                    "--since", "--prometheus.max-answer-mib")  # fmt: skip
    assert "GPU-hours by state and holder: more series" in out.stderr, out.stderr[-2000:]
    assert peak_mib < PEAK_LIMIT_MIB, f"peak RSS {peak_mib:.0f} MiB"


@pytest.mark.integration
def test_a_fleet_just_within_the_series_bound_is_reported_in_under_256_mib(tmp_path: Path) -> None:
    """The bound's other side: 28,000 holder series on 1,000 priced GPUs (30,000 series in all, some
    6 KiB each at the peak: decoded, modelled and rendered) make a whole report within 256 MiB."""
    with store(fleet(28_000, pods_per_gpu=28)) as url:
        out, peak_mib = report(url, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["status"] == "ok"
    assert peak_mib < PEAK_LIMIT_MIB, f"peak RSS {peak_mib:.0f} MiB"


def client(url: str, **opts: Any) -> PromClient:
    return PromClient(ClientOptions(url, retries=0, **opts))


def test_the_series_bound_is_counted_over_every_answer_together() -> None:
    """Each answer within the bound, and all together past it: the second names the bound."""
    body = success("vector", [{"metric": {"gpu": str(i)}, "value": [0, "1"]} for i in range(10)])
    with store(lambda *_: body) as url:
        c = client(url, max_kept_bytes=15 * client_module.SERIES_COST)
        assert len(c.instant("up", 0)) == 10
        with pytest.raises(QueryError) as e:
            c.instant("up", 0)
    assert_mentions(str(e.value), "more series than the report holds in memory", "15 series", "--selector")


def test_points_count_against_the_bound_too() -> None:
    points = [[float(t), "1"] for t in range(1000)]
    body = success("matrix", [{"metric": {"gpu": "0"}, "values": points}])
    with store(lambda *_: body) as url:
        # Room for one and a half series of 1,000 points: one passes, two do not.
        one = client_module.SERIES_COST + 1000 * client_module.POINT_COST
        c = client(url, max_kept_bytes=one * 3 // 2)
        assert len(c.range("up", 0, 999, 1)[0][1]) == 1000
        with pytest.raises(QueryError, match="more series than the report holds"):
            c.range("up", 0, 999, 1)


def test_a_series_with_more_points_than_the_query_has_steps_is_refused() -> None:
    """A store computes a point per step at most: a series of more is no answer to the query, and a
    store that sent one huge series would have it decoded whole."""
    body = success("matrix", [{"metric": {"gpu": "0"}, "values": [[float(t), "1"] for t in range(100)]}])
    with store(lambda *_: body) as url:
        assert len(client(url).range("up", 0, 99, 1)[0][1]) == 100
        with pytest.raises(QueryError) as e:
            client(url).range("up", 0, 98, 1)
    assert_mentions(str(e.value), "100 points", "99 steps")


def test_one_series_longer_than_its_query_allows_is_refused_before_it_is_decoded() -> None:
    long_pod = "x" * (2 * client_module.MAX_LABELS_BYTES)
    huge = success("vector", [{"metric": {"gpu": "0", "pod": long_pod}, "value": [0, "1"]}])
    with store(lambda *_: huge) as url, pytest.raises(QueryError) as e:
        client(url).instant("up", 0)
    assert_mentions(str(e.value), "one series", "65536 bytes")


VM_LIKE = (
    '{"status":"success","isPartial":false,"data":{"result":[{"metric":{"gpu":"0","pod":"é\\u00e9 ü"},'
    '"values":[[10,"1.5"],[20,"NaN"],[30,"2"]]},{"metric":{},"values":[[10,"3e2"]]},'
    '{"metric":{"pod":"é\\u00e9 ü","gpu":"0"},"values":[[10,"9"]]}],"resultType":"matrix"},'
    '"stats":{"seriesFetched":"3","executionTimeMsec":1}}\n'
)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_an_answer_cut_anywhere_decodes_as_it_would_whole(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wherever the reads cut it (inside a string, an escape, a number, a multi-byte character), with
    the members in any order and keys a store adds: the same series as ``json.loads`` of all of it, a
    NaN left out, a label set sent twice taken once."""
    monkeypatch.setattr(client_module, "READ_CHUNK", chunk)
    with store(lambda *_: VM_LIKE.encode()) as url:
        got = client(url).range("up", 0, 30, 10)
    assert [(labels, list(points)) for labels, points in got] == [
        ({"gpu": "0", "pod": "éé ü"}, [(10.0, 1.5), (30.0, 2.0)]),
        ({}, [(10.0, 300.0)]),
    ]
    assert all(isinstance(points, Points) for _, points in got)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}, "value":[0,"1"]}]}} x', "JSON"),
        (b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[0,"1"]}', "JSON"),
        (b'{"status":"success","data":{"resultType":"matrix","result":[{"value":[0,"1"]}]}}', "expected a vector"),
        (b'{"status":"success","data":{"resultType":"vector","result":[1]}}', "not a list of series"),
        (b'{"status":"success","data":{"resultType":"vector","result":{}}}', "not a list of series"),
        (b'{"status":"success","data":{"resultType":"vector"}}', "not a list of series: None"),
        (b'{"status":"error","errorType":"bad_data","error":"parse error"}', "bad_data: parse error"),
        (b"[" * 100000, "JSON"),
        (b"\xff\xfe", "JSON"),
    ],
)
def test_a_broken_answer_read_as_it_arrives_is_named_as_before(body: bytes, said: str) -> None:
    with store(lambda *_: body) as url, pytest.raises(QueryError, match=said):
        client(url).instant("up", 0)


def test_points_read_as_the_pairs_they_stand_for() -> None:
    p = Points([(1.0, 2.0), (3.0, 4.0)])
    assert len(p) == 2 and p[-1] == (3.0, 4.0) and p[0] == (1.0, 2.0) and list(p) == [(1.0, 2.0), (3.0, 4.0)]
    assert p.shifted(-1.0) == [(0.0, 2.0), (2.0, 4.0)] and p == [(1.0, 2.0), (3.0, 4.0)]
    assert not Points() and p[1:] == [(3.0, 4.0)]
    with pytest.raises(IndexError):
        p[2]
