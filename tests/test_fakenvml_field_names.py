"""Issue 34: the fake's field-value names and the declarations' are one table.

The fake models the driver from nvml.h (fakenvml.c: which scenario key each field id serves, in the
header's id order); the scenario builders take their policy and reason names from the declarations
(tests/fakenvml/values.py).  This holds the two together by field id: the key a declaration's label
names is the one the fake serves at that declaration's id, so a label moved to another id (or an id
mistyped) in either place fails here, not as a wrong label somewhere in a metrics test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_exporter.metric_defs import FIELD_METRICS
from tests.fakenvml import Gpu, Scenario

# The builder that writes each labelled field-value metric's keys, by label.
BUILDERS: dict[str, Callable[..., Gpu]] = {
    "gpu_violation_seconds_total": Gpu.violations,
    "gpu_clock_event_seconds_total": Gpu.clock_event_counters,
}


def test_every_labelled_field_metric_has_a_builder() -> None:
    assert BUILDERS.keys() == {d.name for d in FIELD_METRICS if d.fields[0].label}


def test_the_fake_serves_each_declared_label_at_its_declared_field_id(scenario: Scenario, nvml: Any) -> None:
    scenario.driver(580).driver_branch = 580  # the clock event reason counters (269-271) exist from R580
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-f")
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
