"""Helpers shared by the benchmarks that ``benchmarks/run`` drives (vs_nvitop, scale, fleet).

Every process started here is tracked by a ``Children`` and killed by process group when the
``with`` block ends, on errors and on SIGTERM (``benchmarks/run`` wraps everything in ``timeout``).
All traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def exit_on_sigterm() -> None:
    """Turn SIGTERM (from ``timeout``) into SystemExit, so every ``finally`` runs and kills its children."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        models = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = models[0].split(":", 1)[1].strip() if models else cpu
    mem_gib = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_gib = int(Path("/proc/meminfo").read_text().split()[1]) / 1024**2
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    return {
        "commit": commit or "unknown",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m['date']}; {m['cpu']}, {m['cores']} cores, {m['memory_gib']:g} GiB; Python {m['python']}; "
        f"{m['platform']}; gpu-exporter at {m.get('commit', 'unknown')}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- processes -----------------------------------------------------------------------------------


class Children:
    """Processes started in their own process group, all killed (group and all) on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: Sequence[str], *, env: dict[str, str] | None = None, stdout: IO[Any] | int | None = None,
              stderr: IO[Any] | int | None = None, stdin: int | None = subprocess.DEVNULL,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
        proc = subprocess.Popen(
            list(args), env=env, stdout=stdout if stdout is not None else subprocess.DEVNULL,
            stderr=stderr if stderr is not None else subprocess.DEVNULL, stdin=stdin, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 0.0) -> None:
        if proc.poll() is None and grace > 0:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group: anything the child started goes too
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc in self.procs:
            self.procs.remove(proc)

    def __enter__(self) -> Children:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        for proc in list(self.procs):
            self.stop(proc)


def wait_for_log_event(path: Path, proc: subprocess.Popen[bytes], event: str, timeout: float = 60) -> dict[str, Any]:
    """The first JSON log line in ``path`` whose "event" is ``event``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    entry = json.loads(line)
                    if isinstance(entry, dict) and entry.get("event") == event:
                        return entry
        if proc.poll() is not None:
            raise RuntimeError(
                f"{proc.args!r} exited with {proc.returncode}:\n{path.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args!r}: no {event!r} event within {timeout} s")


def spawn_gpu_exporter(children: Children, args: Sequence[str], env: dict[str, str] | None,
                       logfile: Path) -> subprocess.Popen[bytes]:  # fmt: skip
    """The daemon on 127.0.0.1 with an ephemeral port, its JSON log in ``logfile``."""
    with open(logfile, "wb") as f:
        return children.start(
            [sys.executable, "-m", "gpu_exporter", "--web.listen-address", "127.0.0.1:0", "--log.format", "json",
             *args],
            env=env, stderr=f, cwd=ROOT,
        )  # fmt: skip


def listening_port(proc: subprocess.Popen[bytes], logfile: Path, timeout: float = 60) -> int:
    return int(wait_for_log_event(logfile, proc, "listening", timeout)["port"])


def start_gpu_exporter(children: Children, args: Sequence[str], env: dict[str, str] | None, logfile: Path,
                       timeout: float = 60) -> tuple[subprocess.Popen[bytes], int]:  # fmt: skip
    """The daemon started and listening; (process, port)."""
    proc = spawn_gpu_exporter(children, args, env, logfile)
    return proc, listening_port(proc, logfile, timeout)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- HTTP and exposition -------------------------------------------------------------------------


