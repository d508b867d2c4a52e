"""A reader of the log that stops reading never freezes the daemon (issue 28, points 7 and 11).

``gpu-exporter 2>&1 | sleep 1000``: after about 540 lines the logging thread blocked on the pipe,
structlog's lock blocked every other logger, polls stopped and SIGTERM no longer ended the process.
Now lines queue for a writer thread of their own, and past the bound they are dropped and counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpu_exporter.logs import LogPipe
from tests.exporter_helpers import DAEMON_STOP_S, http_get, parse_exposition, value
from tests.fakenvml import Scenario, subprocess_env
from tests.timing import LATE_S, NEVER_S, wait_until

pytestmark = pytest.mark.integration


def test_writes_never_wait_for_a_reader_that_stopped(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    pipe = LogPipe(write_fd, capacity=100)
    logger = structlog.PrintLogger(file=pipe)  # type: ignore[arg-type]
    done = threading.Event()

    def flood() -> None:
        for i in range(20_000):  # ~2 MB: thirty times what the pipe holds
            logger.msg(json.dumps({"event": "flood", "i": i, "pad": "x" * 80}))
        done.set()

    threading.Thread(target=flood, daemon=True).start()
    assert done.wait(NEVER_S), "a log call waited on the pipe nobody reads"
    assert pipe.dropped > 0
    # The reader comes back: what was queued arrives, then how many lines were dropped.
    out = b""
    os.set_blocking(read_fd, False)
    deadline = time.monotonic() + NEVER_S
    while b"log_lines_dropped" not in out:
        logger.msg('{"event": "after"}')
        try:
            out += os.read(read_fd, 1 << 20)
        except BlockingIOError:
            assert time.monotonic() < deadline, "the writer never caught up"
            time.sleep(0.01)
    first = json.loads(out.split(b"\n", 1)[0])
    assert first["event"] == "flood" and first["i"] == 0  # whole lines, oldest first
    said = next(json.loads(line) for line in out.split(b"\n") if b"log_lines_dropped" in line)
    assert 0 < said["lines"] <= pipe.dropped
    # Let the writer finish before the descriptors close: a later test's pipe may reuse their numbers.
    while not pipe.drain(0.01):
        with contextlib.suppress(BlockingIOError):
            os.read(read_fd, 1 << 20)
    os.close(read_fd)
    os.close(write_fd)


def test_a_partial_line_waits_for_its_end_and_a_huge_one_is_cut() -> None:
    read_fd, write_fd = os.pipe()
    pipe = LogPipe(write_fd)
    pipe.write("half ")
    pipe.write("a line\n")
    pipe.write("y" * 100_000 + "\n")
    assert pipe.drain(NEVER_S)
    os.set_blocking(read_fd, False)
    lines = os.read(read_fd, 1 << 20).split(b"\n")
    assert lines[0] == b"half a line"
    assert len(lines[1]) == 16 * 1024
    os.close(read_fd)
    os.close(write_fd)


def test_a_daemon_whose_log_nobody_reads_keeps_polling_and_stops_on_sigterm(scenario: Scenario, tmp_path: Path) -> None:
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
    g.utilization(50, 10).memory(80 * 1024**3, 10 * 1024**3)
    scenario.write()
    config = tmp_path / "c.yml"
    config.write_text("poll_interval: 0.2s\n")
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_exporter", "--web.listen-address", "127.0.0.1:0", "--log.format", "json",
         "--config", str(config)],
        env=subprocess_env(scenario.path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=write_fd,
    )  # fmt: skip
    os.close(write_fd)
    try:
        port = _listening_port(read_fd)  # read until the daemon listens, then never again
        config.write_text("poll_interval: [not, a, duration]\n")  # each reload fails and says so
        for _ in range(3000):  # ~600 KB of error lines into a 64 KB pipe
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.001)
        url = f"http://127.0.0.1:{port}/metrics"

        def polled_at() -> float | None:
            return value(
                parse_exposition(http_get(url)[2].decode()), "gpu_exporter_last_poll_success_timestamp_seconds"
            )

        first = polled_at()
        assert first is not None
        assert wait_until(lambda: (polled_at() or 0) > first), "polls stopped behind the blocked log"
        samples = parse_exposition(http_get(url)[2].decode())
        assert value(samples, "gpu_exporter_log_lines_dropped_total") is not None  # drops: the test above
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DAEMON_STOP_S + LATE_S) == 0, "SIGTERM did not end the process"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(read_fd)


def _listening_port(fd: int) -> int:
    buf = b""
    deadline = time.monotonic() + NEVER_S
    while time.monotonic() < deadline:
        chunk = os.read(fd, 65536)
        assert chunk, f"the daemon exited: {buf.decode(errors='replace')}"
        buf += chunk
        for line in buf.split(b"\n"):
            if b'"listening"' in line:
                return int(json.loads(line)["port"])
    raise AssertionError("the daemon did not listen")


def test_the_daemon_starts_with_stdout_closed_and_stops_cleanly_with_stderr_closed(scenario: Scenario) -> None:
    """Point 11: with stdout closed it crashed at start ('NoneType' ... isatty); a clean SIGTERM exited 1
    with stderr closed."""
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
    g.utilization(50, 10).memory(80 * 1024**3, 10 * 1024**3)
    scenario.write()
    for closed in ("stdout", "stderr"):
        _runs_and_stops_with(closed, scenario)


def _runs_and_stops_with(closed: str, scenario: Scenario) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import os, sys\n"
        f"os.close({1 if closed == 'stdout' else 2}); sys.{closed} = None\n"
        "from gpu_exporter.cli import main\n"
        f"sys.exit(main(['--web.listen-address', '127.0.0.1:{port}']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=subprocess_env(scenario.path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    def up() -> bool:
        assert proc.poll() is None, f"{closed} closed: the daemon exited: {proc.communicate()}"
        try:
            return http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        except OSError:
            return False

    try:
        assert wait_until(up, interval=0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DAEMON_STOP_S + LATE_S) == 0, proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_once_with_stdout_closed_is_unknown(scenario: Scenario) -> None:
    """Point 11: --once with stdout closed exited 1 (a traceback); a check that cannot report is UNKNOWN."""
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
    g.utilization(50, 10).memory(80 * 1024**3, 10 * 1024**3)
    scenario.write()
    code = "import os, sys\nos.close(1)\nfrom gpu_exporter.cli import main\nsys.exit(main(['--once']))\n"
    out: Any = subprocess.run([sys.executable, "-c", code], env=subprocess_env(scenario.path),
                              capture_output=True, text=True, timeout=NEVER_S)  # fmt: skip
    assert out.returncode == 3, out
