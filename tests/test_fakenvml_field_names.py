"""Issue 34: the fake's field-value names and the declarations' are one table.

The fake models the driver from nvml.h (fakenvml.c: which scenario key each field id serves, in the
header's id order); the scenario builders take their policy and reason names from the declarations
(tests/fakenvml/values.py).  This holds the two together by field id: the key a declaration's label
names is the one the fake serves at that declaration's id, so a label moved to another id (or an id
mistyped) in either place fails here, not as a wrong label somewhere in a metrics test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_exporter.metric_defs import CLOCK_EVENT_REASONS, FIELD_METRICS
from gpu_exporter.sources.nvml.reads import Readers
from tests.fakenvml import Gpu, Scenario
from tests.fakenvml.values import NVML_CLOCK_EVENT_REASONS

# The builder that writes each labelled field-value metric's keys, by label.
BUILDERS: dict[str, Callable[..., Gpu]] = {
    "gpu_violation_seconds_total": Gpu.violations,
    "gpu_clock_event_seconds_total": Gpu.clock_event_counters,
    "gpu_c2c_errors_total": Gpu.c2c,
}


def test_every_labelled_field_metric_has_a_builder() -> None:
    assert BUILDERS.keys() == {d.name for d in FIELD_METRICS if d.fields[0].label and not d.fields[0].per_link}


def test_the_fake_serves_each_declared_label_at_its_declared_field_id(scenario: Scenario, nvml: Any) -> None:
    scenario.driver(580).driver_branch = 580  # the clock event reason counters (269-271) exist from R580
    g = scenario.add_gpu().identity("NVIDIA GH200 480GB", "GPU-f")  # a Grace Hopper: C2C's counters too
    expected: dict[int, int] = {}
    for d in FIELD_METRICS:
        if d.name in BUILDERS:
            # A value of its own for every field, so that two labels swapped show as two wrong values.
            values = {f.label: 1_000_000 * (f.field_id + 1) for f in d.fields}
            BUILDERS[d.name](g, **values)
            expected |= {f.field_id: values[f.label] for f in d.fields}
    scenario.write()
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        got = nvml.nvmlDeviceGetFieldValues(handle, list(expected))
        assert {fid: (v.nvmlReturn, v.value.ullVal) for fid, v in zip(expected, got, strict=True)} == {
            fid: (nvml.NVML_SUCCESS, value) for fid, value in expected.items()
        }
    finally:
        nvml.nvmlShutdown()


# -- clock event reasons: the declaration's bits against NVIDIA's nvml.h ---------------------------
def test_each_declared_clock_event_reason_is_nvml_h_s_bit_and_every_bit_of_nvml_h_is_declared() -> None:
    """The declaration's bits (what the poller tests) are the header's (what the fake's scenarios
    set); a reason nvml.h adds (BoardLimit and Reliability came in 13.615) shows here, not as a
    throttled GPU that the exporter says is running free."""
    header = {name: bit for name, bit in NVML_CLOCK_EVENT_REASONS.items() if bit}  # "None" is no reason
    assert {r.nvml_name: r.bit for r in CLOCK_EVENT_REASONS.values()} == header
    assert {"BoardLimit", "Reliability", "HwPowerBrakeSlowdown"} <= header.keys()


def test_a_driver_before_a_reason_s_nvml_h_has_no_series_for_it() -> None:
    old = {name for name, _ in Readers(False, False, None, None, driver_version=(580, 82)).clock_event_reasons}
    new = {name for name, _ in Readers(False, False, None, None, driver_version=(615, 0)).clock_event_reasons}
    assert new == set(CLOCK_EVENT_REASONS) and new - old == {"board_limit", "reliability"}
    unknown = {name for name, _ in Readers(False, False, None, None).clock_event_reasons}  # version unknown
    assert unknown == old