def get(url: str, gzipped: bool = False, timeout: float = 10) -> tuple[bytes, int]:
    """(decoded body, bytes on the wire)."""
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzipped else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw: bytes = r.read()
        enc = r.headers.get("Content-Encoding", "")
    return (gzip.decompress(raw) if enc == "gzip" else raw), len(raw)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_samples(body: bytes) -> list[Sample]:
    out = []
    for line in body.decode(errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            with contextlib.suppress(ValueError):
                out.append(Sample(m.group(1), labels, float(m.group(3))))
    return out


def value(samples: Sequence[Sample], name: str, **labels: str) -> float:
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(name)


# --- wrk -----------------------------------------------------------------------------------------


def wrk(url: str, connections: int, seconds: float, gzipped: bool, threads: int | None = None) -> dict[str, Any]:
    cmd = ["wrk", f"-t{threads or min(connections, 2)}", f"-c{connections}", f"-d{seconds:g}s", "--latency",
           "--timeout", "5s"]  # fmt: skip
    if gzipped:
        cmd += ["-H", "Accept-Encoding: gzip"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=seconds + 60).stdout

    def num(pattern: str) -> float:
        m = re.search(pattern, out, re.MULTILINE)
        return float(m.group(1)) if m else 0.0

    def latency(pct: str) -> float | None:
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\b", out, re.MULTILINE)
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)] if m else None

    errors = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    return {
        "requests_per_second": num(r"Requests/sec:\s+([\d.]+)"),
        "p50_ms": latency("50"),
        "p99_ms": latency("99"),
        "requests": int(num(r"(\d+) requests in")),
        "errors": errors + int(num(r"Non-2xx or 3xx responses: (\d+)")),
    }


# --- py-spy --------------------------------------------------------------------------------------


def pyspy_top(py_spy: Path | None, pid: int, seconds: float, top: int = 10) -> dict[str, Any]:
    """Sample ``pid`` with py-spy; the functions that take the most samples, by self and by total time.

    Only samples of the thread holding the GIL count (``--gil``): that is where the Python CPU
    time goes. Threads waiting on a queue, a socket or a driver call that released the GIL are left out.
    """
    if py_spy is None or not py_spy.exists():
        return {"error": "py-spy is not installed"}
    out = Path(f"/tmp/gpu-exporter-bench-pyspy-{pid}.txt")
    try:
        r = subprocess.run(
            [str(py_spy), "record", "--gil", "--nonblocking", "--format", "raw", "--rate", "1000",
             "--duration", str(max(1, round(seconds))), "--output", str(out), "--pid", str(pid)],
            capture_output=True, text=True, timeout=seconds + 60,
        )  # fmt: skip
        if r.returncode != 0 or not out.exists():
            return {"error": (r.stderr or r.stdout).strip()[-500:]}
        self_time: Counter[str] = Counter()
        total_time: Counter[str] = Counter()
        n = 0
        for line in out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            c = int(count)
            n += c
            frames = [_short_frame(f) for f in stack.split(";")]
            self_time[frames[-1]] += c
            for f in set(frames):
                total_time[f] += c
        return {
            "samples": n,
            "self": [(f, round(100 * c / n, 1)) for f, c in self_time.most_common(top)] if n else [],
            "total": [(f, round(100 * c / n, 1)) for f, c in total_time.most_common(top + 8)] if n else [],
        }
    finally:
        with contextlib.suppress(OSError):
            out.unlink()


def _short_frame(frame: str) -> str:
    """'poll (/x/y/gpu_exporter/poller.py:88)' -> 'poll (gpu_exporter/poller.py:88)'."""
    m = re.match(r"^(.*) \((.*?):(\d+)\)$", frame)
    if not m:
        return frame
    func, path, line = m.groups()
    parts = Path(path).parts
    for anchor in ("site-packages", "gpu_exporter", "python3.11"):
        if anchor in parts:
            i = parts.index(anchor)
            parts = parts[i + 1 :] if anchor != "gpu_exporter" else parts[i:]
            break
    return f"{func} ({'/'.join(parts[-3:])}:{line})"


# --- small statistics ----------------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


def which(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise SystemExit(f"benchmarks: {name} is missing (benchmarks/run installs it)")
    return path


@contextlib.contextmanager
def tempdir(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def wait_ready(url: str, what: str, log_path: Path, timeout: float = 300) -> None:
    """Until ``url`` answers 200 (a store's readiness endpoint); else fail with the end of its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not become ready:\n" + log_path.read_text()[-3000:])
