"""``gpu-exporter --once``: one look at the local GPUs, as a table or as JSON, and a check's exit status.

The exit status follows the monitoring-plugin convention (Nagios, Icinga, Sensu, Checkmk): 0 OK,
1 WARNING, 2 CRITICAL, 3 UNKNOWN (the GPUs, or the configuration, cannot be read).

The JSON's GPUs are built from the same series as /metrics, each metric in the one shape its
declaration gives it (gpu_exporter.serving.gpu_json), so scripts and dashboards share one
vocabulary: each per-GPU key is a metric name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import structlog

from .accounting.pricing import PriceBook
from .accounting.states import WASTE_STATES, card_state, parts
from .alerting.engine import RuleEngine, holding_now
from .alerting.settings import RulesSettings
from .serving.gpu_json import gpu_objects
from .serving.metrics import RenderOptions
from .snapshot import GpuReading, Holder, NodeSnapshot, ProcessReading, device_holders
from .untrusted import for_terminal

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)

GIB = 1024**3

OK: Final = 0
WARNING: Final = 1
CRITICAL: Final = 2
UNKNOWN: Final = 3
STATUS_NAMES: Final = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
# An info finding (GpuIdle) is worth showing but not worth a page.
_SEVERITY_STATUS: Final = {"critical": CRITICAL, "warning": WARNING}


@dataclass(frozen=True)
class Finding:
    """An alert rule whose condition holds right now (its ``for`` is not waited out)."""

    alertname: str
    severity: str
    gpu: int
    uuid: str | None
    summary: str
    description: str
    value: float | None
    threshold: float | None

    def line(self) -> str:
        return f"{self.alertname} ({self.severity}) on GPU {self.gpu}: {self.description or self.summary}"


def findings(snapshot: NodeSnapshot, rules: RulesSettings | None = None) -> list[Finding]:
    """The alert rules whose condition holds right now, worst first."""
    rules = rules or RulesSettings()
    engine = RuleEngine(rules, node="")
    found = [
        Finding(c.alertname, c.severity, g.index, g.uuid or None, c.summary, c.description, c.value, c.threshold)
        for g, c in holding_now(engine, snapshot)
    ]  # fmt: skip
    return sorted(found, key=lambda f: (-_SEVERITY_STATUS.get(f.severity, OK), f.gpu))


def exit_status(found: Sequence[Finding]) -> int:
    """OK, WARNING or CRITICAL: the worst severity found."""
    return max((_SEVERITY_STATUS.get(f.severity, OK) for f in found), default=OK)


@dataclass(frozen=True)
class CostNow:
    """Each GPU's state now (see gpu_exporter.accounting.states) and, with pricing, its price per hour."""

    currency: str | None = None
    gpus: dict[int, tuple[str, float | None]] = field(default_factory=dict)  # index -> (state, price)
    # index -> the share of the GPU idle or allocated but idle now: 0 or 1, or on a card in MIG mode the
    # share of its slices that are (the GPU's state is its busiest slice's); absent: by its state.
    wasted: dict[int, float] = field(default_factory=dict)

    @property
    def waste_per_hour(self) -> float | None:
        share = {i: self.wasted.get(i, 1.0 if state in WASTE_STATES else 0.0) for i, (state, _) in self.gpus.items()}
        prices = [p * share[i] for i, (_, p) in self.gpus.items() if p is not None]
        return sum(prices) if self.currency else None


def cost_now(snapshot: NodeSnapshot, rules: RulesSettings | None = None, prices: PriceBook | None = None) -> CostNow:
    idle = (rules or RulesSettings()).GpuUnderutilized  # the books' and the alert's idea of idle
    cut = {g.index: parts(g, idle.threshold, idle.signal) for g in snapshot.gpus}
    return CostNow(
        prices.currency if prices else None,
        {g.index: (card_state(cut[g.index]),
                   prices.per_hour(g.static.name if g.static else None) if prices else None) for g in snapshot.gpus},
        {i: sum(p.share for p in ps if p.state in WASTE_STATES) for i, ps in cut.items()},
    )  # fmt: skip


def _timestamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def as_json(
    snapshot: NodeSnapshot,
    found: Sequence[Finding],
    opts: RenderOptions | None = None,
    cost: CostNow | None = None,
    node: str = "",
) -> str:
    gpus = gpu_objects(snapshot, opts)
    for index, (state, price) in (cost.gpus if cost else {}).items():
        if (row := gpus.get(index)) is not None:
            row["state"] = state
            if price is not None:
                row["gpu_price_per_hour"] = price
    status = exit_status(found)
    doc: dict[str, Any] = {
        "timestamp": _timestamp(snapshot.taken_at),
        "node": node,
        "status": STATUS_NAMES[status],
        "exit_code": status,
        "nvml_up": snapshot.nvml_up,
        "driver_version": snapshot.driver_version,
        "cuda_version": snapshot.cuda_version,
        "gpus": [gpus[i] for i in sorted(gpus)],
        "findings": [asdict(f) for f in found],
    }
    if cost is not None and cost.currency:
        doc["currency"] = cost.currency
        doc["waste_per_hour"] = cost.waste_per_hour
    return json.dumps(doc, indent=2)


