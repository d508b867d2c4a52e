"""The simulator: plausible, bounded, moving values, one behaviour per profile, and deterministic."""

from __future__ import annotations

import re
import threading
from itertools import pairwise

import pytest

from gpu_exporter.metric_defs import CLOCK_EVENT_REASONS
from gpu_exporter.snapshot import GpuReading
from gpu_exporter.sources.backend import GpuLost
from gpu_exporter.sources.simulated import (
    LOST_PERIOD_SECONDS,
    LOST_WINDOW_SECONDS,
    PROFILES,
    XID_BEFORE_LOSS,
    XID_LEAD_SECONDS,
    SimulatedBackend,
)

DAY = 86400
STEP = 30
# Every reason the simulated driver (580.82) knows, as a real driver reports each of its bits: all
# those declared but the two that came with driver 615.
REASONS = set(CLOCK_EVENT_REASONS) - {"board_limit", "reliability"}
Day = dict[str, list[GpuReading]]


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, now: float = 12345.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def read_all(backend: SimulatedBackend) -> list[GpuReading | None]:
    """One poll of every GPU; None for a GPU that is lost."""
    out: list[GpuReading | None] = []
    for index in range(backend.gpu_count):
        try:
            out.append(backend.read_gpu(backend.read_static(index)))
        except GpuLost:
            out.append(None)
    return out


