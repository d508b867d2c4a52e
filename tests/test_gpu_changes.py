"""Each change of a GPU's state is logged once, at warning: lost, back, reset required, an XID.

Snapshots made by hand, their times given; nothing sleeps.  A newcomer's simulated lost GPU gave
3 log lines in 7.5 minutes and none above info, so ``select(.level != "info")`` showed nothing.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from types import MappingProxyType
from typing import Any

from structlog.testing import capture_logs

from gpu_exporter.snapshot import GpuReading, GpuStatic, NodeSnapshot
from gpu_exporter.sources.changes import GpuChanges

T0 = 1_800_000_000.0
H100 = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0")


def up(index: int = 0, **kw: Any) -> GpuReading:
    return GpuReading(index=index, uuid=f"GPU-{index}", up=True, static=H100, **kw)


def down(index: int = 0, **kw: Any) -> GpuReading:
    return GpuReading(index=index, uuid=f"GPU-{index}", up=False, error="GPU is lost", **kw)


def snap(t: float, *gpus: GpuReading, nvml_up: bool = True) -> NodeSnapshot:
    return NodeSnapshot(taken_at=T0 + t, duration_seconds=0.05, nvml_up=nvml_up, gpus=gpus)


def logged(trace: list[NodeSnapshot]) -> list[MutableMapping[str, Any]]:
    changes = GpuChanges()
    with capture_logs() as logs:
        for s in trace:
            changes.observe(s)
    return logs


def test_a_lost_gpu_is_said_once_and_its_return_once_at_warning() -> None:
    # 7.5 minutes of polls every 5 s: the GPU goes at 60 s and is back at 300 s.
    trace = [snap(t, up(1), down() if 60 <= t < 300 else up()) for t in range(0, 450, 5)]
    logs = logged(trace)
    assert [(e["event"], e["log_level"]) for e in logs] == [("gpu_lost", "warning"), ("gpu_back", "warning")]
    lost, back = logs
    assert lost["gpu"] == 0 and lost["uuid"] == "GPU-0" and lost["error"] == "GPU is lost"
    assert lost["model"] == "NVIDIA H100 80GB HBM3"  # as read before it stopped answering
    assert back["down_s"] == 240.0 and back["model"] == "NVIDIA H100 80GB HBM3"


def test_a_gpu_down_from_the_start_is_said_and_one_up_is_not() -> None:
    logs = logged([snap(0, up(0), down(1)), snap(5, up(0), down(1))])
    assert [(e["event"], e["gpu"]) for e in logs] == [("gpu_lost", 1)]


def test_each_xid_is_said_with_its_number_and_gpu_once_per_new_event() -> None:
    xids = [{}, {79: 1}, {79: 1}, {79: 1, 119: 2}, {79: 1, 119: 2}, {79: 2, 119: 2}]
    logs = logged([snap(5 * i, up(3, xid_errors_total=MappingProxyType(x))) for i, x in enumerate(xids)])
    assert [(e["event"], e["gpu"], e["xid"], e["new"], e["total"]) for e in logs] == [
        ("gpu_xid", 3, 79, 1, 1), ("gpu_xid", 3, 119, 2, 2), ("gpu_xid", 3, 79, 1, 2)]  # fmt: skip
    assert {e["log_level"] for e in logs} == {"warning"}
    # Counted since the exporter started: an XID in the first snapshot is news too.
    assert [e["event"] for e in logged([snap(0, up(xid_errors_total=MappingProxyType({48: 1})))])] == ["gpu_xid"]


def test_reset_required_is_said_when_it_starts_and_when_it_ends() -> None:
    trace = [snap(0, up()), snap(5, up(reset_required=True)), snap(10, up(reset_required=True)), snap(15, up())]
    assert [e["event"] for e in logged(trace)] == ["gpu_reset_required", "gpu_reset_cleared"]


def test_nvml_down_says_nothing_of_single_gpus_and_forgets_nothing() -> None:
    trace = [snap(0, up()), snap(5, nvml_up=False), snap(10, nvml_up=False), snap(15, up())]
    assert logged(trace) == []
    trace = [snap(0, up()), snap(5, down()), snap(10, nvml_up=False), snap(15, up())]
    assert [e["event"] for e in logged(trace)] == ["gpu_lost", "gpu_back"]


def test_a_gpu_the_driver_no_longer_lists_is_lost_and_another_card_in_its_index_is_new() -> None:
    logs = logged([snap(0, up(0), up(1)), snap(5, up(0)), snap(10, up(0)), snap(15, up(0), up(1))])
    assert [(e["event"], e["gpu"]) for e in logs] == [("gpu_lost", 1), ("gpu_back", 1)]
    assert logs[0]["error"] == "no longer listed by the driver"
    swapped = GpuReading(index=0, uuid="GPU-9", up=True, static=H100)
    assert logged([snap(0, down()), snap(5, swapped)]) == logged([snap(0, down())])


def test_a_gpu_the_driver_stopped_listing_is_said_by_missing_alone_and_shares_no_index() -> None:
    """After a reload with 3 of 4 GPUs, GPU 3 moves into GPU 2's index and GPU 2 is shown down there too
    (missing.py, which says that change itself as gpu_missing): one line, not two, and the card that
    moved is neither lost nor new; an XID of the moved card is its own."""
    from gpu_exporter.sources.missing import MISSING

    moved = GpuReading(index=2, uuid="GPU-3", up=True, static=H100)
    gone = GpuReading(index=2, uuid="GPU-2", up=False, error=MISSING)
    before = snap(0, up(0), up(1), up(2), up(3))
    after = snap(5, up(0), up(1), moved, gone)
    xid = snap(10, up(0), up(1), GpuReading(index=2, uuid="GPU-3", up=True, static=H100,
                                            xid_errors_total=MappingProxyType({79: 1})), gone)  # fmt: skip
    back = snap(15, up(0), up(1), up(2), GpuReading(index=3, uuid="GPU-3", up=True, static=H100,
                                                    xid_errors_total=MappingProxyType({79: 1})))  # fmt: skip
    logs = logged([before, after, xid, back])
    assert [(e["event"], e["uuid"]) for e in logs] == [("gpu_xid", "GPU-3")]
