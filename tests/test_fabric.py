"""Issue 36: the NVLink fabric's own verdict (nvmlDeviceGetGpuFabricInfoV) on NVSwitch and GB200
systems: whether the GPU has joined its fabric, and what the health mask reports.

Through the real bindings on the fake driver, whose states and mask come from NVIDIA's nvml.h while
the exporter decodes the mask with nvidia-ml-py's constants.  A card without a fabric, an R535
driver (no such call), and a mask field the driver does not report have no series, never a 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.alerting.engine import RuleEngine, holding_now
from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.once import findings
from gpu_exporter.snapshot import NodeSnapshot
from tests import assert_mentions
from tests.exporter_helpers import ErrorLog, make_poller, samples_of, value
from tests.fakenvml import NOT_SUPPORTED, Scenario, subprocess_env
from tests.fakenvml.presets import HEALTHY_FABRIC, a100_sxm, h100_sxm
from tests.fakenvml.runtime import call_count
from tests.fakenvml.values import fabric_health_mask
from tests.test_gpm import oldest_bindings

GIB = 2**30
CALL = "nvmlDeviceGetGpuFabricInfoV"
ROOT = Path(__file__).resolve().parent.parent


def polls(n: int = 1) -> tuple[list[NodeSnapshot], ErrorLog]:
    poller, errors = make_poller()
    try:
        return [poller.poll() for _ in range(n)], errors
    finally:
        poller.close()


def h100s(scenario: Scenario, count: int) -> None:
    for i in range(count):
        h100_sxm(scenario.add_gpu(), "fabric", i, util=90, mem_used=40 * GIB, power_mw=500_000)


def issues_of(samples: Any, gpu: str) -> dict[str, float]:
    return {dict(ls)["issue"]: v for (n, ls), v in samples.items() if n == "gpu_fabric_issue" and ("gpu", gpu) in ls}


def test_a_registered_healthy_fabric_reads_so_and_alerts_nothing(scenario: Scenario, nvml: Any) -> None:
    scenario.driver(580)
    h100s(scenario, 1)
    scenario.write()
    (snap,), errors = polls()
    s = samples_of(snap)
    assert value(s, "gpu_fabric_state", gpu="0") == 3
    assert value(s, "gpu_fabric_health", gpu="0") == 1
    # Every field the HGX board's driver reports, all clear; no global fabric manager there.
    assert issues_of(s, "0") == {"degraded_bandwidth": 0, "route_recovery": 0, "route_unhealthy": 0,
                                 "access_timeout_recovery": 0, "incorrect_configuration": 0,
                                 "registration_failed": 0}  # fmt: skip
    assert not [f for f in findings(snap) if f.alertname.startswith("GpuFabric")]
    assert not [k for k in errors.counts if k[0] == CALL]


def test_each_issue_of_the_mask_and_a_failed_registration_is_named_with_what_to_do(
    scenario: Scenario, nvml: Any
) -> None:
    scenario.driver(580)
    h100s(scenario, 2)
    scenario.gpu(0).fabric("completed", health_summary="unhealthy", health_mask=fabric_health_mask(
        DEGRADED_BW="TRUE", ROUTE_UNHEALTHY="TRUE", GFM_STATE="DISCONNECTED",
        INCORRECT_CONFIGURATION="INCORRECT_CHASSIS_SN"))  # fmt: skip
    scenario.gpu(1).fabric("completed", status="NOT_READY", health_mask=HEALTHY_FABRIC, health_summary="unhealthy")
    scenario.write()
    (snap,), _ = polls()
    s = samples_of(snap)
    assert issues_of(s, "0") == {"degraded_bandwidth": 1, "route_unhealthy": 1, "fabric_manager_disconnected": 1,
                                 "incorrect_configuration": 1, "registration_failed": 0}  # fmt: skip
    assert issues_of(s, "1")["registration_failed"] == 1
    assert value(s, "gpu_fabric_health", gpu="0") == 2
    engine = RuleEngine(RulesSettings(), node="")
    fired = {(g.index, dict(c.extra_labels)["issue"]): c for g, c in holding_now(engine, snap)
             if c.alertname == "GpuFabricUnhealthy"}  # fmt: skip
    assert set(fired) == {(0, "degraded_bandwidth"), (0, "route_unhealthy"), (0, "fabric_manager_disconnected"),
                          (0, "incorrect_configuration"), (1, "registration_failed")}  # fmt: skip
    assert_mentions(fired[0, "degraded_bandwidth"].summary, "GPU 0", "degraded_bandwidth", "nvidia-smi nvlink -s")
    assert_mentions(fired[0, "incorrect_configuration"].summary, "chassis serial", "nvidia-fabricmanager")
    assert_mentions(fired[1, "registration_failed"].summary, "GPU 1", "register", "nvidia-fabricmanager")
    assert {c.severity for c in fired.values()} == {"critical"}


def test_a_registration_that_does_not_complete_is_not_ready(scenario: Scenario, nvml: Any) -> None:
    """Until the fabric manager registers a GPU, CUDA cannot use it; the status means nothing then
    (nvml.h: "Must be checked only if state returns complete"), so no registration_failed."""
    scenario.driver(580)
    h100s(scenario, 1)
    scenario.gpu(0).fabric("in_progress", status="NOT_READY")
    scenario.write()
    (snap,), _ = polls()
    s = samples_of(snap)
    assert value(s, "gpu_fabric_state", gpu="0") == 2
    assert "registration_failed" not in issues_of(s, "0")
    engine = RuleEngine(RulesSettings(), node="")
    (held,) = [c for _, c in holding_now(engine, snap) if c.alertname == "GpuFabricNotReady"]
    assert held.for_seconds == 300
    assert_mentions(held.summary, "GPU 0", "in progress", "nvidia-fabricmanager")
    assert_mentions(held.description, "802")


def test_an_r570_driver_gives_the_mask_without_the_summary(scenario: Scenario, nvml: Any) -> None:
    """R570 takes nvmlGpuFabricInfo_v2_t only (v3, with the summary, is 580's): asked with v2, once a
    poll, no version error counted."""
    scenario.driver(570)
    h100s(scenario, 1)
    scenario.write()
    before = call_count(CALL)
    (_, second), errors = polls(2)
    assert call_count(CALL) - before == 2
    s = samples_of(second)
    assert value(s, "gpu_fabric_state", gpu="0") == 3
    assert value(s, "gpu_fabric_health", gpu="0") is None
    assert issues_of(s, "0")["degraded_bandwidth"] == 0
    assert not [k for k in errors.counts if k[0] == CALL]


def test_a_driver_that_refuses_the_newer_struct_is_asked_the_older_from_then_on(scenario: Scenario, nvml: Any) -> None:
    """A driver that says 580 but behaves as 570 (refuses v3 with ARGUMENT_VERSION_MISMATCH): the
    first poll asks again with v2, and later polls ask v2 at once."""
    scenario.driver(580)
    scenario.driver_branch = 570
    h100s(scenario, 1)
    scenario.write()
    before = call_count(CALL)
    (first, second), errors = polls(2)
    assert call_count(CALL) - before == 3  # v3 refused, v2; then v2
    for snap in (first, second):
        assert value(samples_of(snap), "gpu_fabric_state", gpu="0") == 3
    assert not [k for k in errors.counts if k[0] == CALL]


def test_no_fabric_no_series(scenario: Scenario, nvml: Any) -> None:
    """An A100 answers NOT_SUPPORTED (asked once, remembered); a GPU answering state NOT_SUPPORTED
    with SUCCESS has no fabric either; an R535 driver has no such call and is not asked."""
    scenario.driver(580)
    a100_sxm(scenario.add_gpu(), "fabric", 0)
    h100_sxm(scenario.add_gpu(), "fabric", 1, util=90, mem_used=40 * GIB, power_mw=500_000).fabric("not_supported")
    h100_sxm(scenario.add_gpu(), "fabric", 2, util=90, mem_used=40 * GIB, power_mw=500_000).fabric(NOT_SUPPORTED)
    scenario.write()
    snaps, errors = polls(3)
    for snap in snaps:
        assert [g.fabric for g in snap.gpus] == [None, None, None]
        assert not [n for n, _ in samples_of(snap) if n.startswith("gpu_fabric")]
    assert errors.counts[(CALL, "not_supported")] == 2  # the A100 and GPU 2, once each
    scenario.gpus.clear()
    scenario.driver(535)
    h100s(scenario, 1)
    scenario.write()
    before = call_count(CALL)
    (snap,), errors = polls()
    assert call_count(CALL) == before and snap.gpus[0].fabric is None


def test_every_issue_a_reading_can_carry_has_its_advice() -> None:
    """GpuFabricUnhealthy says what to do for each issue: none falls back to its bare name."""
    from gpu_exporter.alerting.rules import FABRIC_ADVICE
    from gpu_exporter.metric_defs import FABRIC_ISSUES, FABRIC_REGISTRATION_FAILED

    assert {*FABRIC_ISSUES, FABRIC_REGISTRATION_FAILED} <= FABRIC_ADVICE.keys()


# A child on each allowed nvidia-ml-py: polls three times, prints its fabric series.
FABRIC_POLL = """
import json
from tests.exporter_helpers import make_poller, samples_of
poller, errors = make_poller()
names = [sorted({n for n, _ in samples_of(poller.poll()) if n.startswith("gpu_fabric")}) for _ in range(3)]
poller.close()
print(json.dumps(names))
"""


@pytest.mark.integration  # a child Python process on the oldest bindings
@pytest.mark.parametrize("bindings", ["oldest", "newest"])
def test_bindings_without_the_fabric_call_say_so_once(tmp_path: Path, bindings: str) -> None:
    """nvidia-ml-py 12.535.77, the oldest allowed, has no nvmlDeviceGetGpuFabricInfoV (12.550.89 binds
    it): on a driver that has it, the fabric series are missing, and the log says why, once."""
    s = Scenario(tmp_path / "node.scn")
    s.driver(580)
    h100s(s, 2)
    s.write()
    env = subprocess_env(s.path)
    if bindings == "oldest":
        env["PYTHONPATH"] = str(oldest_bindings())
    out = subprocess.run([sys.executable, "-c", FABRIC_POLL], env=env, capture_output=True, text=True, timeout=60,
                         cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    names = json.loads(out.stdout.splitlines()[-1])
    said = (out.stdout + out.stderr).count("fabric_off_in_bindings")
    if bindings == "oldest":
        assert names == [[]] * 3 and said == 1, out.stderr
        assert_mentions(out.stdout + out.stderr, CALL, "12.550.89")
    else:
        assert all("gpu_fabric_state" in n for n in names) and said == 0, out.stderr


def test_bindings_that_read_part_of_a_fabric_say_what_they_leave_out_once(
    scenario: Scenario, nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bindings before 13.580.65 have no v3 struct (the health summary), before 13.595.45 no GFM_STATE
    field: the rest of the fabric is read, and the log names what is not, once for the node."""
    from structlog.testing import capture_logs

    from gpu_exporter.sources.nvml import fabric

    scenario.driver(580)
    h100s(scenario, 2)
    scenario.write()
    monkeypatch.delattr(nvml, "c_nvmlGpuFabricInfo_v3_t")
    monkeypatch.setattr(fabric, "UNDECODED", ("fabric_manager_disconnected",))
    monkeypatch.setattr(fabric, "_said", set())
    with capture_logs() as logs:
        snaps, _ = polls(3)
    said = [e["missing"] for e in logs if e["event"] == "fabric_off_in_bindings"]
    assert said == ["c_nvmlGpuFabricInfo_v3_t (the health summary)",
                    "the health mask fields of fabric_manager_disconnected"]  # fmt: skip
    s = samples_of(snaps[-1])
    assert value(s, "gpu_fabric_state", gpu="1") == 3
    assert not [k for k in s if k[0] == "gpu_fabric_health"]  # the summary, v3's alone
