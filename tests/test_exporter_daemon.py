"""The daemon as users run it: a subprocess on the fake NVML, scraped over HTTP."""

from __future__ import annotations

import gzip
import signal
import time
from pathlib import Path

import pytest

from tests.exporter_helpers import (
    DAEMON_STOP_S,
    RunningDaemon,
    http_get,
    parse_exposition,
    run_daemon,
    value,
    wait_for,
)
from tests.fakenvml import Scenario, install_library
from tests.fakenvml.presets import preset
from tests.timing import LATE_S, NEVER_S

pytestmark = pytest.mark.integration


def wait_for_a_stuck_poll(d: RunningDaemon) -> None:
    """Until no poll has succeeded for LATE_S / 2 (25 intervals of 200 ms): one is stuck in the
    driver, not merely late on a busy machine, and still has NEVER_S - LATE_S / 2 to hang."""

    def stuck() -> bool:
        last = value(d.metrics(), "gpu_exporter_last_poll_success_timestamp_seconds")
        return last is not None and time.time() - last > LATE_S / 2

    wait_for(stuck, what="a poll stuck in the driver")


def test_scrape_change_scenario_see_change_and_sigterm(scenario: Scenario) -> None:
    s = preset("h100-8x-training", scenario.path)
    s.write()
    with run_daemon(s.path, "--poll.interval", "200ms") as d:
        wait_for(lambda: value(d.metrics(), "gpu_utilization_ratio", gpu="2") is not None, what="first poll")
        assert value(d.metrics(), "gpu_utilization_ratio", gpu="2") == 0.96
        assert value(d.metrics(), "gpu_exporter_nvml_up") == 1
        s.gpu(2).utilization(12, 3)
        s.write()
        wait_for(lambda: value(d.metrics(), "gpu_utilization_ratio", gpu="2") == 0.12, what="the new utilization")
        status, _, body = http_get(d.url + "/readyz")
        assert status == 200, body
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=DAEMON_STOP_S + LATE_S) == 0


def test_http_endpoints(scenario: Scenario) -> None:
    preset("workstation-2x-consumer", scenario.path).write()
    with run_daemon(scenario.path, "--poll.interval", "200ms") as d:
        wait_for(lambda: value(d.metrics(), "gpu_up", gpu="1") == 1, what="first poll")
        status, headers, body = http_get(d.url + "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        status, headers, zipped = http_get(d.url + "/metrics", {"Accept-Encoding": "gzip"})
        assert headers.get("Content-Encoding") == "gzip"
        assert parse_exposition(gzip.decompress(zipped).decode()).keys() == parse_exposition(body.decode()).keys()
        status, headers, empty = http_get(d.url + "/metrics", method="HEAD")
        assert status == 200 and empty == b"" and int(headers["Content-Length"]) > 1000
        assert http_get(d.url + "/healthz")[0] == 200
        assert http_get(d.url + "/readyz", method="HEAD")[0] == 200
        status, _, page = http_get(d.url + "/")
        assert status == 200 and b"/metrics" in page
        assert http_get(d.url + "/nope")[0] == 404
        status, headers, _ = http_get(d.url + "/metrics", method="POST")
        assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_a_scrape_never_waits_on_nvml(scenario: Scenario) -> None:
    """With every NVML call hanging, /metrics still answers at once from the last poll.

    Each call hangs for NEVER_S: a scrape that waited on the driver would take that long, not LATE_S."""
    s = preset("h100-8x-training", scenario.path)
    s.write()
    with run_daemon(s.path, "--poll.interval", "200ms", "--poll.gpu-timeout", f"{10 * NEVER_S:.0f}s") as d:
        wait_for(lambda: value(d.metrics(), "gpu_up", gpu="0") == 1, what="first poll")
        for g in s.gpus:
            g.delay(NEVER_S * 1000)
        s.write()
        wait_for_a_stuck_poll(d)
        for _ in range(5):
            t0 = time.monotonic()
            samples = d.metrics()
            assert time.monotonic() - t0 < LATE_S, "the scrape waited on the driver"
            assert value(samples, "gpu_up", gpu="0") == 1


def test_sigterm_is_prompt_even_with_a_gpu_stuck_in_the_driver(scenario: Scenario) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with run_daemon(s.path, "--poll.interval", "200ms", "--poll.gpu-timeout", f"{10 * NEVER_S:.0f}s") as d:
        wait_for(lambda: value(d.metrics(), "gpu_up", gpu="0") == 1, what="first poll")
        s.gpu(0).delay(NEVER_S * 1000)
        s.write()
        wait_for_a_stuck_poll(d)  # for NEVER_S: a stop that waited for it would miss DAEMON_STOP_S + LATE_S
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=DAEMON_STOP_S + LATE_S) == 0


def test_nvml_missing_at_start_then_the_driver_appears(scenario: Scenario, tmp_path: Path) -> None:
    preset("pcie-degraded", scenario.path).write()
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    with run_daemon(scenario.path, "--poll.interval", "200ms", library_dir=driver_dir) as d:
        wait_for(lambda: value(d.metrics(), "gpu_exporter_nvml_up") == 0, what="nvml_up 0")
        status, _, body = http_get(d.url + "/readyz")
        assert status == 503 and b"libnvidia-ml.so.1 was not found" in body
        assert http_get(d.url + "/healthz")[0] == 200  # alive, just not ready
        warnings = [e for e in d.log if e.get("event") == "nvml_unavailable"]
        assert len(warnings) == 1 and "--simulate" in str(warnings[0].get("hint"))
        install_library(driver_dir)
        wait_for(lambda: value(d.metrics(), "gpu_exporter_nvml_up") == 1, timeout=20, what="recovery")
        assert value(d.metrics(), "gpu_pcie_link_generation", gpu="0") == 1
        wait_for(lambda: http_get(d.url + "/readyz")[0] == 200, what="ready")
        assert len([e for e in d.log if e.get("event") == "nvml_unavailable"]) == 1  # said once, not per retry


def test_driver_unloaded_while_running_and_back(scenario: Scenario) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with run_daemon(s.path, "--poll.interval", "200ms") as d:
        wait_for(lambda: value(d.metrics(), "gpu_up", gpu="0") == 1, what="first poll")
        s.init_error = "DRIVER_NOT_LOADED"
        s.write()
        wait_for(lambda: value(d.metrics(), "gpu_exporter_nvml_up") == 0, what="nvml down")
        assert value(d.metrics(), "gpu_up", gpu="0") is None
        assert http_get(d.url + "/readyz")[0] == 503
        s.init_error = None
        s.write()
        wait_for(lambda: value(d.metrics(), "gpu_up", gpu="0") == 1, timeout=20, what="recovery")


def test_simulated_daemon_serves_all_profiles() -> None:
    with run_daemon(Path("/nonexistent"), "--simulate", "--simulate.gpus", "6", "--poll.interval", "200ms") as d:
        wait_for(lambda: value(d.metrics(), "gpu_up", gpu="5") == 1, what="first poll")
        s = d.metrics()
        assert value(s, "gpu_exporter_nvml_up") == 1
        assert {dict(ls)["gpu"] for (n, ls) in s if n == "gpu_utilization_ratio"} == {str(i) for i in range(6)}
