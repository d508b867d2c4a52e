"""Profiling-grade activity (GPM) and per-process utilization, through the real nvidia-ml-py bindings
against the fake driver: right per GPU and per MIG instance on Hopper, absent (never 0) where not
supported, counted once, and no sample leaked or diffed across devices or re-created instances."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import assert_mentions
from tests.exporter_helpers import ErrorLog, make_poller, samples_of, value, wait_for
from tests.fakenvml import NOT_SUPPORTED, Err, Scenario, build_library, run_python, subprocess_env
from tests.fakenvml.presets import mig_uuid
from tests.fakenvml.runtime import advance_clock, step_wall_clock

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024**3
UUID = "GPU-11111111-2222-3333-4444-555555555555"
# Every GPM metric the exporter exports, with the percentage the scenarios below give it.
PERCENT = {"graphics_util": 91, "sm_util": 62, "sm_occupancy": 31, "any_tensor_util": 44, "dram_bw_util": 27.5,
           "fp64_util": 1, "fp32_util": 12, "fp16_util": 3}  # fmt: skip
METRIC_OF = {"graphics_util": "graphics_active", "sm_util": "sm_active", "sm_occupancy": "sm_occupancy",
             "any_tensor_util": "tensor_active", "dram_bw_util": "dram_active", "fp64_util": "fp64_active",
             "fp32_util": "fp32_active", "fp16_util": "fp16_active"}  # fmt: skip
ACTIVITY_NAMES = {f"gpu_{m}_ratio" for m in METRIC_OF.values()}

# The fake's processes, by pids above Linux's PID_MAX_LIMIT (2^22): never a process of the host that runs
# the tests, whose name the exporter would read from /proc instead (a kworker was pid 4242 once).
TRAINER, NOTEBOOK = 4_198_546, 4_198_647


def hopper(s: Scenario, uuid: str = UUID) -> Any:
    g = s.add_gpu().identity("NVIDIA H100 80GB HBM3", uuid).utilization(95, 40).memory(80 * GIB, 60 * GIB)
    return g.gpm_supported().gpm(**PERCENT)


def _allocated() -> int:
    lib = ctypes.CDLL("libnvidia-ml.so.1")  # the fake, loaded in this process by the nvml fixture
    return int(lib.fakeNvmlGpmLiveSamples())


_baseline = [0]


@pytest.fixture(autouse=True)
def _samples_before_the_test(request: pytest.FixtureRequest) -> None:
    """Samples other tests in this process left allocated; each test counts only its own."""
    if "nvml" in request.fixturenames:
        request.getfixturevalue("nvml")
        _baseline[0] = _allocated()


def live_samples() -> int:
    """GPM samples this test has allocated and not freed."""
    return _allocated() - _baseline[0]


def poll_until_activity(poller: Any, index: int = 0) -> Any:
    """Poll until GPU ``index`` has a GPM pair (the second sample must be 100 ms after the first)."""
    found: list[Any] = []

    def ready() -> bool:
        snap = poller.poll()
        found[:] = [snap]
        return snap.gpus[index].activity is not None

    wait_for(ready, timeout=10, interval=0.05, what="a GPM pair")
    return found[0]


# -- per GPU -------------------------------------------------------------------------------------------
def test_every_activity_metric_is_right_on_hopper_and_only_from_the_second_poll(scenario: Scenario, nvml: Any) -> None:
    hopper(scenario)
    scenario.write()
    poller, errors = make_poller()
    first = samples_of(poller.poll())
    assert ACTIVITY_NAMES.isdisjoint(n for n, _ in first), "one sample is no pair: no activity yet"
    s = samples_of(poll_until_activity(poller))
    for key, metric in METRIC_OF.items():
        assert value(s, f"gpu_{metric}_ratio", gpu="0", uuid=UUID) == pytest.approx(PERCENT[key] / 100, abs=1e-6)
    assert not [k for k in errors.counts if k[0].startswith("nvmlGpm")], errors.counts
    poller.close()
    assert live_samples() == 0, "samples must be freed before nvmlShutdown"


def test_activity_is_the_mean_since_the_previous_poll(scenario: Scenario, nvml: Any) -> None:
    """GPM counts between two samples: a change half-way through an interval shows as the mean."""
    g = hopper(scenario)
    scenario.write()
    poller, _ = make_poller()
    poll_until_activity(poller)

    def between(call: Callable[[], object]) -> tuple[float, float]:
        """When ``call`` ran: some moment in the returned span, however late a busy machine ran it."""
        before = time.monotonic()
        call()
        return before, time.monotonic()

    t0 = between(poller.poll)  # the pair now starts here
    g.gpm(sm_util=20)
    scenario.write()
    t1 = between(nvml.nvmlDeviceGetCount)  # the fake reloads at a call: the change starts then
    g.gpm(sm_util=80)
    time.sleep(0.3)
    scenario.write()
    t2 = between(nvml.nvmlDeviceGetCount)
    time.sleep(0.3)
    activity: list[Any] = []
    t3 = between(lambda: activity.append(poller.poll().gpus[0].activity))
    assert activity[0] is not None
    sm = activity[0].sm

    # 62% until t1, 20% until t2, 80% until the poll: a time-weighted mean.  Each moment is known to
    # lie in its span; the mean is monotonic in each, so its bounds are at the spans' ends.
    def mean(a: float, b: float, c: float, d: float) -> float:
        return (0.62 * (b - a) + 0.20 * (c - b) + 0.80 * (d - c)) / (d - a)

    means = [mean(a, b, c, d) for a in t0 for b in t1 for c in t2 for d in t3]
    assert min(means) - 0.03 <= sm <= max(means) + 0.03, (sm, min(means), max(means))
    poller.close()


def test_no_gpm_on_ampere_is_absent_and_counted_once(scenario: Scenario, nvml: Any) -> None:
    scenario.add_gpu().identity("NVIDIA A100-SXM4-80GB", UUID).utilization(50, 5).gpm_supported(False)
    scenario.add_gpu().identity("NVIDIA A100-PCIE-40GB", "GPU-b").utilization(50, 5)  # the query itself unsupported
    scenario.write()
    poller, errors = make_poller()
    for _ in range(4):
        s = samples_of(poller.poll())
        time.sleep(0.11)
    assert ACTIVITY_NAMES.isdisjoint(n for n, _ in s)
    assert value(s, "gpu_utilization_ratio", gpu="0") == 0.5
    assert errors.counts[("nvmlGpmQueryDeviceSupport", "not_supported")] == 2  # once per GPU, not per poll
    assert live_samples() == 0, "no samples are taken on a GPU without GPM"
    poller.close()


def test_one_failing_metric_is_absent_and_the_others_stay(scenario: Scenario, nvml: Any) -> None:
    g = hopper(scenario)
    g.gpm(fp64_util=NOT_SUPPORTED, fp16_util=Err("UNKNOWN"))
    scenario.write()
    poller, errors = make_poller()
    poll_until_activity(poller)
    for _ in range(3):
        time.sleep(0.11)
        s = samples_of(poller.poll())
    assert value(s, "gpu_fp64_active_ratio") is None and value(s, "gpu_fp16_active_ratio") is None
    assert value(s, "gpu_sm_active_ratio") == pytest.approx(0.62)
    assert errors.counts[("nvmlGpmMetricsGet", "not_supported")] == 1  # not asked again
    assert errors.counts[("nvmlGpmMetricsGet", "unknown")] >= 3  # asked, and counted, every poll
    poller.close()


def test_out_of_range_activity_is_unavailable_and_counted(scenario: Scenario, nvml: Any) -> None:
    hopper(scenario).gpm(dram_bw_util=4294967295)  # a sentinel, not a percentage
    scenario.write()
    poller, errors = make_poller()
    s = samples_of(poll_until_activity(poller))
    assert value(s, "gpu_dram_active_ratio") is None and value(s, "gpu_sm_active_ratio") == pytest.approx(0.62)
    assert errors.counts[("nvmlGpmMetricsGet", "out_of_range")] >= 1
    poller.close()


def test_polls_closer_than_100_ms_never_diff_an_invalid_pair(scenario: Scenario, nvml: Any) -> None:
    """Back-to-back polls keep showing activity (the last answers) and never hand the driver a pair
    under 100 ms, which the fake refuses and the exporter would count."""
    g = hopper(scenario)
    scenario.write()
    poller, errors = make_poller()
    poll_until_activity(poller)
    g.gpm(sm_util=5)
    scenario.write()
    quick = [poller.poll().gpus[0].activity for _ in range(20)]
    assert all(a is not None for a in quick), "no gap in the series"
    assert not [k for k in errors.counts if k[0].startswith("nvmlGpm")], errors.counts
    time.sleep(0.25)
    final = poller.poll().gpus[0].activity
    assert final is not None and final.sm is not None and final.sm < 0.5  # the new value, from a real interval
    poller.close()


def test_a_driver_with_another_struct_version_is_unsupported_counted_once(tmp_path: Path) -> None:
    """A driver that answers nvmlGpmMetricsGet with ARGUMENT_VERSION_MISMATCH (gpud reads it as
    unsupported; so do we): no activity, one count and one log line, other metrics intact."""
    s = Scenario(tmp_path / "node.scn")
    hopper(s)
    s.gpu(0).set("gpm.supported", 1)
    s.write()
    text = s.path.read_text().replace("[system]\n", "[system]\ngpm_metrics_version = 2\n")
    s.path.write_text(text)
    out = run_python(POLL_TWICE, s.path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["activity"] is None and result["utilization"] == 0.95
    assert result["errors"] == {
        "nvmlGpmMetricsGet/argument_version_mismatch": 1,
        "nvmlDeviceGetNumFans/not_supported": 1,
    }
    assert "fake NVML" not in out.stderr  # no sample leaked at shutdown


# A fresh interpreter: polls a few times, then prints what GPU 0 showed and the GPM errors counted.
POLL_TWICE = """
import json, time
from tests.exporter_helpers import make_poller
poller, errors = make_poller()
for _ in range(4):
    snap = poller.poll()
    time.sleep(0.12)
