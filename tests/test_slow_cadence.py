"""Issue 36, item 7: what changes slowly is read at the rate it changes, not at every poll.

ECC counts, remapped rows, NVLink link states (18 calls on an H100) and error counters (54 field
values), the fabric's state, and where the driver has no
PCIe byte counters (R535) its throughput sample (two 20 ms waits), are read at most every
``poll_slow_interval`` (30 s by default) and shown from the last read meanwhile.  Counted with the
fake's call counter, on the driver's clock moved on by ``advance_clock``.
"""

from __future__ import annotations

from typing import Any

from gpu_exporter.metric_defs import METRICS
from gpu_exporter.settings.config import load_settings
from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.poller import Poller
from tests.exporter_helpers import ErrorLog, samples_of, value
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm
from tests.fakenvml.runtime import advance_clock, call_count, driver_monotonic, driver_wall_clock
from tests.fakenvml.values import fabric_health_mask

GIB = 2**30
SLOW = ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetGpuFabricInfoV")  # fmt: skip


def poller(slow_s: float) -> Poller:
    errors = ErrorLog()
    backend = NvmlBackend(errors, profiling_interval=10.0, monotonic=driver_monotonic, wall=driver_wall_clock,
                          slow_interval=slow_s)  # fmt: skip
    return Poller(backend, errors=errors, monotonic=driver_monotonic)


def calls() -> dict[str, int]:
    return {fn: call_count(fn) for fn in (*SLOW, "nvmlDeviceGetPcieThroughput")}


def per_poll(p: Poller, polls: int, gap_s: float = 5.0) -> dict[str, int]:
    before = calls()
    for _ in range(polls):
        advance_clock(gap_s)
        p.poll()
    return {fn: n - before[fn] for fn, n in calls().items()}


def test_ecc_rows_and_link_states_are_read_every_30_s_not_every_poll(scenario: Scenario, nvml: Any) -> None:
    scenario.driver(580)
    h100_sxm(scenario.add_gpu(), "slow", 0, util=90, mem_used=40 * GIB, power_mw=500_000)
    scenario.write()
    p = poller(30.0)
    try:
        p.poll()  # the first poll reads everything
        # Five polls 5 s apart (25 s): none of the slow queries again.
        assert per_poll(p, 5) == {fn: 0 for fn in (*SLOW, "nvmlDeviceGetPcieThroughput")}
        # The sixth poll is 30 s after the first read: each once (ECC twice: corrected, uncorrected).
        assert per_poll(p, 1) == {"nvmlDeviceGetNvLinkState": 18, "nvmlDeviceGetTotalEccErrors": 2,
                                  "nvmlDeviceGetRemappedRows": 1, "nvmlDeviceGetGpuFabricInfoV": 1,
                                  "nvmlDeviceGetPcieThroughput": 0}  # fmt: skip
        # Meanwhile the values stay on /metrics (from the last read), and a change shows at the next read.
        scenario.gpu(0).ecc(corrected=7, uncorrected=0)
        scenario.write()
        advance_clock(5)
        s = samples_of(p.poll())
        assert value(s, "gpu_ecc_errors_total", gpu="0", type="corrected") == 0
        assert value(s, "gpu_nvlink_up", gpu="0", link="17") == 1
        assert value(s, "gpu_nvlink_errors_total", gpu="0", link="17", error="crc") == 0
        assert value(s, "gpu_fabric_state", gpu="0") == 3
        advance_clock(30)
        assert value(samples_of(p.poll()), "gpu_ecc_errors_total", gpu="0", type="corrected") == 7
    finally:
        p.close()


def test_without_byte_counters_the_pcie_sample_is_taken_at_the_slow_cadence(scenario: Scenario, nvml: Any) -> None:
    """R535 has no PCIe byte counters: the rate is the driver's sample, which blocks 20 ms per
    direction.  Taken every 30 s, not every poll; the last sample stands meanwhile."""
    scenario.driver(535)
    h100_sxm(scenario.add_gpu(), "slow", 0, util=90, mem_used=40 * GIB, power_mw=500_000)
    scenario.write()
    p = poller(30.0)
    try:
        first = p.poll().gpus[0].pcie_tx_bytes_per_second
        assert first is not None
        assert per_poll(p, 4)["nvmlDeviceGetPcieThroughput"] == 0
        advance_clock(5)
        assert p.poll().gpus[0].pcie_tx_bytes_per_second == first  # 25 s on: the last sample, shown
        assert per_poll(p, 1)["nvmlDeviceGetPcieThroughput"] == 2  # tx and rx, 30 s after the first
    finally:
        p.close()


def test_every_poll_where_the_setting_says_0_and_30_s_by_default(scenario: Scenario, nvml: Any) -> None:
    assert load_settings({}).poll_slow_interval == 30.0
    scenario.driver(580)
    h100_sxm(scenario.add_gpu(), "slow", 0, util=90, mem_used=40 * GIB, power_mw=500_000)
    scenario.write()
    p = poller(0.0)
    try:
        p.poll()
        got = per_poll(p, 3)
        assert (got["nvmlDeviceGetNvLinkState"], got["nvmlDeviceGetTotalEccErrors"]) == (3 * 18, 3 * 2)
    finally:
        p.close()


def test_each_metric_declared_slow_holds_its_value_until_the_slow_read(scenario: Scenario, nvml: Any) -> None:
    """Every declaration marked ``slow`` (docs/metrics.md says such a value is up to 30 s old) shows
    a change made in the driver not at the next poll but at the next slow read, and every metric
    that behaves so is marked: the table of changes below covers exactly the slow declarations."""
    scenario.driver(580)
    g = h100_sxm(scenario.add_gpu(), "slow", 0, util=90, mem_used=40 * GIB, power_mw=500_000)
    g.remapped_rows(correctable=0, uncorrectable=0)
    scenario.write()
    # What moves each slow metric, and the series that shows it: (labels, before, after).
    moves: dict[str, tuple[dict[str, str], float, float]] = {
        "gpu_ecc_errors_total": ({"type": "uncorrected"}, 0, 2),
        "gpu_remapped_rows_total": ({"cause": "correctable"}, 0, 4),
        "gpu_row_remap_pending": ({}, 0, 1),
        "gpu_row_remap_failure": ({}, 0, 1),
        "gpu_nvlink_up": ({"link": "5"}, 1, 0),
        "gpu_nvlink_errors_total": ({"link": "5", "error": "replay"}, 0, 9),
        "gpu_fabric_state": ({}, 3, 2),
        "gpu_fabric_health": ({}, 1, 2),
        "gpu_fabric_issue": ({"issue": "degraded_bandwidth"}, 0, 1),
    }
    assert moves.keys() == {n for n, d in METRICS.items() if d.slow}
    p = poller(30.0)
    try:
        before = samples_of(p.poll())
        g.ecc(corrected=0, uncorrected=2).remapped_rows(correctable=4, pending=True, failure=True)
        g.nvlink(5, False).nvlink_errors(5, replay=9)
        g.fabric("in_progress", health_summary="unhealthy", health_mask=fabric_health_mask(DEGRADED_BW="TRUE"))
        g.utilization(20, 5)
        scenario.write()
        advance_clock(10)
        held = samples_of(p.poll())
        advance_clock(25)
        read = samples_of(p.poll())
    finally:
        p.close()
    for name, (labels, old, new) in moves.items():
        got = [value(s, name, gpu="0", **labels) for s in (before, held, read)]
        assert got == [old, old, new], name
    # What is not slow moves at the next poll.
    assert [value(s, "gpu_utilization_ratio", gpu="0") for s in (before, held)] == [0.9, 0.2]
