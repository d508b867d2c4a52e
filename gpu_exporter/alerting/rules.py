"""The alert rules: for each GPU, whether each alert's condition holds, and whether it has cleared.

A rule answers with ``Check``s.  ``fire`` starts (or keeps) an alert pending; a firing alert
ends only when ``clear`` holds, which is a stricter condition than "not fire", so a value
hovering at the threshold does not flap.  A rule without the data it needs (a GPU that does not
answer, a reading it does not support, an empty window) answers nothing: the engine resolves a
firing alert it no longer sees, as Prometheus does when a series goes away.  The same rules exist
as PromQL in ``alerts/``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..snapshot import GpuReading, holds_memory, select_activity
from .settings import RulesSettings
from .window import IncreaseTracker, SampleWindow
from .xid_catalogue import advice as xid_advice

THERMAL_REASONS = ("hw_thermal", "sw_thermal")


@dataclass(frozen=True)
class Check:
    alertname: str
    severity: str
    fire: bool
    clear: bool
    summary: str
    description: str
    value: float | None = None
    # What ``value`` is compared with, where the rule has one limit for it (the severity's own for
    # GpuMemoryHigh); None where the condition is a state (lost, an XID, a remap) rather than a level.
    threshold: float | None = None
    extra_labels: tuple[tuple[str, str], ...] = ()
    for_seconds: float = 0.0


@dataclass
class GpuHistory:
    """What the windowed rules remember of one GPU between snapshots."""

    utilization: SampleWindow
    sm_active: SampleWindow
    ecc_uncorrected: IncreaseTracker = field(default_factory=IncreaseTracker)
    xids: dict[int, IncreaseTracker] = field(default_factory=dict)
    # The GPU's (uuid, model) as last read: a GPU that stops answering (an XID 79 or 119 is often why)
    # has no static reading, and its alerts still name the model, as /alerts does.
    model: tuple[str | None, str] | None = None
    # In MIG mode, each GPU instance's SM activity (GPM, the only activity NVML gives per instance).
    instances: dict[int, SampleWindow] = field(default_factory=dict)

    def observe(self, g: GpuReading, now: float) -> None:
        if g.static is not None:
            self.model = (g.uuid, g.static.name)
        # A lost GPU's XIDs (79: fell off the bus) are why it is lost: counted while it is down.
        for code, count in g.xid_errors_total.items():
            self.xids.setdefault(code, IncreaseTracker(from_zero=True)).observe(now, count)
        if not g.up:
            return
        if g.utilization_ratio is not None:
            self.utilization.add(now, g.utilization_ratio)
        else:
            self.utilization.trim(now)
        if g.activity is not None and g.activity.sm is not None:
            self.sm_active.add(now, g.activity.sm)
        else:
            self.sm_active.trim(now)
        if (n := g.ecc_errors_total.get("uncorrected")) is not None:
            self.ecc_uncorrected.observe(now, n)
        self._observe_instances(g, now)

    def _observe_instances(self, g: GpuReading, now: float) -> None:
        live = {m.gpu_instance_id for m in g.migs if m.gpu_instance_id is not None}
        for gi in [gi for gi in self.instances if gi not in live]:  # destroyed: a new one starts afresh
            del self.instances[gi]
        for m in g.migs:
            if m.gpu_instance_id is None:
                continue
            window = self.instances.get(m.gpu_instance_id)
            if m.activity is not None and m.activity.sm is not None:
                if window is None:
                    window = self.instances[m.gpu_instance_id] = SampleWindow(self.sm_active.horizon)
                window.add(now, m.activity.sm)


def _gpu(g: GpuReading, h: GpuHistory | None = None) -> str:
    """``GPU 4 (NVIDIA H100 80GB HBM3)``; the model last read where the GPU does not answer now, and
    only the index where it never did (or another card has taken its index since)."""
    name = g.static.name if g.static else None
    if name is None and h is not None and h.model is not None and g.uuid in (None, h.model[0]):
        name = h.model[1]
    return f"GPU {g.index} ({name})" if name else f"GPU {g.index}"


def _pct(v: float) -> str:
    return f"{v * 100:.0f}%"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


def averaged(samples: SampleWindow, now: float, window: float) -> tuple[str, str]:
    """The verb and the period that describe a window's mean honestly: ("averaged", "over the last
    30 min") once the samples cover the window, else what they do cover (one look by ``--once``,
    a daemon that started a minute ago)."""
    count, span = samples.span(now, window)
    if span >= 0.9 * window:  # samples come one poll interval apart: the oldest is up to one interval short
        return "averaged", f"over the last {_minutes(window)}"
    if count <= 1:
        return "was", "in a single look"
    return "averaged", f"over the last {span:.0f} s"


Rule = Callable[[GpuReading, GpuHistory, float, RulesSettings], Iterator[Check]]


def activity_mean(h: GpuHistory, now: float, window: float, signal: str) -> tuple[float | None, str]:
    """The mean activity over ``window`` and the name of the signal it came from.

    ``auto`` takes SM activity where the window holds any (a GPU with GPM), else GPU-Util: the
    same choice as the PromQL ``avg_over_time(gpu_sm_active_ratio[w]) or avg_over_time(gpu_utilization_ratio[w])``.
    """
    return select_activity(signal, h.sm_active.mean(now, window), h.utilization.mean(now, window))


def underutilized(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuUnderutilized
    if not g.up:
        return
    if g.migs:  # each slice is its own: one busy slice neither hides four idle ones nor is hidden by them
        yield from _underutilized_slices(g, h, now, cfg)
        return
    mean, signal = activity_mean(h, now, r.window, r.signal)
    if mean is None:
        return
    holds = holds_memory(g)
    verb, period = averaged(h.sm_active if signal == "SM activity" else h.utilization, now, r.window)
    yield Check(
        "GpuUnderutilized", "warning",
        fire=holds and mean < r.threshold,
        clear=not holds or mean > r.clear_threshold,
        summary=f"{_gpu(g, h)} is allocated but idle",
        description=f"{len(g.processes)} process(es) hold GPU memory but {signal} {verb} {_pct(mean)} "
                    f"{period} (threshold {_pct(r.threshold)}).",
        value=mean, threshold=r.threshold, for_seconds=r.for_,
    )  # fmt: skip


def _underutilized_slices(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    """GpuUnderutilized for each GPU instance of a card in MIG mode, on its own SM activity (GPM): none
    where GPU-Util is the signal asked for, or the instance has no GPM (A100, A30), as NVML gives
    neither per instance."""
    r = cfg.GpuUnderutilized
    if r.signal == "gpu_utilization":
        return
    for gi in sorted({m.gpu_instance_id for m in g.migs if m.gpu_instance_id is not None}):
        window = h.instances.get(gi)
        mean = window.mean(now, r.window) if window is not None else None
        if window is None or mean is None:
            continue
        migs = [m for m in g.migs if m.gpu_instance_id == gi]
        procs = [p for m in migs for p in m.processes if (p.used_memory_bytes or 0) > 0]
        verb, period = averaged(window, now, r.window)
        yield Check(
            "GpuUnderutilized", "warning",
            fire=bool(procs) and mean < r.threshold,
            clear=not procs or mean > r.clear_threshold,
            summary=f"MIG slice {gi} ({migs[0].profile}) of {_gpu(g)} is allocated but idle",
            description=f"{len(procs)} process(es) hold memory on MIG slice {gi} but its SM activity {verb} "
                        f"{_pct(mean)} {period} (threshold {_pct(r.threshold)}).",
            value=mean, threshold=r.threshold, for_seconds=r.for_,
            extra_labels=(("gpu_instance_id", str(gi)), ("mig_profile", migs[0].profile)),
        )  # fmt: skip


def low_sm_activity(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuLowSmActivity
    if not g.up:
        return
    util, sm = h.utilization.mean(now, r.window), h.sm_active.mean(now, r.window)
    if util is None or sm is None:  # no GPM on this GPU: the rule has nothing to say
        return
    verb, period = averaged(h.sm_active, now, r.window)
    yield Check(
        "GpuLowSmActivity", "warning",
        fire=util >= r.utilization_at_least and sm < r.sm_active_below,
        clear=util < r.clear_utilization_below or sm > r.clear_sm_active_above,
        summary=f"{_gpu(g, h)} looks busy but its SMs mostly idle",
        description=f"GPU utilization {verb} {_pct(util)} but SM activity only {_pct(sm)} {period} "
                    f"(thresholds: utilization at least {_pct(r.utilization_at_least)}, SM activity below "
                    f"{_pct(r.sm_active_below)}): kernels too small or launch-bound, for example tiny batches "
                    f"or one stream.",
        value=sm, threshold=r.sm_active_below, for_seconds=r.for_,
    )  # fmt: skip


def idle(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuIdle
    if not g.up:
        return
    mean = h.utilization.mean(now, r.window)
    if mean is None:
        return
    busy = bool(g.processes) or mean >= r.threshold
    verb, period = averaged(h.utilization, now, r.window)
    yield Check(
        "GpuIdle", "info", fire=not busy, clear=busy,
        summary=f"{_gpu(g, h)} is unused",
        description=f"No processes and utilization {verb} {_pct(mean)} {period}.",
        value=mean, threshold=r.threshold, for_seconds=r.for_,
    )  # fmt: skip


def memory_high(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuMemoryHigh
    ratio = g.memory_used_ratio
    if not g.up or ratio is None:
        return
    for severity, level, clear_level in (("warning", r.warning, r.warning_clear),
                                         ("critical", r.critical, r.critical_clear)):  # fmt: skip
        yield Check(
            "GpuMemoryHigh", severity, fire=ratio > level, clear=ratio < clear_level,
            summary=f"{_gpu(g, h)} memory is {_pct(ratio)} full",
            description=f"{(g.memory_used_bytes or 0) / 2**30:.1f} of {(g.memory_total_bytes or 0) / 2**30:.1f} GiB "
                        f"used ({_pct(ratio)}); threshold {_pct(level)}.",
            value=ratio, threshold=level, for_seconds=r.for_,
        )  # fmt: skip


def pcie_bottleneck(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuPcieBottleneck
    cap = g.pcie_link_max_bytes_per_second
    rates = [x for x in (g.pcie_tx_bytes_per_second, g.pcie_rx_bytes_per_second) if x is not None]
    util = g.utilization_ratio
    if not g.up or not cap or not rates or util is None:
        return
    load = max(rates) / cap
    yield Check(
        "GpuPcieBottleneck", "warning",
        fire=load >= r.threshold and util < r.utilization_below,
        clear=load < r.clear_threshold or util >= r.utilization_below,
        summary=f"{_gpu(g, h)} is starved by its PCIe link",
        description=f"PCIe at {_pct(load)} of the Gen{g.pcie_link_generation} x{g.pcie_link_width} link "
                    f"({max(rates) / 1e9:.2f} of {cap / 1e9:.2f} GB/s; threshold {_pct(r.threshold)}) while GPU "
                    f"utilization is {_pct(util)} (below {_pct(r.utilization_below)}).",
        value=load, threshold=r.threshold, for_seconds=r.for_,
    )  # fmt: skip


def pcie_link_degraded(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuPcieLinkDegraded
    s = g.static
    gen, width, util = g.pcie_link_generation, g.pcie_link_width, g.utilization_ratio
    max_gen, max_width = (s.pcie_max_generation, s.pcie_max_width) if s is not None else (None, None)
    if not g.up or gen is None or width is None or util is None or max_gen is None or max_width is None:
        return
    degraded = gen < max_gen or width < max_width
    loaded = util >= r.min_utilization
    yield Check(
        "GpuPcieLinkDegraded", "warning",
        fire=degraded and loaded,
        clear=not degraded or not loaded,
        summary=f"{_gpu(g, h)} PCIe link runs below its capability under load",
        description=f"Link at Gen{gen} x{width}, the card supports Gen{max_gen} x{max_width}, "
                    f"with GPU utilization {_pct(util)} (load threshold {_pct(r.min_utilization)}).",
        value=float(gen), threshold=float(max_gen), for_seconds=r.for_,
    )  # fmt: skip


def lost(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuLost
    yield Check(
        "GpuLost", "critical", fire=not g.up, clear=g.up,
        summary=f"GPU {g.index} stopped answering",
        description=f"GPU {g.index} ({g.uuid or 'uuid unknown'}) does not answer NVML: {g.error}.",
        value=0.0, for_seconds=r.for_,  # read only while it fires
    )  # fmt: skip


def xid(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuXidError
    for code, tracker in sorted(h.xids.items()):
        if code not in r.codes:
            continue
        recent = tracker.increased_within(now, r.window)
        yield Check(
            "GpuXidError", "critical", fire=recent, clear=not recent,
            summary=f"{_gpu(g, h)} reported XID {code}: {xid_advice(code)}",
            description=f"XID {code} seen; {g.xid_errors_total.get(code, 0)} since the exporter started.  What "
                        f"NVIDIA's XID catalogue says to do: {xid_advice(code)}.",
            value=float(code), extra_labels=(("xid", str(code)),), for_seconds=r.for_,
        )  # fmt: skip


def thermal(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuThermalThrottling
    # A GPU that does not answer, or does not report clock event reasons, has none active: the
    # check neither fires nor keeps an alert.
    active = [x for x in THERMAL_REASONS if g.clock_event_active.get(x)]
    temp = g.temperature_celsius.get("gpu")
    yield Check(
        "GpuThermalThrottling", "warning", fire=bool(active), clear=not active,
        summary=f"{_gpu(g, h)} is throttled by temperature",
        description=f"Thermal slowdown active ({', '.join(active) or 'none'}); GPU at "
                    f"{'n/a' if temp is None else f'{temp:.0f} C'}.",
        value=temp, for_seconds=r.for_,
    )  # fmt: skip


def ecc_uncorrectable(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    r = cfg.GpuEccUncorrectable
    recent = h.ecc_uncorrected.increased_within(now, r.window)
    count = g.ecc_errors_total.get("uncorrected")
    yield Check(
        "GpuEccUncorrectable", "critical", fire=recent, clear=not recent,
        summary=f"{_gpu(g, h)} had an uncorrectable ECC error",
        description=f"Uncorrectable ECC errors rose within the last {r.window / 60:g} min (lifetime total {count}).",
        value=None if count is None else float(count), for_seconds=r.for_,
    )  # fmt: skip


def row_remap(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    for alertname, severity, flag, rule, what in (
        ("GpuRowRemapFailure", "critical", g.row_remap_failure, cfg.GpuRowRemapFailure,
         "a memory row remap failed; the GPU needs service"),
        ("GpuRowRemapPending", "warning", g.row_remap_pending, cfg.GpuRowRemapPending,
         "a memory row remap is pending; reset the GPU when its jobs allow (SIGUSR1 to gpu-exporter, then "
         "nvidia-smi -r -i <gpu>)"),
    ):  # fmt: skip
        on = bool(g.up and flag)
        yield Check(alertname, severity, fire=on, clear=not on, summary=f"{_gpu(g, h)}: {what}",
                    description=f"{_gpu(g, h)}: {what}.", value=1.0,  # read only while it fires
                    for_seconds=rule.for_)  # fmt: skip


# What the driver's recovery action (gpu_recovery_action, nvml.h nvmlDeviceGpuRecoveryAction_t)
# asks an operator to do, by code.
RECOVERY_ACTIONS: dict[int, str] = {
    1: "reset the GPU (SIGUSR1 to gpu-exporter, then nvidia-smi -r -i <gpu>) once its jobs have stopped",
    2: "reboot the node",
    3: "drain peer-to-peer traffic: stop the jobs that use this GPU's NVLink peers",
    4: "drain the GPU's jobs and peer-to-peer traffic, then reset the GPU",
    5: "recover the IMEX domain (restart nvidia-imex on the domain's nodes)",
    6: "reset the GPU's PCIe bus",
    7: "reboot the system",
}


def recovery_required(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    code = g.field_values.get(("gpu_recovery_action", ""))  # a GPU that does not answer has none
    action = 0 if code is None else int(code)
    unknown = f"recovery action {action}, unknown to this exporter: see NVIDIA's XID catalogue"
    what = RECOVERY_ACTIONS.get(action, unknown)
    on = action > 0
    yield Check(
        "GpuRecoveryRequired", "critical", fire=on, clear=not on,
        summary=f"{_gpu(g, h)} needs recovery: {what}",
        description=f"The driver asks for recovery action {action} on {_gpu(g, h)} ({g.uuid}): {what}.",
        value=None if code is None else float(code), for_seconds=cfg.GpuRecoveryRequired.for_,
    )  # fmt: skip


def reset_required(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    on = g.up and g.reset_required
    yield Check(
        "GpuResetRequired", "critical", fire=on, clear=not on,
        summary=f"{_gpu(g, h)} must be reset: {RECOVERY_ACTIONS[1]}",
        description=f"{_gpu(g, h)} ({g.uuid}) answers its queries with NVML_ERROR_RESET_REQUIRED: the driver will "
                    f"not use it again until it is reset; {RECOVERY_ACTIONS[1]}.",
        value=1.0, for_seconds=cfg.GpuResetRequired.for_,
    )  # fmt: skip


# What each NVLink fabric issue (gpu_fabric_issue, metric_defs.FABRIC_ISSUES) asks an operator to do.
FABRIC_ADVICE: dict[str, str] = {
    "degraded_bandwidth": "NVLink bandwidth is degraded: check the GPU's links (nvidia-smi nvlink -s) and the "
                          "NVSwitch trays, and drain the node for service if it persists",
    "route_recovery": "the fabric is recovering a route; if it persists, check nvidia-fabricmanager's log",
    "route_unhealthy": "a fabric route is unhealthy: check nvidia-fabricmanager's log and the NVSwitch trays",
    "access_timeout_recovery": "the fabric is recovering from an access timeout; if it persists, drain the node",
    "incorrect_configuration": "the fabric is configured wrongly (nvidia-smi -q shows which: system GUID, chassis "
                               "serial, partition, NVLinks, firmware): fix it and restart nvidia-fabricmanager",
    "fabric_manager_disconnected": "the global fabric manager is disconnected: check the NVLink subnet manager",
    "registration_failed": "the GPU failed to register with the fabric: check nvidia-fabricmanager's log and "
                           "restart it",
}  # fmt: skip


def fabric_unhealthy(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    # Only the issues reported now: one that goes (or a GPU that stops answering) has no check, and
    # the engine resolves what has none, as it would clear it; a healthy fabric costs no check at all.
    issues = g.fabric.issues if g.up and g.fabric is not None else {}
    for issue in sorted(i for i, present in issues.items() if present):
        what = FABRIC_ADVICE.get(issue, f"fabric issue {issue}")
        yield Check(
            "GpuFabricUnhealthy", "critical", fire=True, clear=False,
            summary=f"{_gpu(g, h)}: NVLink fabric issue {issue}: {what}",
            description=f"The driver reports NVLink fabric issue {issue} on {_gpu(g, h)} ({g.uuid}): {what}.",
            value=1.0, extra_labels=(("issue", issue),),
            for_seconds=cfg.GpuFabricUnhealthy.for_,
        )  # fmt: skip


FABRIC_STATES = {1: "not started", 2: "in progress"}  # nvml.h NVML_GPU_FABRIC_STATE_*; 3 is completed


def fabric_not_ready(g: GpuReading, h: GpuHistory, now: float, cfg: RulesSettings) -> Iterator[Check]:
    state = g.fabric.state if g.up and g.fabric is not None else None
    if state is None or state >= 3:
        return  # registered, or no fabric: no check, so an alert of before resolves
    yield Check(
        "GpuFabricNotReady", "critical", fire=True, clear=False,
        summary=f"{_gpu(g, h)} has not joined its NVLink fabric (registration {FABRIC_STATES.get(state or 0, state)}): "
                "CUDA cannot use it until nvidia-fabricmanager (or the NVLink subnet manager) registers it",
        description=f"{_gpu(g, h)} ({g.uuid}): fabric registration state {state}; CUDA applications on it fail "
                    "with error 802 (system not yet initialized) until it completes.",
        value=float(state), for_seconds=cfg.GpuFabricNotReady.for_,
    )  # fmt: skip


# Every rule; a rule may answer for several severities or label sets of its alert, and the
# engine drops the answers of alerts that are switched off.
RULES: tuple[Rule, ...] = (
    underutilized, low_sm_activity, idle, memory_high, pcie_bottleneck, pcie_link_degraded, lost, xid, thermal,
    ecc_uncorrectable, row_remap, recovery_required, reset_required, fabric_unhealthy, fabric_not_ready,
)  # fmt: skip


def is_enabled(cfg: RulesSettings, alertname: str) -> bool:
    return bool(getattr(cfg, alertname).enabled)
