"""Snapshot -> Prometheus metric families, and the exporter's own health metrics.

Every metric is declared once, in :mod:`gpu_exporter.metric_defs` (name, type, help, labels, the
snapshot value it reads, its collector); this module renders those declarations.  Values the GPU
does not support are absent from the snapshot and so are left out here, never written as 0 or NaN.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..alerting.engine import Alert
from ..metric_defs import COLLECTOR_METRICS, METRICS, MetricDef, Scope, gpu_metrics
from ..snapshot import (
    UNKNOWN_USER,
    GpuReading,
    HolderLabels,
    MigReading,
    NodeSnapshot,
    ProcessReading,
    device_holders,
    pod_holder,
)


@dataclass(frozen=True)
class RenderOptions:
    """How snapshots become series: the per-GPU process cap, and which holders name the series (the
    pod label names with pod attribution on; Slurm jobs and containers where theirs is on)."""

    process_top_n: int = 0  # 0: every process
    pod_labels: tuple[str, str, str] | None = None  # names for namespace, pod and container
    disabled: frozenset[str] = frozenset()  # collectors switched off
    jobs: bool = False  # Slurm job attribution is on: hpc_job on every per-GPU series
    containers: bool = False  # container attribution is on: container_name on every per-GPU series

    @property
    def holders(self) -> HolderLabels:
        return HolderLabels(self.pod_labels, self.jobs, self.containers)

    @property
    def left_out(self) -> frozenset[str]:
        """The metric names of the collectors switched off."""
        return frozenset().union(*(COLLECTOR_METRICS[c] for c in self.disabled))


def device_name(minor: int | None) -> str:
    """The GPU's device file, as dcgm-exporter's ``device`` label names it (``nvidia0``: /dev/nvidia0,
    from nvmlDeviceGetMinorNumber); "" where the driver does not say."""
    return "" if minor is None else f"nvidia{minor}"


def top_processes(processes: Iterable[ProcessReading], n: int) -> list[ProcessReading]:
    """The ``n`` processes using the most memory (all if ``n`` is 0); unknown usage sorts last."""
    ranked = sorted(processes, key=lambda p: (-(p.used_memory_bytes or -1), p.pid))
    return ranked[:n] if n > 0 else ranked


# One series of a per-GPU metric: its declaration, its label values (in the order of
# ``labels_of(metric, opts)``) and its value.  /metrics and the ``--once`` JSON both render these.
Series = tuple[MetricDef, list[str], float]


def labels_of(d: MetricDef, opts: RenderOptions) -> tuple[str, ...]:
    """The label names of ``d``'s series: its scope's, the holder labels on (a pod's only, for the
    pod-only ``gpu_pod_info``), then its own."""
    return d.series_labels(opts.pod_labels or ()) if d.pods else d.series_labels(opts.holders)


def gpu_declarations(opts: RenderOptions) -> tuple[MetricDef, ...]:
    """The per-GPU metrics rendered, in exposition order: those of collectors switched off, and the
    pod-only ones without pod attribution, are left out."""
    ordered = (METRICS["gpu_up"], METRICS["gpu_info"], *gpu_metrics(Scope.GPU), *gpu_metrics(Scope.PROCESS),
               *((METRICS["gpu_pod_info"],) if opts.pod_labels else ()), METRICS["gpu_holder_info"],
               *gpu_metrics(Scope.MIG), *gpu_metrics(Scope.MIG_PROCESS))  # fmt: skip
    left_out = opts.left_out
    return tuple(d for d in ordered if d.name not in left_out)


class _Walk:
    """The series of one snapshot, each starting with its scope's labels, the holder labels (those
    on) right after ``gpu`` and ``uuid``."""

    def __init__(self, opts: RenderOptions) -> None:
        self.opts = opts
        self.holders = opts.holders
        self.on = frozenset(d.name for d in gpu_declarations(opts))

    def scoped(self, scope: Scope) -> list[MetricDef]:
        return [d for d in gpu_metrics(scope) if d.name in self.on]

    def base(self, g: GpuReading, held: GpuReading | MigReading | ProcessReading | None = None) -> list[str]:
        """``gpu`` and ``uuid``, and the holder labels of ``held`` (the GPU itself by default)."""
        h = g if held is None else held
        if isinstance(h, ProcessReading):
            labels = self.holders.values(_one(h.pod), _one(h.job), _one(h.container))
        else:
            labels = self.holders.of(h)
        return [str(g.index), g.uuid, *labels]


def _one(ref: Any) -> tuple[Any, ...]:
    return () if ref is None else (ref,)


def _values(d: MetricDef, labels: list[str], reading: Any) -> Iterator[Series]:
    """The series of one reading: a number, or one per extra label value; None is left out."""
    got = d.value(reading) if d.value is not None else None
    if got is None:
        return
    if len(d.labels) == 0:
        yield d, labels, float(got)  # type: ignore[arg-type]
        return
    for key, v in got:  # type: ignore[union-attr]
        if v is not None:
            yield d, [*labels, *key] if isinstance(key, tuple) else [*labels, key], float(v)


def gpu_series(snapshot: NodeSnapshot, opts: RenderOptions | None = None) -> Iterator[Series]:
    """Every per-GPU series of one snapshot, but those of collectors switched off.  A lost GPU gets
    ``gpu_up 0`` and the series declared ``while_down`` (its XIDs)."""
    opts = opts or RenderOptions()
    w = _Walk(opts)
    gpus = snapshot.gpus
    up = METRICS["gpu_up"]
    for g in gpus:
        yield up, w.base(g), 1.0 if g.up else 0.0
    live = [g for g in gpus if g.up]
    info = METRICS["gpu_info"]
    for g in live:
        s = g.static
        if s is not None:
            yield info, [*w.base(g), s.name, s.pci_bus_id, snapshot.driver_version or "", snapshot.cuda_version or "",
                         s.serial or "", s.mig_mode, device_name(s.minor_number)], 1.0  # fmt: skip
    for d in w.scoped(Scope.GPU):
        for g in gpus if d.while_down else live:
            yield from _values(d, w.base(g), g)
    procs = w.scoped(Scope.PROCESS)
    if procs:
        for g in live:
            for p in top_processes(g.processes, opts.process_top_n):
                labels = [*w.base(g, p), str(p.pid), p.name, p.user or UNKNOWN_USER]
                for d in procs:
                    yield from _values(d, labels, p)
    if "gpu_pod_info" in w.on:
        # One pod per series: its own labels, not the GPU's other holders'.
        pod_info = METRICS["gpu_pod_info"]
        for g in gpus:
            for ref in sorted({(g.uuid, r) for r in g.pods} | {(m.uuid, r) for m in g.migs for r in m.pods},
                              key=lambda x: (x[0], x[1].namespace, x[1].pod, x[1].container)):  # fmt: skip
                yield pod_info, [str(g.index), g.uuid, ref[1].namespace, ref[1].pod, ref[1].container, ref[0]], 1.0
    if "gpu_holder_info" in w.on:
        holder_info = METRICS["gpu_holder_info"]
        pod_mode = opts.pod_labels is not None
        for g in live:
            devices: tuple[GpuReading | MigReading, ...] = (g, *g.migs)
            for device in devices:
                if pod_mode:  # each container with what the kubelet and its processes say beyond its name
                    rows = sorted({(pod_holder(r), r.uid, r.claim_namespace, r.claim_name) for r in device.pods})
                else:
                    rows = [(h, "", "", "") for h in device_holders(device, pod_mode, migs=False)]
                for h, *pod_facts in rows:
                    yield holder_info, [str(g.index), g.uuid, *w.holders.detail_values(h), h.kind, device.uuid,
                                        *pod_facts], 1.0  # fmt: skip
    yield from _mig_series(w, live)


def mig_ids(m: MigReading) -> list[str]:
    """A MIG device's own labels: its UUID, GPU and compute instance ids ("" where unknown) and profile."""
    gi = "" if m.gpu_instance_id is None else str(m.gpu_instance_id)
    ci = "" if m.compute_instance_id is None else str(m.compute_instance_id)
    return [m.uuid, gi, ci, m.profile]


