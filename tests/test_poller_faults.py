"""A hung driver, errors that force NVML to be initialised again, sentinel values, and GPUs that
appear while the exporter runs: all against the fake NVML, through the real bindings.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpu_exporter.snapshot import GpuReading, GpuStatic
from gpu_exporter.sources.backend import SystemInfo
from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.poller import Poller
from tests.exporter_helpers import ErrorLog
from tests.fakenvml import Counter as Moving
from tests.fakenvml import Scenario, subprocess_env
from tests.fakenvml.presets import preset
from tests.fakenvml.scenario import Err
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingBackend:
    """The real NVML backend, counting how often it is opened."""

    def __init__(self, errors: ErrorLog) -> None:
        self.inner = NvmlBackend(errors)
        self.opens = 0

    def open(self) -> SystemInfo:
        self.opens += 1
        return self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def count(self) -> int | None:
        return self.inner.count()

    def read_static(self, index: int) -> GpuStatic:
        return self.inner.read_static(index)

    def read_gpu(self, static: GpuStatic) -> GpuReading:
        return self.inner.read_gpu(static)

    def xid_counts(self, uuid: str) -> Mapping[int, int]:
        return self.inner.xid_counts(uuid)


def two_gpus(scenario: Scenario) -> Scenario:
    s = preset("workstation-2x-consumer", scenario.path)
    s.write()
    return s


# -- 8. --once with a hung GPU -------------------------------------------------------------------------
def test_once_exits_right_after_printing_with_a_gpu_hung_in_the_driver(scenario: Scenario) -> None:
    s = two_gpus(scenario)
    s.gpu(1).delay(2 * NEVER_S * 1000)  # a --once that waited for it would miss the run's NEVER_S
    s.write()
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "--once", "--poll.gpu-timeout", "2s"],
                         env=subprocess_env(s.path), capture_output=True, text=True, timeout=NEVER_S)  # fmt: skip
    assert "GPU 1" in out.stdout and "NOT ANSWERING" in out.stdout and "GPU 0  NVIDIA GeForce RTX 4090" in out.stdout
    assert out.returncode == 2, out.stderr  # a GPU that does not answer is CRITICAL (GpuLost)


# -- 9. threads, backoff and logs with a hung GPU and re-initialisation ------------------------------------
def test_threads_stay_bounded_with_a_hung_gpu_and_errors_that_force_reinit(nvml: Any, scenario: Scenario) -> None:
    s = two_gpus(scenario)
    s.gpu(0).delay(20_000)  # hung in the driver
    s.gpu(1).error("util.gpu", Err("UNINITIALIZED"))  # the driver forgot us: NVML must be initialised again
    s.write()
    clock = Clock()
    errors = ErrorLog()
    backend = CountingBackend(errors)
    poller = Poller(backend, errors=errors, gpu_timeout_s=0.3, monotonic=clock)
    before = threading.active_count()
    try:
        for _ in range(12):
            poller.poll()
            clock.now += 120  # past any backoff: every poll initialises NVML again
        assert backend.opens >= 10
        grown = threading.active_count() - before
        assert grown <= 4, f"{grown} more threads after {backend.opens} initialisations with one GPU hung"
    finally:
        poller.close()


def test_backoff_keeps_growing_when_init_succeeds_but_the_same_failure_follows(nvml: Any, scenario: Scenario) -> None:
    s = two_gpus(scenario)
    s.gpu(1).error("util.gpu", Err("UNINITIALIZED"))
    s.write()
    clock = Clock()
    errors = ErrorLog()
    backend = CountingBackend(errors)
    poller = Poller(backend, errors=errors, monotonic=clock)
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(120):  # two minutes, a poll a second
                poller.poll()
                clock.now += 1
    finally:
        poller.close()
    # 1, 2, 4, 8, 16, 32, 60 s apart: 7 or 8 attempts, not one a second.
    assert 5 <= backend.opens <= 10, backend.opens
    per_event = Counter(str(e["event"]) for e in logs if e["log_level"] != "debug")
    assert per_event and max(per_event.values()) <= 3, per_event


def test_repeated_identical_log_lines_are_rate_limited(nvml: Any, scenario: Scenario) -> None:
    s = two_gpus(scenario)
    s.gpu(0).delay(10_000)
    s.write()
    clock = Clock()
    errors = ErrorLog()
    poller = Poller(NvmlBackend(errors), errors=errors, gpu_timeout_s=0.2, monotonic=clock)
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(10):
                snap = poller.poll()
                assert not snap.gpus[0].up and snap.gpus[1].up
                clock.now += 5
    finally:
        poller.close()
    per_event = Counter(str(e["event"]) for e in logs if e["log_level"] in ("warning", "error"))
    assert per_event.get("gpu_not_answering", 0) == 1, per_event


# -- 10. sentinels and GPUs that appear later ----------------------------------------------------------------
def test_a_sentinel_utilization_is_left_out_and_counted(nvml: Any, scenario: Scenario) -> None:
    s = two_gpus(scenario)
    s.gpu(0).set("util.gpu", 4294967295).set("util.memory", 4294967295)
    s.gpu(0).set("fan.0", 255)
    s.write()
    errors = ErrorLog()
    poller = Poller(NvmlBackend(errors), errors=errors)
    try:
        g = poller.poll().gpus[0]
    finally:
        poller.close()
    assert g.up and g.utilization_ratio is None and g.memory_copy_utilization_ratio is None
    assert "0" not in g.fan_speed_ratio
    assert errors.counts[("nvmlDeviceGetUtilizationRates", "out_of_range")] >= 1
    assert errors.counts[("nvmlDeviceGetFanSpeed_v2", "out_of_range")] >= 1


def test_a_gpu_that_appears_after_start_is_found_at_the_next_static_refresh(nvml: Any, scenario: Scenario) -> None:
    s = preset("workstation-2x-consumer", scenario.path)
    second = s.gpus.pop()
    s.write()
    clock = Clock()
    errors = ErrorLog()
    poller = Poller(NvmlBackend(errors), errors=errors, static_refresh_s=300, monotonic=clock)
    try:
        assert [g.index for g in poller.poll().gpus] == [0]
        s.gpus.append(second)  # hot-plugged, or back after a driver reload
        s.write()
        clock.now += 10
        assert [g.index for g in poller.poll().gpus] == [0]  # not looked for on every poll
        clock.now += 300
        snap = poller.poll()
        assert [(g.index, g.up) for g in snap.gpus] == [(0, True), (1, True)]
    finally:
        poller.close()


def test_the_simulated_backend_counts_too() -> None:
    from gpu_exporter.sources.simulated import SimulatedBackend

    b = SimulatedBackend(3)
    assert b.open().gpu_count == 3 and b.count() == 3


def test_once_output_is_unchanged_for_a_healthy_node(scenario: Scenario, tmp_path: Path) -> None:
    two_gpus(scenario)
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "--once", "--format", "json"],
                         env=subprocess_env(scenario.path), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode in (0, 1) and '"nvml_up": true' in out.stdout


# -- 11. a GPU lost on any path comes back as a new device -----------------------------------------------------
@pytest.mark.parametrize("path", ["field value", "MIG handle"])
def test_a_gpu_lost_on_any_path_is_never_diffed_across_its_reset(nvml: Any, scenario: Scenario, path: str) -> None:
    """Whichever call says GPU_IS_LOST, the GPU is marked lost: when it comes back under the same UUID
    (reset, counters started again), nothing is diffed against what it counted before."""
    g = scenario.add_gpu().identity("NVIDIA A100-SXM4-80GB", "GPU-00000000-0000-0000-0000-0000000000ab")
    g.temperature(50, memory=60).pcie(sample_ms=1, tx_kbps=1000, rx_kbps=1000, tx_bytes=Moving(2**33, 1e6),
                                      rx_bytes=Moving(2**33, 1e6))  # fmt: skip
    mig = g.mig_mode(True).add_mig("NVIDIA A100-SXM4-80GB MIG 7g.80gb", "MIG-1", 0)
    scenario.write()
    errors = ErrorLog()
    poller = Poller(NvmlBackend(errors), errors=errors)
    try:
        poller.poll()
        time.sleep(0.2)
        assert poller.poll().gpus[0].pcie_tx_bytes_per_second == pytest.approx(1e6, rel=0.2)  # from the counters
        if path == "field value":
            g.error("temperature.memory", "GPU_IS_LOST")
        else:
            mig.handle_error("GPU_IS_LOST")
        scenario.write()
        assert not poller.poll().gpus[0].up
        # Back after a reset: its counters started again and are already past the old reading.
        g.temperature(50, memory=60).pcie(tx_bytes=Moving(2**40, 1e6), rx_bytes=Moving(2**40, 1e6))
        mig.unset("handle")
        scenario.write()
        time.sleep(0.2)
        back = poller.poll().gpus[0]
    finally:
        poller.close()
    assert back.up
    assert back.pcie_tx_bytes_per_second == 1000 * 1024, "a rate across the reset"  # the driver's sample
    function = "nvmlDeviceGetFieldValues" if path == "field value" else "nvmlDeviceGetMigDeviceHandleByIndex"
    assert errors.counts[(function, "gpu_is_lost")] == 1
