"""Core daemon benchmark: poll time for 8 GPUs, /metrics throughput, resident memory over time.

Runs against the fake NVML (8x H100, 20 ms PCIe sampling, 64 processes), on loopback only.
Everything is measured side by side in one run and reported as medians and ratios, because the
machines this runs on are shared and noisy.

    .venv/bin/python benchmarks/core.py              # about 12 minutes (10-minute memory run)
    .venv/bin/python benchmarks/core.py --rss-minutes 1

Writes benchmarks/results/core.md and core.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakenvml import Scenario, build_library, load_in_process, subprocess_env  # noqa: E402
from tests.fakenvml.presets import preset  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GIB = 1024**3


def scenario(path: Path) -> Scenario:
    s = preset("h100-8x-training", path)
    for i, g in enumerate(s.gpus):
        g.processes.clear()
        for p in range(8):
            g.add_process(50_000 + 10 * i + p, 8 * GIB, name=f"worker{p}")
    s.write()
    return s


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        models = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = models[0].split(":", 1)[1].strip() if models else cpu
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def bench_poll(path: Path, polls: int) -> dict[str, float]:
    """In-process: the real poller and NVML backend against the fake library."""
    load_in_process()
    os.environ["FAKE_NVML_SCENARIO"] = str(path)
    from gpu_exporter.logs import configure_logging
    from gpu_exporter.sources.nvml import NvmlBackend
    from gpu_exporter.sources.poller import Poller

    configure_logging("json", "warning")
    poller = Poller(NvmlBackend(lambda f, e: None), errors=lambda f, e: None)
    poller.poll()  # discovery and static facts
    walls, cpus = [], []
    for _ in range(polls):
        c0, w0 = time.process_time(), time.perf_counter()
        snap = poller.poll()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        assert all(g.up for g in snap.gpus) and len(snap.gpus) == 8
    poller.close()
    return {
        "polls": polls,
        "wall_median_ms": statistics.median(walls) * 1000,
        "wall_p90_ms": sorted(walls)[int(len(walls) * 0.9)] * 1000,
        "cpu_median_ms": statistics.median(cpus) * 1000,
        "sequential_floor_ms": 8 * 2 * 20,
    }


def wait_listening(proc: subprocess.Popen[str], timeout: float = 30) -> int:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"process exited: {proc.poll()}")
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("event") == "listening":
            return int(entry["port"])
    raise RuntimeError("did not start listening")


def wrk(url: str, connections: int, seconds: int, gzip: bool) -> dict[str, float]:
    cmd = ["wrk", f"-t{min(connections, 2)}", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    if gzip:
        cmd[1:1] = ["-H", "Accept-Encoding: gzip"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]

    def latency(pct: str) -> float:
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)", out, re.MULTILINE)
        assert m, out
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    return {"requests_per_second": rps, "p50_ms": latency("50"), "p99_ms": latency("99")}


BASELINE = textwrap.dedent("""
    # prometheus_client's default path: the same collector, rendered on every scrape.
    import json, os, sys, time
    from prometheus_client import CollectorRegistry, start_http_server
    from gpu_exporter.settings.config import load_settings
    from gpu_exporter.daemon import Daemon
    from gpu_exporter.sources.nvml import NvmlBackend
    d = Daemon(load_settings(), NvmlBackend)
    d.poll_once()
    server, _ = start_http_server(0, addr="127.0.0.1", registry=d.registry)
    print(json.dumps({"event": "listening", "port": server.server_address[1]}), file=sys.stderr, flush=True)
    time.sleep(3600)
