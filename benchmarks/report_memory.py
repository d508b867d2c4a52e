"""Peak memory of ``gpu-exporter report`` against the series count and size of a store's answers
(issue 50, item 3): an answer of many small series cost about 17 times its bytes decoded.

A store in this process (an HTTP server on 127.0.0.1) answers the report's hours query (GPU-hours by
GPU, holder and state) with N series, a pod each, 8 pods a GPU and 8 GPUs a node, as a fleet whose
pods change hourly answers it; every GPU has a price (one point) and the other queries answer
nothing. The real ``gpu-exporter report`` runs as a subprocess (``--since 1h --format json``), and its
peak RSS is its VmHWM, which it reads from /proc/self/status as it exits (``PEAK``). ``--against
REV`` runs another revision (``git archive``) on the same answers, alternately; ``--runs`` repeats
each case (the table shows medians).

    .venv/bin/python benchmarks/report_memory.py                          # ~2 minutes
    .venv/bin/python benchmarks/report_memory.py --against 4ed73e8 --series 50000 200000 300000

Results: results/report-memory.md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from benchlib import RESULTS, ROOT, log, machine, machine_line, median

PODS_PER_GPU = 8
GPUS_PER_NODE = 8
STATES = ("busy", "allocated_idle")


def hours_answer(series: int) -> bytes:
    """The hours query's answer: ``series`` series of one GPU, pod and state each."""
    out = []
    for i in range(series):
        g = i // PODS_PER_GPU
        node = g // GPUS_PER_NODE
        labels = {"node": f"node-{node:05d}", "instance": f"10.1.{node // 250}.{node % 250}:9400",
                  "gpu": str(g % GPUS_PER_NODE), "uuid": f"GPU-{g:08x}-5e1f-4a2b-9c3d-0123456789ab",
                  "namespace": f"team-{i % 40}", "pod": f"train-{i:07d}-x7k2q", "state": STATES[i % 2]}  # fmt: skip
        out.append({"metric": labels, "value": [0, f"{0.25 + (i % 7) / 8:g}"]})
    return _success("vector", out)


def prices_answer(series: int, start: float, points: int = 1) -> bytes:
    gpus = -(-series // PODS_PER_GPU)
    out = []
    for g in range(gpus):
        node = g // GPUS_PER_NODE
        labels = {"node": f"node-{node:05d}", "instance": f"10.1.{node // 250}.{node % 250}:9400",
                  "gpu": str(g % GPUS_PER_NODE), "uuid": f"GPU-{g:08x}-5e1f-4a2b-9c3d-0123456789ab",
                  "currency": "USD"}  # fmt: skip
        out.append({"metric": labels, "values": [[start + 5 * k, "2.5"] for k in range(points)]})
    return _success("matrix", out)


def priced_steps_answer(series: int) -> bytes:
    """Every GPU priced on each of the 720 steps of ``--since 1h`` (5 s each): no price changed."""
    gpus = -(-series // PODS_PER_GPU)
    out = []
    for g in range(gpus):
        node = g // GPUS_PER_NODE
        labels = {"node": f"node-{node:05d}", "instance": f"10.1.{node // 250}.{node % 250}:9400",
                  "gpu": str(g % GPUS_PER_NODE), "uuid": f"GPU-{g:08x}-5e1f-4a2b-9c3d-0123456789ab",
                  "currency": "USD"}  # fmt: skip
        out.append({"metric": labels, "value": [0, "720"]})
    return _success("vector", out)


def _success(kind: str, result: list[dict[str, Any]]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}},
                      separators=(",", ":")).encode()  # fmt: skip


