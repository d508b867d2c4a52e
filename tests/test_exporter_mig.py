"""MIG devices get their own series; the parent GPU's stay per GPU.  Process series are capped."""

from __future__ import annotations

from typing import Any

from gpu_exporter.serving.metrics import RenderOptions, gpu_families
from tests.exporter_helpers import make_poller, samples_of, value
from tests.fakenvml import Scenario
from tests.fakenvml.presets import mig_uuid, preset

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
