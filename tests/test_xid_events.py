"""XID events when a GPU falls off the bus, and across an NVML restart that renumbers the GPUs.

nvml.h: nvmlEventSetWait_v2 returns NVML_ERROR_GPU_IS_LOST "if a GPU has fallen off the bus or is
otherwise inaccessible"; the fake's ``events_wait_lost`` quirk answers so.
"""

from __future__ import annotations

import time
from typing import Any

from tests.exporter_helpers import make_poller, samples_of, value, wait_for
from tests.fakenvml import Scenario

UUIDS = [f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(3)]


def xids_by_uuid(poller: Any) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for (n, ls), v in samples_of(poller.poll()).items():
        if n == "gpu_xid_errors_total":
            labels = dict(ls)
            out.setdefault(labels["uuid"], {})[labels["xid"]] = v
    return out


def test_xids_of_the_healthy_gpus_are_counted_after_one_falls_off_the_bus(scenario: Scenario, nvml: Any) -> None:
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
    # The set was built again without the lost GPU: its loss is said once, not at every wait.
    time.sleep(1.5)
    scenario.gpu(0).add_xid(31)
    scenario.write()
    wait_for(lambda: xids_by_uuid(poller).get(UUIDS[0]) == {"48": 1, "31": 1}, what="a later XID")
    assert errors.counts[("nvmlEventSetWait", "gpu_is_lost")] == 1
    poller.close()


def test_xid_counts_follow_the_gpu_when_a_restart_renumbers_them(scenario: Scenario, nvml: Any) -> None:
    for uuid in UUIDS:
        scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", uuid).utilization(50, 5)
    scenario.write()
    poller, _ = make_poller()
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
    time.sleep(1.1)  # the poller's first backoff
    s = samples_of(poller.poll())
    assert value(s, "gpu_up", gpu="0", uuid=UUIDS[1]) == 1
    assert value(s, "gpu_xid_errors_total", uuid=UUIDS[1], xid="48") == 1
    assert value(s, "gpu_xid_errors_total", uuid=UUIDS[2], xid="48") is None
    poller.close()