def error_json(error: str, node: str, taken_at: float, hint: str | None = None) -> str:
    """What a script gets on stdout when nothing could be checked: status UNKNOWN and why."""
    doc: dict[str, Any] = {
        "timestamp": _timestamp(taken_at),
        "node": node,
        "status": STATUS_NAMES[UNKNOWN],
        "exit_code": UNKNOWN,
        "nvml_up": False,
        "error": error,
    }
    if hint:
        doc["hint"] = hint
    doc |= {"gpus": [], "findings": []}
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


def _link(g: GpuReading) -> str:
    if g.pcie_link_generation is None or g.pcie_link_width is None:
        return "n/a"
    link = f"Gen{g.pcie_link_generation} x{g.pcie_link_width}"
    s = g.static
    best = (s.pcie_max_generation, s.pcie_max_width) if s is not None else (None, None)
    if None not in best and (g.pcie_link_generation, g.pcie_link_width) != best:
        link += f" (max Gen{best[0]} x{best[1]})"
    return link


def _state_line(state: str, price: float | None, currency: str | None) -> str:
    line = f"  state        {state}"
    if price is not None and currency:
        verb = "wasting" if state in WASTE_STATES else "costs"
        line += f"   {verb} {price:.2f} {currency}/h"
    return line


def biggest_first(processes: Sequence[ProcessReading]) -> list[ProcessReading]:
    """Processes by GPU memory held, largest first (as /metrics and the JSON keep them); unknown last."""
    return sorted(processes, key=lambda p: (p.used_memory_bytes is None, -(p.used_memory_bytes or 0), p.pid))


def held_by(holders: Sequence[Holder], most: int = 3) -> str:
    """Who holds a GPU, in words: ``job 4242 of alice, container trainer``; ``-`` for nobody."""
    names = [h.name for h in holders]
    if len(names) > most:
        names = [*names[:most], f"+{len(names) - most} more"]
    return ", ".join(names) or "-"


def _holder_details(h: Holder) -> str:
    labels = h.labels()
    extra = [f"{word} {labels[key]}" for word, key in (("account", "slurm_account"), ("partition", "slurm_partition"),
             ("engine", "container_engine"), ("id", "container_id")) if labels.get(key)]  # fmt: skip
    return h.name + (f" ({', '.join(extra)})" if extra else "")


def _summary_row(g: GpuReading, state: str) -> list[str]:
    assert g.static is not None
    mem = "n/a"
    if g.memory_total_bytes is not None and g.memory_used_bytes is not None:
        mem = f"{g.memory_used_bytes / GIB:.1f}/{g.memory_total_bytes / GIB:.1f} GiB {_pct(g.memory_used_ratio):>4}"
    temp = g.temperature_celsius.get("gpu")
    power = "n/a" if g.power_usage_watts is None else f"{g.power_usage_watts:.0f}"
    if g.power_usage_watts is not None and g.power_limit_watts is not None:
        power += f"/{g.power_limit_watts:.0f}"
    return [
        str(g.index), g.static.name, _pct(g.utilization_ratio), mem, "n/a" if temp is None else f"{temp:.0f} C",
        power if g.power_usage_watts is None else f"{power} W", _link(g),
        "RESET REQUIRED" if g.reset_required else state, held_by(device_holders(g, False)),
    ]  # fmt: skip


def _unread(g: GpuReading) -> str:
    """What a GPU not read at all is: one the driver refuses until it is reset is not lost."""
    return "RESET REQUIRED" if g.up and g.reset_required else "LOST"


_HEADINGS = ("GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER", "PCIE LINK", "STATE", "HELD BY")
_RIGHT = frozenset({0, 2, 3, 4, 5})  # numbers line up on the right


