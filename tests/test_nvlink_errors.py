"""Issue 36: NVLink error counters per link, read where each generation has them, and NVLink-C2C's.

Hopper and older count replay, recovery and CRC errors in fields 161-163 (nvml.h
NVML_FI_DEV_NVLINK_ERROR_DL_*); Blackwell answers those NOT_SUPPORTED and counts NVLink 5's in
206-221, and its byte counters are 202/204 where 138/139 do not apply.  The fake takes its field ids
from nvml.h's macros, the exporter from its declarations: a wrong id shows as a missing series.
"""

from __future__ import annotations

from typing import Any

from tests.exporter_helpers import ErrorLog, make_poller, samples_of, value
from tests.fakenvml import Counter, Err, Scenario
from tests.fakenvml.presets import a100_sxm, h100_sxm, preset
from tests.fakenvml.runtime import advance_clock

GIB = 2**30
B200 = "NVIDIA B200"


def polls(n: int = 2) -> tuple[list[Any], ErrorLog]:
    poller, errors = make_poller()
    try:
        return [samples_of(poller.poll()) for _ in range(n)], errors
    finally:
        poller.close()


def refused_fields(errors: ErrorLog) -> int:
    return errors.counts[("nvmlDeviceGetFieldValues", "not_supported")]


def baseline(scenario: Scenario) -> int:
    """The field values the scenario's GPU refuses with its NVLink links taken away (memory
    temperature, the PCIe and perf-policy counters a bare scenario leaves out)."""
    g = scenario.gpus[0]
    kept = dict(g.values)
    g.values = {k: v for k, v in kept.items() if not k.startswith("nvlink.")}
    g.nvlinks(0)
    scenario.write()
    _, errors = polls(1)
    g.values = kept
    scenario.write()
    return refused_fields(errors)


def errors_of(samples: Any, gpu: str = "0") -> dict[tuple[str, str], float]:
    return {
        (dict(ls)["link"], dict(ls)["error"]): v
        for (n, ls), v in samples.items()
        if n == "gpu_nvlink_errors_total" and ("gpu", gpu) in ls
    }


def b200(scenario: Scenario, links: int = 18) -> Any:
    """A B200 as its driver reports it: Blackwell, NVLink 5 on 18 links."""
    g = scenario.add_gpu().identity(B200, "GPU-00000000-0000-0000-0000-0000000b2000").utilization(80, 40)
    g.nvlinks(links)
    for link in range(links):
        g.nvlink(link, True, tx_kib=Counter(1000 + link, 2_000_000), rx_kib=Counter(2000 + link, 1_000_000))
    return g


def test_a_hoppers_links_count_replay_recovery_and_crc(scenario: Scenario, nvml: Any) -> None:
    scenario.driver(580)
    g = h100_sxm(scenario.add_gpu(), "nvlerr", 0, util=90, mem_used=40 * GIB, power_mw=500_000)
    g.nvlink_errors(3, crc=5, replay=2).nvlink_errors(17, recovery=Counter(1, 0))
    scenario.write()
    (_, s), errors = polls()
    got = errors_of(s)
    assert set(got) == {(str(link), kind) for link in range(18) for kind in ("replay", "recovery", "crc")}
    assert (got["3", "crc"], got["3", "replay"], got["17", "recovery"], got["0", "crc"]) == (5, 2, 1, 0)
    # NVLink 5's fields are not asked of a Hopper: a refusal of one would count on each of 18 links
    # (the 6 are the perf-policy fields the preset leaves unsupported).
    assert errors.counts[("nvmlDeviceGetFieldValues", "not_supported")] < 18, errors.counts


def test_a_blackwells_links_count_nvlink_5s_errors_and_bytes(scenario: Scenario, nvml: Any) -> None:
    """The old fields are not asked of it (they would answer NOT_SUPPORTED on every link); its byte
    counters are NVLink 5's, in bytes."""
    scenario.driver(580)
    b200(scenario).nvlink_errors(1, symbol=7, effective=3, recovery_failed=1)
    scenario.write()
    refused = baseline(scenario)
    (_, s), errors = polls()
    got = errors_of(s)
    kinds = {kind for _, kind in got}
    assert "crc" not in kinds and {"symbol", "effective", "recovery_failed", "malformed_packet"} <= kinds
    assert (got["1", "symbol"], got["1", "effective"], got["1", "recovery_failed"], got["2", "symbol"]) == (7, 3, 1, 0)
    assert {link for link, _ in got} == {str(n) for n in range(18)}
    tx = {dict(ls)["link"]: v for (n, ls), v in s.items() if n == "gpu_nvlink_tx_bytes_total"}
    assert len(tx) == 18 and tx["5"] >= (1000 + 5) * 1024  # bytes, from field 202
    assert refused_fields(errors) == refused, "a field of the other generation was asked"


def test_a_gpu_of_unknown_architecture_is_asked_both_and_keeps_what_answers(scenario: Scenario, nvml: Any) -> None:
    """A chip newer than the bindings know (NVML_DEVICE_ARCH_UNKNOWN) is asked both generations'
    fields; the ones it refuses are counted once per link and field and not asked again."""
    scenario.driver(580)
    g = scenario.add_gpu().identity("NVIDIA Future GPU", "GPU-00000000-0000-0000-0000-00000000f00d")
    g.nvlinks(2).nvlink(0, True, tx_kib=10, rx_kib=20).nvlink(1, True, tx_kib=30, rx_kib=40)
    g.nvlink_errors(0, crc=4)
    scenario.write()
    refused = baseline(scenario)
    (_, s), errors = polls()
    assert errors_of(s) == {(str(link), k): (4 if (link, k) == (0, "crc") else 0)
                            for link in range(2) for k in ("replay", "recovery", "crc")}  # fmt: skip
    # 11 NVLink 5 kinds and 2 byte counters, on 2 links, refused once each: not at every poll.
    assert refused_fields(errors) - refused == 26


