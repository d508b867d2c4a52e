"""The accounting's books as metric families: GPU time by state and holder, memory peaks, last
activity and prices (see :mod:`gpu_exporter.accounting`).

Series carry ``gpu``, ``uuid`` and the holder labels that are on (pods, jobs, containers), like
every per-GPU series.  ``gpu_state_seconds_total`` is the exception that proves it: one series per
holder, with every label of that holder's kind (a job's user, account and partition; a container's
engine, ID and name; a user), where the other series join a shared GPU's holders with commas; and,
on a GPU in MIG mode, one per GPU instance (``gpu_instance_id``; empty for a whole GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..accounting.ledger import AccountingView, GpuAccount
from ..metric_defs import METRICS
from .metrics import RenderOptions


def accounting_families(view: AccountingView, opts: RenderOptions | None = None) -> Iterator[Metric]:
    holders = (opts or RenderOptions()).holders

    def base(a: GpuAccount) -> list[str]:
        return [str(a.index), a.uuid, *holders.values(a.pods, a.jobs, a.containers)]

    def gauge(name: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, METRICS[name].help, labels=list(METRICS[name].series_labels(holders)))

    d = METRICS["gpu_state_seconds_total"]
    seconds = CounterMetricFamily(d.family_name, d.help, labels=list(d.series_labels(holders)))
    last_active = gauge("gpu_last_active_timestamp_seconds")
    peak = gauge("gpu_memory_used_max_bytes")
    price = gauge("gpu_price_per_hour")
    energy = gauge("gpu_energy_price_per_kwh")
    currency = view.currency or ""
    for a in view.gpus:
        for holder, state, value in a.seconds:
            seconds.add_metric([str(a.index), a.uuid, *holders.detail_values(holder), "", state], value)
        for instance, holder, state, value in a.instance_seconds:
            seconds.add_metric([str(a.index), a.uuid, *holders.detail_values(holder), instance, state], value)
        if a.last_active is not None:
            last_active.add_metric(base(a), a.last_active)
        if a.memory_peak_bytes is not None:
            peak.add_metric(base(a), a.memory_peak_bytes)
        if a.price_per_hour is not None:
            price.add_metric([*base(a), currency], a.price_per_hour)
        if a.energy_price_per_kwh is not None:
            energy.add_metric([*base(a), currency], a.energy_price_per_kwh)
    yield from (seconds, last_active, peak, price, energy)


class AccountingCollector(Collector):
    """The accountant's latest view, at render time; it never touches NVML."""

    def __init__(self, view: Callable[[], AccountingView | None], opts: RenderOptions | None = None) -> None:
        self._view = view
        self.opts = opts

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        if view is not None:
            yield from accounting_families(view, self.opts)
