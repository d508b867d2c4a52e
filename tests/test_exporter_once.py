"""``gpu-exporter --once``: the table, the JSON, and the exit status of a monitoring check.

0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN: what Nagios, Icinga, Sensu and Checkmk expect of a plugin."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpu_exporter.metric_defs import METRICS
from tests.fakenvml import Scenario, subprocess_env
from tests.fakenvml.presets import MIB, preset

pytestmark = pytest.mark.integration


def once(scenario: Path, *args: str, library_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_exporter", "--once", *args],
                          env=subprocess_env(scenario, library_dir=library_dir), capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_table_with_findings_exits_1(scenario: Scenario) -> None:
    preset("pcie-degraded", scenario.path).write()
    out = once(scenario.path)
    assert out.returncode == 1, out.stderr
    text = out.stdout
    assert text.splitlines()[0].startswith("GPU WARNING - 1 GPUs, 2 finding(s): GpuPcieBottleneck on GPU 0")
    # One line per GPU first, nvidia-smi style; the details below.
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(" GPU  NAME"))
    assert re.split(r"\s{2,}", lines[head].strip()) == ["GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER", "PCIE LINK",
                                                          "STATE", "HELD BY"]  # fmt: skip
    # The scenario's process is not in /proc: held by an unknown user.
    assert re.split(r"\s{2,}", lines[head + 1].strip()) == [
        "0", "NVIDIA A100-PCIE-40GB", "38%", "30.0/40.0 GiB", "75%", "51 C", "118/250 W", "Gen1 x8 (max Gen4 x16)",
        "busy", "user unknown"]  # fmt: skip
    assert text.index(lines[head + 1]) < text.index("GPU 0  NVIDIA A100-PCIE-40GB")
    assert "GPU 0  NVIDIA A100-PCIE-40GB" in text
    assert "utilization    38%" in text
    assert "memory 30.0 / 40.0 GiB (75%)" in text
    assert "51 C (memory 58 C)" in text and "118 W / 250 W" in text
    assert "Gen1 x8 (max Gen4 x16)" in text
    assert "rx 1.9 GB/s" in text  # 1,860,000 KB/s x 1024
    assert "7001" in text and "python3" in text
    findings = text.split("Findings:", 1)[1]
    # The rules whose condition holds now, without waiting out their "for".
    assert "GpuPcieBottleneck (warning) on GPU 0: PCIe at 95%" in findings
    assert "GpuPcieLinkDegraded (warning) on GPU 0: Link at Gen1 x8" in findings
    assert "GpuMemoryHigh" not in findings


def test_json_uses_metric_names(scenario: Scenario) -> None:
    preset("h100-8x-training", scenario.path).write()
    before = datetime.now(UTC).replace(microsecond=0)
    out = once(scenario.path, "--format", "json", "--node.name", "gpu-node-7")
    assert out.returncode == 0, out.stderr  # a healthy node: no findings
    doc = json.loads(out.stdout)
    assert doc["findings"] == [] and doc["status"] == "OK" and doc["exit_code"] == 0
    assert doc["node"] == "gpu-node-7"
    assert before <= datetime.fromisoformat(doc["timestamp"]) <= datetime.now(UTC)
    assert doc["nvml_up"] is True and doc["driver_version"] == "550.54.15" and len(doc["gpus"]) == 8
    g = doc["gpus"][0]
    assert g["gpu"] == 0 and g["uuid"].startswith("GPU-") and g["up"] is True
    assert [gpu["gpu"] for gpu in doc["gpus"]] == list(range(8))
    assert g["gpu_utilization_ratio"] == 0.94
    assert g["gpu_memory_total_bytes"] == 81559 * 1024**2
    assert g["gpu_temperature_celsius"] == {"gpu": 64, "memory": 71}
    assert g["gpu_nvlink_up"]["17"] == 1
    assert g["gpu_info"]["name"] == "NVIDIA H100 80GB HBM3"
    # The scenario's pids are not in /proc: their user is unknown.
    assert g["gpu_process_memory_used_bytes"] == [
        {"pid": 10000, "process": "python3", "user": "unknown", "value": 70 * 1024**3}
    ]
    assert g["state"] == "busy" and "gpu_price_per_hour" not in g and "currency" not in doc  # no pricing: no prices
    keys = {k for gpu in doc["gpus"] for k in gpu} - {"gpu", "uuid", "up", "state"}
    assert keys <= set(METRICS)


def test_a_lost_gpu_is_critical_exit_2(scenario: Scenario) -> None:
    s = preset("gpu-lost-midway", scenario.path)
    s.gpu(2).lost()
    s.write()
    out = once(scenario.path)
    assert out.returncode == 2, out.stderr
    assert out.stdout.startswith("GPU CRITICAL - 4 GPUs, 1 lost, 1 finding(s): GpuLost on GPU 2\n")
    assert re.search(r"^   2  LOST  .*: .*lost", out.stdout, flags=re.MULTILINE), out.stdout
    assert "GPU 2" in out.stdout and "NOT ANSWERING" in out.stdout
    assert "Findings:\n  - GpuLost (critical) on GPU 2:" in out.stdout
    js = once(scenario.path, "--format", "json")
    assert js.returncode == 2
    doc = json.loads(js.stdout)
    assert doc["status"] == "CRITICAL" and doc["exit_code"] == 2
    lost = doc["gpus"][2]
    assert lost["gpu"] == 2 and lost["up"] is False and lost["gpu_up"] == 0 and "lost" in lost["error"].lower()
    (finding,) = doc["findings"]
    assert finding == {"alertname": "GpuLost", "severity": "critical", "gpu": 2, "uuid": lost["uuid"],
                       "summary": "GPU 2 stopped answering", "description": finding["description"], "value": 0.0,
                       "threshold": None}  # fmt: skip
    assert lost["error"] in finding["description"]


def test_critical_outranks_warning_and_comes_first(scenario: Scenario) -> None:
    s = preset("pcie-degraded", scenario.path)  # two warnings on GPU 0
    s.gpu(0).memory(40960 * MIB, 40550 * MIB)  # and memory 99% full: critical
    s.write()
    out = once(scenario.path, "--format", "json")
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    assert doc["findings"][0]["severity"] == "critical"
    assert {(f["alertname"], f["severity"], f["threshold"]) for f in doc["findings"]} >= {
        ("GpuMemoryHigh", "critical", 0.98),
        ("GpuMemoryHigh", "warning", 0.9),
        ("GpuPcieBottleneck", "warning", 0.8),
    }
    assert all(isinstance(f["value"], float) for f in doc["findings"])


def test_no_nvml_is_unknown_exit_3_with_reason_hint_and_json_error(scenario: Scenario, tmp_path: Path) -> None:
    preset("pcie-degraded", scenario.path).write()
    out = once(scenario.path, library_dir=tmp_path)
    assert out.returncode == 3
    assert "libnvidia-ml.so.1 was not found" in out.stderr
    assert "--simulate" in out.stderr
    # A plugin's first stdout line is what Nagios shows: UNKNOWN and why, not an empty output.
    unknown = "GPU UNKNOWN - cannot read the GPUs: the NVIDIA driver library libnvidia-ml.so.1 was not found"
    assert out.stdout == unknown + "\n"
    js = once(scenario.path, "--format", "json", "--node.name", "n1", library_dir=tmp_path)
    assert js.returncode == 3 and "libnvidia-ml.so.1 was not found" in js.stderr
    doc = json.loads(js.stdout)  # jq gets an object, not an empty stream
    assert doc["status"] == "UNKNOWN" and doc["exit_code"] == 3 and doc["node"] == "n1" and doc["nvml_up"] is False
    assert "libnvidia-ml.so.1 was not found" in doc["error"] and doc["gpus"] == [] and doc["findings"] == []
    scenario.init_error = "NO_PERMISSION"
    scenario.write()
    out = once(scenario.path)
    assert out.returncode == 3 and "no permission" in out.stderr
    assert out.stdout.startswith("GPU UNKNOWN - cannot read the GPUs: ") and "no permission" in out.stdout.lower()


def test_a_config_it_cannot_use_is_unknown_not_critical(tmp_path: Path) -> None:
    """A monitoring plugin that cannot check says UNKNOWN (3); 2 would page someone for a typo."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("poll_interval: soon\n")
    out = once(Path("/nonexistent"), "--simulate", "--config", str(cfg), "--format", "json")
    assert out.returncode == 3 and "poll_interval" in out.stderr
    assert json.loads(out.stdout)["status"] == "UNKNOWN"
    table = once(Path("/nonexistent"), "--simulate", "--config", str(cfg))
    assert table.returncode == 3 and table.stdout.startswith("GPU UNKNOWN - invalid poll_interval ")
    assert len(table.stdout.splitlines()) == 1
    out = once(Path("/nonexistent"), "--simulate", "--no-such-flag")
    assert out.returncode == 3 and "--no-such-flag" in out.stderr
    assert out.stdout == "GPU UNKNOWN - unrecognized arguments: --no-such-flag\n"
    js = once(Path("/nonexistent"), "--simulate", "--no-such-flag", "--format=json")
    assert js.returncode == 3 and json.loads(js.stdout)["error"] == "unrecognized arguments: --no-such-flag"
    daemon = subprocess.run([sys.executable, "-m", "gpu_exporter", "--simulate", "--config", str(cfg)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert daemon.returncode == 2, "the daemon keeps exit 2 for a bad config"


def test_processes_are_listed_biggest_first_with_fan_and_pstate(scenario: Scenario) -> None:
    preset("workstation-2x-consumer", scenario.path).write()  # GPU 0: Xorg 412 MiB, gnome-shell 96 MiB, python3 8 GiB
    text = once(scenario.path).stdout
    gpu0 = text.split("\nGPU 0  ", 1)[1].split("\nGPU 1  ", 1)[0]
    pids = [int(m) for m in re.findall(r"^\s+(\d+)  \S+\s+[\d.]+ GiB", gpu0, flags=re.MULTILINE)]
    assert pids == [8812, 2301, 2544], gpu0
    assert "fan 45%" in gpu0 and "clocks       P2  graphics 2520 MHz" in gpu0
    gpu1 = text.split("\nGPU 1  ", 1)[1]
    assert "fan" not in gpu1.split("Findings", 1)[0], "GPU 1's fan cannot be read: no fan shown"
    assert "P8" in gpu1


def test_simulate_works_with_once() -> None:
    out = once(Path("/nonexistent"), "--simulate", "--simulate.gpus", "2", "--format", "json")
    doc = json.loads(out.stdout)
    assert len(doc["gpus"]) == 2
    # The simulator's GPU 1 is allocated but idle, by design.
    assert out.returncode == 1
    (under,) = [f for f in doc["findings"] if f["alertname"] == "GpuUnderutilized"]
    assert under["gpu"] == 1 and under["severity"] == "warning" and under["threshold"] == 0.1
    # One look is not a 30-minute average, and does not say it is.
    assert "in a single look" in under["description"] and "30 min" not in under["description"]
