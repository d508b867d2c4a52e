"""Soak run: the daemon under constant churn, watched for anything that grows without bound.

Throughout the run, the fake NVML scenario changes every few seconds:
- processes come and go: a few hundred short-lived PIDs;
- a GPU is lost and comes back;
- memory crosses the alert threshold, so alerts fire and resolve, delivered to a local webhook.

A scraper reads /metrics once a second. Every 10 s the script records the daemon's RSS, thread
count, open file descriptors and the scrape latency, then reports their start, end and maximum,
and the trend of the second half.

    .venv/bin/python benchmarks/soak.py            # 5 minutes
    .venv/bin/python benchmarks/soak.py --full     # 30 minutes

Writes benchmarks/results/soak.md and soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakenvml import Scenario, build_library, subprocess_env  # noqa: E402
from tests.fakenvml.presets import preset  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GIB = 1024**3


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def churn(s: Scenario, step: int) -> None:
    g0, g1, g2 = s.gpu(0), s.gpu(1), s.gpu(2)
    g0.processes.clear()
    for i in range(300):  # 300 fresh PIDs every step
        g0.add_process(1_000_000 + step * 300 + i, 64 * 1024**2, name=f"job{i}")
    if step % 6 == 3:
        g1.lost()
    elif step % 6 == 5:
        g1.recovered()
    total = 81559 * 1024**2
    g2.memory(total, int(total * (0.95 if step % 4 < 2 else 0.5)), reserved=0)  # fires, then resolves
    s.write()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="30 minutes instead of 5")
    args = ap.parse_args()
    minutes = 30 if args.full else 5
    build_library()
    received = [0]

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received[0] += 1
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *a: object) -> None:
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        s = preset("h100-8x-training", Path(tmp) / "node.scn")
        s.write()
        cfg = Path(tmp) / "config.yaml"
        cfg.write_text(json.dumps({
            "rules": {"GpuMemoryHigh": {"for": "0s"}, "GpuLost": {"for": "0s"}},
            "alerting": {"resend_interval": "5s", "webhooks": [{"url": f"http://127.0.0.1:{hook.server_port}/"}]},
        }))  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_exporter", "--web.listen-address", "127.0.0.1:0", "--log.format", "json",
             "--poll.interval", "1s", "--config", str(cfg)],
            env=subprocess_env(s.path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        samples: list[dict[str, float]] = []
        try:
            assert proc.stderr is not None
            port = 0
            while not port:
                entry = json.loads(proc.stderr.readline())
                port = int(entry["port"]) if entry.get("event") == "listening" else 0
            threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
            t0 = time.monotonic()
            step, latencies = 0, []
            next_sample = next_churn = t0
            while time.monotonic() - t0 < minutes * 60:
                now = time.monotonic()
                if now >= next_churn:
                    churn(s, step)
                    step += 1
                    next_churn = now + 5
                w = time.perf_counter()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    r.read()
                latencies.append(time.perf_counter() - w)
                if now >= next_sample:
                    samples.append({"t": round(now - t0), **proc_stats(proc.pid),
                                    "scrape_ms_median": statistics.median(latencies) * 1000,
                                    "scrape_ms_max": max(latencies) * 1000,
                                    "notifications": received[0]})  # fmt: skip
                    latencies = []
                    next_sample = now + 10
                time.sleep(max(0.0, 1 - (time.perf_counter() - w)))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            hook.shutdown()
    half = samples[len(samples) // 2 :]

    def trend(key: str) -> float:
        return half[-1][key] - half[0][key]

    res: dict[str, Any] = {
        "minutes": minutes,
        "churn_steps": step,
        "notifications_received": received[0],
        "first": samples[0],
        "last": samples[-1],
        "max": {k: max(x[k] for x in samples) for k in ("rss_mib", "threads", "fds", "scrape_ms_max")},
        "second_half_change": {k: trend(k) for k in ("rss_mib", "threads", "fds")},
        "timeline": samples,
    }
    f, last, mx, tr = res["first"], res["last"], res["max"], res["second_half_change"]
    text = "\n".join([
        f"# Soak: {minutes} minutes under churn",
        "",
        f"Every 5 s: 300 new PIDs, GPU 1 lost or back, GPU 2's memory across the alert threshold "
        f"({step} steps, {received[0]} webhook notifications). Scrapes at 1/s.",
        "",
        "| figure | after 10 s | at the end | max | change over the second half |",
        "|---|---|---|---|---|",
        f"| RSS | {f['rss_mib']:.1f} MiB | {last['rss_mib']:.1f} MiB | {mx['rss_mib']:.1f} MiB | "
        f"{tr['rss_mib']:+.1f} MiB |",
        f"| threads | {f['threads']:.0f} | {last['threads']:.0f} | {mx['threads']:.0f} | {tr['threads']:+.0f} |",
        f"| open fds | {f['fds']:.0f} | {last['fds']:.0f} | {mx['fds']:.0f} | {tr['fds']:+.0f} |",
        f"| scrape latency (median of the window) | {f['scrape_ms_median']:.2f} ms | "
        f"{last['scrape_ms_median']:.2f} ms | {mx['scrape_ms_max']:.1f} ms (slowest scrape) | |",
        "",
    ])  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(res, indent=2))
    (RESULTS / "soak.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
