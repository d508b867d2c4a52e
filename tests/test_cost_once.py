"""``gpu-exporter --once`` shows each GPU's state now and, with pricing, what the idle ones cost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cost_helpers import H100_PRICE, L4_PRICE, pricing_config, three_gpu_node
from tests.fakenvml import Scenario, subprocess_env

pytestmark = pytest.mark.integration


def once(scenario: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_exporter", "--once", *args], env=subprocess_env(scenario),
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_table_shows_states_and_the_hourly_cost_of_waste(scenario: Scenario, tmp_path: Path) -> None:
    three_gpu_node(scenario.path).write()
    out = once(scenario.path, "--config", str(pricing_config(tmp_path / "c.yaml")))
    text = out.stdout
    blocks = text.split("\nGPU ")
    assert "state        busy   costs 3.00 USD/h" in blocks[1]
    assert "state        allocated_idle   wasting 3.00 USD/h" in blocks[2]
    assert "state        idle   wasting 0.80 USD/h" in blocks[3]
    assert f"Waste now: 2 GPU(s) idle or allocated but idle, {H100_PRICE + L4_PRICE:.2f} USD/h" in text


def test_the_json_has_state_price_and_waste(scenario: Scenario, tmp_path: Path) -> None:
    three_gpu_node(scenario.path).write()
    out = once(scenario.path, "--format", "json", "--config", str(pricing_config(tmp_path / "c.yaml")))
    doc = json.loads(out.stdout)
    assert [(g["state"], g["gpu_price_per_hour"]) for g in doc["gpus"]] == [
        ("busy", H100_PRICE), ("allocated_idle", H100_PRICE), ("idle", L4_PRICE)]  # fmt: skip
    assert doc["currency"] == "USD" and doc["waste_per_hour"] == H100_PRICE + L4_PRICE


def test_without_pricing_states_but_no_money(scenario: Scenario) -> None:
    three_gpu_node(scenario.path).write()
    out = once(scenario.path)
    assert "state        allocated_idle\n" in out.stdout and "USD" not in out.stdout and "Waste now" not in out.stdout
