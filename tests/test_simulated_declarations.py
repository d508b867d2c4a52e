"""Issue 34: ``--simulate`` is held to the declarations, as the fake NVML library is
(test_exporter_metrics.test_metric_table_covers_every_emitted_name).  A node with one simulated GPU
of each profile shows every metric ``metric_defs`` declares that a poll's snapshot gives, so that a
newcomer trying the dashboards on it finds no empty panel; a declaration added without teaching the
simulator fails here.  Polled through the daemon's Poller on an injected clock: no process, no wait."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import pairwise

import pytest
from prometheus_client.core import Metric

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.accounting.pricing import PriceBook
from gpu_exporter.accounting.settings import PricingSettings
from gpu_exporter.metric_defs import C2C_ERRORS, FIELD_METRICS, METRICS, MetricDef, Scope, series_names
from gpu_exporter.serving.accounting_metrics import accounting_families
from gpu_exporter.serving.metrics import gpu_families
from gpu_exporter.snapshot import NodeSnapshot
from gpu_exporter.sources.poller import Poller
from gpu_exporter.sources.simulated import LOST_PERIOD_SECONDS, POLICY_REASONS, PROFILES, SimulatedBackend

STEP = 30.0
# Two periods of the "lost" GPU: it reports its XID, falls off the bus and comes back, twice.
POLLS = int(2 * LOST_PERIOD_SECONDS // STEP)

# Declared metrics no simulated node has, and why; the test below checks each reason still holds.
# (The exporter's own health, scope EXPORTER, is the daemon's, not the backend's: not asked of it.)
NEEDS_PODS = {"gpu_pod_info": "exists only with pod attribution on: the kubelet's PodResources API"}
# NVLink-C2C joins a Grace CPU to its GPU (GH200, GB200): the simulated cards (an HGX H100, an L40S, an
# RTX 6000) have none, as the real ones have not, and their drivers answer its counters NOT_SUPPORTED.
NEEDS_GRACE = {"gpu_c2c_errors_total": "exists only on a GPU joined to a Grace CPU by NVLink-C2C"}
LEFT_OUT = NEEDS_PODS.keys() | NEEDS_GRACE.keys()

Sample = tuple[str, tuple[tuple[str, str], ...]]


class FakeClock:
    """Monotonic and wall clock at once, moved only by the test."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def polls() -> list[NodeSnapshot]:
    """A node with one GPU of each profile, polled every 30 s for two lost periods."""
    clock = FakeClock()
    backend = SimulatedBackend(len(PROFILES), clock=clock, node="sim")
    poller = Poller(backend, errors=lambda function, error: None, wall_clock=clock, monotonic=clock)
    out = []
    try:
        for _ in range(POLLS):
            out.append(poller.poll())
            clock.now += STEP
    finally:
        poller.close()
    assert all(s.nvml_up for s in out)
    return out


def families(snapshots: Iterable[NodeSnapshot]) -> Iterator[list[Metric]]:
    """What /metrics renders from each snapshot: the per-GPU families, and the books kept since the
    first one, priced (the price series exist only where prices are configured)."""
    books = Accountant(threshold=0.1, prices=PriceBook(PricingSettings(currency="USD", default=2.5,
                                                                      energy_per_kwh=0.12)))  # fmt: skip
    for s in snapshots:
        books.observe(s)
        yield [*gpu_families(s), *accounting_families(books.view())]


def samples(fams: list[Metric]) -> dict[Sample, float]:
    return {(x.name, tuple(sorted(x.labels.items()))): x.value for fam in fams for x in fam.samples}


def emitted(snapshots: list[NodeSnapshot]) -> set[str]:
    """The declared metrics with at least one series in any poll (an undeclared series is a KeyError)."""
    names = series_names()
    return {names[name] for fams in families(snapshots) for name, _ in samples(fams)}


def not_simulated(declared: Mapping[str, MetricDef], shown: set[str]) -> set[str]:
    """The declared metrics of a GPU that the simulated node did not show, but those it cannot."""
    return {n for n, d in declared.items() if d.scope != Scope.EXPORTER} - LEFT_OUT - shown


