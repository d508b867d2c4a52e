"""Snapshot -> Prometheus metric families, and the exporter's own health metrics.

Every metric the exporter can emit is declared in ``METRICS`` (name, type, help); the README's
metrics reference is checked against it.  Values the GPU does not support are absent from the
snapshot and so are left out here, never written as 0 or NaN.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..accounting.states import UNKNOWN_USER
from ..alerting.engine import Alert
from ..snapshot import GpuReading, MigReading, NodeSnapshot, PodRef, ProcessReading, pod_label_values

GPU_LABELS = ("gpu", "uuid")
# Activity (GPM) metric name stems and the snapshot field each reads: gpu_<stem>_ratio per GPU,
# gpu_mig_<stem>_ratio per MIG instance.
ACTIVITY_METRICS = (("graphics_active", "graphics"), ("sm_active", "sm"), ("sm_occupancy", "sm_occupancy"),
                    ("tensor_active", "tensor"), ("dram_active", "dram"), ("fp64_active", "fp64"),
                    ("fp32_active", "fp32"), ("fp16_active", "fp16"))  # fmt: skip


@dataclass(frozen=True)
class MetricDef:
    name: str  # as exposed; counters include their _total suffix
    type: str  # "gauge", "counter", "histogram" or "info"
    help: str


_DEFS = [
    MetricDef("gpu_up", "gauge", "1 when the GPU answered the last poll, 0 when it is lost or unreadable."),
    MetricDef("gpu_info", "gauge", "Constant 1; the labels describe the GPU and its driver."),
    MetricDef("gpu_utilization_ratio", "gauge", "Fraction of the last sample period in which a kernel ran (0-1)."),
    MetricDef("gpu_memory_copy_utilization_ratio", "gauge", "Fraction of the last sample period in which memory was read or written (0-1)."),
    MetricDef("gpu_encoder_utilization_ratio", "gauge", "Video encoder utilization (0-1)."),
    MetricDef("gpu_decoder_utilization_ratio", "gauge", "Video decoder utilization (0-1)."),
    MetricDef("gpu_graphics_active_ratio", "gauge", "Fraction of time any graphics or compute engine was active since the previous poll, from GPM (0-1; Hopper and newer)."),
    MetricDef("gpu_sm_active_ratio", "gauge", "Fraction of SMs with at least one warp resident, averaged since the previous poll, from GPM (0-1; Hopper and newer)."),
    MetricDef("gpu_sm_occupancy_ratio", "gauge", "Resident warps as a fraction of the SMs' maximum, averaged since the previous poll, from GPM (0-1; Hopper and newer)."),
    MetricDef("gpu_tensor_active_ratio", "gauge", "Fraction of time any tensor pipe was active since the previous poll, from GPM (0-1; Hopper and newer)."),
    MetricDef("gpu_dram_active_ratio", "gauge", "DRAM bandwidth used as a fraction of the peak since the previous poll, from GPM (0-1; Hopper and newer)."),
    MetricDef("gpu_fp64_active_ratio", "gauge", "Fraction of time the FP64 (non-tensor) pipe was active since the previous poll, from GPM (0-1; Hopper and newer)."),
    MetricDef("gpu_fp32_active_ratio", "gauge", "Fraction of time the FP32 (non-tensor) pipe was active since the previous poll, from GPM (0-1; Hopper and newer)."),
    MetricDef("gpu_fp16_active_ratio", "gauge", "Fraction of time the FP16 (non-tensor) pipe was active since the previous poll, from GPM (0-1; Hopper and newer)."),
    MetricDef("gpu_memory_total_bytes", "gauge", "Total installed GPU memory in bytes."),
    MetricDef("gpu_memory_used_bytes", "gauge", "GPU memory allocated by processes, in bytes (excludes driver-reserved memory where the driver reports it separately)."),
    MetricDef("gpu_memory_free_bytes", "gauge", "GPU memory free for allocation, in bytes."),
    MetricDef("gpu_memory_reserved_bytes", "gauge", "GPU memory reserved by the driver and firmware, in bytes."),
    MetricDef("gpu_temperature_celsius", "gauge", "Temperature in degrees Celsius, by sensor (gpu die, memory)."),
    MetricDef("gpu_temperature_threshold_celsius", "gauge", "Temperature thresholds in degrees Celsius (slowdown, shutdown, gpu_max, mem_max)."),
    MetricDef("gpu_fan_speed_ratio", "gauge", "Fan speed as a fraction of its maximum (0-1), per fan."),
    MetricDef("gpu_power_usage_watts", "gauge", "Power draw in watts."),
    MetricDef("gpu_power_limit_watts", "gauge", "Enforced power limit in watts."),
    MetricDef("gpu_energy_consumed_joules_total", "counter", "Energy consumed since the driver was loaded, in joules."),
    MetricDef("gpu_clock_hertz", "gauge", "Current clock frequency in hertz, per clock domain."),
    MetricDef("gpu_clock_max_hertz", "gauge", "Maximum clock frequency in hertz, per clock domain."),
    MetricDef("gpu_performance_state", "gauge", "Performance state (0 = P0, the fastest, up to 15)."),
    MetricDef("gpu_clock_event_active", "gauge", "1 while a clock event reason (throttling) is active, per reason."),
    MetricDef("gpu_pcie_tx_bytes_per_second", "gauge", "PCIe transmit throughput in bytes per second: the mean since the previous poll from the byte counter where there is one, else a 20 ms driver sample."),
    MetricDef("gpu_pcie_rx_bytes_per_second", "gauge", "PCIe receive throughput in bytes per second: the mean since the previous poll from the byte counter where there is one, else a 20 ms driver sample."),
    MetricDef("gpu_pcie_tx_bytes_total", "counter", "PCIe bytes transmitted (may wrap)."),
    MetricDef("gpu_pcie_rx_bytes_total", "counter", "PCIe bytes received (may wrap)."),
    MetricDef("gpu_pcie_link_generation", "gauge", "Current PCIe link generation (idle cards may train down)."),
    MetricDef("gpu_pcie_link_max_generation", "gauge", "Maximum PCIe link generation of the card and slot."),
    MetricDef("gpu_pcie_link_width", "gauge", "Current PCIe link width in lanes."),
    MetricDef("gpu_pcie_link_max_width", "gauge", "Maximum PCIe link width in lanes."),
    MetricDef("gpu_pcie_link_max_bytes_per_second", "gauge", "Usable bandwidth of one direction of the link at its current generation and width: transfer rate per lane (2.5/5/8/16/32/64 GT/s) x line-code efficiency (8b/10b for Gen1-2, 128b/130b for Gen3-5, 242/256 for Gen6) / 8 x lanes."),
    MetricDef("gpu_pcie_replay_errors_total", "counter", "PCIe replay counter (link-level retransmissions)."),
    MetricDef("gpu_nvlink_tx_bytes_total", "counter", "NVLink data bytes transmitted, per link (NVML KiB x 1024)."),
    MetricDef("gpu_nvlink_rx_bytes_total", "counter", "NVLink data bytes received, per link (NVML KiB x 1024)."),
    MetricDef("gpu_nvlink_up", "gauge", "1 when the NVLink link is active, per link."),
    MetricDef("gpu_ecc_errors_total", "counter", "ECC memory errors over the device lifetime, by type (corrected, uncorrected)."),
    MetricDef("gpu_remapped_rows_total", "counter", "Memory rows remapped, by cause (correctable, uncorrectable)."),
    MetricDef("gpu_row_remap_pending", "gauge", "1 when a row remap is pending and the GPU needs a reset."),
    MetricDef("gpu_row_remap_failure", "gauge", "1 when a row remap has failed."),
    MetricDef("gpu_xid_errors_total", "counter", "XID error events seen since the exporter started, by XID code."),
    MetricDef("gpu_process_memory_used_bytes", "gauge", "GPU memory used by a process, in bytes (the processes using the most memory, up to the configured cap per GPU)."),
    MetricDef("gpu_process_sm_utilization_ratio", "gauge", "SM utilization of a process in the driver's latest sample since the previous poll (0-1; 0 when idle since then; capped like gpu_process_memory_used_bytes)."),
    MetricDef("gpu_process_memory_utilization_ratio", "gauge", "Memory (frame buffer) utilization of a process in the driver's latest sample since the previous poll (0-1; capped like gpu_process_memory_used_bytes)."),
    MetricDef("gpu_processes", "gauge", "Processes using the GPU, all of them (also those beyond the per-GPU series cap)."),
    MetricDef("gpu_pod_info", "gauge", "Constant 1 for every Kubernetes container holding the GPU or one of its MIG devices (device_uuid), from the kubelet; present only with pod attribution on."),
    MetricDef("gpu_mig_info", "gauge", "Constant 1 for each MIG device of a GPU in MIG mode; the labels give its UUID, GPU and compute instance ids and profile."),
    MetricDef("gpu_mig_memory_total_bytes", "gauge", "Memory of a MIG device, in bytes."),
    MetricDef("gpu_mig_memory_used_bytes", "gauge", "Memory used on a MIG device, in bytes."),
    MetricDef("gpu_mig_memory_free_bytes", "gauge", "Memory free on a MIG device, in bytes."),
    *(MetricDef(f"gpu_mig_{name}_ratio", "gauge", f"Like gpu_{name}_ratio, for one MIG GPU instance, from GPM (0-1).")
      for name, _ in ACTIVITY_METRICS),
    MetricDef("gpu_mig_process_memory_used_bytes", "gauge", "Memory used by a process on a MIG device, in bytes (capped like gpu_process_memory_used_bytes)."),
    MetricDef("gpu_state_seconds_total", "counter", "Seconds each GPU spent in each state (busy, allocated_idle, idle, down), by holder: the pod with pod attribution, else the user whose processes hold memory; a shared GPU's time is split between its holders."),
    MetricDef("gpu_last_active_timestamp_seconds", "gauge", "Unix time the GPU was last busy (activity at or above the idle threshold); absent until it has been busy since the exporter started."),
    MetricDef("gpu_memory_used_max_bytes", "gauge", "Highest GPU memory used seen by the polls over the memory peak window (default 5 min), in bytes."),
    MetricDef("gpu_price_per_hour", "gauge", "Price of the GPU per hour in the configured currency, from the pricing settings; absent where no price is configured."),
    MetricDef("gpu_energy_price_per_kwh", "gauge", "Price of one kWh of energy in the configured currency, from the pricing settings; absent where none is configured."),
    MetricDef("gpu_exporter_build_info", "gauge", "Constant 1; labels give the exporter's version."),
    MetricDef("gpu_exporter_nvml_up", "gauge", "1 when NVML is initialised and answering."),
    MetricDef("gpu_exporter_poll_duration_seconds", "histogram", "Wall time of one poll of all GPUs."),
    MetricDef("gpu_exporter_last_poll_success_timestamp_seconds", "gauge", "Unix time of the last poll in which NVML answered."),
    MetricDef("gpu_exporter_alerts", "gauge", "Pending and firing alerts, like Prometheus's ALERTS: the number of alerts with these labels."),
    MetricDef("gpu_exporter_notifications_total", "counter", "Alert notifications by receiver and outcome (sent, retried, rejected, dropped)."),
    MetricDef("gpu_exporter_notification_queue_length", "gauge", "Alerts waiting for a receiver that is slow or down (to an Alertmanager: not yet delivered; to a webhook: in groups with an undelivered change)."),
    MetricDef("gpu_exporter_kubelet_refreshes_total", "counter", "Refreshes of pod attribution from the kubelet's PodResources API, by outcome (ok, error, missing)."),
    MetricDef("gpu_exporter_pod_attribution_expired_total", "counter", "Times the last good pod attribution was dropped because the kubelet had not answered for kubernetes.keep_last_good_for."),
    MetricDef("gpu_exporter_nvml_errors_total", "counter", "Failed NVML queries, by function and error (not_supported is counted once per GPU and query, then again after each static refresh)."),
]  # fmt: skip
METRICS: dict[str, MetricDef] = {d.name: d for d in _DEFS}

# The series each collector (``--[no-]collector.<name>``) contributes; every other one is always on.
COLLECTOR_METRICS: dict[str, frozenset[str]] = {
    "nvlink": frozenset({"gpu_nvlink_up", "gpu_nvlink_tx_bytes_total", "gpu_nvlink_rx_bytes_total"}),
    "processes": frozenset({"gpu_processes", "gpu_process_memory_used_bytes", "gpu_process_sm_utilization_ratio",
                            "gpu_process_memory_utilization_ratio", "gpu_mig_process_memory_used_bytes"}),
    "clocks": frozenset({"gpu_clock_hertz", "gpu_clock_max_hertz", "gpu_clock_event_active", "gpu_performance_state"}),
    "ecc": frozenset({"gpu_ecc_errors_total", "gpu_remapped_rows_total", "gpu_row_remap_pending",
                      "gpu_row_remap_failure"}),
    "profiling": frozenset({f"gpu_{p}{name}_ratio" for name, _ in ACTIVITY_METRICS for p in ("", "mig_")}),
}  # fmt: skip


# Metrics with one value per GPU: name -> how to read it from a reading.
_SCALARS: list[tuple[str, Callable[[GpuReading], float | int | bool | None]]] = [
    ("gpu_utilization_ratio", lambda g: g.utilization_ratio),
    ("gpu_memory_copy_utilization_ratio", lambda g: g.memory_copy_utilization_ratio),
    ("gpu_encoder_utilization_ratio", lambda g: g.encoder_utilization_ratio),
    ("gpu_decoder_utilization_ratio", lambda g: g.decoder_utilization_ratio),
    *(
        (f"gpu_{name}_ratio", (lambda f: lambda g: getattr(g.activity, f) if g.activity else None)(field))
        for name, field in ACTIVITY_METRICS
    ),
    ("gpu_memory_total_bytes", lambda g: g.memory_total_bytes),
    ("gpu_memory_used_bytes", lambda g: g.memory_used_bytes),
    ("gpu_memory_free_bytes", lambda g: g.memory_free_bytes),
    ("gpu_memory_reserved_bytes", lambda g: g.memory_reserved_bytes),
    ("gpu_power_usage_watts", lambda g: g.power_usage_watts),
    ("gpu_power_limit_watts", lambda g: g.power_limit_watts),
    ("gpu_energy_consumed_joules_total", lambda g: g.energy_consumed_joules_total),
    ("gpu_performance_state", lambda g: g.performance_state),
    ("gpu_pcie_tx_bytes_per_second", lambda g: g.pcie_tx_bytes_per_second),
    ("gpu_pcie_rx_bytes_per_second", lambda g: g.pcie_rx_bytes_per_second),
    ("gpu_pcie_tx_bytes_total", lambda g: g.pcie_tx_bytes_total),
    ("gpu_pcie_rx_bytes_total", lambda g: g.pcie_rx_bytes_total),
    ("gpu_pcie_link_generation", lambda g: g.pcie_link_generation),
    ("gpu_pcie_link_max_generation", lambda g: g.static.pcie_max_generation if g.static else None),
    ("gpu_pcie_link_width", lambda g: g.pcie_link_width),
    ("gpu_pcie_link_max_width", lambda g: g.static.pcie_max_width if g.static else None),
    ("gpu_pcie_link_max_bytes_per_second", lambda g: g.pcie_link_max_bytes_per_second),
    ("gpu_pcie_replay_errors_total", lambda g: g.pcie_replay_errors_total),
    ("gpu_row_remap_pending", lambda g: g.row_remap_pending),
    ("gpu_row_remap_failure", lambda g: g.row_remap_failure),
]

# Metrics with one value per GPU and one extra label: (name, label, how to read the mapping).
_LABELLED: list[tuple[str, str, Callable[[GpuReading], Iterable[tuple[str, float | int | bool | None]]]]] = [
    ("gpu_temperature_celsius", "sensor", lambda g: g.temperature_celsius.items()),
    ("gpu_temperature_threshold_celsius", "threshold",
     lambda g: g.static.temperature_thresholds_celsius.items() if g.static else ()),
    ("gpu_fan_speed_ratio", "fan", lambda g: g.fan_speed_ratio.items()),
    ("gpu_clock_hertz", "clock", lambda g: g.clock_hertz.items()),
    ("gpu_clock_max_hertz", "clock", lambda g: g.static.clock_max_hertz.items() if g.static else ()),
    ("gpu_clock_event_active", "reason", lambda g: g.clock_event_active.items()),
    ("gpu_nvlink_tx_bytes_total", "link", lambda g: ((str(n.link), n.tx_bytes_total) for n in g.nvlinks)),
    ("gpu_nvlink_rx_bytes_total", "link", lambda g: ((str(n.link), n.rx_bytes_total) for n in g.nvlinks)),
    ("gpu_nvlink_up", "link", lambda g: ((str(n.link), n.up) for n in g.nvlinks)),
    ("gpu_ecc_errors_total", "type", lambda g: g.ecc_errors_total.items()),
    ("gpu_remapped_rows_total", "cause", lambda g: g.remapped_rows_total.items()),
    ("gpu_xid_errors_total", "xid", lambda g: ((str(x), n) for x, n in sorted(g.xid_errors_total.items()))),
]  # fmt: skip


@dataclass(frozen=True)
class RenderOptions:
    """How snapshots become series: the per-GPU process cap, and the pod label names if any."""

    process_top_n: int = 0  # 0: every process
    pod_labels: tuple[str, str, str] | None = None  # names for namespace, pod and container
    disabled: frozenset[str] = frozenset()  # collectors switched off

    @property
    def left_out(self) -> frozenset[str]:
        """The metric names of the collectors switched off."""
        return frozenset().union(*(COLLECTOR_METRICS[c] for c in self.disabled))


def top_processes(processes: Iterable[ProcessReading], n: int) -> list[ProcessReading]:
    """The ``n`` processes using the most memory (all if ``n`` is 0); unknown usage sorts last."""
    ranked = sorted(processes, key=lambda p: (-(p.used_memory_bytes or -1), p.pid))
    return ranked[:n] if n > 0 else ranked


class _Families:
    """Builds families whose every series starts with gpu, uuid and, when on, the pod labels."""

    def __init__(self, opts: RenderOptions) -> None:
        self.opts = opts
        self.pod_names: tuple[str, ...] = opts.pod_labels or ()

    def family(self, name: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily | CounterMetricFamily:
        labels = [*GPU_LABELS, *self.pod_names, *extra]
        if METRICS[name].type == "counter":
            return CounterMetricFamily(name.removesuffix("_total"), METRICS[name].help, labels=labels)
        return GaugeMetricFamily(name, METRICS[name].help, labels=labels)

    def base(self, g: GpuReading, pods: Iterable[PodRef] | None = None) -> list[str]:
        values = [str(g.index), g.uuid]
        if self.pod_names:
            values += pod_label_values(g.pods if pods is None else pods)
        return values


def gpu_families(snapshot: NodeSnapshot, opts: RenderOptions | None = None) -> Iterator[Metric]:
    """The per-GPU metric families of one snapshot, but those of collectors switched off.  A lost
    GPU only gets ``gpu_up 0``."""
    opts = opts or RenderOptions()
    if not opts.disabled:
        yield from _gpu_families(snapshot, opts)
        return
    left_out = opts.left_out
    for fam in _gpu_families(snapshot, opts):
        if (fam.name + "_total" if fam.type == "counter" else fam.name) not in left_out:
            yield fam


def _gpu_families(snapshot: NodeSnapshot, opts: RenderOptions) -> Iterator[Metric]:
    f = _Families(opts)
    gpus = snapshot.gpus
    up = f.family("gpu_up")
    for g in gpus:
        up.add_metric(f.base(g), 1 if g.up else 0)
    yield up
    live = [g for g in gpus if g.up]
    info = f.family("gpu_info", ("name", "pci_bus_id", "driver_version", "cuda_version", "serial", "mig_mode"))
    for g in live:
        s = g.static
        if s is not None:
            info.add_metric(
                [*f.base(g), s.name, s.pci_bus_id, snapshot.driver_version or "", snapshot.cuda_version or "",
                 s.serial or "", s.mig_mode],
                1,
            )  # fmt: skip
    yield info
    for name, read in _SCALARS:
        fam = f.family(name)
        for g in live:
            v = read(g)
            if v is not None:
                fam.add_metric(f.base(g), float(v))
        yield fam
    for name, label, items in _LABELLED:
        fam = f.family(name, (label,))
        for g in live:
            for key, v in items(g):
                if v is not None:
                    fam.add_metric([*f.base(g), key], float(v))
        yield fam
    count = f.family("gpu_processes")
    procs = f.family("gpu_process_memory_used_bytes", ("pid", "process", "user"))
    proc_sm = f.family("gpu_process_sm_utilization_ratio", ("pid", "process", "user"))
    proc_mem = f.family("gpu_process_memory_utilization_ratio", ("pid", "process", "user"))
    for g in live:
        count.add_metric(f.base(g), len(g.processes))
        for p in top_processes(g.processes, f.opts.process_top_n):
            labels = [*f.base(g, [p.pod] if p.pod else ()), str(p.pid), p.name, p.user or UNKNOWN_USER]
            if p.used_memory_bytes is not None:
                procs.add_metric(labels, float(p.used_memory_bytes))
            if p.sm_utilization_ratio is not None:
                proc_sm.add_metric(labels, p.sm_utilization_ratio)
            if p.memory_utilization_ratio is not None:
                proc_mem.add_metric(labels, p.memory_utilization_ratio)
    yield count
    yield procs
    yield proc_sm
    yield proc_mem
    if f.pod_names:
        holders = f.family("gpu_pod_info", ("device_uuid",))
        for g in gpus:
            for ref in sorted({(g.uuid, r) for r in g.pods} | {(m.uuid, r) for m in g.migs for r in m.pods},
                              key=lambda x: (x[0], x[1].namespace, x[1].pod, x[1].container)):  # fmt: skip
                holders.add_metric([str(g.index), g.uuid, ref[1].namespace, ref[1].pod, ref[1].container, ref[0]], 1)
        yield holders
    yield from _mig_families(f, live)


_MIG_LABELS = ("mig_uuid", "gpu_instance_id", "compute_instance_id", "mig_profile")


def _mig_families(f: _Families, live: list[GpuReading]) -> Iterator[Metric]:
    def ids(g: GpuReading, m: MigReading) -> list[str]:
        gi = "" if m.gpu_instance_id is None else str(m.gpu_instance_id)
        ci = "" if m.compute_instance_id is None else str(m.compute_instance_id)
        return [*f.base(g, m.pods), m.uuid, gi, ci, m.profile]

    info = f.family("gpu_mig_info", _MIG_LABELS)
    scalars: list[tuple[str, Callable[[MigReading], float | int | None]]] = [
        ("gpu_mig_memory_total_bytes", lambda m: m.memory_total_bytes),
        ("gpu_mig_memory_used_bytes", lambda m: m.memory_used_bytes),
        ("gpu_mig_memory_free_bytes", lambda m: m.memory_free_bytes),
    ]
    scalars += [(f"gpu_mig_{name}_ratio", (lambda f: lambda m: getattr(m.activity, f) if m.activity else None)(field))
                for name, field in ACTIVITY_METRICS]  # fmt: skip
    fams = [(f.family(name, _MIG_LABELS), read) for name, read in scalars]
    procs = f.family("gpu_mig_process_memory_used_bytes", (*_MIG_LABELS, "pid", "process", "user"))
    for g in live:
        for m in g.migs:
            info.add_metric(ids(g, m), 1)
            for fam, read in fams:
                v = read(m)
                if v is not None:
                    fam.add_metric(ids(g, m), float(v))
            for p in top_processes(m.processes, f.opts.process_top_n):
                if p.used_memory_bytes is not None:
                    procs.add_metric(
                        [*ids(g, m), str(p.pid), p.name, p.user or UNKNOWN_USER], float(p.used_memory_bytes)
                    )
    yield info
    for fam, _ in fams:
        yield fam
    yield procs


class AlertsCollector(Collector):
    """The rule engine's pending and firing alerts, and the receivers' queues, at render time."""

    def __init__(self, alerts: Callable[[], Iterable[Alert]], queues: Callable[[], Iterable[tuple[str, int]]]) -> None:
        self._alerts = alerts
        self._queues = queues

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily("gpu_exporter_alerts", METRICS["gpu_exporter_alerts"].help,
                                labels=["alertname", "alertstate", "severity", "gpu", "uuid"])  # fmt: skip
        counts: dict[tuple[str, ...], int] = {}
        for a in self._alerts():
            labels = a.label_dict
            alert_key = (labels["alertname"], a.state, labels["severity"], labels["gpu"], labels.get("uuid", ""))
            counts[alert_key] = counts.get(alert_key, 0) + 1
        for label_values, n in sorted(counts.items()):
            fam.add_metric(list(label_values), n)
        yield fam
        queue = GaugeMetricFamily("gpu_exporter_notification_queue_length",
                                  METRICS["gpu_exporter_notification_queue_length"].help, labels=["receiver"])  # fmt: skip
        for name, length in self._queues():
            queue.add_metric([name], length)
        yield queue


class SnapshotCollector(Collector):
    """A custom collector over the latest snapshot; it never touches NVML."""

    def __init__(self, opts: RenderOptions | None = None) -> None:
        self.snapshot: NodeSnapshot | None = None
        self.opts = opts or RenderOptions()

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        if snapshot is not None:
            yield from gpu_families(snapshot, self.opts)


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


class SelfMetrics:
    """The exporter's own health, in the registry that /metrics renders."""

    def __init__(self, registry: CollectorRegistry) -> None:
        d = METRICS
        self._registry = registry
        build = Gauge("gpu_exporter_build_info", d["gpu_exporter_build_info"].help,
                      ["version", "python_version", "nvidia_ml_py_version"], registry=registry)  # fmt: skip
        build.labels(__version__, platform.python_version(), _package_version("nvidia-ml-py")).set(1)
        self.nvml_up = Gauge("gpu_exporter_nvml_up", d["gpu_exporter_nvml_up"].help, registry=registry)
        self.poll_duration = Histogram(
            "gpu_exporter_poll_duration_seconds",
            d["gpu_exporter_poll_duration_seconds"].help,
            buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.last_success = Gauge(
            "gpu_exporter_last_poll_success_timestamp_seconds",
            d["gpu_exporter_last_poll_success_timestamp_seconds"].help,
            registry=registry,
        )
        self.notifications = Counter(
            "gpu_exporter_notifications",
            d["gpu_exporter_notifications_total"].help,
            ["receiver", "outcome"],
            registry=registry,
        )
        self.kubelet_refreshes = Counter(
            "gpu_exporter_kubelet_refreshes",
            d["gpu_exporter_kubelet_refreshes_total"].help,
            ["outcome"],
            registry=registry,
        )
        self.nvml_errors = Counter(
            "gpu_exporter_nvml_errors",
            d["gpu_exporter_nvml_errors_total"].help,
            ["function", "error"],
            registry=registry,
        )

        self.pod_attribution_expired: Counter | None = None

    def watch_kubelet(self, outcomes: Iterable[str]) -> None:
        """Pod attribution is on: every refresh outcome and the expiry counter exist from the start,
        at 0, so that ``increase()`` sees the first failure."""
        for outcome in outcomes:
            self.kubelet_refreshes.labels(outcome)
        if self.pod_attribution_expired is None:
            self.pod_attribution_expired = Counter(
                "gpu_exporter_pod_attribution_expired",
                METRICS["gpu_exporter_pod_attribution_expired_total"].help,
                registry=self._registry,
            )

    def watch_receiver(self, receiver: str, outcomes: Iterable[str]) -> None:
        """Every delivery outcome of ``receiver`` exists from the start, at 0."""
        for outcome in outcomes:
            self.notifications.labels(receiver, outcome)

    def count_attribution_expired(self) -> None:
        if self.pod_attribution_expired is not None:
            self.pod_attribution_expired.inc()

    def count_error(self, function: str, error: str) -> None:
        self.nvml_errors.labels(function, error).inc()

    def count_kubelet(self, outcome: str) -> None:
        self.kubelet_refreshes.labels(outcome).inc()

    def count_notification(self, receiver: str, outcome: str) -> None:
        self.notifications.labels(receiver, outcome).inc()
