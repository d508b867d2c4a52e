"""``gpu-exporter --once``: one look at the local GPUs, as a table or as JSON.

The JSON is built from the same metric families as /metrics, so scripts and dashboards share
one vocabulary: each key is a metric name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .accounting.pricing import PriceBook
from .accounting.states import WASTE_STATES, classify
from .alerting.engine import RuleEngine, holding_now
from .alerting.settings import RulesSettings
from .serving.metrics import GPU_LABELS, RenderOptions, gpu_families
from .snapshot import GpuReading, NodeSnapshot

GIB = 1024**3


def findings(snapshot: NodeSnapshot, rules: RulesSettings | None = None) -> list[str]:
    """The alert rules whose condition holds right now (``for`` is not waited out), in words."""
    engine = RuleEngine(rules or RulesSettings(), node="")
    return [f"{c.alertname} ({c.severity}) on GPU {g.index}: {c.description or c.summary}"
            for g, c in holding_now(engine, snapshot)]  # fmt: skip


@dataclass(frozen=True)
class CostNow:
    """Each GPU's state now (see gpu_exporter.accounting.states) and, with pricing, its price per hour."""

    currency: str | None = None
    gpus: dict[int, tuple[str, float | None]] = field(default_factory=dict)  # index -> (state, price)

    @property
    def waste_per_hour(self) -> float | None:
        prices = [p for state, p in self.gpus.values() if state in WASTE_STATES and p is not None]
        return sum(prices) if self.currency else None


def cost_now(snapshot: NodeSnapshot, rules: RulesSettings | None = None, prices: PriceBook | None = None) -> CostNow:
    idle = (rules or RulesSettings()).GpuUnderutilized  # the books' and the alert's idea of idle
    return CostNow(
        prices.currency if prices else None,
        {g.index: (classify(g, idle.threshold, idle.signal),
                   prices.per_hour(g.static.name if g.static else None) if prices else None) for g in snapshot.gpus},
    )  # fmt: skip


def as_json(
    snapshot: NodeSnapshot, problems: list[str], opts: RenderOptions | None = None, cost: CostNow | None = None
) -> str:
    gpus: dict[str, dict[str, Any]] = {}
    for fam in gpu_families(snapshot, opts):
        for s in fam.samples:
            gpu = gpus.setdefault(s.labels["gpu"], {"gpu": s.labels["gpu"], "uuid": s.labels["uuid"]})
            extra = {k: v for k, v in s.labels.items() if k not in GPU_LABELS}
            value: Any = int(s.value) if float(s.value).is_integer() else s.value
            if fam.name == "gpu_info":
                gpu["gpu_info"] = extra
            elif not extra:
                gpu[s.name] = value
            elif len(extra) == 1:
                gpu.setdefault(s.name, {})[next(iter(extra.values()))] = value
            else:
                gpu.setdefault(s.name, []).append({**extra, "value": value})
    for index, (state, price) in (cost.gpus if cost else {}).items():
        if (row := gpus.get(str(index))) is not None:
            row["state"] = state
            if price is not None:
                row["gpu_price_per_hour"] = price
    doc: dict[str, Any] = {
        "nvml_up": snapshot.nvml_up,
        "driver_version": snapshot.driver_version,
        "cuda_version": snapshot.cuda_version,
        "gpus": sorted(gpus.values(), key=lambda g: int(g["gpu"])),
        "findings": problems,
    }
    if cost is not None and cost.currency:
        doc["currency"] = cost.currency
        doc["waste_per_hour"] = cost.waste_per_hour
    return json.dumps(doc, indent=2)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.0f}%"


def _bytes_rate(v: float | None) -> str:
    if v is None:
        return "n/a"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B/s"


def _state_line(state: str, price: float | None, currency: str | None) -> str:
    line = f"  state        {state}"
    if price is not None and currency:
        verb = "wasting" if state in WASTE_STATES else "costs"
        line += f"   {verb} {price:.2f} {currency}/h"
    return line