def test_a_simulated_node_shows_every_declared_metric(polls: list[NodeSnapshot]) -> None:
    shown = emitted(polls)
    assert not_simulated(METRICS, shown) == set()
    assert shown.isdisjoint(LEFT_OUT)


def test_a_declaration_the_simulator_does_not_produce_is_caught(polls: list[NodeSnapshot]) -> None:
    """Someone declares a metric and does not teach the simulator: the check above names it."""
    new = MetricDef("gpu_test_widgets_ratio", "gauge", "ratio", "Widgets.", value=lambda g: None)
    assert not_simulated({**METRICS, new.name: new}, emitted(polls)) == {new.name}


def test_each_metric_left_out_is_declared_and_needs_what_a_simulated_node_lacks() -> None:
    for name in NEEDS_PODS:
        assert name in METRICS, f"{name} is declared no more: drop it from NEEDS_PODS"
        assert METRICS[name].pods, f"{name} no longer needs pod attribution: the simulator must show it"
    # Every metric that exists only with pod attribution is left out for that reason, and only those.
    assert NEEDS_PODS.keys() == {n for n, d in METRICS.items() if d.pods}
    # Those left out for want of Grace read NVLink-C2C's field ids and nothing else, and no simulated
    # card is a Grace one.
    for name in NEEDS_GRACE:
        assert {f.field_id for f in METRICS[name].fields} == {fid for fid, _ in C2C_ERRORS}, name
    sim = SimulatedBackend(len(PROFILES), node="sim")
    names = {sim.read_static(i).name for i in range(sim.gpu_count)}
    assert names and not [n for n in names if "GH200" in n or "GB200" in n], names


def test_every_declared_field_value_is_on_every_gpu(polls: list[NodeSnapshot]) -> None:
    """Each (metric, label) a field-value declaration names, on every simulated GPU that answers: the
    simulated driver (580.82) has every declared id, and the simulated cards report them all."""
    device_wide = (d for d in FIELD_METRICS if d.name not in NEEDS_GRACE)
    declared = {(d.name, f.label) for d in device_wide for f in d.fields if not f.per_link}
    assert {("gpu_violation_seconds_total", "power"), ("gpu_clock_event_seconds_total", "hw_thermal")} <= declared
    # Per link, those of the GPU's NVLink generation (the simulated H100s are Hopper: 161-163).
    hopper = {(d.name, f.label) for d in FIELD_METRICS for f in d.fields if f.per_link and f.arch_from <= 9}
    assert ("gpu_nvlink_errors_total", "crc") in hopper
    for s in polls:
        for g in s.gpus:
            assert not g.up or set(g.field_values) == declared, g.index
            if g.up and g.static is not None:
                per_link = {(name, key[1]) for name, m in g.link_field_values.items() for key in m}
                links = {key[0] for m in g.link_field_values.values() for key in m}
                assert per_link == (hopper if g.static.nvlink_count else set()), g.index
                assert links == {str(n) for n in range(g.static.nvlink_count)}, g.index


def test_the_policies_the_simulator_models_are_declared() -> None:
    """The simulator's table of which clock event reason runs which perf-policy counter names only
    policies a declaration has (a policy renamed there would silently stop moving here)."""
    policies = {f.label for f in METRICS["gpu_violation_seconds_total"].fields}
    assert set(POLICY_REASONS) <= policies


def test_counters_never_decrease_across_polls(polls: list[NodeSnapshot]) -> None:
    """Every series of every declared counter, across consecutive polls: it only grows, whatever the
    GPU does in between (lost, its MIG instances' processes come and go)."""
    counters = {n for n, d in METRICS.items() if d.type == "counter"}
    names = series_names()
    checked: set[str] = set()
    rendered = [samples(fams) for fams in families(polls)]
    for before, after in pairwise(rendered):
        for key, value in before.items():
            metric = names[key[0]]
            if metric in counters and key in after:
                assert after[key] >= value, key
                checked.add(metric)
    assert checked == {n for n in counters if METRICS[n].scope != Scope.EXPORTER} - LEFT_OUT, "a counter never compared"
