"""Issue 36: the driver's own verdict on each GPU, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230),
and a GPU that answers NVML_ERROR_RESET_REQUIRED, which is up but unusable until it is reset.

Through the real bindings on the fake driver: a GPU whose driver asks for a reset has
``gpu_recovery_action 1`` on /metrics and a critical GpuRecoveryRequired that says to reset it; a
healthy one reads 0; a card that does not report it, or a driver whose nvml.h has no field 230
(R550), has no series at all (never a 0 it cannot mean) and no alert.
"""

from __future__ import annotations

from typing import Any

from gpu_exporter.accounting.states import classify
from gpu_exporter.once import as_table, findings
from gpu_exporter.snapshot import NodeSnapshot
from tests import assert_mentions
from tests.exporter_helpers import ErrorLog, make_poller, samples_of, value
from tests.fakenvml import NOT_SUPPORTED, Err, Scenario
from tests.fakenvml.presets import h100_sxm


def one_poll() -> tuple[NodeSnapshot, ErrorLog]:
    """One poll of the scenario as written, on a poller of its own."""
    poller, errors = make_poller()
    try:
        return poller.poll(), errors
    finally:
        poller.close()


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
    snap, errors = one_poll()
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
    snap, _ = one_poll()
    assert all(("gpu_recovery_action", "") not in g.field_values for g in snap.gpus)
    assert not any(n == "gpu_recovery_action" for n, _ in samples_of(snap))
    assert [f for f in findings(snap) if f.alertname == "GpuRecoveryRequired"] == []


def test_a_gpu_that_answers_reset_required_is_up_says_so_and_alerts_as_such(scenario: Scenario, nvml: Any) -> None:
    """NVML_ERROR_RESET_REQUIRED is its own state: the GPU is there (its identity answers) but the
    driver will not use it; not a lost GPU, and not a GPU whose values merely went missing."""
    for i in range(2):
        h100_sxm(scenario.add_gpu(), "reset", i, util=90, mem_used=40 * 2**30, power_mw=500_000)
    scenario.gpu(1).reset_required()
    scenario.write()
    snap, errors = one_poll()
    healthy, broken = snap.gpus
    assert healthy.up and not healthy.reset_required
    assert broken.up and broken.reset_required and broken.uuid and broken.utilization_ratio is None
    samples = samples_of(snap)
    assert value(samples, "gpu_reset_required", gpu="0") == 0 and value(samples, "gpu_reset_required", gpu="1") == 1
    assert value(samples, "gpu_up", gpu="1") == 1
    assert value(samples, "gpu_info", gpu="1") == 1  # still named: which card to reset
    # Nobody can use it: the books count it down, not idle and free to take.
    assert (classify(healthy, 0.1), classify(broken, 0.1)) == ("busy", "down")
    assert errors.counts[("nvmlDeviceGetUtilizationRates", "reset_required")] == 1
    found = [f for f in findings(snap) if f.gpu == 1]
    assert [(f.alertname, f.severity) for f in found] == [("GpuResetRequired", "critical")]
    assert_mentions(found[0].summary, "GPU 1", "reset", "nvidia-smi -r")
    assert_mentions(found[0].description, "RESET_REQUIRED", broken.uuid)
    # Once reset, it answers again and the reading says so.
    scenario.gpu(1).values.pop("state")
    scenario.write()
    again, _ = one_poll()
    assert not again.gpus[1].reset_required and again.gpus[1].utilization_ratio == 0.9


def test_the_once_table_shows_a_gpu_that_needs_a_reset_as_such(scenario: Scenario, nvml: Any) -> None:
    h100_sxm(scenario.add_gpu(), "reset", 0, util=90, mem_used=40 * 2**30, power_mw=500_000).reset_required()
    scenario.write()
    snap, _ = one_poll()
    table = as_table(snap, findings(snap))
    (row,) = [line for line in table.splitlines() if line.strip().startswith("0 ")]
    assert_mentions(row, "NVIDIA H100", "RESET REQUIRED")
    assert "GpuResetRequired (critical) on GPU 0" in table
    assert "RESET REQUIRED: the driver answers NVML_ERROR_RESET_REQUIRED" in table
