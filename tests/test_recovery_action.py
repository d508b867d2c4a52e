"""Issue 36: the driver's own verdict on each GPU, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230).

Through the real bindings on the fake driver: a GPU whose driver asks for a reset has
``gpu_recovery_action 1`` on /metrics and a critical GpuRecoveryRequired that says to reset it; a
healthy one reads 0; a card that does not report it, or a driver whose nvml.h has no field 230
(R550), has no series at all (never a 0 it cannot mean) and no alert.
"""

from __future__ import annotations

from typing import Any

from gpu_exporter.once import findings
from tests import assert_mentions
from tests.exporter_helpers import make_poller, samples_of, value
from tests.fakenvml import NOT_SUPPORTED, Err, Scenario
from tests.fakenvml.presets import h100_sxm


def node(scenario: Scenario, branch: int) -> None:
    scenario.driver(branch)
    codes: tuple[int | Err, ...] = (1, 0, NOT_SUPPORTED, 4)
    for i, code in enumerate(codes):
        h100_sxm(scenario.add_gpu(), "verdict", i, util=90, mem_used=40 * 2**30, power_mw=500_000).recovery_action(code)
    scenario.write()


def test_the_driver_s_recovery_action_is_a_series_and_a_critical_alert_that_says_what_to_do(
    scenario: Scenario, nvml: Any
) -> None:
    node(scenario, 580)
    poller, errors = make_poller()
    try:
        snap = poller.poll()
    finally:
        poller.close()
    samples = samples_of(snap)
    assert [value(samples, "gpu_recovery_action", gpu=str(i)) for i in range(4)] == [1.0, 0.0, None, 4.0]
    found = {f.gpu: f for f in findings(snap) if f.alertname == "GpuRecoveryRequired"}
    assert found.keys() == {0, 3} and {f.severity for f in found.values()} == {"critical"}
    assert_mentions(found[0].summary, "GPU 0", "reset the GPU", "nvidia-smi -r")
    assert_mentions(found[3].summary, "GPU 3", "drain", "then reset the GPU")
    assert found[0].value == 1.0 and found[3].value == 4.0
    assert not [k for k in errors.counts if "FieldValues" in k[0] and k[1] != "not_supported"]


def test_a_driver_without_field_230_is_not_asked_and_has_no_series(scenario: Scenario, nvml: Any) -> None:
    node(scenario, 550)  # R550's nvml.h ends at 228: the id means nothing there
    poller, _ = make_poller()
    try:
        snap = poller.poll()
    finally:
        poller.close()
    assert all(("gpu_recovery_action", "") not in g.field_values for g in snap.gpus)
    assert not any(n == "gpu_recovery_action" for n, _ in samples_of(snap))
    assert [f for f in findings(snap) if f.alertname == "GpuRecoveryRequired"] == []
