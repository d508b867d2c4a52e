"""The metric declarations (gpu_exporter/metric_defs.py) keep Prometheus's naming conventions, and
everything that lists metrics derives from them: a new declaration needs no second edit."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from gpu_exporter.config import COLLECTORS, CollectorSettings
from gpu_exporter.metric_defs import (
    COLLECTOR_HELP,
    COLLECTOR_METRICS,
    METRICS,
    Collector,
    MetricDef,
    Scope,
    gpu_metrics,
    reference_table,
    series_names,
)
from gpu_exporter.serving.metrics import RenderOptions, gpu_families
from gpu_exporter.snapshot import GpuReading, GpuStatic, NodeSnapshot

# Units as Prometheus names them (https://prometheus.io/docs/practices/naming/#base-units).
UNITS = {"ratio", "bytes", "celsius", "watts", "joules", "hertz", "seconds", "bytes_per_second"}
NAME = re.compile(r"[a-z_][a-z0-9_]*")


@pytest.mark.parametrize("d", METRICS.values(), ids=list(METRICS))
def test_a_declaration_follows_the_naming_conventions(d: MetricDef) -> None:
    assert NAME.fullmatch(d.name) and d.name.startswith("gpu_")
    assert d.name.endswith("_total") == (d.type == "counter"), "counters, and only counters, end in _total"
    stem = d.name.removesuffix("_total")
    if d.unit:
        assert d.unit in UNITS, f"{d.unit} is not a base unit"
        assert stem.endswith("_" + d.unit), f"{d.name} does not end with its unit {d.unit}"
    else:
        assert not any(stem.endswith("_" + u) for u in UNITS), f"{d.name} names a unit its declaration lacks"
    assert d.help.endswith(".") and "\n" not in d.help
    labels = d.series_labels(("namespace", "pod", "container"))
    assert len(set(labels)) == len(labels), f"{d.name}: a label twice in {labels}"
    assert all(NAME.fullmatch(label) and not label.startswith("__") for label in labels)
    if d.type == "histogram":
        assert d.scope == Scope.EXPORTER, "per-GPU histograms would multiply series by buckets"
    if d.value is not None:
        assert d.scope != Scope.EXPORTER and len(d.labels) <= 1, "a reader gives a number or (label, number) pairs"


def test_every_collector_is_declared_with_its_help_and_switch() -> None:
    assert set(COLLECTOR_HELP) == set(Collector)
    assert tuple(c.value for c in Collector) == COLLECTORS
    for c in Collector:
        assert COLLECTOR_METRICS[c.value], f"collector {c} has no metric"
        assert CollectorSettings.model_fields[c.value].description == COLLECTOR_HELP[c]


def test_a_collector_left_out_takes_exactly_its_declared_metrics() -> None:
    off = RenderOptions(disabled=frozenset({"clocks", "ecc"}))
    assert off.left_out == {d.name for d in METRICS.values() if d.collector in (Collector.CLOCKS, Collector.ECC)}


def test_histograms_have_their_three_series_names() -> None:
    names = series_names()
    assert names["gpu_exporter_poll_duration_seconds_bucket"] == "gpu_exporter_poll_duration_seconds"
    assert set(names.values()) == set(METRICS)


def test_the_reference_table_has_a_row_per_declaration_with_its_unit_labels_and_collector() -> None:
    rows = reference_table().splitlines()[2:]
    assert len(rows) == len(METRICS)
    row = next(r for r in rows if r.startswith("| `gpu_clock_hertz` |"))
    assert row.startswith("| `gpu_clock_hertz` | gauge | hertz | `gpu`, `uuid`, `clock` | clocks | Current clock")
    pod_info = next(r for r in rows if r.startswith("| `gpu_pod_info` |"))
    assert "`gpu`, `uuid`, `namespace`, `pod`, `container`, `device_uuid`" in pod_info


def test_a_declaration_is_all_it_takes_to_render_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new per-GPU declaration appears in /metrics's families (and so in --once's JSON) with its help,
    and a None value is left out, never written as 0."""
    import gpu_exporter.metric_defs as defs

    new = MetricDef("gpu_test_widgets_bytes", "gauge", "bytes", "Widgets, in bytes.", labels=("widget",),
                    value=lambda g: [("a", 3), ("b", None)])  # fmt: skip
    monkeypatch.setattr(defs, "_DEFS", (*defs._DEFS, new))
    static = GpuStatic(index=0, uuid="GPU-x", name="n", pci_bus_id="b")
    snap = NodeSnapshot(taken_at=0, duration_seconds=0, nvml_up=True,
                        gpus=(GpuReading(index=0, uuid="GPU-x", up=True, static=static),))  # fmt: skip
    fams = {f.name: f for f in gpu_families(snap)}
    fam = fams["gpu_test_widgets_bytes"]
    assert fam.documentation == "Widgets, in bytes."
    assert [(s.labels, s.value) for s in fam.samples] == [({"gpu": "0", "uuid": "GPU-x", "widget": "a"}, 3.0)]
    assert new in gpu_metrics(Scope.GPU)


def test_unsupported_values_render_no_series() -> None:
    """An empty reading (a card that supports nothing) gives gpu_up and gpu_info only."""
    static = GpuStatic(index=0, uuid="GPU-x", name="n", pci_bus_id="b")
    reading = GpuReading(index=0, uuid="GPU-x", up=True, static=static, temperature_celsius=MappingProxyType({}))
    snap = NodeSnapshot(taken_at=0, duration_seconds=0, nvml_up=True, gpus=(reading,))
    with_series = {f.name for f in gpu_families(snap) if f.samples}
    assert with_series == {"gpu_up", "gpu_info", "gpu_processes"}  # no processes is a count of 0, not unknown