""")


def bench_http(path: Path, seconds: int) -> dict[str, Any]:
    env = subprocess_env(path)
    results: dict[str, Any] = {}
    ours = subprocess.Popen(
        [sys.executable, "-m", "gpu_exporter", "--web.listen-address", "127.0.0.1:0", "--log.format", "json",
         "--poll.interval", "1s"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = subprocess.Popen([sys.executable, "-c", BASELINE], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        ports = {"gpu-exporter": wait_listening(ours), "prometheus_client default": wait_listening(base)}
        time.sleep(2)
        body = urllib.request.urlopen(f"http://127.0.0.1:{ports['gpu-exporter']}/metrics").read()
        series = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
        gpu_series = [s for s in series if s.startswith("gpu_") and not s.startswith("gpu_exporter_")]
        results["bytes_per_scrape"] = len(body)
        results["series"] = len(series)
        results["series_per_gpu"] = len(gpu_series) / 8
        for name, port in ports.items():
            for conns in (2, 16):
                for gz in (False, True):
                    key = f"{name} c={conns}{' gzip' if gz else ''}"
                    results[key] = wrk(f"http://127.0.0.1:{port}/metrics", conns, seconds, gz)
        ours_rps = results["gpu-exporter c=2"]["requests_per_second"]
        base_rps = results["prometheus_client default c=2"]["requests_per_second"]
        results["ratio_c2"] = ours_rps / base_rps
    finally:
        for p in (ours, base):
            p.kill()
            p.wait()
    return results


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def bench_rss(path: Path, minutes: float) -> dict[str, Any]:
    """The daemon polling every second and scraped every second, RSS sampled over the run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_exporter", "--web.listen-address", "127.0.0.1:0", "--log.format", "json",
         "--poll.interval", "1s"],
        env=subprocess_env(path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = wait_listening(proc)
        samples = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < minutes * 60:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
            samples.append((round(time.monotonic() - t0), rss_kib(proc.pid)))
            time.sleep(1)
    finally:
        proc.kill()
        proc.wait()
    start = samples[min(10, len(samples) - 1)][1]
    return {
        "minutes": minutes,
        "rss_after_10s_mib": start / 1024,
        "rss_end_mib": samples[-1][1] / 1024,
        "rss_max_mib": max(s[1] for s in samples) / 1024,
        "timeline_mib": [(t, kib / 1024) for t, kib in samples[:: max(1, len(samples) // 20)]],
    }


def report(res: dict[str, Any]) -> str:
    p, h, r = res["poll"], res["http"], res["rss"]
    lines = [
        "# Core daemon benchmark",
        "",
        f"Machine: {res['machine']['cpu']}, {res['machine']['cores']} cores, Python {res['machine']['python']}.  ",
        "Fake NVML: 8x H100, 20 ms PCIe sampling per direction, 64 processes.",
        "",
        "## Poll of 8 GPUs (in-process, real pynvml)",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| wall, median | {p['wall_median_ms']:.1f} ms | <= 60 ms (floor 40 ms) |",
        f"| wall, p90 | {p['wall_p90_ms']:.1f} ms | |",
        f"| CPU, median | {p['cpu_median_ms']:.1f} ms | |",
        f"| one GPU after another would cost | >= {p['sequential_floor_ms']} ms | |",
        "",
        f"## /metrics ({h['bytes_per_scrape']} bytes, {h['series']} series, {h['series_per_gpu']:.0f} per GPU)",
        "",
        "| server | connections | gzip | requests/s | p50 | p99 |",
        "|---|---|---|---|---|---|",
    ]
    for key, v in h.items():
        if isinstance(v, dict):
            name, rest = key.split(" c=")
            conns, _, gz = rest.partition(" ")
            lines.append(f"| {name} | {conns} | {'yes' if gz else 'no'} | {v['requests_per_second']:.0f} | "
                         f"{v['p50_ms']:.2f} ms | {v['p99_ms']:.2f} ms |")  # fmt: skip
    lines += [
        "",
        f"Ratio at 2 connections, ours / prometheus_client's default path: **{h['ratio_c2']:.1f}x** "
        "(target: >= 1000 requests/s).",
        "",
        f"## Resident memory over {r['minutes']:g} minutes (poll 1/s, scrape 1/s)",
        "",
        f"After 10 s: {r['rss_after_10s_mib']:.1f} MiB; at the end: {r['rss_end_mib']:.1f} MiB; "
        f"max: {r['rss_max_mib']:.1f} MiB (target <= 60 MB after 10 minutes).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--polls", type=int, default=100)
    ap.add_argument("--wrk-seconds", type=int, default=10)
    ap.add_argument("--rss-minutes", type=float, default=10)
    args = ap.parse_args()
    if not shutil.which("wrk"):
        print("benchmarks/core.py needs wrk: apt-get install wrk", file=sys.stderr)
        return 2
    build_library()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "node.scn"
        scenario(path)
        res = {"machine": machine(), "poll": bench_poll(path, args.polls)}
        res["http"] = bench_http(path, args.wrk_seconds)
        res["rss"] = bench_rss(path, args.rss_minutes)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "core.json").write_text(json.dumps(res, indent=2))
    text = report(res)
    (RESULTS / "core.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
