"""What a user sees through each driver profile and real drivers' quirks (issue 26): NVLink links
that exist and no others, field values that stay true when a driver accumulates into them, field ids
an older driver does not know, fans above 100%, a per-process sample racing the read, an error that
is not a card's fault counted once.  The fake's profiles and quirks are in tests/fakenvml/README.md."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_exporter.metric_defs import METRICS
from tests.exporter_helpers import make_poller, samples_of, value
from tests.fakenvml import Counter, Err, Scenario
from tests.fakenvml.presets import GIB, a100_sxm, h100_sxm, l40s, t4
from tests.fakenvml.runtime import call_count

CARDS: tuple[tuple[str, Any, int], ...] = (("A100", a100_sxm, 12), ("H100", h100_sxm, 18), ("L40S", l40s, 0),
                                           ("T4", t4, 0))  # fmt: skip


def links_of(samples: Any, gpu: str, name: str = "gpu_nvlink_up") -> set[str]:
    return {dict(ls)["link"] for (n, ls) in samples if n == name and ("gpu", gpu) in ls}


def four_cards(scenario: Scenario, beyond: int | None) -> None:
    for i, (_, card, links) in enumerate(CARDS):
        extra = {"power_mw": 500_000} if card is h100_sxm else {}
        card(scenario.add_gpu(), "fleet", i, util=50, mem_used=GIB, **extra).nvlinks(links, beyond=beyond)
    scenario.write()


@pytest.mark.parametrize("beyond", [None, 0], ids=["past-the-count-invalid", "past-the-count-inactive"])
def test_nvlink_series_only_for_the_links_each_card_has(scenario: Scenario, nvml: Any, beyond: int | None) -> None:
    """A100 12 links, H100 18, L40S and T4 none, whatever a link past the count answers: no fleet
    dashboard shows a link that does not exist as down."""
    four_cards(scenario, beyond)
    poller, _ = make_poller()
    s = samples_of(poller.poll())
    for gpu, (card, _, links) in enumerate(CARDS):
        want = {str(link) for link in range(links)}
        for name in ("gpu_nvlink_up", "gpu_nvlink_tx_bytes_total", "gpu_nvlink_rx_bytes_total"):
            assert links_of(s, str(gpu), name) == want, (card, name)
        assert all(value(s, "gpu_nvlink_up", gpu=str(gpu), link=k) == 1 for k in want), card


def test_a_gap_in_the_link_list_hides_no_later_link(scenario: Scenario, nvml: Any) -> None:
    """An inactive port of an H100 NVL answers NOT_SUPPORTED (DataDog's NVML check): that link has no
    state series, and every later link still has its own."""
    g = h100_sxm(scenario.add_gpu(), "gap", 0, util=50, mem_used=GIB, power_mw=500_000)
    g.error("nvlink.4.state", "NOT_SUPPORTED").error("nvlink.4.tx_kib", "NOT_SUPPORTED")
    g.error("nvlink.4.rx_kib", "NOT_SUPPORTED")
    scenario.write()
    poller, errors = make_poller()
    for _ in range(3):
        s = samples_of(poller.poll())
    assert links_of(s, "0") == {str(link) for link in range(18)} - {"4"}
    assert links_of(s, "0", "gpu_nvlink_tx_bytes_total") == {str(link) for link in range(18)} - {"4"}
    assert errors.counts[("nvmlDeviceGetNvLinkState", "not_supported")] == 1  # once, not per poll


def test_field_values_stay_true_where_the_driver_adds_into_the_callers_value(scenario: Scenario, nvml: Any) -> None:
    """go-nvml #46: a driver that adds into the caller's ``value``; one reused array must be zeroed."""
    g = h100_sxm(scenario.add_gpu(), "acc", 0, util=50, mem_used=GIB, power_mw=500_000).fields_accumulate()
    g.temperature(60, memory=71).violations(power=5_000_000_000, thermal=0)
    g.pcie(tx_bytes=Counter(5 * 2**32, 0), rx_bytes=Counter(6 * 2**32, 0))
    g.nvlink(0, True, tx_kib=Counter(1000, 0), rx_kib=Counter(2000, 0))
    scenario.write()
    poller, _ = make_poller()
    for _ in range(4):
        s = samples_of(poller.poll())
        assert value(s, "gpu_temperature_celsius", sensor="memory") == 71
        assert value(s, "gpu_violation_seconds_total", policy="power") == 5.0
        assert value(s, "gpu_pcie_tx_bytes_total") == 5 * 2**32
        assert value(s, "gpu_nvlink_tx_bytes_total", link="0") == 1000 * 1024


def test_a_field_answered_as_an_unsigned_short(scenario: Scenario, nvml: Any) -> None:
    """NVML_VALUE_TYPE_UNSIGNED_SHORT (6, from R570): read as two bytes, not as the whole union."""
    scenario.driver(570)
    h100_sxm(scenario.add_gpu(), "us", 0, util=50, mem_used=GIB, power_mw=500_000).temperature(
        60, memory=61, memory_value_type=6
    )
    scenario.write()
    poller, errors = make_poller()
    s = samples_of(poller.poll())
    assert value(s, "gpu_temperature_celsius", sensor="memory") == 61
    assert ("nvmlDeviceGetFieldValues", "unknown_value_type") not in errors.counts


@pytest.mark.parametrize("branch", [535, 550, 570, 580])
def test_each_driver_branch(scenario: Scenario, nvml: Any, branch: int) -> None:
    """R535 does not know the PCIe byte counters (fields 197/198, after its NVML_FI_MAX of 197): no
    counter series, the rate from the driver's sample, and the unknown fields counted once, not per
    poll.  Later branches have them."""
    scenario.driver(branch)
    h100_sxm(scenario.add_gpu(), "branch", 0, util=50, mem_used=GIB, power_mw=500_000).violations(
        power=10**9, thermal=0, sync_boost=0, board_limit=0, low_utilization=0, reliability=0
    )
    scenario.write()
    poller, errors = make_poller()
    for _ in range(4):
        s = samples_of(poller.poll())
    counters = value(s, "gpu_pcie_tx_bytes_total"), value(s, "gpu_pcie_rx_bytes_total")
    assert (counters == (None, None)) == (branch == 535)
    assert value(s, "gpu_pcie_tx_bytes_per_second") == pytest.approx(1_800_000 * 1024, rel=0.05)
    assert value(s, "gpu_temperature_celsius", sensor="memory") is not None  # field 82: every branch
    assert value(s, "gpu_violation_seconds_total", policy="power") is not None  # fields 74-79: every branch
    field_errors = {k: n for k, n in errors.counts.items() if k[0] == "nvmlDeviceGetFieldValues"}
    # 535 knows no PCIe byte counters (197/198); 580 is the first asked NVLink-C2C's (231-233), which an
    # H100 without Grace refuses, once.
    assert field_errors == {535: {("nvmlDeviceGetFieldValues", "invalid_argument"): 2},
                            580: {("nvmlDeviceGetFieldValues", "not_supported"): 3}}.get(branch, {})  # fmt: skip
    assert {k for k in errors.counts if k[1] == "function_not_found"} == set()


@pytest.mark.parametrize(
    ("branch", "version", "has"),
    [(570, None, False), (580, None, False), (580, "580.82.07", True), (590, "590.44.01", True)],
    ids=["570", "580.65", "580.82", "590"],
)
def test_the_clock_event_counters_from_the_driver_whose_nvml_h_has_them(
    scenario: Scenario, nvml: Any, branch: int, version: str | None, has: bool
) -> None:
    """Fields 269-271 are the clock event reason counters from nvidia-ml-py 13.580.82's nvml.h on: R570
    does not know the ids (its NVML_FI_MAX is 269) and 580.65's header numbered the counters 251-253,
    so neither is asked (no error counted) and no series is there; 580.82 and later have them.  The
    perf-policy counters (74-79) are the same on every driver."""
    scenario.driver(min(branch, 580))
    if version is not None:
        scenario.driver_version, scenario.nvml_version = version, "13." + version
    g = h100_sxm(scenario.add_gpu(), "branch", 0, util=50, mem_used=GIB, power_mw=500_000)
    g.violations(power=10**9, thermal=2 * 10**9, sync_boost=0, board_limit=0, low_utilization=0, reliability=0)
    g.clock_event_counters(sw_thermal=3 * 10**9, hw_thermal=0, hw_power_brake=Counter(10**9, 5e8))
    scenario.write()
    poller, errors = make_poller()
    s = samples_of(poller.poll())
    counters = {dict(ls)["reason"]: v for (n, ls), v in s.items() if n == "gpu_clock_event_seconds_total"}
    assert counters.keys() == ({"sw_thermal", "hw_thermal", "hw_power_brake"} if has else set())
    if has:
        assert counters["sw_thermal"] == 3.0 and counters["hw_thermal"] == 0
        assert counters["hw_power_brake"] == pytest.approx(1.0, abs=0.5)
    assert value(s, "gpu_violation_seconds_total", policy="thermal") == 2.0
    # Nothing refused but NVLink-C2C's ids (231-233, asked from 575 on), which an H100 without Grace has not.
    refused = {k: n for k, n in errors.counts.items() if k[0] == "nvmlDeviceGetFieldValues"}
    assert refused == ({("nvmlDeviceGetFieldValues", "not_supported"): 3} if branch >= 580 else {})
    poller.close()


def test_a_fan_above_100_percent_is_kept(scenario: Scenario, nvml: Any) -> None:
    """nvml.h: the fan speed "may exceed 100% in certain cases"."""
    g = scenario.add_gpu().identity("NVIDIA GeForce RTX 4090", "GPU-0000000a-0000-0000-0000-000000000000")
    g.fans(112, 45)
    scenario.write()
    poller, errors = make_poller()
    s = samples_of(poller.poll())
    assert value(s, "gpu_fan_speed_ratio", fan="0") == pytest.approx(1.12)
    assert value(s, "gpu_fan_speed_ratio", fan="1") == pytest.approx(0.45)
    assert ("nvmlDeviceGetFanSpeed_v2", "out_of_range") not in errors.counts


def test_a_process_sample_landing_between_the_two_calls_is_read_again(scenario: Scenario, nvml: Any) -> None:
    g = h100_sxm(scenario.add_gpu(), "race", 0, util=50, mem_used=GIB, power_mw=500_000)
    g.add_process(4242, GIB, name="trainer", sm=70, mem=20).process_util_race(1)
    scenario.write()
    poller, errors = make_poller()
    s = samples_of(poller.poll())
    assert value(s, "gpu_process_sm_utilization_ratio", pid="4242") == pytest.approx(0.70)
    assert ("nvmlDeviceGetProcessUtilization", "insufficient_size") not in errors.counts


def test_no_permission_is_counted_once_like_an_unsupported_query(scenario: Scenario, nvml: Any) -> None:
    g = h100_sxm(scenario.add_gpu(), "perm", 0, util=50, mem_used=GIB, power_mw=500_000)
    g.error("power.usage_mw", "NO_PERMISSION").error("ecc.corrected.aggregate", Err("NO_PERMISSION"))
    scenario.write()
    poller, errors = make_poller()
    for _ in range(3):
        s = samples_of(poller.poll())
    assert value(s, "gpu_power_usage_watts") is None
    assert errors.counts[("nvmlDeviceGetPowerUsage", "no_permission")] == 1
    assert errors.counts[("nvmlDeviceGetTotalEccErrors", "no_permission")] == 1


def test_the_docs_say_what_ecc_and_power_measure() -> None:
    """dcgm-exporter's DCGM_FI_DEV_ECC_DBE_VOL_TOTAL is volatile (since the driver loaded); ours is the
    aggregate (lifetime) count.  nvml.h: power is instantaneous on GA100 and older, a 1 s average on
    other Ampere and newer GPUs."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `DCGM_FI_DEV_ECC_DBE_"))
    assert row.startswith("| `DCGM_FI_DEV_ECC_DBE_AGG_TOTAL`") and "gpu_ecc_errors_total" in row
    assert "VOL" in row  # and says the volatile one is another count
    power = METRICS["gpu_power_usage_watts"].doc
    assert "instantaneous" in power and "1 s average" in power and "A100" in power and "H100" in power
    ecc = METRICS["gpu_ecc_errors_total"].doc
    assert "aggregate" in ecc and "volatile" in ecc


@pytest.mark.parametrize(("branch", "versioned"), [(535, False), (550, False), (570, True), (580, True)])
def test_the_temperature_is_read_through_the_versioned_call_where_the_driver_has_it(
    scenario: Scenario, nvml: Any, branch: int, versioned: bool
) -> None:
    """nvml.h deprecates nvmlDeviceGetTemperature (gone in CUDA 14) for nvmlDeviceGetTemperatureV, new
    in R570: asked of 570 and later, the old call of older drivers, and neither counted as missing."""
    scenario.driver(branch)
    h100_sxm(scenario.add_gpu(), "temp", 0, util=50, mem_used=GIB, power_mw=500_000).temperature(71, memory=80)
    scenario.write()

    def counts() -> tuple[int, int]:  # a prefix counts every name it starts: the V call and the thresholds too
        v = call_count("nvmlDeviceGetTemperatureV")
        return v, call_count("nvmlDeviceGetTemperature") - v - call_count("nvmlDeviceGetTemperatureThreshold")

    before = counts()
    poller, errors = make_poller()
    s = samples_of(poller.poll())
    poller.close()
    v, old = (n - b for n, b in zip(counts(), before, strict=True))
    assert (v > 0, old > 0) == (versioned, not versioned)
    assert value(s, "gpu_temperature_celsius", sensor="gpu") == 71
    assert {k for k in errors.counts if k[1] == "function_not_found"} == set()