def _summary_table(snapshot: NodeSnapshot, cost: CostNow | None) -> list[str]:
    rows: list[list[str] | str] = [list(_HEADINGS)]
    for g in snapshot.gpus:
        if not g.up or g.static is None:  # a lost GPU, or one refused until reset: what is known, and why
            rows.append(f" {g.index:>3}  {_unread(g)}  {g.uuid or 'uuid unknown'}: {g.error}")
            continue
        state = cost.gpus.get(g.index, ("", None))[0] if cost else ""
        rows.append(_summary_row(g, state))
    cells = [r for r in rows if isinstance(r, list)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(_HEADINGS))]

    def line(r: list[str]) -> str:
        cells = (c.rjust(w) if i in _RIGHT else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        return " " + "  ".join(cells).rstrip()

    return [r if isinstance(r, str) else line(r) for r in rows]


def _details(g: GpuReading, cost: CostNow | None = None) -> list[str]:
    s = g.static
    state, price = cost.gpus.get(g.index, ("", None)) if cost else ("", None)
    if not g.up or s is None:
        word = "RESET REQUIRED" if g.up and g.reset_required else "NOT ANSWERING"
        lost = [f"GPU {g.index}  {g.uuid or 'uuid unknown'}  {word}: {g.error}"]
        return lost + ([_state_line(state, price, cost.currency)] if cost and state else [])
    lines = [f"GPU {g.index}  {s.name}  {s.uuid}  {s.pci_bus_id}"]
    if g.reset_required:
        lines.append("  RESET REQUIRED: the driver answers NVML_ERROR_RESET_REQUIRED and will not use it until reset")
    if cost and state:
        lines.append(_state_line(state, price, cost.currency))
    holders = device_holders(g, False)
    lines.append(f"  held by      {'; '.join(_holder_details(h) for h in holders) or 'nobody'}")
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
    if g.fan_speed_ratio:  # passively cooled cards have none
        temp_s += "   fan " + " ".join(_pct(g.fan_speed_ratio[k]) for k in sorted(g.fan_speed_ratio, key=int))
    power = "n/a" if g.power_usage_watts is None else f"{g.power_usage_watts:.0f} W"
    if g.power_usage_watts is not None and g.power_limit_watts is not None:
        power += f" / {g.power_limit_watts:.0f} W"
    lines.append(f"  temperature  {temp_s}   power {power}")
    clocks = "  ".join(f"{k} {v / 1e6:.0f} MHz" for k, v in g.clock_hertz.items())
    if g.performance_state is not None:
        clocks = f"P{g.performance_state}  {clocks}".rstrip()
    if clocks:
        lines.append(f"  clocks       {clocks}")
    lines.append(
        f"  pcie         {_link(g)}   tx {_bytes_rate(g.pcie_tx_bytes_per_second)}"
        f"   rx {_bytes_rate(g.pcie_rx_bytes_per_second)}"
    )
    active = [r for r, on in g.clock_event_active.items() if on]
    if active:
        lines.append(f"  clock events {', '.join(active)}")
    if g.processes:
        lines.append("  processes")
        for p in biggest_first(g.processes):
            used = "n/a" if p.used_memory_bytes is None else f"{p.used_memory_bytes / GIB:.2f} GiB"
            sm = "" if p.sm_utilization_ratio is None else f"  SM {_pct(p.sm_utilization_ratio):>4}"
            lines.append(f"    {p.pid:>8}  {p.name:<20} {used:>10}  {p.kind:<8}{sm:<9}  {p.holder.name}")
    else:
        lines.append("  processes    none")
    for m in g.migs:
        mem = "n/a" if m.memory_used_bytes is None or m.memory_total_bytes is None else \
            f"{m.memory_used_bytes / GIB:.1f} / {m.memory_total_bytes / GIB:.1f} GiB"  # fmt: skip
        act = "" if m.activity is None else f"   SM {_pct(m.activity.sm)}   tensor {_pct(m.activity.tensor)}"
        lines.append(f"  MIG {m.index}        {m.profile:<9} gi {m.gpu_instance_id}   memory {mem}{act}   {m.uuid}")
    return lines


def status_line(snapshot: NodeSnapshot, found: Sequence[Finding], node: str) -> str:
    """The first line, which a monitoring system shows as the check's output."""
    status = exit_status(found)
    lost = sum(not g.up for g in snapshot.gpus)
    what = f"{len(snapshot.gpus)} GPUs" + (f", {lost} lost" if lost else "")
    if found:
        names = ", ".join(dict.fromkeys(f"{f.alertname} on GPU {f.gpu}" for f in found))
        what += f", {len(found)} finding(s): {names}"
    return f"GPU {STATUS_NAMES[status]} - {what}"


def unknown_line(error: str) -> str:
    """The status line when nothing could be checked: a plugin's first stdout line is its output,
    so Nagios shows why rather than "(null)" or "no output"; the reason's first line only."""
    reason = error.strip().splitlines()[0] if error.strip() else "cannot check"
    return for_terminal(f"GPU {STATUS_NAMES[UNKNOWN]} - {reason}")


def as_table(snapshot: NodeSnapshot, found: Sequence[Finding], cost: CostNow | None = None, node: str = "") -> str:
    head = (f"node {node or 'n/a'}   {_timestamp(snapshot.taken_at)}   driver {snapshot.driver_version or 'n/a'}"
            f"   CUDA {snapshot.cuda_version or 'n/a'}")  # fmt: skip
    out = [status_line(snapshot, found, node), head, "", *_summary_table(snapshot, cost), ""]
    for g in snapshot.gpus:
        out += [*_details(g, cost), ""]
    if cost is not None and cost.currency:
        wasted = [i for i, (state, _) in cost.gpus.items() if state in WASTE_STATES]
        out += [f"Waste now: {len(wasted)} GPU(s) idle or allocated but idle, {cost.waste_per_hour or 0:.2f} "
                f"{cost.currency}/h", ""]  # fmt: skip
    out.append("Findings:" if found else "Findings: none")
    out += [f"  - {f.line()}" for f in found]
    # Process, user and pod names are chosen by whoever runs them: an ESC or a newline in one
    # must not drive the terminal or break a row.
    return "\n".join(for_terminal(line) for line in out)