@contextmanager
def store(series: int, points: int = 1) -> Iterator[tuple[str, dict[str, int]]]:
    """A store whose hours answer has ``series`` series, and each GPU's prices ``points`` points; yields
    its URL and the larger of the two answers' sizes."""
    hours = hours_answer(series)
    prices: dict[float, bytes] = {}  # made once, when a start is asked
    largest = {"bytes": len(hours)}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
            query = form.get("query", [""])[0]
            range_query = self.path.endswith("query_range")
            if query.startswith("sum by (node, instance, gpu, uuid, ") and "gpu_state_seconds_total" in query:
                body = hours
            elif range_query and query.startswith("(max by (node, instance, gpu, uuid, currency)"):
                start = float(form["start"][0])
                if start not in prices:
                    prices[start] = prices_answer(series, start, points)
                    largest["bytes"] = max(largest["bytes"], len(prices[start]))
                body = prices[start]
            elif query.startswith("max by (node, instance, gpu, uuid, currency) (count_over_time("):
                body = priced_steps_answer(series)
            else:
                body = _success("matrix" if range_query else "vector", [])
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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", largest
    finally:
        server.shutdown()
        server.server_close()


# The report's own peak, VmHWM, which it reads at its exit: a child's ru_maxrss also holds the peak of
# the process it was spawned from (Linux keeps the old memory's high-water mark across fork and exec),
# and this one holds every answer it serves.
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


def run_report(tree: Path, url: str, *extra: str) -> dict[str, Any]:
    """One ``gpu-exporter report`` of ``tree``'s code: its exit status, peak RSS (MiB), wall time and last line."""
    with tempfile.NamedTemporaryFile(prefix="report-peak-") as peak:
        cmd = [sys.executable, "-c", PEAK, "report", "--prometheus.url", url, "--since", "1h", "--format", "json",
               "--output", os.devnull, *extra]  # fmt: skip
        t0 = time.monotonic()
        out = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree), "REPORT_PEAK_FILE": peak.name},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)  # fmt: skip
        wall = time.monotonic() - t0
        hwm_kib = int(Path(peak.name).read_text() or 0)
    lines = out.stderr.strip().splitlines()
    return {"rc": out.returncode, "peak_mib": hwm_kib / 1024, "wall_s": wall, "last": lines[-1] if lines else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, nargs="+", default=[0, 10_000, 50_000, 100_000, 200_000, 300_000, 500_000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--points", type=int, default=1, help="each GPU's prices answer this many points (at most 720)")
    ap.add_argument("--against", metavar="REV", help="also measure this git revision, alternately")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="report-memory-") as tmp:
        trees = {"this tree": ROOT}
        if args.against:
            old = Path(tmp) / "against"
            old.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against], check=True,
                                     capture_output=True).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            trees[args.against] = old
        rows = []
        for n in args.series:
            with store(n, args.points) as (url, largest):
                got: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
                for _ in range(args.runs):
                    for name, tree in trees.items():
                        got[name].append(run_report(tree, url))
                for name, runs in got.items():
                    row = {"tree": name, "series": n, "points": args.points, "answer_mib": largest["bytes"] / 1048576,
                           "peak_mib": median([r["peak_mib"] for r in runs]),
                           "wall_s": median([r["wall_s"] for r in runs]), "rc": runs[-1]["rc"],
                           "last": runs[-1]["last"]}  # fmt: skip
                    rows.append(row)
                    log(f"{name}: {n:,} series, {row['answer_mib']:.1f} MiB answer: peak {row['peak_mib']:.0f} MiB, "
                        f"{row['wall_s']:.1f} s, exit {row['rc']}: {row['last'][:160]}")  # fmt: skip
    m = machine()
    RESULTS.mkdir(exist_ok=True)
    tag = "" if args.points == 1 else f"-{args.points}-points"
    (RESULTS / f"report-memory{tag}.json").write_text(json.dumps({"machine": m, "rows": rows}, indent=2) + "\n")
    md = [f"# gpu-exporter report: peak RSS against the hours answer's series, {args.points} price point(s) a GPU "
          f"({machine_line(m)})", "",
          f"Medians of {args.runs} runs. Exit 0/4: a report (4: some GPUs without a price); 1: stopped, naming "
          "the query and the bound.", "",
          "| tree | series | answer | peak RSS | wall | exit |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        md.append(f"| {r['tree']} | {r['series']:,} | {r['answer_mib']:.1f} MiB | {r['peak_mib']:.0f} MiB | "
                  f"{r['wall_s']:.1f} s | {r['rc']} |")  # fmt: skip
    (RESULTS / f"report-memory{tag}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
