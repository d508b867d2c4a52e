"""XID events when a GPU falls off the bus, and across an NVML restart that renumbers the GPUs.

nvml.h: nvmlEventSetWait_v2 returns NVML_ERROR_GPU_IS_LOST "if a GPU has fallen off the bus or is
otherwise inaccessible"; the fake's ``events_wait_lost`` quirk answers so.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpu_exporter.sources.nvml import NvmlBackend, xid
from gpu_exporter.sources.poller import Poller
from tests.exporter_helpers import ErrorLog, make_poller, samples_of, value, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.runtime import call_count

UUIDS = [f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(3)]


class Monotonic:
    """The poller's monotonic clock, which the test moves on past a backoff instead of sleeping."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def xids_by_uuid(poller: Any) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for (n, ls), v in samples_of(poller.poll()).items():
        if n == "gpu_xid_errors_total":
            labels = dict(ls)
            out.setdefault(labels["uuid"], {})[labels["xid"]] = v
    return out


def test_xids_of_the_healthy_gpus_are_counted_after_one_falls_off_the_bus(
    scenario: Scenario, nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xid, "PAUSE_S", 0.01)  # after GPU 1's wait says "lost", before its set is tried again
    for uuid in UUIDS:
        scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", uuid).utilization(50, 5).events_wait_lost()
    scenario.write()
    poller, errors = make_poller()
    poller.poll()
    scenario.gpu(1).lost()
    scenario.gpu(0).add_xid(48)
    scenario.gpu(2).add_xid(63)
    scenario.write()
    wait_for(lambda: xids_by_uuid(poller) == {UUIDS[0]: {"48": 1}, UUIDS[2]: {"63": 1}}, what="the healthy GPUs' XIDs")
    # The healthy GPUs' XIDs of the very moment GPU 1 fell off the bus are counted: their own sets
    # never closed (one set for all, built again without the lost GPU, lost them in the gap).  The
    # loss is said once, not at every wait (ten or more of them here: the fake counts a call each
    # time a wait looks at its GPUs, twice or more a wait).
    waits = call_count("nvmlEventSetWait")
    wait_for(lambda: call_count("nvmlEventSetWait") >= waits + 20, what="ten more waits")
    scenario.gpu(0).add_xid(31)
    scenario.write()
    wait_for(lambda: xids_by_uuid(poller).get(UUIDS[0]) == {"48": 1, "31": 1}, what="a later XID")
    assert errors.counts[("nvmlEventSetWait", "gpu_is_lost")] == 1
    poller.close()


def test_xid_counts_follow_the_gpu_when_a_restart_renumbers_them(scenario: Scenario, nvml: Any) -> None:
    for uuid in UUIDS:
        scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", uuid).utilization(50, 5)
    scenario.write()
    clock = Monotonic()
    errors = ErrorLog()
    poller = Poller(NvmlBackend(errors, profiling_interval=0.1), errors=errors, monotonic=clock)
    poller.poll()
    scenario.gpu(1).add_xid(48)
    scenario.write()
    wait_for(lambda: xids_by_uuid(poller) == {UUIDS[1]: {"48": 1}}, what="GPU 1's XID")
    # GPU 0 goes away with a driver reload: GPU 1 becomes index 0, GPU 2 index 1.
    scenario.gpus = scenario.gpus[1:]
    scenario.gpus[0].xids.clear()  # delivered already; a new event set would see it again
    scenario.init_error = "DRIVER_NOT_LOADED"
    scenario.write()
    assert not poller.poll().nvml_up
    scenario.init_error = None
    scenario.write()
    clock.offset += 1.1  # the poller's first backoff
    s = samples_of(poller.poll())
    assert value(s, "gpu_up", gpu="0", uuid=UUIDS[1]) == 1
    assert value(s, "gpu_xid_errors_total", uuid=UUIDS[1], xid="48") == 1
    assert value(s, "gpu_xid_errors_total", uuid=UUIDS[2], xid="48") is None
    poller.close()


def test_a_gpu_that_appears_after_start_has_its_xids_counted(scenario: Scenario, nvml: Any) -> None:
    """Issue 36: a hot-plugged GPU (or one back after a reset) is watched too, from the recount
    that finds it, not only from the next restart of NVML."""
    scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", UUIDS[0]).utilization(50, 5)
    scenario.write()
    poller, _ = make_poller(static_refresh_s=0.0)  # every poll counts the GPUs again
    try:
        poller.poll()
        registered = call_count("nvmlDeviceRegisterEvents")
        scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", UUIDS[1]).utilization(50, 5)
        scenario.gpu(0).add_xid(48)  # as the new GPU appears: GPU 0's watch must not close for it
        scenario.write()
        wait_for(lambda: [g.uuid for g in poller.poll().gpus if g.up] == UUIDS[:2], what="the new GPU polled")
        # The new GPU is registered in a set of its own before its XID comes; GPU 0's set stays.
        wait_for(lambda: call_count("nvmlDeviceRegisterEvents") >= registered + 1, what="the new GPU registered")
        scenario.gpu(1).add_xid(79)
        scenario.write()
        wait_for(lambda: xids_by_uuid(poller).get(UUIDS[1]) == {"79": 1}, what="the new GPU's XID 79")
        wait_for(lambda: xids_by_uuid(poller).get(UUIDS[0]) == {"48": 1}, what="GPU 0's XID of that moment")
        assert call_count("nvmlDeviceRegisterEvents") == registered + 1, "GPU 0 was registered again"
    finally:
        poller.close()


def test_an_xid_is_credited_to_the_gpu_the_event_names_not_the_set_it_arrived_in(scenario: Scenario, nvml: Any) -> None:
    """Issue 49, point 4: a driver may deliver a GPU's event to a set that watches another GPU (NVIDIA's
    mock library does; the fake's ``events_via``).  The event names its GPU (nvmlEventData_t.device),
    and that GPU is the one charged."""
    for uuid in UUIDS:
        scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", uuid).utilization(50, 5)
    scenario.gpu(2).events_via(0)  # GPU 2's events arrive in GPU 0's set
    scenario.write()
    poller, _ = make_poller()
    try:
        poller.poll()
        wait_for(lambda: call_count("nvmlDeviceRegisterEvents") >= 3, what="the three GPUs watched")
        scenario.gpu(2).add_xid(79)
        scenario.gpu(0).add_xid(48)
        scenario.write()
        wait_for(lambda: xids_by_uuid(poller) == {UUIDS[0]: {"48": 1}, UUIDS[2]: {"79": 1}},
                 what="each XID on the GPU its event names")  # fmt: skip
    finally:
        poller.close()