g = snap.gpus[0]
poller.close()
print(json.dumps({"activity": None if g.activity is None else g.activity.sm, "utilization": g.utilization_ratio,
                  "fans": dict(g.fan_speed_ratio), "nvlinks": len(g.nvlinks), "up": [n.up for n in g.nvlinks],
                  "errors": {f"{f}/{e}": n for (f, e), n in errors.counts.items() if "Gpm" in f or "NvLink" in f
                             or "Fan" in f}}))
"""


# -- per MIG instance ----------------------------------------------------------------------------------
def mig_node(s: Scenario) -> Any:
    g = s.add_gpu().identity("NVIDIA H100 80GB HBM3", UUID).memory(80 * GIB, 30 * GIB).gpm_supported()
    g.mig_mode(True)
    for m, (gi, sm) in enumerate(((1, 70), (5, 35), (13, 10))):
        g.add_mig(f"NVIDIA H100 80GB HBM3 MIG {['3g.40gb', '2g.20gb', '1g.10gb'][m]}", mig_uuid("t", 0, m), gi).gpm(
            sm_util=sm, any_tensor_util=sm / 2, dram_bw_util=sm / 4
        )
    return g


def test_each_mig_instance_has_its_own_activity(scenario: Scenario, nvml: Any) -> None:
    mig_node(scenario)
    scenario.write()
    poller, errors = make_poller()
    s = samples_of(poll_until_activity_of_migs(poller))
    for m, (gi, sm) in enumerate((("1", 70), ("5", 35), ("13", 10))):
        labels = {"mig_uuid": mig_uuid("t", 0, m), "gpu_instance_id": gi}
        assert value(s, "gpu_mig_sm_active_ratio", **labels) == pytest.approx(sm / 100)
        assert value(s, "gpu_mig_tensor_active_ratio", **labels) == pytest.approx(sm / 200)
        assert value(s, "gpu_mig_dram_active_ratio", **labels) == pytest.approx(sm / 400)
        assert value(s, "gpu_mig_fp64_active_ratio", **labels) is None  # not in the scenario: unsupported
    assert value(s, "gpu_sm_active_ratio") is None  # the parent has no activity of its own here
    assert not [k for k in errors.counts if k[1] not in ("not_supported",)], errors.counts
    poller.close()
    assert live_samples() == 0


def poll_until_activity_of_migs(poller: Any) -> Any:
    found: list[Any] = []

    def ready() -> bool:
        snap = poller.poll()
        found[:] = [snap]
        return all(m.activity is not None for m in snap.gpus[0].migs)

    wait_for(ready, timeout=10, interval=0.05, what="GPM pairs of every MIG instance")
    return found[0]


def test_a_re_created_mig_instance_is_never_diffed_against_the_old_one(scenario: Scenario, nvml: Any) -> None:
    """Destroy 2g.20gb (gi 5) and create another instance under the same id: its first poll has no
    activity, and no pair ever spans the two (the fake refuses such a pair, which would be counted)."""
    g = mig_node(scenario)
    scenario.write()
    poller, errors = make_poller()
    poll_until_activity_of_migs(poller)
    g.migs[1] = type(g.migs[1])()
    g.migs[1].identity("NVIDIA H100 80GB HBM3 MIG 2g.20gb", "MIG-recreated").instance(5, 0).gpm(sm_util=90)
    scenario.write()
    time.sleep(0.12)
    first = samples_of(poller.poll())
    assert value(first, "gpu_mig_sm_active_ratio", mig_uuid="MIG-recreated") is None
    assert value(first, "gpu_mig_sm_active_ratio", gpu_instance_id="1") == pytest.approx(0.70)  # others go on
    time.sleep(0.12)
    s = samples_of(poller.poll())
    assert value(s, "gpu_mig_sm_active_ratio", mig_uuid="MIG-recreated") == pytest.approx(0.90)
    assert ("nvmlGpmMetricsGet", "invalid_argument") not in errors.counts
    assert live_samples() == 2 * 3 + 0, "the old instance's samples were freed"  # 3 instances x 2 buffers
    poller.close()
    assert live_samples() == 0


def test_samples_are_freed_when_nvml_goes_away_and_comes_back(scenario: Scenario, nvml: Any) -> None:
    hopper(scenario)
    scenario.write()
    poller, _ = make_poller()
    poll_until_activity(poller)
    assert live_samples() == 2
    scenario.init_error = "DRIVER_NOT_LOADED"
    scenario.write()
    assert not poller.poll().nvml_up
    assert live_samples() == 0
    scenario.init_error = None
    scenario.write()
    wait_for(lambda: poller.poll().nvml_up, timeout=10, what="NVML back")
    poll_until_activity(poller)
    assert live_samples() == 2  # a new pair, not a second one beside a leaked first
    poller.close()
    assert live_samples() == 0


def test_a_lost_gpu_loses_its_samples_and_starts_a_new_pair_when_back(scenario: Scenario, nvml: Any) -> None:
    g = hopper(scenario)
    hopper(scenario, "GPU-other")
    scenario.write()
    poller, errors = make_poller()
    poll_until_activity(poller, 1)
    g.lost()
    scenario.write()
    snap = poller.poll()
    assert not snap.gpus[0].up and snap.gpus[1].activity is not None  # one GPU never takes down the others
    g.recovered()
    scenario.write()
    wait_for(lambda: poller.poll().gpus[0].up, what="GPU 0 back")
    snap = poll_until_activity(poller)
    assert snap.gpus[0].activity.sm == pytest.approx(0.62)
    assert ("nvmlGpmMetricsGet", "invalid_argument") not in errors.counts
    poller.close()
    assert live_samples() == 0


# -- per process ---------------------------------------------------------------------------------------
def test_per_process_utilization(scenario: Scenario, nvml: Any) -> None:
    g = hopper(scenario).process_utilization(50)
    g.add_process(TRAINER, 30 * GIB, name="trainer", sm=70, mem=25)
    g.add_process(NOTEBOOK, 10 * GIB, name="notebook")  # holds memory, runs nothing: no driver sample
    scenario.write()
    poller, errors = make_poller()
    s = samples_of(poller.poll())
    assert value(s, "gpu_process_sm_utilization_ratio", pid=str(TRAINER), process="trainer") == pytest.approx(0.70)
    assert value(s, "gpu_process_memory_utilization_ratio", pid=str(TRAINER)) == pytest.approx(0.25)
    assert value(s, "gpu_process_sm_utilization_ratio", pid=str(NOTEBOOK)) == 0.0  # idle is a real 0
    g.processes[0].utilization = (0, 0, 0, 0)  # the trainer stops; the driver has no busy sample any more
    scenario.write()
    time.sleep(0.12)  # past the profiling interval (0.1 s here) and the driver's 50 ms sample period
    s = samples_of(poller.poll())
    assert value(s, "gpu_process_sm_utilization_ratio", pid=str(TRAINER)) == 0.0
    assert not [k for k in errors.counts if "ProcessUtilization" in k[0]], errors.counts
    poller.close()


def test_per_process_utilization_passes_the_last_seen_timestamp(scenario: Scenario, nvml: Any) -> None:
    """The second read asks only for samples newer than the first's: within one driver sample
    period there are none (NOT_FOUND), which is not an error."""
    g = hopper(scenario).process_utilization(60_000)  # one sample a minute
    g.add_process(TRAINER, 30 * GIB, name="trainer", sm=70)
    scenario.write()
    poller, errors = make_poller()
    assert value(samples_of(poller.poll()), "gpu_process_sm_utilization_ratio", pid=str(TRAINER)) == pytest.approx(0.7)
    time.sleep(0.12)
    assert value(samples_of(poller.poll()), "gpu_process_sm_utilization_ratio", pid=str(TRAINER)) == 0.0
    assert not errors.counts.get(("nvmlDeviceGetProcessUtilization", "not_found"))
    poller.close()


def test_a_wall_clock_stepped_back_an_hour_leaves_per_process_utilization_read(scenario: Scenario, nvml: Any) -> None:
    """NTP steps the clock back an hour: the driver stamps its samples an hour below the newest one
    read.  Asked for samples since that one, it has none for an hour, and every busy process would
    read idle; the exporter asks since its previous read, on the stepped clock, and reads them."""
    g = hopper(scenario).process_utilization(50)
    g.add_process(TRAINER, 30 * GIB, name="trainer", sm=70, mem=25)
    scenario.write()
    poller, errors = make_poller()
    assert value(samples_of(poller.poll()), "gpu_process_sm_utilization_ratio", pid=str(TRAINER)) == pytest.approx(0.7)
    step_wall_clock(-3600)
    try:
        for _ in range(3):
            advance_clock(0.2)  # past the profiling interval and the driver's sample period
            s = samples_of(poller.poll())
            assert value(s, "gpu_process_sm_utilization_ratio", pid=str(TRAINER)) == pytest.approx(0.7)
            assert value(s, "gpu_process_memory_utilization_ratio", pid=str(TRAINER)) == pytest.approx(0.25)
    finally:
        step_wall_clock(3600)  # and forward again: the samples are newer than any seen, as they are
    advance_clock(0.2)
    assert value(samples_of(poller.poll()), "gpu_process_sm_utilization_ratio", pid=str(TRAINER)) == pytest.approx(0.7)
    assert not [k for k in errors.counts if "ProcessUtilization" in k[0]], errors.counts
    poller.close()


def test_per_process_utilization_respects_the_process_cap_and_labels(scenario: Scenario, nvml: Any) -> None:
    from gpu_exporter.serving.metrics import RenderOptions, gpu_families

    g = hopper(scenario).process_utilization(50)
    for i in range(5):
        g.add_process(5000 + i, (i + 1) * GIB, name="worker", sm=10 * (i + 1))
    scenario.write()
    poller, _ = make_poller()
    snap = poller.poll()
    fams = {f.name: f for f in gpu_families(snap, RenderOptions(process_top_n=2))}
    pids = {s.labels["pid"] for s in fams["gpu_process_sm_utilization_ratio"].samples}
    assert pids == {s.labels["pid"] for s in fams["gpu_process_memory_used_bytes"].samples} == {"5003", "5004"}
    poller.close()


@pytest.mark.parametrize(
    ("setup", "counted"),
    [
        (lambda g: g.process_utilization(None), ("nvmlDeviceGetProcessUtilization", "not_supported")),
        (lambda g: g.process_utilization(Err("NO_PERMISSION")), ("nvmlDeviceGetProcessUtilization", "no_permission")),
        (lambda g: g.process_utilization(50).mig_mode(True), None),  # MIG: not even asked
    ],
)
def test_per_process_utilization_absent_where_unavailable(
    scenario: Scenario, nvml: Any, setup: Any, counted: tuple[str, str] | None
) -> None:
    g = hopper(scenario)
    setup(g)
    g.add_process(TRAINER, 30 * GIB, name="trainer", sm=70)
    scenario.write()
    poller, errors = make_poller()
    for _ in range(3):
        s = samples_of(poller.poll())
        time.sleep(0.11)
    assert value(s, "gpu_process_sm_utilization_ratio", pid=str(TRAINER)) is None
    if counted is not None:
        assert errors.counts[counted] == 1  # not supported, or not allowed: said once, not at every poll
    poller.close()


def test_a_sentinel_process_utilization_is_unavailable_and_counted(scenario: Scenario, nvml: Any) -> None:
    g = hopper(scenario).process_utilization(50)
    g.add_process(TRAINER, 30 * GIB, name="trainer", sm=4294967295, mem=10)
    scenario.write()
    poller, errors = make_poller()
    s = samples_of(poller.poll())
    assert value(s, "gpu_process_sm_utilization_ratio", pid=str(TRAINER)) is None
    assert value(s, "gpu_process_memory_utilization_ratio", pid=str(TRAINER)) == pytest.approx(0.10)
    assert errors.counts[("nvmlDeviceGetProcessUtilization", "out_of_range")] == 1
    poller.close()


def test_the_profiling_interval_bounds_the_driver_calls(scenario: Scenario, nvml: Any) -> None:
    """GPM and per-process utilization cost the real driver ~1.2 and ~2 ms of CPU per call, so they
    are re-read once per profiling interval; between, the last values stand and no call is made
    (an error injected after the first read shows up only once the interval has passed)."""
    from gpu_exporter.sources.nvml import NvmlBackend
    from gpu_exporter.sources.poller import Poller

    g = hopper(scenario).process_utilization(50)
    g.add_process(TRAINER, 30 * GIB, name="trainer", sm=70)
    scenario.write()
    now = [1000.0]
    errors = ErrorLog()
    poller = Poller(NvmlBackend(errors, profiling_interval=10.0, monotonic=lambda: now[0]), errors=errors)
    poller.poll()
    now[0] += 10
    time.sleep(0.12)  # the fake driver's own clock: a GPM pair needs 100 ms of real time
    first = poller.poll().gpus[0]
    assert first.activity is not None and first.processes[0].sm_utilization_ratio == pytest.approx(0.7)
    g.gpm(sm_util=Err("UNKNOWN")).process_utilization(Err("UNKNOWN"))
    scenario.write()
    for _ in range(3):
        now[0] += 3  # within the 10 s interval
        again = poller.poll().gpus[0]
        assert again.activity == first.activity and again.processes == first.processes
    assert not [k for k in errors.counts if k[1] == "unknown"], "no call was made"
    now[0] += 2
    time.sleep(0.12)
    due = poller.poll().gpus[0]
    assert due.activity is not None and due.activity.sm is None  # the failing metric is now left out
    assert due.processes[0].sm_utilization_ratio is None
    assert errors.counts[("nvmlGpmMetricsGet", "unknown")] == 1
    assert errors.counts[("nvmlDeviceGetProcessUtilization", "unknown")] == 1
    poller.close()


# -- an older driver: GPM, the fan count and NVLink state missing --------------------------------------
OLD_DRIVER = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet",
              "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlDeviceGetNumFans", "nvmlDeviceGetFanSpeed_v2",
              "nvmlDeviceGetNvLinkState")  # fmt: skip


def test_an_older_driver_without_the_calls(tmp_path: Path) -> None:
    """Missing entry points are unsupported, counted once; fans fall back to nvmlDeviceGetFanSpeed,
    and missing NVLink state is said in the counter, so a panel without states has a reason (the link
    itself, which field 91 counts, still has its traffic counters)."""
    s = Scenario(tmp_path / "node.scn")
    hopper(s).fans(40).nvlink(0, True, tx_kib=1, rx_kib=1)
    s.write()
    lib_dir = build_library(hide=OLD_DRIVER).parent
    out = run_python(POLL_TWICE, s.path, library_dir=lib_dir)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["activity"] is None and result["utilization"] == 0.95
    assert result["fans"] == {"0": 0.4}
    assert result["nvlinks"] == 1 and result["up"] == [None]
    assert result["errors"] == {
        "nvmlGpmQueryDeviceSupport/function_not_found": 1,
        "nvmlDeviceGetNumFans/function_not_found": 1,
        "nvmlDeviceGetNvLinkState/function_not_found": 1,
    }
    assert "nvlink_state_unavailable" in out.stdout + out.stderr


# -- the nvidia-ml-py version matrix -------------------------------------------------------------------
OLDEST_NVML = ROOT / ".venv" / "nvidia-ml-py-oldest"  # installed by .ci/setup


def oldest_bindings() -> Path:
    if not (OLDEST_NVML / "pynvml.py").exists():
        pytest.fail(f"{OLDEST_NVML} is missing: run `bash .ci/setup`, which installs the oldest nvidia-ml-py we allow")
    return OLDEST_NVML


def allowed_minimum() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return text.split('"nvidia-ml-py>=', 1)[1].split('"', 1)[0]


@pytest.mark.parametrize("bindings", ["newest", "oldest"])
def test_the_exporter_works_with_the_oldest_and_newest_nvidia_ml_py(tmp_path: Path, bindings: str) -> None:
    """--once against a Hopper with GPM and MIG, through each version's own ctypes structs (their
    GPM metric arrays differ in length: 98 in 12.535, 477 in 13.x, under the same struct version)."""
    s = Scenario(tmp_path / "node.scn")
    hopper(s).process_utilization(50).add_process(TRAINER, GIB, name="trainer", sm=70)
    mig_node(s)
    s.write()
    env = subprocess_env(s.path)
    if bindings == "oldest":
        env["PYTHONPATH"] = str(oldest_bindings())
    check = "import pynvml, sys; print(pynvml.NVML_GPM_METRIC_MAX, pynvml.__file__)"
    probe = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True)
    arrays, where = probe.stdout.split()
    assert (int(arrays) == 98) == (bindings == "oldest"), probe.stdout
    assert (str(OLDEST_NVML) in where) == (bindings == "oldest")
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "--once", "--format", "json"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    g0, g1 = doc["gpus"][0], doc["gpus"][1]
    assert g0["gpu_sm_active_ratio"] == pytest.approx(0.62) and g0["gpu_tensor_active_ratio"] == pytest.approx(0.44)
    assert g0["gpu_process_sm_utilization_ratio"][0]["value"] == pytest.approx(0.70)
    migs = {m["gpu_instance_id"]: m["value"] for m in g1["gpu_mig_sm_active_ratio"]}
    assert migs == {1: pytest.approx(0.70), 5: pytest.approx(0.35), 13: pytest.approx(0.10)}  # ids are numbers
    assert "fake NVML" not in out.stderr  # nothing leaked


def test_the_oldest_bindings_are_the_oldest_the_project_allows() -> None:
    dist = sorted(oldest_bindings().glob("nvidia_ml_py-*.dist-info"))
    assert len(dist) == 1, dist
    installed = dist[0].name.removeprefix("nvidia_ml_py-").removesuffix(".dist-info")
    assert installed == allowed_minimum()


# The fake's GPM through nvidia-ml-py's own structs and calls, with no exporter code in between:
# the layouts the fake was compiled with (nvml.h) must agree with each bindings version's, and with
# the exporter's own struct, whose metric array is longer than any.
BINDINGS_CHECK = """
import ctypes, json, time, pynvml as N
from gpu_exporter.sources.nvml import profiling as ours
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
support = N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
N.nvmlGpmSampleGet(h, a)
time.sleep(0.15)
N.nvmlGpmSampleGet(h, b)
mg = N.c_nvmlGpmMetricsGet_t()
mg.version, mg.numMetrics, mg.sample1, mg.sample2 = N.NVML_GPM_METRICS_GET_VERSION, 3, a, b
for i, m in enumerate((2, 10, 7)):
    mg.metrics[i].metricId = m
