"""Every metric's value and unit, read through the real pynvml from the fake driver."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.accounting.pricing import PriceBook
from gpu_exporter.accounting.settings import PricingSettings
from gpu_exporter.metric_defs import METRICS, Scope
from gpu_exporter.serving.accounting_metrics import accounting_families
from tests.exporter_helpers import make_poller, names_for_gpu, samples_of, value, wait_for
from tests.fakenvml import Counter, Err, Scenario
from tests.fakenvml.presets import preset
from tests.fakenvml.values import fabric_health_mask
from tests.timing import LATE_S, NEVER_S

GIB = 1024**3
MIB = 1024**2
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def full_node(scenario: Scenario, live_pid: int) -> None:
    # R580 from 580.82 on, the first driver whose nvml.h has the clock event reason counters 269-271.
    scenario.driver(580).driver_version, scenario.nvml_version = "580.82.07", "13.580.82.07"
    # A Grace Hopper, so that NVLink-C2C's counters are there too (an H100 on HGX has no C2C).
    g = scenario.add_gpu().identity("NVIDIA GH200 480GB", UUID).pci("00000000:18:00.0").serial("1652324000123")
    g.minor_number(4)  # /dev/nvidia4: not the index (a GPU the container does not see, or a renumbering)
    g.utilization(87, 41).memory(80 * GIB, 60 * GIB, reserved=512 * MIB).codec(12, 7)
    g.temperature(66, memory=71).thresholds(shutdown=92, slowdown=89, mem_max=95, gpu_max=87)
    g.fans(30, 45)
    g.power(612_345, 700_000).energy(123_456_789)
    g.clocks(graphics=1755, sm=1760, memory=2619, video=1500, max_graphics=1980, max_sm=1985, max_memory=2620,
             max_video=1755)  # fmt: skip
    g.pstate(2).clocks_event_reasons("sw_power_cap", "hw_thermal")
    g.violations(power=12_500_000_000, thermal=250_000_000, sync_boost=0, board_limit=1, low_utilization=3 * 10**18,
                 reliability=Err("NOT_SUPPORTED"))  # fmt: skip
    g.clock_event_counters(sw_thermal=1_500_000_000, hw_thermal=250_000_000, hw_power_brake=Err("NOT_SUPPORTED"))
    # Counters past 2^32 (64 bits wide: trusted whatever the driver's sample says, sources/nvml/pcie.py).
    g.pcie(gen=4, max_gen=5, width=8, max_width=16, tx_kbps=123_456, rx_kbps=654_321, sample_ms=1, replay=17,
           tx_bytes=2**40 + 1111, rx_bytes=2**40 + 2222)  # fmt: skip
    g.nvlink(0, True, tx_kib=1000, rx_kib=2000).nvlink(1, False, tx_kib=3000, rx_kib=4000)
    g.ecc(corrected=5, uncorrected=1).remapped_rows(correctable=3, uncorrectable=1, pending=True, failure=False)
    g.mig_mode(False).recovery_action(2)  # the driver asks for a node reboot
    g.c2c(crc=2, replay=Counter(40, 0), replay_b2b=1)
    # A fabric registered, degraded, wrongly configured; two fields the driver does not report.
    g.fabric("completed", health_summary="limited_capacity", health_mask=fabric_health_mask(
        DEGRADED_BW="TRUE", ROUTE_RECOVERY="FALSE", INCORRECT_CONFIGURATION="INSUFFICIENT_NVLINKS",
        GFM_STATE="CONNECTED"))  # fmt: skip
    g.gpm_supported().gpm(graphics_util=91, sm_util=62, sm_occupancy=31, any_tensor_util=44, dram_bw_util=27,
                          fp64_util=1, fp32_util=12, fp16_util=3)  # fmt: skip
    g.process_utilization(100)
    g.add_process(live_pid, 3 * GIB, sm=58, mem=21)
    g.add_process(999_999_001, 2 * GIB, name="/opt/conda/bin/trainer")
    g.add_process(999_999_002, None)  # memory not available: no series
    g.add_process(999_999_003, 1 * GIB, name=Err("NO_PERMISSION"))
    scenario.write()


def test_every_metric_value_and_unit(scenario: Scenario, nvml: Any, live_process: Any) -> None:
    full_node(scenario, live_process.pid)
    poller, errors = make_poller()
    snap = poller.poll()
    s = samples_of(snap)
    g = {"gpu": "0", "uuid": UUID}
    expected = {
        "gpu_up": 1,
        "gpu_utilization_ratio": 0.87,
        "gpu_memory_copy_utilization_ratio": 0.41,
        "gpu_encoder_utilization_ratio": 0.12,
        "gpu_decoder_utilization_ratio": 0.07,
        "gpu_memory_total_bytes": 80 * GIB,
        "gpu_memory_used_bytes": 60 * GIB,  # v2: reserved memory is not "used"
        "gpu_memory_reserved_bytes": 512 * MIB,
        "gpu_memory_free_bytes": 80 * GIB - 60 * GIB - 512 * MIB,
        "gpu_power_usage_watts": 612.345,  # mW / 1000
        "gpu_power_limit_watts": 700.0,
        "gpu_energy_consumed_joules_total": 123_456.789,  # mJ / 1000
        "gpu_performance_state": 2,
        "gpu_pcie_tx_bytes_per_second": 123_456 * 1024,  # KB/s x 1024
        "gpu_pcie_rx_bytes_per_second": 654_321 * 1024,
        "gpu_pcie_tx_bytes_total": 2**40 + 1111,
        "gpu_pcie_rx_bytes_total": 2**40 + 2222,
        "gpu_pcie_link_generation": 4,
        "gpu_pcie_link_max_generation": 5,
        "gpu_pcie_link_width": 8,
        "gpu_pcie_link_max_width": 16,
        "gpu_pcie_link_max_bytes_per_second": 16e9 * 128 / 130 / 8 * 8,  # Gen4 x8, one direction
        "gpu_pcie_replay_errors_total": 17,
        "gpu_recovery_action": 2,
        "gpu_fabric_state": 3,
        "gpu_fabric_health": 3,
        "gpu_row_remap_pending": 1,
        "gpu_row_remap_failure": 0,
    }
    for name, want in expected.items():
        assert value(s, name, **g) == pytest.approx(want), name
    labelled: dict[tuple[str, str], dict[str, float]] = {
        ("gpu_temperature_celsius", "sensor"): {"gpu": 66, "memory": 71},
        ("gpu_temperature_threshold_celsius", "threshold"): {"shutdown": 92, "slowdown": 89, "mem_max": 95,
                                                               "gpu_max": 87},
        ("gpu_fan_speed_ratio", "fan"): {"0": 0.30, "1": 0.45},
        ("gpu_clock_hertz", "clock"): {"graphics": 1755e6, "sm": 1760e6, "memory": 2619e6, "video": 1500e6},
        ("gpu_clock_max_hertz", "clock"): {"graphics": 1980e6, "sm": 1985e6, "memory": 2620e6, "video": 1755e6},
        ("gpu_nvlink_tx_bytes_total", "link"): {"0": 1000 * 1024, "1": 3000 * 1024},  # KiB x 1024
        ("gpu_nvlink_rx_bytes_total", "link"): {"0": 2000 * 1024, "1": 4000 * 1024},
        ("gpu_nvlink_up", "link"): {"0": 1, "1": 0},
        ("gpu_ecc_errors_total", "type"): {"corrected": 5, "uncorrected": 1},
        ("gpu_remapped_rows_total", "cause"): {"correctable": 3, "uncorrectable": 1},
        # nanoseconds / 1e9; past 2^53 ns (104 days) the float keeps 15 digits
        ("gpu_violation_seconds_total", "policy"): {"power": 12.5, "thermal": 0.25, "sync_boost": 0,
                                                    "board_limit": 1e-9, "low_utilization": 3e9},
        ("gpu_clock_event_seconds_total", "reason"): {"sw_thermal": 1.5, "hw_thermal": 0.25},
        ("gpu_c2c_errors_total", "error"): {"crc": 2, "replay": 40, "replay_b2b": 1},
        ("gpu_fabric_issue", "issue"): {"degraded_bandwidth": 1, "route_recovery": 0, "incorrect_configuration": 1,
                                        "fabric_manager_disconnected": 0, "registration_failed": 0},
    }  # fmt: skip
    for (name, label), want_map in labelled.items():
        for key, want in want_map.items():
            assert value(s, name, **g, **{label: key}) == pytest.approx(want), (name, key)
    policies = {dict(ls)["policy"] for (n, ls) in s if n == "gpu_violation_seconds_total"}
    assert policies == {"power", "thermal", "sync_boost", "board_limit", "low_utilization"}  # reliability: unsupported
    issues = {dict(ls)["issue"] for (n, ls) in s if n == "gpu_fabric_issue"}
    assert issues == {
        "degraded_bandwidth",
        "route_recovery",
        "incorrect_configuration",
        "fabric_manager_disconnected",
        "registration_failed",
    }  # route_unhealthy, access_timeout_recovery: not reported, left out
    reasons_counted = {dict(ls)["reason"] for (n, ls) in s if n == "gpu_clock_event_seconds_total"}
    assert reasons_counted == {"sw_thermal", "hw_thermal"}  # hw_power_brake: unsupported, left out, not 0
    assert errors.counts[("nvmlDeviceGetFieldValues", "not_supported")] == 2
    reasons = {k: value(s, "gpu_clock_event_active", **g, reason=k) for k in ("sw_power_cap", "hw_thermal", "gpu_idle")}
    assert reasons == {"sw_power_cap": 1, "hw_thermal": 1, "gpu_idle": 0}
    info = [dict(ls) for (n, ls) in s if n == "gpu_info"]
    assert info == [{"gpu": "0", "uuid": UUID, "name": "NVIDIA GH200 480GB", "pci_bus_id": "00000000:18:00.0",
                     "driver_version": "580.82.07", "cuda_version": "13.0", "serial": "1652324000123",
                     "mig_mode": "disabled", "device": "nvidia4"}]  # fmt: skip
    procs = {
        (dict(ls)["pid"], dict(ls)["process"]): v for (n, ls), v in s.items() if n == "gpu_process_memory_used_bytes"
    }
    comm = Path(f"/proc/{live_process.pid}/comm").read_text().strip()
    assert procs == {
        (str(live_process.pid), comm): 3 * GIB,  # from /proc
        ("999999001", "trainer"): 2 * GIB,  # from NVML: /proc does not know this pid
        ("999999003", "unknown"): 1 * GIB,  # neither /proc nor NVML can name it
    }  # fmt: skip
    assert not errors.counts.get(("nvmlDeviceGetPowerUsage", "not_supported"))


def test_unsupported_values_are_left_out_and_counted_once(scenario: Scenario, nvml: Any) -> None:
    s = preset("workstation-2x-consumer", scenario.path)
    s.write()
    poller, errors = make_poller()
    snaps = [poller.poll() for _ in range(3)]
    samples = samples_of(snaps[-1])
    for gpu in ("0", "1"):
        present = names_for_gpu(samples, gpu)
        for absent in ("gpu_ecc_errors_total", "gpu_nvlink_up", "gpu_nvlink_tx_bytes_total",
                       "gpu_energy_consumed_joules_total", "gpu_remapped_rows_total", "gpu_row_remap_pending",
                       "gpu_pcie_tx_bytes_total"):  # fmt: skip
            assert absent not in present, (gpu, absent)
        assert value(samples, "gpu_temperature_celsius", gpu=gpu, sensor="memory") is None
        assert value(samples, "gpu_temperature_celsius", gpu=gpu, sensor="gpu") is not None
    assert value(samples, "gpu_fan_speed_ratio", gpu="0", fan="0") == pytest.approx(0.45)
    assert "gpu_fan_speed_ratio" not in names_for_gpu(samples, "1")  # its only fan cannot be read
    info = next(dict(ls) for (n, ls) in samples if n == "gpu_info" and ("gpu", "0") in ls)
    assert info["serial"] == ""
    # NOT_SUPPORTED is remembered: counted once per GPU and query, not once per poll.
    assert errors.counts[("nvmlDeviceGetTotalEnergyConsumption", "not_supported")] == 2
    assert errors.counts[("nvmlDeviceGetFanSpeed_v2", "not_supported")] == 1


def test_lost_gpu_mid_run_and_back(scenario: Scenario, nvml: Any) -> None:
    s = preset("h100-8x-training", scenario.path)
    s.write()
    poller, errors = make_poller()
    before = samples_of(poller.poll())
    uuid3 = s.gpu(3).values["uuid"]
    assert value(before, "gpu_up", gpu="3") == 1
    s.gpu(3).lost()
    s.write()
    during = samples_of(poller.poll())
    assert value(during, "gpu_up", gpu="3", uuid=str(uuid3)) == 0
    assert names_for_gpu(during, "3") == {"gpu_up"}  # its other series disappear
    assert all(value(during, "gpu_up", gpu=str(i)) == 1 for i in range(8) if i != 3)
    assert value(during, "gpu_utilization_ratio", gpu="4") is not None
    # Counted under the poll's first query of it (the MIG mode check, on a card with MIG).
    assert sum(n for (_, error), n in errors.counts.items() if error == "gpu_is_lost") >= 1
    s.gpu(3).recovered()
    s.write()
    after = samples_of(poller.poll())
    assert value(after, "gpu_up", gpu="3") == 1
    assert names_for_gpu(after, "3") == names_for_gpu(before, "3")


def test_static_facts_are_not_reread_every_poll(scenario: Scenario, nvml: Any) -> None:
    scenario.add_gpu().identity("Old Name", UUID).utilization(10, 10).clocks(max_graphics=1000)
    scenario.write()
    poller, _ = make_poller(static_refresh_s=0.3)
    poller.poll()
    scenario.gpu(0).identity("New Name", UUID).utilization(20, 10).clocks(max_graphics=2000)
    scenario.write()
    s = samples_of(poller.poll())
    assert value(s, "gpu_utilization_ratio", gpu="0") == pytest.approx(0.2)  # dynamic: fresh
    assert value(s, "gpu_clock_max_hertz", gpu="0", clock="graphics") == 1000e6  # static: cached
    time.sleep(0.35)
    s = samples_of(poller.poll())
    assert value(s, "gpu_clock_max_hertz", gpu="0", clock="graphics") == 2000e6
    assert {dict(ls)["name"] for (n, ls) in s if n == "gpu_info"} == {"New Name"}


def test_gpus_are_sampled_in_parallel(scenario: Scenario, nvml: Any) -> None:
    gpus, sample_s = 64, 0.1
    for i in range(gpus):
        scenario.add_gpu().identity(f"g{i}", f"GPU-00000000-0000-0000-0000-{i:012d}").pcie(
            tx_kbps=1,
            rx_kbps=1,
            sample_ms=sample_s * 1000,
            tx_bytes=Err("NOT_SUPPORTED"),
            rx_bytes=Err("NOT_SUPPORTED"),
        )  # no byte counters: each poll takes the driver's blocking samples
    scenario.write()
    poller, _ = make_poller(gpu_timeout_s=NEVER_S)
    poller.poll()  # discovery
    snap = poller.poll()
    # In parallel, a poll takes one GPU's two samples (0.2 s); one after another, 64 GPUs x 2 x 0.1 s =
    # 12.8 s, more than the 0.2 s + LATE_S a busy machine may take.
    assert gpus * 2 * sample_s > 2 * sample_s + LATE_S
    assert snap.duration_seconds < 2 * sample_s + LATE_S
    assert len(snap.gpus) == gpus
    assert all(g.pcie_rx_bytes_per_second == 1024 for g in snap.gpus)


def test_a_hung_gpu_does_not_hold_up_the_others(scenario: Scenario, nvml: Any) -> None:
    for i in range(3):
        scenario.add_gpu().identity(f"g{i}", f"GPU-00000000-0000-0000-0000-{i:012d}").utilization(50, 5)
    scenario.write()
    poller, errors = make_poller(gpu_timeout_s=2.0)
    poller.poll()
    # Stuck for longer than the GPU timeout + LATE_S: a poll that waited for it would be seen to.
    scenario.gpu(1).delay(1000 * (2.0 + 2 * LATE_S))
    scenario.write()
    t0 = time.monotonic()
    snap = poller.poll()
    assert time.monotonic() - t0 < 2.0 + LATE_S
    assert [g.up for g in snap.gpus] == [True, False, True]
    assert "no answer within" in (snap.gpus[1].error or "")
    assert errors.counts[("poll", "timeout")] == 1


def test_xid_events_are_counted(scenario: Scenario, nvml: Any) -> None:
    scenario.add_gpu().identity("g", UUID).utilization(1, 1)
    scenario.write()
    poller, _ = make_poller()
    poller.poll()
    scenario.gpu(0).add_xid(79).add_xid(79).add_xid(48)
    scenario.write()

    def counted() -> bool:
        s = samples_of(poller.poll())
        return value(s, "gpu_xid_errors_total", xid="79") == 2 and value(s, "gpu_xid_errors_total", xid="48") == 1

    wait_for(counted, what="XID events in the snapshot")
    poller.close()


def test_counters_move_between_polls(scenario: Scenario, nvml: Any) -> None:
    scenario.add_gpu().identity("g", UUID).energy(Counter(0, 1_000_000)).pcie(tx_bytes=Counter(0, 1e9), sample_ms=1)
    scenario.write()
    poller, _ = make_poller()
    a = samples_of(poller.poll())
    time.sleep(0.05)
    b = samples_of(poller.poll())
    for name in ("gpu_energy_consumed_joules_total", "gpu_pcie_tx_bytes_total"):
        assert (value(b, name) or 0) > (value(a, name) or 0)


def test_metric_table_covers_every_emitted_name(scenario: Scenario, nvml: Any, live_process: Any) -> None:
    full_node(scenario, live_process.pid)
    scenario.gpu(0).add_xid(31)
    scenario.write()
    poller, _ = make_poller()
    poller.poll()
    wait_for(lambda: any(g.xid_errors_total for g in poller.poll().gpus), what="an XID")
    wait_for(lambda: poller.poll().gpus[0].activity is not None, what="two GPM samples 100 ms apart")
    snapshot = poller.poll()
    emitted = {n for (n, _) in samples_of(snapshot)}
    # The accounting's books, priced, render from the same snapshots (tests/test_accounting_daemon.py).
    books = Accountant(
        threshold=0.1, prices=PriceBook(PricingSettings(currency="USD", default=1.0, energy_per_kwh=0.1))
    )
    books.observe(snapshot)
    emitted |= {s.name for fam in accounting_families(books.view()) for s in fam.samples}
    # Every per-GPU and per-process declaration; MIG devices and pod attribution have their own tests
    # (test_exporter_mig, test_pod_attribution), the exporter's health its own.
    gpu_metrics = {n for n, d in METRICS.items() if d.scope in (Scope.GPU, Scope.PROCESS) and not d.pods}
    assert emitted == gpu_metrics
    poller.close()


def test_nvml_timeouts_leave_values_out_and_are_counted(scenario: Scenario, nvml: Any) -> None:
    """A query that times out in the driver loses that value for this poll only; nothing else."""
    g = scenario.add_gpu().identity("g", UUID).utilization(50, 5).power(100_000, 200_000).temperature(60)
    scenario.write()
    poller, errors = make_poller()
    g.error("power.usage_mw", "TIMEOUT").error("temperature.gpu", "TIMEOUT")
    scenario.write()
    for _ in range(2):
        s = samples_of(poller.poll())
        assert value(s, "gpu_power_usage_watts") is None and value(s, "gpu_temperature_celsius", sensor="gpu") is None
        assert value(s, "gpu_utilization_ratio") == pytest.approx(0.5) and value(s, "gpu_up") == 1
    assert errors.counts[("nvmlDeviceGetPowerUsage", "timeout")] == 2  # asked again each poll, unlike NOT_SUPPORTED
    g.power(120_000, 200_000).temperature(61)
    scenario.write()
    s = samples_of(poller.poll())
    assert value(s, "gpu_power_usage_watts") == pytest.approx(120.0)
