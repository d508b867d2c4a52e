"""``promtool check metrics`` passes on the exposition of every ready-made scenario."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest

from gpu_exporter.daemon import Daemon
from gpu_exporter.settings.config import load_settings
from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.simulated import SimulatedBackend
from tests.fakenvml import Scenario
from tests.fakenvml.presets import PRESETS, preset

pytestmark = pytest.mark.integration


def promtool_check(body: bytes) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (out.stdout, out.stderr)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_promtool_accepts_every_scenario(scenario: Scenario, nvml: Any, name: str) -> None:
    s = preset(name, scenario.path)
    if name == "gpu-lost-midway":
        s.gpu(2).lost()  # the lost GPU's gpu_up 0 must also be well-formed
    s.gpu(0).add_xid(79)
    s.write()
    daemon = Daemon(load_settings(), NvmlBackend)
    try:
        daemon.poll_once()
        body = daemon.exposition.body()
        assert b"gpu_up{" in body
        promtool_check(body)
    finally:
        daemon.poller.close()


def test_promtool_accepts_the_simulator() -> None:
    daemon = Daemon(load_settings(), lambda errors: SimulatedBackend(6))
    daemon.poll_once()
    promtool_check(daemon.exposition.body())


def test_promtool_accepts_the_nvml_down_page(monkeypatch: pytest.MonkeyPatch, nvml: Any, tmp_path: Any) -> None:
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(tmp_path / "missing.scn"))
    daemon = Daemon(load_settings(), NvmlBackend)
    daemon.poll_once()
    body = daemon.exposition.body()
    assert b"gpu_exporter_nvml_up 0\n" in body
    promtool_check(body)
