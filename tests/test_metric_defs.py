"""The metric declarations (gpu_exporter/metric_defs.py) keep Prometheus's naming conventions, and
everything that lists metrics derives from them: a new declaration needs no second edit."""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

import pytest

from gpu_exporter.metric_defs import (
    COLLECTOR_HELP,
    COLLECTOR_METRICS,
    DEFAULT_POD_LABELS,
    EVERY_HOLDER,
    FIELD_METRICS,
    METRICS,
    NVLINK5_ERRORS,
    NVLINK_DL_ERRORS,
    Collector,
    FieldValue,
    MetricDef,
    Scope,
    gpu_metrics,
    reference_table,
    series_names,
)
from gpu_exporter.serving.metrics import RenderOptions, gpu_families
from gpu_exporter.settings.config import COLLECTORS, CollectorSettings, KubernetesSettings
from gpu_exporter.snapshot import GpuReading, GpuStatic, NodeSnapshot
from gpu_exporter.sources.nvml import reads
from gpu_exporter.sources.nvml.reads import Readers
from tests.exporter_helpers import make_poller, samples_of, value
from tests.fakenvml import Counter, Scenario

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
        per_link = bool(d.fields) and d.fields[0].per_link  # ((link, label), number) pairs
        assert d.scope != Scope.EXPORTER and len(d.labels) <= 1 + per_link, (
            "a reader gives a number or (label, number) pairs"
        )


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
    """An empty reading (a card that supports nothing) gives gpu_up and gpu_info only, and the two
    things known of any GPU that answered: its process count, and that no query asked for a reset."""
    static = GpuStatic(index=0, uuid="GPU-x", name="n", pci_bus_id="b")
    reading = GpuReading(index=0, uuid="GPU-x", up=True, static=static, temperature_celsius=MappingProxyType({}))
    snap = NodeSnapshot(taken_at=0, duration_seconds=0, nvml_up=True, gpus=(reading,))
    with_series = {f.name for f in gpu_families(snap) if f.samples}
    assert with_series == {"gpu_up", "gpu_info", "gpu_processes", "gpu_reset_required"}


# -- field values: one declaration is the read, the collector gate, the conversion and the slot ------------
def readers(disabled: frozenset[str] = frozenset(), version: tuple[int, ...] = (999,)) -> Readers:
    return Readers(clocks="clocks" not in disabled, ecc=True, processes=None, gpm=None, disabled=disabled,
                   driver_version=version)  # fmt: skip


def test_the_poll_asks_exactly_the_declared_field_ids_of_the_collectors_that_are_on() -> None:
    static = GpuStatic(index=0, uuid="GPU-x", name="n", pci_bus_id="b")
    declared = {(f.field_id, 0) for d in FIELD_METRICS for f in d.fields if not f.per_link}
    clocks = {(f.field_id, 0) for d in FIELD_METRICS if d.collector == Collector.CLOCKS for f in d.fields}
    assert {(74, 0), (79, 0), (269, 0), (271, 0)} <= clocks
    on = reads._wanted_fields(static, readers())
    off = reads._wanted_fields(static, readers(frozenset({"clocks"})))
    assert len(on) == len(set(on)), "a field asked twice"
    assert set(on) & declared == declared
    assert set(off) & declared == declared - clocks
    assert set(on) - declared == set(off) - declared  # the rest (memory temperature, PCIe, NVLink) as before
    # An id that means something else before the declared driver version is not asked there.
    old = reads._wanted_fields(static, readers(version=(580, 65, 6)))
    assert {(269, 0), (270, 0), (271, 0)}.isdisjoint(old) and (74, 0) in old
    assert {(269, 0), (270, 0), (271, 0)}.isdisjoint(reads._wanted_fields(static, readers(version=())))
    # Each value with its metric, label and scale: the perf-policy counters are ns, read as seconds.
    assert (("gpu_violation_seconds_total", 75, 1e-9, "thermal")) in readers().fields(None)


def test_c2c_is_asked_of_hopper_and_newer_and_of_an_unknown_architecture_only() -> None:
    """NVLink-C2C came with Grace Hopper: an Ampere or Ada is not asked 231-233 (its driver answers
    INVALID_ARGUMENT, which would count as an NVML error at every static refresh); a Hopper, a
    Blackwell and a GPU whose architecture is unknown are, from driver 575 on."""
    c2c = {(231, 0), (232, 0), (233, 0)}

    def asked(arch: int | None, version: tuple[int, ...] = (999,)) -> bool:
        static = GpuStatic(index=0, uuid="GPU-x", name="n", pci_bus_id="b", architecture=arch)
        wanted = set(reads._wanted_fields(static, readers(version=version)))
        assert wanted & c2c in (set(), c2c)
        return c2c <= wanted

    assert [asked(a) for a in (7, 8, 9, 10, None)] == [False, False, True, True, True]
    assert not asked(9, (570, 172)) and asked(9, (575, 51))
    assert not asked(9, ()), "a driver whose version is unknown is asked no id it may not have"
    hopper = GpuStatic(index=0, uuid="GPU-x", name="n", pci_bus_id="b", architecture=9)
    assert c2c.isdisjoint(reads._wanted_fields(hopper, readers(frozenset({"nvlink"})))), "NVLink collector off"


