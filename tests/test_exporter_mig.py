"""MIG devices get their own series; the parent GPU's stay per GPU.  Process series are capped."""

from __future__ import annotations

from typing import Any

from gpu_exporter.serving.metrics import RenderOptions, gpu_families
from tests.exporter_helpers import make_poller, samples_of, value
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm, mig_uuid, preset

MIB = 1024**2
GIB = 1024**3


def test_mig_devices(scenario: Scenario, nvml: Any) -> None:
    s = preset("a100-mig", scenario.path)
    s.write()
    poller, _ = make_poller()
    samples = samples_of(poller.poll())
    parent = str(s.gpu(0).values["uuid"])
    infos = sorted((dict(ls) for (n, ls) in samples if n == "gpu_mig_info"), key=lambda d: d["gpu_instance_id"])
    assert [(d["gpu"], d["uuid"], d["mig_uuid"], d["gpu_instance_id"], d["compute_instance_id"], d["mig_profile"])
            for d in infos] == [
        ("0", parent, mig_uuid("mig", 0, 0), "1", "0", "3g.40gb"),
        ("0", parent, mig_uuid("mig", 0, 2), "13", "0", "1g.10gb"),
        ("0", parent, mig_uuid("mig", 0, 1), "5", "0", "2g.20gb"),
    ]  # fmt: skip
    m1 = {"mig_uuid": mig_uuid("mig", 0, 1)}
    assert value(samples, "gpu_mig_memory_total_bytes", **m1) == 19968 * MIB
    assert value(samples, "gpu_mig_memory_used_bytes", **m1) == 18 * GIB
    assert value(samples, "gpu_mig_memory_free_bytes", **m1) == 19968 * MIB - 18 * GIB
    procs = {
        (dict(ls)["mig_profile"], dict(ls)["pid"]) for (n, ls) in samples if n == "gpu_mig_process_memory_used_bytes"
    }
    assert procs == {("3g.40gb", "30001"), ("2g.20gb", "30002"), ("1g.10gb", "30003")}
    assert value(samples, "gpu_mig_process_memory_used_bytes", pid="30003") == 4 * GIB
    # The parent GPU keeps its own series: memory per GPU, and no utilization (not given in MIG mode).
    assert value(samples, "gpu_memory_used_bytes", gpu="0") == 52 * GIB
    assert value(samples, "gpu_utilization_ratio", gpu="0") is None
    info = next(dict(ls) for (n, ls) in samples if n == "gpu_info" and ("gpu", "0") in ls)
    assert info["mig_mode"] == "enabled"
    # The GPU with MIG off has no MIG series.
    assert not [ls for (n, ls) in samples if n.startswith("gpu_mig_") and ("gpu", "1") in ls]


def test_process_series_are_capped_per_gpu_and_the_count_is_not(scenario: Scenario, nvml: Any) -> None:
    g = scenario.add_gpu().identity("g", "GPU-00000000-0000-0000-0000-000000000001")
    for i in range(50):
        g.add_process(70_000 + i, (i + 1) * MIB, name=f"w{i}")
    scenario.write()
    poller, _ = make_poller()
    snap = poller.poll()
    capped = [(n, dict(ls)) for fam in gpu_families(snap, RenderOptions(process_top_n=5)) for s in fam.samples
              for n, ls in [(s.name, s.labels)] if n == "gpu_process_memory_used_bytes"]  # fmt: skip
    assert sorted(int(ls["pid"]) for _, ls in capped) == [70_045, 70_046, 70_047, 70_048, 70_049]  # the biggest
    assert value(samples_of(snap), "gpu_processes", gpu="0") == 50
    scenario.gpu(0).processes = scenario.gpu(0).processes[:3]
    scenario.write()
    after = samples_of(poller.poll())
    assert {dict(ls)["pid"] for (n, ls) in after if n == "gpu_process_memory_used_bytes"} == {"70000", "70001", "70002"}


def test_a_mig_mode_switch_shows_in_the_next_poll_not_at_the_static_refresh(scenario: Any, nvml: Any) -> None:
    """Issue 36: an operator turns MIG on (nvidia-smi -mig 1, then creates instances); the exporter
    read the mode as a static fact, so for up to five minutes the GPU showed no MIG devices."""
    g = h100_sxm(scenario.add_gpu(), "switch", 0, util=50, mem_used=2 * GIB, power_mw=300_000)
    g.mig_mode(False, max_devices=7)
    scenario.write()
    poller, _ = make_poller(static_refresh_s=300.0)
    try:
        before = poller.poll().gpus[0]
        assert before.static is not None and before.static.mig_mode == "disabled" and before.migs == ()
        g.mig_mode(True, max_devices=7)
        g.add_mig("NVIDIA H100 80GB HBM3 MIG 1g.10gb", mig_uuid("switch", 0, 0), 7, 0).memory(9856 * MIB, GIB)
        scenario.write()
        after = poller.poll().gpus[0]
        assert after.up and after.static is not None and after.static.mig_mode == "enabled"
        assert [m.uuid for m in after.migs] == [mig_uuid("switch", 0, 0)]
        g.mig_mode(False, max_devices=7)
        scenario.write()
        off = poller.poll().gpus[0]
        assert off.static is not None and off.static.mig_mode == "disabled" and off.migs == ()
    finally:
        poller.close()
