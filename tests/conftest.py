"""Shared fixtures: the fake NVML library, scenarios, and pynvml bound to them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.fakenvml import SCENARIO_ENV, Scenario, build_library, load_in_process
from tests.timing import NEVER_S


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Path:
    """The compiled fake ``libnvidia-ml.so.1`` (built once, cached by source hash)."""
    return build_library()


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    """An empty scenario at a fresh path; add GPUs, then ``write()`` it."""
    return Scenario(tmp_path / "node.scn")


@pytest.fixture
def nvml(fake_nvml_lib: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The real pynvml module, in this process, talking to the fake library and ``scenario``.

    The test writes the scenario and calls ``nvmlInit`` itself; every init is undone afterwards.
    """
    load_in_process(fake_nvml_lib)
    monkeypatch.setenv(SCENARIO_ENV, str(scenario.path))
    import pynvml

    from gpu_exporter.sources.nvml import NvmlBackend

    # A backend a test leaves open keeps its XID thread waiting on the driver for the rest of the
    # run (each wake-up allocates, which disturbed tracemalloc measurements in later tests): close
    # every backend this test opened, as the daemon does when it stops.
    opened: list[NvmlBackend] = []
    real_open = NvmlBackend.open

    def open_and_remember(self: NvmlBackend) -> Any:
        opened.append(self)
        return real_open(self)

    monkeypatch.setattr(NvmlBackend, "open", open_and_remember)
    yield pynvml
    for backend in opened:
        backend.close()
    while True:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            break


@pytest.fixture
def live_process() -> Iterator[subprocess.Popen[bytes]]:
    """A real running process whose PID a scenario can list as a GPU process."""
    proc = spawn_sleeper()
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def spawn_sleeper() -> subprocess.Popen[bytes]:
    """A sleeping Python process, returned once /proc shows its command line.

    Popen returns when exec has begun, slightly before the kernel fills in the new command line;
    a lookup in that window reads an empty one.
    """
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + NEVER_S
    while b"sleep" not in cmdline.read_bytes():
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"process {proc.pid} did not start")
        time.sleep(0.001)
    return proc


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """A throwaway certificate authority for TLS tests."""
    return trustme.CA()


def pytest_report_header() -> list[str]:
    return [f"fake NVML build dir: {os.environ.get('FAKE_NVML_BUILD_DIR', 'tests/fakenvml/.build')}"]
