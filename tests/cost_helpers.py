"""A node for the cost and waste tests: one busy H100, one H100 a job holds but leaves idle (an
over-sized card), and one L4 nobody holds; and the pricing that goes with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakenvml import Scenario
from tests.fakenvml.presets import GIB, MIB, gpu_uuid, h100_sxm

H100_PRICE = 3.00  # per hour, in PRICING's currency; figures for the tests, not quotes
L4_PRICE = 0.80
PRICING: dict[str, Any] = {"currency": "USD", "models": {"H100": H100_PRICE, "L4": L4_PRICE}, "energy_per_kwh": 0.20}
BUSY_PEAK = 60 * GIB
OVERSIZED_PEAK = 10 * GIB


def three_gpu_node(path: Path) -> Scenario:
    s = Scenario(path, comment="busy H100, allocated-but-idle H100, idle L4")
    busy = h100_sxm(s.add_gpu(), "cost", 0, util=95, mem_used=BUSY_PEAK, power_mw=650_000, nvlinks=0)
    busy.add_process(4_198_801, BUSY_PEAK, name="python3", sm=95, mem=40)
    busy.process_utilization()
    idle_job = h100_sxm(s.add_gpu(), "cost", 1, util=2, mem_used=OVERSIZED_PEAK, power_mw=90_000, nvlinks=0)
    idle_job.add_process(4_198_802, OVERSIZED_PEAK, name="python3", sm=2, mem=1)
    idle_job.process_utilization()
    l4 = s.add_gpu().identity("NVIDIA L4", gpu_uuid("cost", 2)).pci("00000000:3A:00.0").minor_number(2)
    l4.utilization(0, 0).memory(23034 * MIB, 0, reserved=300 * MIB).power(16_000, 72_000).temperature(35)
    return s


def pricing_config(path: Path, **extra: Any) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"pricing": PRICING, **extra}))
    return path
