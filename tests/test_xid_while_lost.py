"""A GPU that falls off the bus says why: its XID 79 is on /metrics beside gpu_up 0, and GpuLost and
GpuXidError fire together (issue 36, point 1).

nvml.h on nvmlEventSetWait_v2: the lost GPU's own events already due come first, then every wait
answers NVML_ERROR_GPU_IS_LOST; the fake's ``events_wait_lost`` quirk answers so.  Before, the poller
built the lost GPU's reading with no XIDs at all: the count sat in the watcher and reached /metrics
only when the GPU came back, which after XID 79 is usually a reboot.
"""

from __future__ import annotations

from typing import Any

from gpu_exporter.alerting.engine import RuleEngine, holding_now
from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.sources.poller import Poller
from gpu_exporter.sources.simulated import LOST_WINDOW_SECONDS, PROFILES, XID_BEFORE_LOSS, SimulatedBackend
from tests.exporter_helpers import make_poller, samples_of, value, wait_for
from tests.fakenvml import Scenario

UUIDS = [f"GPU-00000000-0000-0000-0000-00000000007{i}" for i in range(2)]


def test_a_lost_gpus_xid_79_is_exported_while_it_is_down_and_both_alerts_hold(scenario: Scenario, nvml: Any) -> None:
    for uuid in UUIDS:
        scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", uuid).utilization(50, 5).events_wait_lost()
    scenario.write()
    poller, _ = make_poller()
    assert all(g.up for g in poller.poll().gpus)
    scenario.gpu(1).add_xid(79)
    scenario.gpu(1).lost()
    scenario.write()

    def lost_with_its_xid() -> bool:
        s = samples_of(snap := poller.poll())
        lost_with_its_xid.snap = snap  # type: ignore[attr-defined]
        return value(s, "gpu_up", uuid=UUIDS[1]) == 0 and value(s, "gpu_xid_errors_total", uuid=UUIDS[1], xid="79") == 1

    wait_for(lost_with_its_xid, what="GPU 1 down with its XID 79 on /metrics")
    snap = lost_with_its_xid.snap  # type: ignore[attr-defined]
    down = snap.gpus[1]
    assert (down.up, down.uuid, dict(down.xid_errors_total)) == (False, UUIDS[1], {79: 1})
    # The healthy GPU has no XID series, and the lost one no other series but gpu_up and its XIDs.
    s = samples_of(snap)
    assert {n for (n, ls) in s if ("uuid", UUIDS[1]) in ls} == {"gpu_up", "gpu_xid_errors_total"}
    assert value(s, "gpu_xid_errors_total", uuid=UUIDS[0], xid="79") is None
    engine = RuleEngine(RulesSettings(), node="")
    fired = {(c.alertname, dict(c.extra_labels).get("xid")) for g, c in holding_now(engine, snap) if g.index == 1}
    assert {("GpuLost", None), ("GpuXidError", "79")} <= fired
    poller.close()


def test_a_gpu_lost_before_its_uuid_was_ever_read_has_no_xid_series_and_breaks_nothing(
    scenario: Scenario, nvml: Any
) -> None:
    scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", UUIDS[0]).utilization(50, 5)
    scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", UUIDS[1]).lost()
    scenario.write()
    poller, _ = make_poller()
    snap = poller.poll()
    assert [(g.up, g.uuid, dict(g.xid_errors_total)) for g in snap.gpus] == [(True, UUIDS[0], {}), (False, "", {})]
    assert value(samples_of(snap), "gpu_up", gpu="1") == 0
    poller.close()


def test_the_simulators_lost_gpu_keeps_its_xid_while_it_is_down() -> None:
    now = [0.0]
    lost = PROFILES.index("lost")
    backend = SimulatedBackend(gpus=lost + 1, clock=lambda: now[0])
    poller = Poller(backend, errors=lambda function, error: None, wall_clock=lambda: now[0], monotonic=lambda: now[0])
    assert poller.poll().gpus[lost].up
    now[0] = (LOST_WINDOW_SECONDS[0] + LOST_WINDOW_SECONDS[1]) / 2  # in its first fall
    down = poller.poll().gpus[lost]
    assert (down.up, dict(down.xid_errors_total)) == (False, {XID_BEFORE_LOSS: 1})
    assert value(samples_of(poller.poll()), "gpu_xid_errors_total", gpu=str(lost), xid=str(XID_BEFORE_LOSS)) == 1
