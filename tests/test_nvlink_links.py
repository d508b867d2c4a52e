"""Issue 48: how many NVLink links a GPU has, 0 included, so that the report tells a card known to
move nothing over NVLink (an L40S, a PCIe H100 without a bridge) from one whose NVLink is unknown.

The fake answers field 91 (NVML_FI_DEV_NVLINK_LINK_COUNT) with ``nvlink.count`` where the scenario
sets it (an L40S's is 0), and NOT_SUPPORTED where the scenario lists no link at all (fakenvml.c)."""

from __future__ import annotations

from typing import Any

from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.poller import Poller
from tests.exporter_helpers import ErrorLog, make_poller, samples_of, value
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm, l40s
from tests.fakenvml.runtime import driver_monotonic, driver_wall_clock

GIB = 2**30


def three_cards(scenario: Scenario) -> None:
    h100_sxm(scenario.add_gpu(), "links", 0, util=50, mem_used=10 * GIB, power_mw=300_000)
    l40s(scenario.add_gpu(), "links", 1)
    # A card whose scenario lists no link: field 91 answers NOT_SUPPORTED, as on a T4.
    bare = l40s(scenario.add_gpu(), "links", 2)
    bare.values = {k: v for k, v in bare.values.items() if not k.startswith("nvlink.")}
    scenario.write()


def test_each_gpu_says_how_many_links_it_has_none_included(scenario: Scenario, nvml: Any) -> None:
    three_cards(scenario)
    poller, _ = make_poller()
    try:
        samples = samples_of(poller.poll())
    finally:
        poller.close()
    assert [value(samples, "gpu_nvlink_links", gpu=str(i)) for i in range(3)] == [18.0, 0.0, 0.0]


def test_without_the_nvlink_collector_the_count_is_unknown_not_zero(scenario: Scenario, nvml: Any) -> None:
    three_cards(scenario)
    errors = ErrorLog()
    backend = NvmlBackend(errors, monotonic=driver_monotonic, wall=driver_wall_clock, slow_interval=0.0,
                          disabled=frozenset({"nvlink"}))  # fmt: skip
    poller = Poller(backend, errors=errors, static_refresh_s=300.0, gpu_timeout_s=10.0)
    try:
        samples = samples_of(poller.poll())
    finally:
        poller.close()
    assert not [n for n, _ in samples if n == "gpu_nvlink_links"]