def test_per_link_fields_are_asked_for_every_link_of_their_generation_only() -> None:
    """A Hopper's links are asked 161-163, a Blackwell's NVLink 5's counters and byte counters, one
    whose architecture is unknown both; a GPU without links, none; NVLink off, none."""
    dl = {fid for fid, _ in NVLINK_DL_ERRORS}
    nv5 = {fid for fid, _ in NVLINK5_ERRORS} | {202, 204}

    def asked(arch: int | None, links: int = 18, **kw: Any) -> dict[int, set[int]]:
        static = GpuStatic(index=0, uuid="GPU-x", name="n", pci_bus_id="b", nvlink_count=links, architecture=arch)
        out: dict[int, set[int]] = {}
        r = readers(**kw)  # the byte counters every poll, the error counters at the slow cadence
        for fid, scope in reads._wanted_fields(static, r) + reads._wanted_link_fields(static, r):
            if fid in dl | nv5:
                out.setdefault(fid, set()).add(scope)
        return out

    assert asked(9) == {fid: set(range(18)) for fid in dl}
    assert asked(10) == {fid: set(range(18)) for fid in nv5}
    assert asked(None).keys() == dl | nv5
    assert asked(10, version=(555,)) == {}  # NVLink 5's ids are in the nvml.h of 560 and later
    assert asked(9, links=0) == {} and asked(9, disabled=frozenset({"nvlink"})) == {}


def test_a_field_value_declaration_reads_its_slot_and_leaves_out_what_is_not_there() -> None:
    d = MetricDef("gpu_test_seconds_total", "counter", "seconds", "Test.", labels=("why",),
                  fields=(FieldValue(300, 1e-9, "a"), FieldValue(301, 1e-9, "b")))  # fmt: skip
    assert d.value is not None
    g = GpuReading(
        index=0, uuid="GPU-x", up=True, field_values=MappingProxyType({(d.name, "b"): 2.0, ("other", "a"): 1.0})
    )
    assert list(d.value(g)) == [("b", 2.0)]  # type: ignore[arg-type]
    plain = MetricDef("gpu_test_bytes", "gauge", "bytes", "Test.", fields=(FieldValue(302),))
    assert plain.value is not None and plain.value(g) is None
    assert (
        plain.value(GpuReading(index=0, uuid="x", up=True, field_values=MappingProxyType({(plain.name, ""): 4.0})))
        == 4.0
    )
    with pytest.raises(ValueError, match="per GPU"):
        MetricDef("gpu_test_bytes", "gauge", "bytes", "Test.", fields=(FieldValue(302, label="x"),))  # no label named
    with pytest.raises(ValueError, match="per GPU"):
        MetricDef("gpu_test_bytes", "gauge", "bytes", "Test.", fields=(FieldValue(302),), value=lambda g: 1)


def test_a_new_field_value_declaration_alone_is_read_from_the_driver_and_rendered(
    scenario: Scenario, nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One MetricDef with ``fields`` (here the energy counter, field 83, in mJ): asked for in the poll's
    one nvmlDeviceGetFieldValues call, scaled to joules, and on /metrics, with no other edit."""
    import gpu_exporter.metric_defs as defs

    new = MetricDef("gpu_test_energy_joules_total", "counter", "joules", "Energy, again.",
                    fields=(FieldValue(83, 1e-3),), collector=Collector.CLOCKS)  # fmt: skip
    monkeypatch.setattr(defs, "_DEFS", (*defs._DEFS, new))
    monkeypatch.setattr(reads, "FIELD_METRICS", (*FIELD_METRICS, new))
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-e")
    g.energy(Counter(123_456, 0)).memory(80 * 2**30, 2**30)
    scenario.write()
    poller, _ = make_poller()
    assert value(samples_of(poller.poll()), "gpu_test_energy_joules_total") == pytest.approx(123.456)
    poller.close()


def test_a_configured_label_name_may_not_take_a_label_of_any_declaration() -> None:
    """``namespace_label: policy`` would give violation series two policy labels and lose the namespace."""
    own = {label for d in METRICS.values() for label in d.series_labels(EVERY_HOLDER)} - set(DEFAULT_POD_LABELS)
    assert "policy" in own
    for label in sorted(own):
        with pytest.raises(ValueError, match="already used"):
            KubernetesSettings(namespace_label=label)
    assert KubernetesSettings(namespace_label="k8s_namespace").namespace_label == "k8s_namespace"