def _mig_series(w: _Walk, live: list[GpuReading]) -> Iterator[Series]:
    migs, procs = w.scoped(Scope.MIG), w.scoped(Scope.MIG_PROCESS)
    for g in live:
        for m in g.migs:
            ids = [*w.base(g, m), *mig_ids(m)]
            for d in migs:
                yield from _values(d, ids, m)
            if procs:
                for p in top_processes(m.processes, w.opts.process_top_n):
                    for d in procs:
                        yield from _values(d, [*ids, str(p.pid), p.name, p.user or UNKNOWN_USER], p)


def gpu_families(snapshot: NodeSnapshot, opts: RenderOptions | None = None) -> Iterator[Metric]:
    """The per-GPU metric families of one snapshot, one per declaration rendered (empty where no GPU
    has the metric), in exposition order."""
    opts = opts or RenderOptions()
    fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    for d in gpu_declarations(opts):
        family = CounterMetricFamily if d.type == "counter" else GaugeMetricFamily
        fams[d.name] = family(d.family_name, d.help, labels=labels_of(d, opts))
    for d, labels, value in gpu_series(snapshot, opts):
        fams[d.name].add_metric(labels, value)
    yield from fams.values()


def _gauge_family(name: str) -> GaugeMetricFamily:
    d = METRICS[name]
    return GaugeMetricFamily(d.name, d.help, labels=list(d.series_labels()))


class AlertsCollector(Collector):
    """The rule engine's pending and firing alerts, and the receivers' queues, at render time."""

    def __init__(self, alerts: Callable[[], Iterable[Alert]], queues: Callable[[], Iterable[tuple[str, int]]]) -> None:
        self._alerts = alerts
        self._queues = queues

    def collect(self) -> Iterator[Metric]:
        fam = _gauge_family("gpu_exporter_alerts")
        counts: dict[tuple[str, ...], int] = {}
        for a in self._alerts():
            labels = a.label_dict
            alert_key = (labels["alertname"], a.state, labels["severity"], labels["gpu"], labels.get("uuid", ""))
            counts[alert_key] = counts.get(alert_key, 0) + 1
        for label_values, n in sorted(counts.items()):
            fam.add_metric(list(label_values), n)
        yield fam
        queue = _gauge_family("gpu_exporter_notification_queue_length")
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


