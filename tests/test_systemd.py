"""deploy/systemd: the unit passes systemd's own checks and stays hardened."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "gpu-exporter.service"


def analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, "systemd-analyze is missing: apt-get install systemd (bash .ci/setup does it)"
    return path


@pytest.fixture
def runnable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointed at this checkout's gpu-exporter, which verify requires to exist."""
    exe = Path(sys.executable).parent / "gpu-exporter"
    assert exe.exists(), exe
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/gpu-exporter/venv/bin/gpu-exporter", str(exe)))
    return unit


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def test_systemd_analyze_verify_accepts_the_unit(runnable_unit: Path) -> None:
    out = subprocess.run([analyze(), "verify", str(runnable_unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr


def test_the_unit_is_hardened(runnable_unit: Path) -> None:
    out = subprocess.run([analyze(), "security", "--offline=true", str(runnable_unit)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out.stdout)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) <= 2.0, out.stdout  # systemd calls up to 2.9 "OK"; keep well inside


def test_the_unit_runs_unprivileged_with_the_gpus_and_reloads_on_hup() -> None:
    s = settings()
    assert s["User"] == ["gpu-exporter"] and s["NoNewPrivileges"] == ["yes"]
    assert s["CapabilityBoundingSet"] == [""] and s["AmbientCapabilities"] == [""]
    assert "ExecReload" in s and "HUP" in s["ExecReload"][0]
    assert "NVIDIA_VISIBLE_DEVICES" not in UNIT.read_text().replace("no NVIDIA_VISIBLE_DEVICES", "")
    allowed = " ".join(s["DeviceAllow"])
    assert "/dev/nvidiactl" in allowed and "nvidia-frontend" in allowed, "the GPUs must stay reachable"
    assert "PrivateDevices" not in s, "PrivateDevices would hide /dev/nvidia*"
    assert s["ExecStart"][0].split()[0] == "/opt/gpu-exporter/venv/bin/gpu-exporter"


def test_the_unit_parses_as_ini_with_the_three_sections() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string(UNIT.read_text())
    assert parser.sections() == ["Unit", "Service", "Install"]
    assert parser["Install"]["WantedBy"] == "multi-user.target"
