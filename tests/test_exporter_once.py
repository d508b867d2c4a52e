"""``gpu-exporter --once``: the table, the JSON, and the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpu_exporter.serving.metrics import METRICS
from tests.fakenvml import Scenario, subprocess_env
from tests.fakenvml.presets import preset


def once(scenario: Path, *args: str, library_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_exporter", "--once", *args],
                          env=subprocess_env(scenario, library_dir=library_dir), capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_table_with_findings_exits_1(scenario: Scenario) -> None:
    preset("pcie-degraded", scenario.path).write()
    out = once(scenario.path)
    assert out.returncode == 1, out.stderr
    text = out.stdout
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
    out = once(scenario.path, "--format", "json")
    assert out.returncode == 0, out.stderr  # a healthy node: no findings
    doc = json.loads(out.stdout)
    assert doc["findings"] == []
    assert doc["nvml_up"] is True and doc["driver_version"] == "550.54.15" and len(doc["gpus"]) == 8
    g = doc["gpus"][0]
    assert g["gpu"] == "0" and g["uuid"].startswith("GPU-")
    assert g["gpu_utilization_ratio"] == 0.94
    assert g["gpu_memory_total_bytes"] == 81559 * 1024**2
    assert g["gpu_temperature_celsius"] == {"gpu": 64, "memory": 71}
    assert g["gpu_nvlink_up"]["17"] == 1
    assert g["gpu_info"]["name"] == "NVIDIA H100 80GB HBM3"
    # The scenario's pids are not in /proc: their user is unknown.
    assert g["gpu_process_memory_used_bytes"] == [
        {"pid": "10000", "process": "python3", "user": "unknown", "value": 70 * 1024**3}
    ]
    assert g["state"] == "busy" and "gpu_price_per_hour" not in g and "currency" not in doc  # no pricing: no prices
    keys = {k for gpu in doc["gpus"] for k in gpu} - {"gpu", "uuid", "state"}
    assert keys <= set(METRICS)


def test_a_lost_gpu_is_a_finding_with_exit_1(scenario: Scenario) -> None:
    s = preset("gpu-lost-midway", scenario.path)
    s.gpu(2).lost()
    s.write()
    out = once(scenario.path)
    assert out.returncode == 1, out.stderr
    assert "GPU 2" in out.stdout and "NOT ANSWERING" in out.stdout
    assert "Findings:\n  - GpuLost (critical) on GPU 2:" in out.stdout
    doc = json.loads(once(scenario.path, "--format", "json").stdout)
    assert doc["gpus"][2]["gpu_up"] == 0 and doc["findings"]


def test_no_nvml_exits_2_with_reason_and_hint(scenario: Scenario, tmp_path: Path) -> None:
    preset("pcie-degraded", scenario.path).write()
    out = once(scenario.path, library_dir=tmp_path)
    assert out.returncode == 2
    assert "libnvidia-ml.so.1 was not found" in out.stderr
    assert "--simulate" in out.stderr
    assert out.stdout == ""
    scenario.init_error = "NO_PERMISSION"
    scenario.write()
    out = once(scenario.path)
    assert out.returncode == 2 and "no permission" in out.stderr


def test_simulate_works_with_once() -> None:
    out = once(Path("/nonexistent"), "--simulate", "--simulate.gpus", "2", "--format", "json")
    doc = json.loads(out.stdout)
    assert len(doc["gpus"]) == 2
    # The simulator's GPU 1 is allocated but idle, by design.
    assert out.returncode == 1 and any(f.startswith("GpuUnderutilized (warning) on GPU 1") for f in doc["findings"])