class _CountOf(Collector):
    """A counter whose value another part keeps (read at render time)."""

    def __init__(self, name: str, count: Callable[[], int]) -> None:
        self._def = METRICS[name]
        self._count = count

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(self._def.family_name, self._def.help)
        fam.add_metric([], self._count())
        yield fam


class _CountsOf(Collector):
    """A counter or gauge by one label whose values another part keeps (read at render time)."""

    def __init__(self, name: str, counts: Callable[[], Mapping[str, int]]) -> None:
        self._def = METRICS[name]
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily if self._def.type == "counter" else GaugeMetricFamily
        fam = family(self._def.family_name, self._def.help, labels=list(self._def.series_labels()))
        for key, n in sorted(self._counts().items()):
            fam.add_metric([key], n)
        yield fam


_METRIC_TYPES: dict[str, type[Gauge] | type[Counter] | type[Histogram]] = {
    "gauge": Gauge, "counter": Counter, "histogram": Histogram,
}  # fmt: skip


def _declared(name: str, registry: CollectorRegistry, **kwargs: Any) -> Any:
    """The prometheus_client metric of declaration ``name``, registered in ``registry``."""
    d = METRICS[name]
    return _METRIC_TYPES[d.type](d.family_name, d.help, d.series_labels(), registry=registry, **kwargs)


class SelfMetrics:
    """The exporter's own health, in the registry that /metrics renders."""

    def __init__(self, registry: CollectorRegistry, log_lines_dropped: Callable[[], int] = lambda: 0) -> None:
        self._registry = registry
        registry.register(_CountOf("gpu_exporter_log_lines_dropped_total", log_lines_dropped))
        build: Gauge = _declared("gpu_exporter_build_info", registry)
        build.labels(__version__, platform.python_version(), _package_version("nvidia-ml-py")).set(1)
        self.nvml_up: Gauge = _declared("gpu_exporter_nvml_up", registry)
        self.nvml_released: Gauge = _declared("gpu_exporter_nvml_released", registry)
        self.nvml_released.set(0)
        self.poll_duration: Histogram = _declared(
            "gpu_exporter_poll_duration_seconds", registry,
            buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )  # fmt: skip
        self.last_success: Gauge = _declared("gpu_exporter_last_poll_success_timestamp_seconds", registry)
        self.notifications: Counter = _declared("gpu_exporter_notifications_total", registry)
        self.kubelet_refreshes: Counter = _declared("gpu_exporter_kubelet_refreshes_total", registry)
        self.nvml_errors: Counter = _declared("gpu_exporter_nvml_errors_total", registry)
        # Like Prometheus's prometheus_config_*: alert on failures since the last success.
        self.config_reload_failures: Counter = _declared("gpu_exporter_config_reload_failures_total", registry)
        self.config_loaded_at: Gauge = _declared("gpu_exporter_config_last_reload_success_timestamp_seconds", registry)
        self.pod_attribution_expired: Counter | None = None

    def watch_kubelet(self, outcomes: Iterable[str]) -> None:
        """Pod attribution is on: every refresh outcome and the expiry counter exist from the start,
        at 0, so that ``increase()`` sees the first failure."""
        for outcome in outcomes:
            self.kubelet_refreshes.labels(outcome)
        if self.pod_attribution_expired is None:
            self.pod_attribution_expired = _declared("gpu_exporter_pod_attribution_expired_total", self._registry)

    def watch_unattributed(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Pod attribution is on: the kubelet's devices given to no GPU, by reason, from the start."""
        self._registry.register(_CountsOf("gpu_exporter_pod_attribution_unattributed_devices", counts))

    def watch_holders(self, errors: Callable[[], Mapping[str, int]]) -> None:
        """Jobs or containers are attributed: the failed reads of each source on, from the start."""
        self._registry.register(_CountsOf("gpu_exporter_holder_errors_total", errors))

    def watch_receiver(self, receiver: str, outcomes: Iterable[str]) -> None:
        """Every delivery outcome of ``receiver`` exists from the start, at 0."""
        for outcome in outcomes:
            self.notifications.labels(receiver, outcome)

    def forget_receiver(self, receiver: str, outcomes: Iterable[str]) -> None:
        """A receiver removed by a reload: its series end (a receiver added back starts from 0)."""
        for outcome in outcomes:
            with contextlib.suppress(KeyError):
                self.notifications.remove(receiver, outcome)

    def count_attribution_expired(self) -> None:
        if self.pod_attribution_expired is not None:
            self.pod_attribution_expired.inc()

    def count_error(self, function: str, error: str) -> None:
        self.nvml_errors.labels(function, error).inc()

    def count_kubelet(self, outcome: str) -> None:
        self.kubelet_refreshes.labels(outcome).inc()

    def count_notification(self, receiver: str, outcome: str) -> None:
        self.notifications.labels(receiver, outcome).inc()
