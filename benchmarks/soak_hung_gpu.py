"""Soak with a hung driver: one GPU stuck in every call, another forcing NVML to start over.

8 fake H100s: GPU 0's calls block for a day (a hung driver), and GPU 1 answers
NVML_ERROR_UNINITIALIZED to nvmlDeviceGetUtilizationRates, so every poll that reads it must
initialise NVML again.  The daemon polls every second with a 2 s GPU timeout.  Every 10 s the
script records its threads, open files, RSS and the log lines written since the start; a scrape
of /metrics and /healthz is timed at each sample.

    .venv/bin/python benchmarks/soak_hung_gpu.py                    # 10 minutes
    .venv/bin/python benchmarks/soak_hung_gpu.py --compare 5df7fb2  # and that revision, side by side

With ``--compare REV`` the daemon of that git revision runs at the same time against its own copy
of the scenario, and the figures of both are reported side by side.  Writes
benchmarks/results/soak-hung-gpu.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakenvml import build_library, subprocess_env  # noqa: E402
from tests.fakenvml.presets import preset  # noqa: E402
from tests.fakenvml.scenario import Err  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}  # fmt: skip


class Daemon:
    def __init__(self, name: str, tree: Path, scenario: Path) -> None:
        self.name = name
        self.lines = 0
        self.events: dict[str, int] = {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_exporter", "--web.listen-address", "127.0.0.1:0", "--log.format", "json",
             "--poll.interval", "1s", "--poll.gpu-timeout", "2s"],
            cwd=tree, env=subprocess_env(scenario), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        self.port = 0
        while not self.port:
            line = self.proc.stderr.readline()
            if not line:
                raise SystemExit(f"{name}: the daemon exited, rc={self.proc.wait()}")
            self._count(line)
            entry = json.loads(line)
            self.port = int(entry["port"]) if entry.get("event") == "listening" else 0
        threading.Thread(target=self._drain, daemon=True).start()

    def _count(self, line: str) -> None:
        self.lines += 1
        try:
            event = str(json.loads(line).get("event"))
        except json.JSONDecodeError:
            event = "(not JSON)"
        self.events[event] = self.events.get(event, 0) + 1

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._count(line)

    def timed_get(self, path: str) -> float | None:
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                r.read()
        except (OSError, urllib.error.URLError):
            return None
        return (time.perf_counter() - t0) * 1000

    def sample(self, t: float) -> dict[str, Any]:
        return {"t": round(t), **proc_stats(self.proc.pid), "log_lines": self.lines,
                "scrape_ms": self.timed_get("/metrics"), "healthz_ms": self.timed_get("/healthz")}  # fmt: skip

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def source_tree(rev: str, tmp: Path) -> Path:
    dest = tmp / "tree"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def scenario(path: Path) -> Path:
    s = preset("h100-8x-training", path)
    s.gpu(0).delay(86_400_000)  # every call on GPU 0 hangs for a day
    s.gpu(1).error("util.gpu", Err("UNINITIALIZED"))  # reading GPU 1 makes NVML start over
    return s.write()


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    half = rows[len(rows) // 2 :]
    keys = ("threads", "fds", "rss_mib", "log_lines")
    return {
        "first": {k: rows[0][k] for k in keys},
        "last": {k: rows[-1][k] for k in keys},
        "max": {k: max(r[k] for r in rows) for k in keys},
        "second_half_change": {k: half[-1][k] - half[0][k] for k in keys},
        "scrape_ms_max": max((r["scrape_ms"] for r in rows if r["scrape_ms"] is not None), default=None),
        "scrapes_failed": sum(1 for r in rows if r["scrape_ms"] is None or r["healthz_ms"] is None),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--compare", metavar="REV", help="also run this git revision, side by side")
    args = ap.parse_args()
    build_library()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        daemons = [Daemon("this tree", ROOT, scenario(tmp / "a.scn"))]
        if args.compare:
            daemons.append(Daemon(args.compare, source_tree(args.compare, tmp), scenario(tmp / "b.scn")))
        timelines: dict[str, list[dict[str, Any]]] = {d.name: [] for d in daemons}
        t0 = time.monotonic()
        try:
            time.sleep(10)
            while time.monotonic() - t0 < args.minutes * 60:
                for d in daemons:
                    if d.proc.poll() is not None:
                        raise SystemExit(f"{d.name}: the daemon died, rc={d.proc.returncode}")
                    timelines[d.name].append(d.sample(time.monotonic() - t0))
                time.sleep(10)
        finally:
            for d in daemons:
                d.stop()
        events = {d.name: dict(sorted(d.events.items(), key=lambda kv: -kv[1])) for d in daemons}
    res = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
        "revision": subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                                   text=True).stdout.strip(),
        "minutes": args.minutes,
        "summary": {name: summary(rows) for name, rows in timelines.items()},
        "log_events": events,
        "timelines": timelines,
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak-hung-gpu.json").write_text(json.dumps(res, indent=2))
    text = report(res)
    (RESULTS / "soak-hung-gpu.md").write_text(text)
    print(text)
    return 0


def report(res: dict[str, Any]) -> str:
    names = list(res["summary"])
    m = res["machine"]
    out = [
        f"# Soak: a hung GPU and NVML re-initialisation for {res['minutes']:g} minutes",
        "",
        f"{m['date']}; {m['cores']} cores, Python {m['python']}; this tree is {res['revision']}.",
        "",
        "8 fake H100s; every call on GPU 0 hangs (a day), GPU 1's utilization answers UNINITIALIZED, so "
        "each poll that reads it initialises NVML again. Poll every 1 s, GPU timeout 2 s. Sampled every 10 s "
        "from 10 s after the start.",
        "",
        "| figure | "
        + " | ".join(f"{n}: at 10 s | {n}: at the end | {n}: max | {n}: change over the second half" for n in names)
        + " |",
        "|---|" + "---|---|---|---|" * len(names),
    ]
    figures = (("threads", "threads", "{:.0f}"), ("fds", "open files", "{:.0f}"), ("rss_mib", "RSS (MiB)", "{:.1f}"),
               ("log_lines", "log lines so far", "{:.0f}"))  # fmt: skip
    for key, label, fmt in figures:
        cells = []
        for n in names:
            s = res["summary"][n]
            cells += [fmt.format(s["first"][key]), fmt.format(s["last"][key]), fmt.format(s["max"][key]),
                      ("{:+" + fmt[2:]).format(s["second_half_change"][key])]  # fmt: skip
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("")
    for n in names:
        s = res["summary"][n]
        top = ", ".join(f"{e} {c}" for e, c in list(res["log_events"][n].items())[:6])
        out.append(f"- {n}: slowest scrape {s['scrape_ms_max']:.1f} ms, {s['scrapes_failed']} failed; "
                   f"log lines by event: {top}.")  # fmt: skip
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