N.nvmlGpmMetricsGet(mg)
got = [(mg.metrics[i].metricId, mg.metrics[i].nvmlReturn, round(mg.metrics[i].value, 3),
        (mg.metrics[i].metricInfo.shortName or b"").decode()) for i in range(3)]
N.nvmlGpmSampleFree(a)
N.nvmlGpmSampleFree(b)
N.nvmlShutdown()
theirs = N.c_nvmlGpmMetric_t
layout = [ctypes.sizeof(theirs) == ctypes.sizeof(ours._GpmMetric),
          theirs.value.offset == ours._GpmMetric.value.offset,
          theirs.metricInfo.offset == ours._GpmMetric.shortName.offset,
          N.c_nvmlGpmMetricsGet_t.metrics.offset == ours._GpmMetricsGet.metrics.offset,
          N.NVML_GPM_METRIC_MAX <= ours._GPM_METRIC_SLOTS]
print(json.dumps({"max": N.NVML_GPM_METRIC_MAX, "support": support, "got": got, "layout": layout}))
"""


@pytest.mark.parametrize("bindings", ["newest", "oldest"])
def test_the_fakes_gpm_layout_agrees_with_each_bindings_version(tmp_path: Path, bindings: str) -> None:
    s = Scenario(tmp_path / "node.scn")
    hopper(s).gpm(hmma_tensor_util=Err("NOT_SUPPORTED"))
    s.write()
    env = subprocess_env(s.path)
    if bindings == "oldest":
        env["PYTHONPATH"] = str(oldest_bindings())
    out = subprocess.run([sys.executable, "-c", BINDINGS_CHECK], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert (result["max"] == 98) == (bindings == "oldest")
    assert result["support"] == 1
    assert result["got"] == [[2, 0, 62.0, "sm_util"], [10, 0, 27.5, "dram_bw_util"], [7, 3, 0.0, ""]]
    assert result["layout"] == [True] * 5


def test_once_shows_activity_and_per_process_utilization(tmp_path: Path) -> None:
    s = Scenario(tmp_path / "node.scn")
    hopper(s).process_utilization(50).add_process(TRAINER, GIB, name="trainer", sm=70)
    s.write()
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "--once"], env=subprocess_env(s.path),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    (activity,) = [line for line in out.stdout.splitlines() if line.strip().startswith("activity ")]
    assert_mentions(" ".join(activity.split()), "SM 62%", "occupancy 31%", "tensor 44%", "DRAM 28%")
    assert "trainer" in out.stdout and "SM  70%" in out.stdout