def _gpu_block(g: GpuReading, cost: CostNow | None = None) -> list[str]:
    s = g.static
    state, price = cost.gpus.get(g.index, ("", None)) if cost else ("", None)
    if not g.up or s is None:
        lost = [f"GPU {g.index}  {g.uuid or 'uuid unknown'}  NOT ANSWERING: {g.error}"]
        return lost + ([_state_line(state, price, cost.currency)] if cost and state else [])
    lines = [f"GPU {g.index}  {s.name}  {s.uuid}  {s.pci_bus_id}"]
    if cost and state:
        lines.append(_state_line(state, price, cost.currency))
    mem = "n/a"
    if g.memory_total_bytes is not None and g.memory_used_bytes is not None:
        mem = (f"{g.memory_used_bytes / GIB:.1f} / {g.memory_total_bytes / GIB:.1f} GiB "
               f"({_pct(g.memory_used_ratio)})")  # fmt: skip
    lines.append(f"  utilization  {_pct(g.utilization_ratio):>5}   memory {mem}")
    if (a := g.activity) is not None:
        lines.append(f"  activity     SM {_pct(a.sm)}   occupancy {_pct(a.sm_occupancy)}   tensor {_pct(a.tensor)}"
                     f"   DRAM {_pct(a.dram)}")  # fmt: skip
    temp = g.temperature_celsius.get("gpu")
    temp_s = "n/a" if temp is None else f"{temp:.0f} C"
    if "memory" in g.temperature_celsius:
        temp_s += f" (memory {g.temperature_celsius['memory']:.0f} C)"
    power = "n/a" if g.power_usage_watts is None else f"{g.power_usage_watts:.0f} W"
    if g.power_usage_watts is not None and g.power_limit_watts is not None:
        power += f" / {g.power_limit_watts:.0f} W"
    lines.append(f"  temperature  {temp_s}   power {power}")
    if g.clock_hertz:
        clocks = "  ".join(f"{k} {v / 1e6:.0f} MHz" for k, v in g.clock_hertz.items())
        lines.append(f"  clocks       {clocks}")
    link = "n/a"
    if g.pcie_link_generation is not None and g.pcie_link_width is not None:
        link = f"Gen{g.pcie_link_generation} x{g.pcie_link_width}"
        if s.pcie_max_generation is not None and s.pcie_max_width is not None:
            link += f" (max Gen{s.pcie_max_generation} x{s.pcie_max_width})"
    lines.append(
        f"  pcie         {link}   tx {_bytes_rate(g.pcie_tx_bytes_per_second)}"
        f"   rx {_bytes_rate(g.pcie_rx_bytes_per_second)}"
    )
    active = [r for r, on in g.clock_event_active.items() if on]
    if active:
        lines.append(f"  clock events {', '.join(active)}")
    if g.processes:
        lines.append("  processes")
        for p in g.processes:
            used = "n/a" if p.used_memory_bytes is None else f"{p.used_memory_bytes / GIB:.2f} GiB"
            sm = "" if p.sm_utilization_ratio is None else f"  SM {_pct(p.sm_utilization_ratio):>4}"
            lines.append(f"    {p.pid:>8}  {p.name:<20} {used:>10}  {p.kind}{sm}")
    else:
        lines.append("  processes    none")
    for m in g.migs:
        mem = "n/a" if m.memory_used_bytes is None or m.memory_total_bytes is None else \
            f"{m.memory_used_bytes / GIB:.1f} / {m.memory_total_bytes / GIB:.1f} GiB"  # fmt: skip
        act = "" if m.activity is None else f"   SM {_pct(m.activity.sm)}   tensor {_pct(m.activity.tensor)}"
        lines.append(f"  MIG {m.index}        {m.profile:<9} gi {m.gpu_instance_id}   memory {mem}{act}   {m.uuid}")
    return lines


def as_table(snapshot: NodeSnapshot, problems: list[str], cost: CostNow | None = None) -> str:
    head = (
        f"driver {snapshot.driver_version or 'n/a'}   CUDA {snapshot.cuda_version or 'n/a'}   {len(snapshot.gpus)} GPUs"
    )
    out = [head, ""]
    for g in snapshot.gpus:
        out += [*_gpu_block(g, cost), ""]
    if cost is not None and cost.currency:
        wasted = [i for i, (state, _) in cost.gpus.items() if state in WASTE_STATES]
        out += [f"Waste now: {len(wasted)} GPU(s) idle or allocated but idle, {cost.waste_per_hour or 0:.2f} "
                f"{cost.currency}/h", ""]  # fmt: skip
    out.append("Findings:" if problems else "Findings: none")
    out += [f"  - {p}" for p in problems]
    return "\n".join(out)