@pytest.fixture(scope="module")
def day() -> Day:
    """A simulated day of every profile, polled every 30 s, by profile name (lost polls left out)."""
    clock = FakeClock()
    backend = SimulatedBackend(len(PROFILES), clock=clock, seed=7)
    readings: Day = {backend.profile(i): [] for i in range(backend.gpu_count)}
    for _ in range(DAY // STEP):
        for index, reading in enumerate(read_all(backend)):
            if reading is not None:
                readings[backend.profile(index)].append(reading)
        clock.advance(STEP)
    return readings


def test_needs_at_least_one_gpu() -> None:
    for gpus in (0, -1):
        with pytest.raises(ValueError, match="at least one GPU"):
            SimulatedBackend(gpus)


def test_open_describes_the_system() -> None:
    backend = SimulatedBackend(3, clock=FakeClock())
    info = backend.open()
    assert info.gpu_count == 3
    assert info.driver_version and "simulated" in info.driver_version
    # A driver that has every declared field value: the clock event reason counters are 580.82 and newer.
    assert info.driver_version.startswith("580.82.") and info.cuda_version == "13.0"
    backend.close()


@pytest.mark.parametrize("gpus", [1, 4, 16])
def test_any_number_of_gpus_with_distinct_identities(gpus: int) -> None:
    backend = SimulatedBackend(gpus, clock=FakeClock())
    statics = [backend.read_static(i) for i in range(gpus)]
    assert [s.index for s in statics] == list(range(gpus))
    assert len({s.uuid for s in statics}) == gpus
    assert len({s.pci_bus_id for s in statics}) == gpus
    assert len({s.serial for s in statics}) == gpus
    for s in statics:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", s.uuid)
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", s.pci_bus_id)
    assert all(r is not None and r.up for r in read_all(backend))


def test_a_gpu_looks_the_same_whatever_the_gpu_count() -> None:
    small, large = SimulatedBackend(1, clock=FakeClock()), SimulatedBackend(16, clock=FakeClock())
    assert small.read_static(0) == large.read_static(0)


def test_out_of_range_index_is_an_error() -> None:
    backend = SimulatedBackend(2, clock=FakeClock())
    with pytest.raises(IndexError):
        backend.read_static(2)


def test_profiles_cycle_by_index() -> None:
    backend = SimulatedBackend(13, clock=FakeClock())
    assert [backend.profile(i) for i in range(13)] == [PROFILES[i % len(PROFILES)] for i in range(13)]
    assert PROFILES == ("training", "idle-allocated", "memory-creep", "pcie-bound", "lost", "idle", "mig")


def test_static_facts_match_the_models() -> None:
    backend = SimulatedBackend(len(PROFILES), clock=FakeClock())
    statics = {backend.profile(i): backend.read_static(i) for i in range(backend.gpu_count) if i != 4}
    h100 = statics["training"]
    assert h100.name == "NVIDIA H100 80GB HBM3"
    assert (h100.pcie_max_generation, h100.pcie_max_width, h100.nvlink_count, h100.fan_count) == (5, 16, 18, 0)
    l40s = statics["pcie-bound"]
    assert (l40s.name, l40s.pcie_max_generation, l40s.pcie_max_width, l40s.nvlink_count) == ("NVIDIA L40S", 4, 16, 0)
    assert statics["idle"].fan_count >= 1
    assert statics["mig"].name == h100.name and statics["mig"].mig_mode == "enabled"
    for profile, s in statics.items():
        assert s.mig_mode == ("enabled" if profile == "mig" else "disabled")
        assert s.serial
        assert set(s.clock_max_hertz) == {"graphics", "sm", "memory", "video"}
        assert all(100e6 < hz < 20e9 for hz in s.clock_max_hertz.values())
        assert dict(s.temperature_thresholds_celsius) == {"shutdown": 92, "slowdown": 89, "gpu_max": 87, "mem_max": 95}


def test_every_field_the_simulator_promises_is_filled(day: Day) -> None:
    for profile, readings in day.items():
        r = readings[0]
        assert r.up and r.static is not None and r.uuid == r.static.uuid and r.index == r.static.index, profile
        mig = profile == "mig"
        # What NVML does not answer for a GPU in MIG mode: GPU-Util, the codecs, remapped rows.
        not_in_mig = ("utilization_ratio", "memory_copy_utilization_ratio", "encoder_utilization_ratio",
                      "decoder_utilization_ratio", "row_remap_pending", "row_remap_failure")  # fmt: skip
        for name in GpuReading.__slots__:
            if name not in ("error", "nvlinks", "processes", "xid_errors_total", "fan_speed_ratio", "activity",
                            "fabric", "mig_slices"):  # fmt: skip
                assert (getattr(r, name) is None) == (mig and name in not_in_mig), (profile, name)
        assert r.mig_slices == (7 if mig else None), profile  # an H100's compute slices, in MIG mode only
        # The H100 SXMs sit on an NVSwitch fabric, registered and healthy; PCIe cards have none.
        assert (r.fabric is not None) == (r.static.nvlink_count > 0), profile
        if r.fabric is not None:
            assert (r.fabric.state, r.fabric.health_summary) == (3, 1) and not any(r.fabric.issues.values())
        # GPM is Hopper and newer: the simulated H100s have it, the L40S and RTX 6000 Ada do not; the
        # MIG-mode H100's is per GPU instance.
        assert r.static.gpm_supported == ("H100" in r.static.name), profile
        assert (r.activity is not None) == (r.static.gpm_supported and not mig), profile
        if r.activity is not None:
            assert None not in (getattr(r.activity, f) for f in r.activity.__slots__), profile
            assert r.activity.sm is not None and r.utilization_ratio is not None
            assert r.activity.sm <= r.utilization_ratio, "SM activity never exceeds GPU-Util"
        for p in r.processes:  # nvmlDeviceGetProcessUtilization does not answer in MIG mode
            assert (p.sm_utilization_ratio is None) == (p.memory_utilization_ratio is None) == mig, profile
        assert set(r.temperature_celsius) == {"gpu", "memory"}
        assert set(r.clock_hertz) == {"graphics", "sm", "memory", "video"}
        assert set(r.clock_event_active) == REASONS
        assert dict(r.ecc_errors_total).keys() == {"corrected", "uncorrected"}
        assert dict(r.remapped_rows_total) == ({} if mig else {"correctable": 0, "uncorrectable": 0})
        assert not r.row_remap_pending and not r.row_remap_failure
        assert dict(r.xid_errors_total) == {}, "the first poll comes before any XID"
        assert bool(r.migs) == mig, profile
        assert len(r.nvlinks) == r.static.nvlink_count
        assert set(r.fan_speed_ratio) == {str(f) for f in range(r.static.fan_count)}


def test_values_stay_within_physical_ranges_all_day(day: Day) -> None:
    for profile, readings in day.items():
        assert len(readings) > DAY // STEP * 0.85, profile
        for r in readings:
            assert r.static is not None
            ctx = (profile, r)
            ratios = [r.utilization_ratio, r.memory_copy_utilization_ratio, r.encoder_utilization_ratio]
            ratios += [r.decoder_utilization_ratio, *r.fan_speed_ratio.values()]
            ratios += [getattr(m.activity, f) for m in r.migs if m.activity for f in m.activity.__slots__]
            assert all(x is not None and 0 <= x <= 1 for x in ratios) or profile == "mig", ctx
            assert all(0 <= x <= 1 for x in ratios if x is not None), ctx
            for m in r.migs:
                assert m.memory_total_bytes and m.memory_used_bytes is not None and m.memory_free_bytes is not None
                assert 0 < m.memory_used_bytes <= m.memory_total_bytes == m.memory_used_bytes + m.memory_free_bytes, ctx
            assert r.memory_total_bytes and r.memory_used_bytes is not None and r.memory_reserved_bytes is not None
            assert 0 < r.memory_used_bytes <= r.memory_total_bytes, ctx
            assert r.memory_free_bytes == r.memory_total_bytes - r.memory_used_bytes - r.memory_reserved_bytes, ctx
            assert r.memory_free_bytes >= 0, ctx
            assert r.power_usage_watts is not None and r.power_limit_watts is not None
            assert 0 < r.power_usage_watts <= r.power_limit_watts, ctx
            thresholds = r.static.temperature_thresholds_celsius
            assert 20 < r.temperature_celsius["gpu"] < thresholds["gpu_max"], ctx
            assert 20 < r.temperature_celsius["memory"] < thresholds["mem_max"], ctx
            for name, hz in r.clock_hertz.items():
                assert 0 < hz <= r.static.clock_max_hertz[name], ctx
            assert r.performance_state in (0, 8), ctx
            assert r.pcie_link_width == r.static.pcie_max_width, ctx
            assert r.pcie_link_generation is not None and r.static.pcie_max_generation is not None
            assert 1 <= r.pcie_link_generation <= r.static.pcie_max_generation, ctx
            link = r.pcie_link_max_bytes_per_second
            assert link and r.pcie_rx_bytes_per_second is not None and r.pcie_tx_bytes_per_second is not None
            assert 0 < r.pcie_rx_bytes_per_second <= link and 0 < r.pcie_tx_bytes_per_second <= link, ctx
            assert all(n.up for n in r.nvlinks), ctx
            assert r.ecc_errors_total["uncorrected"] == 0, ctx


def test_counters_never_decrease(day: Day) -> None:
    for profile, readings in day.items():
        for before, after in pairwise(readings):
            ctx = (profile, after)
            assert before.energy_consumed_joules_total is not None and after.energy_consumed_joules_total is not None
            assert after.energy_consumed_joules_total > before.energy_consumed_joules_total, ctx
            assert before.pcie_tx_bytes_total is not None and after.pcie_tx_bytes_total is not None
            assert before.pcie_rx_bytes_total is not None and after.pcie_rx_bytes_total is not None
            assert after.pcie_tx_bytes_total >= before.pcie_tx_bytes_total, ctx
            assert after.pcie_rx_bytes_total >= before.pcie_rx_bytes_total, ctx
            for a, b in zip(before.nvlinks, after.nvlinks, strict=True):
                assert a.tx_bytes_total is not None and a.rx_bytes_total is not None
                assert b.tx_bytes_total is not None and b.rx_bytes_total is not None
                assert b.tx_bytes_total >= a.tx_bytes_total and b.rx_bytes_total >= a.rx_bytes_total, ctx
            for key in ("corrected", "uncorrected"):
                assert after.ecc_errors_total[key] >= before.ecc_errors_total[key], ctx
            assert before.pcie_replay_errors_total is not None and after.pcie_replay_errors_total is not None
            assert after.pcie_replay_errors_total >= before.pcie_replay_errors_total, ctx
            assert before.field_values.keys() == after.field_values.keys(), ctx
            assert all(after.field_values[k] >= v for k, v in before.field_values.items()), ctx
            assert all(after.xid_errors_total.get(x, 0) >= n for x, n in before.xid_errors_total.items()), ctx


def test_energy_follows_power(day: Day) -> None:
    readings = day["training"]
    first, last = readings[0], readings[-1]
    assert first.energy_consumed_joules_total is not None and last.energy_consumed_joules_total is not None
    mean_power = (last.energy_consumed_joules_total - first.energy_consumed_joules_total) / (DAY - STEP)
    powers = [r.power_usage_watts for r in readings if r.power_usage_watts is not None]
    assert mean_power == pytest.approx(sum(powers) / len(powers), rel=0.02)


def test_values_move_over_time(day: Day) -> None:
    for profile in ("training", "memory-creep", "pcie-bound"):
        readings = day[profile]
        assert len({r.utilization_ratio for r in readings}) > 100, profile
        assert len({r.power_usage_watts for r in readings}) > 100, profile
        assert len({r.memory_used_bytes for r in readings}) > 10, profile


def test_processes_account_for_used_memory(day: Day) -> None:
    for profile, readings in day.items():
        for r in readings[::50]:
            if profile == "idle":
                assert r.processes == ()
                continue
            assert r.processes and all(p.kind == "compute" and p.name for p in r.processes), profile
            held = sum(p.used_memory_bytes or 0 for p in r.processes)
            assert r.memory_used_bytes is not None
            assert held == pytest.approx(r.memory_used_bytes, rel=0.05), profile


def test_training_is_busy_everywhere(day: Day) -> None:
    for r in day["training"]:
        assert r.utilization_ratio is not None and r.utilization_ratio >= 0.9
        assert r.memory_used_ratio is not None and 0.84 <= r.memory_used_ratio <= 0.91
        assert r.pcie_link_generation == 5 and r.performance_state == 0
        assert r.nvlinks and not r.clock_event_active["gpu_idle"]
    assert any(r.clock_event_active["sw_power_cap"] for r in day["training"])
    assert not all(r.clock_event_active["sw_power_cap"] for r in day["training"])


def test_idle_allocated_holds_memory_but_does_nothing(day: Day) -> None:
    for r in day["idle-allocated"]:
        assert r.processes
        assert r.utilization_ratio is not None and r.utilization_ratio < 0.1
        assert r.memory_used_ratio is not None and r.memory_used_ratio > 0.5
        assert r.clock_event_active["gpu_idle"]


def test_memory_creep_climbs_then_drops_back(day: Day) -> None:
    ratios = [r.memory_used_ratio for r in day["memory-creep"]]
    assert all(x is not None for x in ratios)
    values = [x for x in ratios if x is not None]
    peak = next(i for i, x in enumerate(values) if x > 0.9)
    assert min(values[peak:]) < 0.55
    climbs = sum(b >= a for a, b in pairwise(values))
    assert climbs > 0.95 * (len(values) - 1)  # steady growth, only the restarts go down
    pids = {p.pid for r in day["memory-creep"] for p in r.processes}
    assert len(pids) >= DAY // 1200 - 1  # each restart is a new process


def test_pcie_bound_saturates_its_link_not_its_gpu(day: Day) -> None:
    for r in day["pcie-bound"]:
        link = r.pcie_link_max_bytes_per_second
        assert link is not None and r.pcie_rx_bytes_per_second is not None
        assert (r.pcie_link_generation, r.pcie_link_width) == (4, 16)
        assert r.pcie_rx_bytes_per_second / link > 0.8
        assert r.utilization_ratio is not None and r.utilization_ratio < 0.5


def test_idle_gpu_rests(day: Day) -> None:
    for r in day["idle"]:
        assert r.processes == () and r.utilization_ratio == 0
        assert r.performance_state == 8 and r.pcie_link_generation == 1
        assert r.clock_event_active["gpu_idle"] and not r.clock_event_active["sw_power_cap"]
        assert r.power_usage_watts is not None and r.power_limit_watts is not None
        assert r.power_usage_watts < 0.15 * r.power_limit_watts
        assert r.static is not None
        assert r.clock_hertz["graphics"] < 0.2 * r.static.clock_max_hertz["graphics"]


def test_lost_gpu_drops_out_in_its_window_and_recovers() -> None:
    clock = FakeClock()
    backend = SimulatedBackend(6, clock=clock)
    lost = PROFILES.index("lost")
    static = backend.read_static(lost)
    start, end = LOST_WINDOW_SECONDS
    for cycle in range(3):
        base = cycle * LOST_PERIOD_SECONDS
        clock.now = 12345.0 + base + start - 1
        assert backend.read_gpu(static).up
        for offset in (start, (start + end) / 2, end - 1):
            clock.now = 12345.0 + base + offset
            with pytest.raises(GpuLost):
                backend.read_gpu(static)
            with pytest.raises(GpuLost):
                backend.read_static(lost)
            # Only that GPU is lost.
            assert backend.read_gpu(backend.read_static(0)).up
        clock.now = 12345.0 + base + end
        assert backend.read_static(lost) == static
        assert backend.read_gpu(static).up


def test_lost_gpu_is_down_a_tenth_of_the_time() -> None:
    clock = FakeClock()
    backend = SimulatedBackend(5, clock=clock)
    down = 0
    for _ in range(DAY // STEP):
        down += read_all(backend)[4] is None
        clock.advance(STEP)
    assert down == DAY // STEP // 10


def test_same_seed_and_clock_give_identical_readings() -> None:
    def run(seed: int) -> list[list[GpuReading | None]]:
        clock = FakeClock()
        backend = SimulatedBackend(8, clock=clock, seed=seed)
        polls = []
        for step in range(200):
            polls.append(read_all(backend))
            clock.advance(7 + step % 13)
        return polls

    assert run(3) == run(3)
    assert run(3) != run(4)
    first, other = SimulatedBackend(2, seed=3), SimulatedBackend(2, seed=4)
    assert first.read_static(0).uuid != other.read_static(0).uuid


def test_start_time_does_not_matter_only_elapsed_time() -> None:
    early, late = FakeClock(0.0), FakeClock(1e6)
    a, b = SimulatedBackend(4, clock=early), SimulatedBackend(4, clock=late)
    for _ in range(20):
        assert read_all(a) == read_all(b)
        early.advance(30)
        late.advance(30)


def test_concurrent_reads_keep_counters_monotonic() -> None:
    clock = FakeClock()
    backend = SimulatedBackend(8, clock=clock)
    statics = [backend.read_static(i) for i in range(backend.gpu_count)]
    totals: dict[int, list[float]] = {i: [] for i in range(backend.gpu_count)}
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            clock.advance(0.5)

    def poll(index: int) -> None:
        for _ in range(300):
            try:
                energy = backend.read_gpu(statics[index]).energy_consumed_joules_total
            except GpuLost:
                continue
            totals[index].append(-1.0 if energy is None else energy)  # checked below: asserts here would be lost

    ticker = threading.Thread(target=tick)
    ticker.start()
    pollers = [threading.Thread(target=poll, args=(i,)) for i in range(backend.gpu_count)]
    for t in pollers:
        t.start()
    for t in pollers:
        t.join()
    stop.set()
    ticker.join()
    for index, values in totals.items():
        # The free-running ticker can carry the "lost" GPU through its whole run inside the lost window.
        assert values or backend.profile(index) == "lost", index
        assert all(v > 0 for v in values) and values == sorted(values), index


def test_time_held_back_follows_the_clock_event_reasons(day: Day) -> None:
    """The perf-policy and clock event reason counters grow by the time their reason was active: the
    training GPU's power policy while it sits at its power cap, the idle one's low-utilization policy
    all the time, and no thermal time on cards that run cool."""
    power, low, thermal = (
        ("gpu_violation_seconds_total", "power"),
        ("gpu_violation_seconds_total", "low_utilization"),
        ("gpu_clock_event_seconds_total", "sw_thermal"),
    )

    def grew(readings: list[GpuReading], key: tuple[str, str]) -> float:
        return readings[-1].field_values[key] - readings[0].field_values[key]

    training = day["training"]
    capped = sum(STEP for r in training[1:] if r.clock_event_active["sw_power_cap"])
    assert 0 < grew(training, power) == pytest.approx(capped)
    assert grew(day["idle"], low) == pytest.approx(DAY - STEP)
    assert grew(training, low) == 0
    assert all(grew(readings, thermal) == 0 for readings in day.values())


def test_the_lost_gpu_reports_an_xid_before_each_loss() -> None:
    clock = FakeClock()
    backend = SimulatedBackend(len(PROFILES), clock=clock)
    lost = PROFILES.index("lost")
    start, _ = LOST_WINDOW_SECONDS
    static = backend.read_static(lost)
    seen = []
    for at in (start - XID_LEAD_SECONDS - 1, start - 1, LOST_PERIOD_SECONDS + start - 1, 2 * LOST_PERIOD_SECONDS):
        clock.now = 12345.0 + at
        seen.append(dict(backend.read_gpu(static).xid_errors_total))
    assert seen == [{}, {XID_BEFORE_LOSS: 1}, {XID_BEFORE_LOSS: 2}, {XID_BEFORE_LOSS: 2}]
    assert all(not r.xid_errors_total for r in read_all(backend) if r is not None and r.index != lost)


def test_the_mig_gpu_is_split_into_instances_that_add_up(day: Day) -> None:
    """An H100 in MIG mode: three GPU instances, each with its own memory and GPM activity; the parent's
    memory used and processes are its instances'."""
    for r in day["mig"]:
        assert [m.profile for m in r.migs] == ["3g.40gb", "2g.20gb", "1g.10gb"]
        assert len({m.uuid for m in r.migs}) == 3 and all(m.uuid.startswith("MIG-") for m in r.migs)
        assert len({m.gpu_instance_id for m in r.migs}) == 3
        assert r.memory_used_bytes == sum(m.memory_used_bytes or 0 for m in r.migs)
        assert r.memory_total_bytes is not None
        assert sum(m.memory_total_bytes or 0 for m in r.migs) <= r.memory_total_bytes
        assert r.processes == tuple(p for m in r.migs for p in m.processes)
        busy, _, empty = r.migs
        assert busy.activity is not None and busy.activity.sm is not None and busy.activity.sm > 0.5
        assert empty.processes == () and empty.activity is not None and empty.activity.sm == 0
    assert len({r.migs[0].memory_used_bytes for r in day["mig"]}) > 10, "the instances' memory moves"


def test_the_default_number_of_simulated_gpus_shows_every_workload() -> None:
    """``gpu-exporter --simulate`` alone has a MIG GPU and a lost one: no empty dashboard panel."""
    from gpu_exporter.settings.config import Settings

    n = Settings.model_fields["simulate_gpus"].default
    assert {SimulatedBackend(n).profile(i) for i in range(n)} == set(PROFILES)