def test_the_blackwell_presets_through_the_exporter(scenario: Scenario, nvml: Any) -> None:
    """The HGX B200 and GB200 NVL72 tray presets: NVLink 5 errors and bytes on all 18 links of every
    GPU, a registered healthy fabric, and the GB200's global fabric manager connected."""
    for name, gpus in (("b200-8x-training", 8), ("gb200-nvl72-tray", 4)):
        preset(name, scenario.path).write()
        (_, s), errors = polls()
        for gpu in map(str, range(gpus)):
            got = errors_of(s, gpu)
            assert {link for link, _ in got} == {str(n) for n in range(18)} and ("0", "crc") not in got, name
            tx = [v for (n, ls), v in s.items() if n == "gpu_nvlink_tx_bytes_total" and ("gpu", gpu) in ls]
            assert len(tx) == 18 and min(tx) > 0, name
            assert value(s, "gpu_fabric_state", gpu=gpu) == 3 and value(s, "gpu_fabric_health", gpu=gpu) == 1
        gfm = value(s, "gpu_fabric_issue", gpu="0", issue="fabric_manager_disconnected")
        assert gfm == (0 if name.startswith("gb200") else None), name
        assert not [k for k in errors.counts if k[1] not in ("not_supported",)], errors.counts


def c2c_of(samples: Any, gpu: str = "0") -> dict[str, float]:
    return {
        dict(ls)["error"]: v for (n, ls), v in samples.items() if n == "gpu_c2c_errors_total" and ("gpu", gpu) in ls
    }


def test_a_grace_gpus_c2c_link_counts_its_errors(scenario: Scenario, nvml: Any) -> None:
    """GB200 (the preset): NVLink-C2C's CRC, replay and back-to-back replay counters per GPU, 0 where
    the link is clean, growing as the driver counts."""
    tray = preset("gb200-nvl72-tray", scenario.path)
    tray.gpus[1].c2c(crc=Counter(7, 10))
    tray.write()
    poller, errors = make_poller()
    try:
        first = samples_of(poller.poll())
        advance_clock(2)
        second = samples_of(poller.poll())
    finally:
        poller.close()
    assert c2c_of(first, "0") == {"crc": 0, "replay": 0, "replay_b2b": 0}
    assert c2c_of(first, "3") == {"crc": 0, "replay": 9, "replay_b2b": 0}
    # 10 a second, over the 2 s the driver's clock was moved on (and whatever real time passed too).
    assert c2c_of(second, "1")["crc"] - c2c_of(first, "1")["crc"] >= 20
    assert not [k for k in errors.counts if k[1] != "not_supported"], errors.counts


def test_a_gpu_without_c2c_has_no_series_and_is_asked_once(scenario: Scenario, nvml: Any) -> None:
    """An H100 (Hopper, no Grace) answers NOT_SUPPORTED, once, not at every poll; an A100 is not
    asked, as its driver would answer INVALID_ARGUMENT (what Datadog's agent found older
    architectures do), which the NVML-errors alert counts.  Neither shows a 0."""
    scenario.driver(580)
    h100_sxm(scenario.add_gpu(), "noc2c", 0, util=90, mem_used=40 * GIB, power_mw=500_000)
    a100_sxm(scenario.add_gpu(), "noc2c", 1)
    scenario.write()
    (first, *rest), errors = polls(3)
    for s in (first, *rest):
        assert c2c_of(s, "0") == {} and c2c_of(s, "1") == {}
    # The H100's three, and the perf-policy ids (74-79) both presets leave out: had the A100 been asked
    # C2C's, 3 more (or 3 invalid_argument).
    assert errors.counts[("nvmlDeviceGetFieldValues", "not_supported")] == 3 + 6 + 6, errors.counts
    assert ("nvmlDeviceGetFieldValues", "invalid_argument") not in errors.counts, errors.counts


def test_a_driver_whose_nvml_h_skips_the_c2c_ids_is_not_asked(scenario: Scenario, nvml: Any) -> None:
    """Driver 570's nvml.h has no 231-233 (it jumps from 230 to 235): a GB200 on it is not asked, so
    there is neither a series nor a refusal; on 580 the same GPU counts."""
    tray = preset("gb200-nvl72-tray", scenario.path)
    tray.driver(570).write()
    (s, _), errors = polls()
    assert c2c_of(s) == {} and ("nvmlDeviceGetFieldValues", "invalid_argument") not in errors.counts
    tray.driver(580).write()
    (s, _), _ = polls()
    assert c2c_of(s) == {"crc": 0, "replay": 0, "replay_b2b": 0}


def test_a_c2c_counter_that_errors_is_left_out_not_zero(scenario: Scenario, nvml: Any) -> None:
    tray = preset("gb200-nvl72-tray", scenario.path)
    tray.gpus[2].c2c(replay=Err("UNKNOWN"))
    tray.write()
    (s, _), errors = polls()
    assert c2c_of(s, "2") == {"crc": 0, "replay_b2b": 0} and c2c_of(s, "1")["replay"] == 3
    assert errors.counts[("nvmlDeviceGetFieldValues", "unknown")] == 2, errors.counts
