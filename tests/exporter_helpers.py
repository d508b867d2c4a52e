"""Helpers for exporter tests: polling the fake NVML in-process, and running the daemon."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.serving.metrics import gpu_families
from gpu_exporter.snapshot import NodeSnapshot
from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.poller import Poller
from tests.fakenvml import start
from tests.fakenvml.runtime import driver_monotonic, driver_wall_clock
from tests.timing import LATE_S, NEVER_S

# Daemon.stop(): "within a couple of seconds even if a poll is stuck in the driver"; a test waits
# for the exit after SIGTERM this long + LATE_S.
DAEMON_STOP_S = 2.0


@dataclass
class ErrorLog:
    counts: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    def __call__(self, function: str, error: str) -> None:
        self.counts[(function, error)] += 1


def make_poller(
    static_refresh_s: float = 300.0, gpu_timeout_s: float = 10.0, profiling_interval: float = 0.1
) -> tuple[Poller, ErrorLog]:
    """A poller on the NVML backend; GPM and process utilization are re-read at every poll 100 ms
    apart unless ``profiling_interval`` says otherwise, and the slow reads (ECC, links, fabric) at every
    poll, so that a test's change shows at the next.  Its backend's clocks are the fake driver's,
    so that its spans follow ``advance_clock`` and its wall clock ``step_wall_clock``."""
    errors = ErrorLog()
    backend = NvmlBackend(errors, profiling_interval=profiling_interval, monotonic=driver_monotonic,
                          wall=driver_wall_clock, slow_interval=0.0)  # fmt: skip
    poller = Poller(backend, errors=errors, static_refresh_s=static_refresh_s, gpu_timeout_s=gpu_timeout_s)
    return poller, errors


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples_of(snapshot: NodeSnapshot) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value for fam in gpu_families(snapshot) for s in fam.samples}


def parse_exposition(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def names_for_gpu(samples: Samples, gpu: str) -> set[str]:
    return {n for (n, ls) in samples if ("gpu", gpu) in ls}


def wait_for(predicate: object, timeout: float = 15.0, interval: float = 0.05, what: str = "condition") -> None:
    """Waits until ``predicate()`` holds; fails after ``timeout`` + LATE_S (a busy machine is slower,
    and a wait for what does happen ends when it does, so the margin costs nothing then)."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout + LATE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} + {LATE_S} s waiting for {what}")
        time.sleep(interval)


def http_get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=NEVER_S) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@dataclass
class RunningDaemon:
    proc: subprocess.Popen[str]
    port: int
    log: list[dict[str, object]]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> Samples:
        status, _, body = http_get(self.url + "/metrics")
        assert status == 200
        return parse_exposition(body.decode())


def _drain(proc: subprocess.Popen[str], log: list[dict[str, object]]) -> None:
    """Collect the daemon's JSON log lines, so its stderr pipe never fills up."""
    assert proc.stderr is not None
    for line in proc.stderr:
        try:
            log.append(json.loads(line))
        except json.JSONDecodeError:
            log.append({"raw": line.rstrip()})


def _listening_port(proc: subprocess.Popen[str], log: list[dict[str, object]], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in list(log):
            if entry.get("event") == "listening":
                return int(str(entry["port"]))
        if proc.poll() is not None:
            time.sleep(0.1)  # let the drain thread catch the last lines
            raise AssertionError(f"daemon exited early (rc={proc.returncode}); log: {log}")
        time.sleep(0.02)
    raise AssertionError(f"daemon did not start listening in {timeout} s; log: {log}")


@contextmanager
def run_daemon(scenario: Path, *args: str, library_dir: Path | None = None,
               listen_flag: bool = True) -> Iterator[RunningDaemon]:  # fmt: skip
    """The real daemon in a subprocess against the fake NVML, on a free loopback port (given as a
    flag unless ``listen_flag`` is False: then the config file must say where)."""
    listen = ["--web.listen-address", "127.0.0.1:0"] if listen_flag else []
    cmd = [sys.executable, "-m", "gpu_exporter", *listen, "--log.format", "json", *args]
    proc = start(cmd, scenario, library_dir=library_dir, stdin=subprocess.DEVNULL)
    log: list[dict[str, object]] = []
    drain = threading.Thread(target=_drain, args=(proc, log), daemon=True)
    drain.start()
    try:
        yield RunningDaemon(proc, _listening_port(proc, log, timeout=NEVER_S), log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=NEVER_S)
        drain.join(timeout=NEVER_S)
        if proc.stdout is not None:
            proc.stdout.close()
