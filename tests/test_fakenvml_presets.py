"""The ready-made scenarios: committed files match their builders and say what they promise."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import SCENARIO_ENV
from tests.fakenvml.presets import PRESETS, SCENARIO_DIR, preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_committed_file_matches_its_builder(name: str) -> None:
    s = preset(name)
    assert s.path == SCENARIO_DIR / f"{name}.scn"
    assert s.path.read_text() == s.render(), "run: python -m tests.fakenvml.presets"


def test_no_stray_scenario_files() -> None:
    assert {p.stem for p in SCENARIO_DIR.glob("*.scn")} == set(PRESETS)


@pytest.fixture
def load(nvml: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    def _load(path: Path) -> Any:
        monkeypatch.setenv(SCENARIO_ENV, str(path))
        nvml.nvmlInit()
        return nvml

    return _load


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loads_and_every_gpu_answers(load: Any, name: str) -> None:
    N = load(SCENARIO_DIR / f"{name}.scn")
    count = N.nvmlDeviceGetCount()
    assert count == len(preset(name).gpus) > 0
    uuids = {N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(i)) for i in range(count)}
    assert len(uuids) == count


def test_h100_node(load: Any) -> None:
    N = load(SCENARIO_DIR / "h100-8x-training.scn")
    assert N.nvmlDeviceGetCount() == 8
    for i in range(8):
        h = N.nvmlDeviceGetHandleByIndex(i)
        assert N.nvmlDeviceGetUtilizationRates(h).gpu >= 90
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetNumFans(h)  # SXM modules are passively cooled
        assert N.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
        links = [N.nvmlDeviceGetNvLinkState(h, link) for link in range(18)]
        assert links == [N.NVML_FEATURE_ENABLED] * 18
        assert len(N.nvmlDeviceGetComputeRunningProcesses(h)) == 1
    h = N.nvmlDeviceGetHandleByIndex(0)
    e0 = N.nvmlDeviceGetTotalEnergyConsumption(h)
    time.sleep(0.05)
    assert N.nvmlDeviceGetTotalEnergyConsumption(h) > e0  # counters move on their own


def test_workstation(load: Any) -> None:
    N = load(SCENARIO_DIR / "workstation-2x-consumer.scn")
    for i in range(2):
        h = N.nvmlDeviceGetHandleByIndex(i)
        for fn, args in (
            (N.nvmlDeviceGetTotalEccErrors, (0, 1)),
            (N.nvmlDeviceGetNvLinkState, (0,)),
            (N.nvmlDeviceGetTotalEnergyConsumption, ()),
            (N.nvmlDeviceGetSerial, ()),
            (N.nvmlDeviceGetRemappedRows, ()),
        ):
            with pytest.raises(N.NVMLError_NotSupported):
                fn(h, *args)
        fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_MEMORY_TEMP])
        assert fv[0].nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED
    h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
    assert N.nvmlDeviceGetFanSpeed_v2(h0, 0) == 45
    assert N.nvmlDeviceGetNumFans(h1) == 1
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetFanSpeed_v2(h1, 0)
    assert len(N.nvmlDeviceGetGraphicsRunningProcesses(h0)) == 2


def test_pcie_degraded(load: Any) -> None:
    N = load(SCENARIO_DIR / "pcie-degraded.scn")
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert (N.nvmlDeviceGetCurrPcieLinkGeneration(h), N.nvmlDeviceGetCurrPcieLinkWidth(h)) == (1, 8)
    assert (N.nvmlDeviceGetMaxPcieLinkGeneration(h), N.nvmlDeviceGetMaxPcieLinkWidth(h)) == (4, 16)
    # ~1.9 GB/s received on a link that carries 2 GB/s: the bus is the bottleneck.
    assert N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES) * 1000 / 2e9 > 0.9


def test_gpu_lost_midway(load: Any, tmp_path: Path) -> None:
    s = preset("gpu-lost-midway")
    assert s.gpu(2).values["lost_after_s"] == 30
    s.path = tmp_path / "fast.scn"
    s.gpu(2).lost(after_s=0.3).xids[0].after_s = 0.3
    s.write()
    N = load(s.path)
    h2 = N.nvmlDeviceGetHandleByIndex(2)
    assert N.nvmlDeviceGetUtilizationRates(h2).gpu == 82
    es = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(h2, N.nvmlEventTypeXidCriticalError, es)
    assert N.nvmlEventSetWait(es, 5000).eventData == 79
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetUtilizationRates(h2)
    assert N.nvmlDeviceGetUtilizationRates(N.nvmlDeviceGetHandleByIndex(3)).gpu == 83


def test_a100_mig(load: Any) -> None:
    N = load(SCENARIO_DIR / "a100-mig.scn")
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetMigMode(h) == [1, 1]
    migs = [N.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(3)]
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)
    assert len({N.nvmlDeviceGetUUID(m) for m in migs}) == 3
    assert all(N.nvmlDeviceGetUUID(m).startswith("MIG-") for m in migs)
    assert [N.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [1, 5, 13]
    totals = [N.nvmlDeviceGetMemoryInfo(m).total // 1024**2 for m in migs]
    assert totals == [40192, 19968, 9728]
    assert [len(N.nvmlDeviceGetComputeRunningProcesses(m)) for m in migs] == [1, 1, 1]
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetUtilizationRates(h)
    assert N.nvmlDeviceGetMigMode(N.nvmlDeviceGetHandleByIndex(1)) == [0, 0]


def test_scale_16(load: Any) -> None:
    N = load(SCENARIO_DIR / "scale-16x.scn")
    assert N.nvmlDeviceGetCount() == 16
    total = sum(len(N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(i))) for i in range(16))
    assert total == 64
