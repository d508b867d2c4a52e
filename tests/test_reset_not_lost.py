"""A GPU that needs a reset is not lost, whatever the driver refuses (issue 49, point 5).

A GPU answering NVML_ERROR_RESET_REQUIRED is up and needs a reset (tests/test_recovery_action.py).
Its handle or UUID lookup may also refuse at the next static refresh (nvml.h: the handle lookup
"causes NVML to initialize the target GPU"; the fake's ``lookup_refused``).  Before, that turned it
into a lost GPU: ``gpu_up`` 0, ``GpuLost`` instead of ``GpuResetRequired``, and its identity gone.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_exporter.accounting.states import DOWN, classify
from gpu_exporter.alerting.engine import RuleEngine
from gpu_exporter.once import as_table, findings
from gpu_exporter.settings.config import load_settings
from gpu_exporter.snapshot import NodeSnapshot
from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.poller import Poller
from tests.exporter_helpers import ErrorLog, make_poller, samples_of, value
from tests.fakenvml import Scenario
from tests.fakenvml.presets import gpu_uuid, h100_sxm
from tests.fakenvml.runtime import driver_monotonic, driver_wall_clock

REFRESH_S = 300.0
UUID = gpu_uuid("reset", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def two_gpus(scenario: Scenario) -> None:
    for i in range(2):
        h100_sxm(scenario.add_gpu(), "reset", i, util=90, mem_used=40 * 2**30, power_mw=500_000)
    scenario.write()


def refuse(scenario: Scenario, what: str) -> None:
    """GPU 1 needs a reset, and the driver also refuses its handle, or its UUID, from now on."""
    g = scenario.gpu(1).reset_required()
    if what == "handle":
        g.lookup_refused("RESET_REQUIRED")
    else:
        g.error("uuid", "RESET_REQUIRED")
    scenario.write()


@pytest.mark.parametrize("what", ["handle", "uuid"])
def test_a_gpu_that_needs_a_reset_stays_so_across_static_refreshes(scenario: Scenario, nvml: Any, what: str) -> None:
    two_gpus(scenario)
    clock = Clock()
    errors = ErrorLog()
    backend = NvmlBackend(errors, monotonic=driver_monotonic, wall=driver_wall_clock, slow_interval=0.0)
    poller = Poller(backend, errors=errors, static_refresh_s=REFRESH_S, monotonic=clock, wall_clock=clock)
    engine = RuleEngine(load_settings({"rules": {"GpuLost": {"for": "0s"}, "GpuResetRequired": {"for": "0s"}}}).rules,
                        "n1")  # fmt: skip
    seen: list[NodeSnapshot] = []

    def poll(after_s: float) -> NodeSnapshot:
        clock.now += after_s
        snap = poller.poll()
        engine.evaluate(snap)
        seen.append(snap)
        return snap

    try:
        assert poll(0).gpus[1].uuid == UUID
        refuse(scenario, what)
        poll(15)  # the handle in hand answers RESET_REQUIRED
        for _ in range(3):  # static refreshes ask the driver for the handle and UUID again
            poll(REFRESH_S)
        for snap in seen[1:]:
            g = snap.gpus[1]
            assert (g.index, g.uuid, g.up, g.reset_required) == (1, UUID, True, True)
            assert g.static is not None and g.static.name == "NVIDIA H100 80GB HBM3", "which card to reset"
            assert classify(g, 0.1) == DOWN
        s = samples_of(seen[-1])
        assert value(s, "gpu_up", gpu="1", uuid=UUID) == 1 and value(s, "gpu_reset_required", gpu="1") == 1
        assert {a.label_dict["alertname"] for a in engine.active()} == {"GpuResetRequired"}
        # Reset: the driver answers again, handle, UUID and queries alike.
        scenario.gpu(1).recovered().lookup_refused(None).set("uuid", UUID)
        scenario.write()
        back = poll(15).gpus[1]
        assert (back.up, back.reset_required, back.uuid, back.utilization_ratio) == (True, False, UUID, 0.9)
        assert engine.active() == []
    finally:
        poller.close()


def test_the_fake_refuses_the_lookup_but_not_a_handle_given_out_before(scenario: Scenario, nvml: Any) -> None:
    """The model: nvmlDeviceGetHandleByIndex and ByUUID refuse, an earlier handle still answers."""
    two_gpus(scenario)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    scenario.gpu(1).reset_required().lookup_refused("RESET_REQUIRED")
    scenario.write()
    for lookup, arg in ((nvml.nvmlDeviceGetHandleByIndex, 1), (nvml.nvmlDeviceGetHandleByUUID, UUID)):
        with pytest.raises(nvml.NVMLError) as refused:
            lookup(arg)
        assert refused.value.value == nvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetUUID(handle) == UUID  # its identity, from the probe
    with pytest.raises(nvml.NVMLError) as queried:
        nvml.nvmlDeviceGetUtilizationRates(handle)
    assert queried.value.value == nvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetHandleByIndex(0) is not None
    nvml.nvmlShutdown()


def test_a_gpu_refused_from_the_start_reads_as_needing_a_reset_in_once(scenario: Scenario, nvml: Any) -> None:
    """``--once`` (one poll, nothing read of it before): the handle refused with RESET_REQUIRED is a
    GPU to reset, not a lost one."""
    two_gpus(scenario)
    refuse(scenario, "handle")
    poller, _ = make_poller()
    try:
        snap = poller.poll()
    finally:
        poller.close()
    g = snap.gpus[1]
    assert (g.up, g.reset_required, g.static) == (True, True, None)
    assert [(f.alertname, f.gpu) for f in findings(snap)] == [("GpuResetRequired", 1)]
    table = as_table(snap, findings(snap))
    (row,) = [line for line in table.splitlines() if line.strip().startswith("1 ")]
    assert "RESET REQUIRED" in row and "LOST" not in row
    assert "NOT ANSWERING" not in table and "GPU 1  uuid unknown  RESET REQUIRED" in table
