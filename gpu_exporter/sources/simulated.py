"""A backend that invents plausible GPUs, for ``gpu-exporter --simulate``.

It lets people try the exporter, its dashboards and its alerts on a machine with no GPU.  Each GPU
plays a workload profile chosen by its index (see ``PROFILES``), so a small node already shows
something on every panel and trips the usual alerts now and then.

Gauges are pure functions of the seed and the time elapsed on ``clock`` since the backend was made:
a few sinusoids with seeded phases, so they drift smoothly and repeat exactly for the same inputs.
Counters (energy, PCIe and NVLink bytes, the time each perf policy or clock event reason held the
clocks back) integrate those rates between polls, so they only grow.

Every metric ``metric_defs`` declares shows on a node with one GPU of each profile (tests/
test_simulated_declarations.py holds it to that): the field-value metrics are made from their
declarations (``FIELD_METRICS``), the "mig" GPU is an H100 in MIG mode with three GPU instances, the
"lost" GPU reports an XID before each time it falls off the bus, and the RTX 6000 Ada has a fan.

Each GPU's UUID is derived from the node's name (``$NODE_NAME``, else the hostname, as the daemon
names its node), the seed and the index: the same on every restart of one node's simulator, and
another on every other node, so that two simulated nodes are a fleet of distinct GPUs and not one
node's GPUs counted twice.
"""

from __future__ import annotations

import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..metric_defs import (
    CLOCK_EVENT_REASONS,
    FABRIC_ISSUES,
    FABRIC_REGISTRATION_FAILED,
    FIELD_METRICS,
    NVLINK_DL_ERRORS,
)
from ..snapshot import (
    Activity,
    FabricReading,
    GpuReading,
    GpuStatic,
    LinkKey,
    MigReading,
    NvLinkReading,
    ProcessReading,
    pcie_link_bytes_per_second,
)
from .backend import GpuLost, SystemInfo

PROFILES = ("training", "idle-allocated", "memory-creep", "pcie-bound", "lost", "idle", "mig")
"""Workload of GPU ``i`` is ``PROFILES[i % len(PROFILES)]``."""

LOST_PERIOD_SECONDS = 600.0
LOST_WINDOW_SECONDS = (300.0, 360.0)
"""A "lost" GPU does not answer while ``elapsed % LOST_PERIOD_SECONDS`` is in ``[start, end)``."""

MEMORY_CREEP_PERIOD_SECONDS = 1200.0
"""A "memory-creep" GPU leaks from ~50% to ~97% of its memory over this long, then restarts."""

# A driver recent enough for every field value the metrics declare (the clock event reason counters
# are 580.82 and newer, metric_defs.FieldValue.since).
DRIVER_VERSION = "580.82.07 (simulated)"
CUDA_VERSION = "13.0"
_DRIVER = (580, 82, 7)

XID_BEFORE_LOSS = 119
"""A "lost" GPU reports this XID (GSP RPC timeout, the usual H100 prelude) shortly before each loss."""
XID_LEAD_SECONDS = 10.0

_MIB = 1024**2
_NVLINK_BYTES_PER_SECOND = 25e9  # one H100 NVLink4 link, one direction: 900 GB/s over 18 links, both ways
_AMBIENT_CELSIUS = 28.0
# Every declared reason the simulated driver's nvml.h defines, as a real driver reports each bit it knows.
_CLOCK_EVENT_REASONS = tuple(name for name, r in CLOCK_EVENT_REASONS.items() if r.since <= _DRIVER)
# The time counters NVML keeps as field values (the metrics declared with ``fields``, in seconds) run
# while a clock event reason is active: a clock event reason counter while its own reason is (the
# labels are the reasons' names), a perf-policy counter while the reason of its policy is.  A label
# with no active reason here (sync_boost, board_limit, reliability) is a counter the card keeps at
# its value, as a real one does for a policy that never engages.
POLICY_REASONS: Mapping[str, str] = MappingProxyType(
    {"power": "sw_power_cap", "thermal": "sw_thermal", "low_utilization": "gpu_idle"}
)
# Seconds per second of uptime each reason held the clocks back before the simulator started.
_HELD_BEFORE = MappingProxyType({"gpu_idle": 0.3, "sw_power_cap": 0.01})
_THRESHOLDS = MappingProxyType({"shutdown": 92.0, "slowdown": 89.0, "gpu_max": 87.0, "mem_max": 95.0})
# Bus numbers of the eight GPUs of an HGX H100 board; more GPUs move on to further PCI domains.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_UUID_NAMESPACE = uuid.UUID("0f5c7c1e-4f6b-4a55-9d0e-5a1b9e3c7d21")
# Who runs the simulated jobs: a shared server's users, GPU i's job belonging to _USERS[i % 3].
_USERS = ("alice", "bob", "carol")


@dataclass(frozen=True, slots=True)
class _Model:
    """What NVML reports for one product; figures taken from real cards."""

    name: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    clock_max_mhz: Mapping[str, float]
    clock_idle_mhz: Mapping[str, float]
    pcie_generation: int
    pcie_width: int
    power_limit_watts: float
    power_idle_watts: float
    thermal_rise_celsius: float  # above ambient at the power limit
    fan_count: int = 0
    nvlink_count: int = 0
    gpm: bool = False  # GPM (profiling-grade activity) is Hopper and newer
    architecture: int | None = None  # nvml.h NVML_DEVICE_ARCH_*


_HEALTHY_FABRIC = FabricReading(
    state=3, health_summary=1,
    issues=MappingProxyType({issue: False for issue in (*FABRIC_ISSUES, FABRIC_REGISTRATION_FAILED)
                             if issue != "fabric_manager_disconnected"}),  # no global fabric manager on HGX
)  # fmt: skip
_H100 = _Model(
    name="NVIDIA H100 80GB HBM3",
    memory_total_bytes=81559 * _MIB,
    memory_reserved_bytes=512 * _MIB,
    clock_max_mhz=MappingProxyType({"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1755}),
    clock_idle_mhz=MappingProxyType({"graphics": 345, "sm": 345, "memory": 2619, "video": 765}),
    pcie_generation=5,
    pcie_width=16,
    power_limit_watts=700.0,
    power_idle_watts=70.0,
    thermal_rise_celsius=40.0,
    nvlink_count=18,
    gpm=True,
    architecture=9,  # NVML_DEVICE_ARCH_HOPPER
)
# A PCIe card, to show a Gen4 link that really can be saturated.
_L40S = _Model(
    name="NVIDIA L40S",
    memory_total_bytes=46068 * _MIB,
    memory_reserved_bytes=496 * _MIB,
    clock_max_mhz=MappingProxyType({"graphics": 2520, "sm": 2520, "memory": 9001, "video": 1965}),
    clock_idle_mhz=MappingProxyType({"graphics": 210, "sm": 210, "memory": 405, "video": 1185}),
    pcie_generation=4,
    pcie_width=16,
    power_limit_watts=350.0,
    power_idle_watts=35.0,
    thermal_rise_celsius=45.0,
    architecture=8,  # NVML_DEVICE_ARCH_ADA
)
# A blower-cooled workstation card, so that the fan metrics have something to show.
_RTX6000 = _Model(
    name="NVIDIA RTX 6000 Ada Generation",
    memory_total_bytes=49140 * _MIB,
    memory_reserved_bytes=496 * _MIB,
    clock_max_mhz=MappingProxyType({"graphics": 2505, "sm": 2505, "memory": 10001, "video": 1965}),
    clock_idle_mhz=MappingProxyType({"graphics": 210, "sm": 210, "memory": 405, "video": 1185}),
    pcie_generation=4,
    pcie_width=16,
    power_limit_watts=300.0,
    power_idle_watts=20.0,
    thermal_rise_celsius=50.0,
    fan_count=1,
    architecture=8,  # NVML_DEVICE_ARCH_ADA
)
_MODEL_OF_PROFILE = {"pcie-bound": _L40S, "idle": _RTX6000}


@dataclass(frozen=True, slots=True)
class _MigSlice:
    """One GPU instance (with one compute instance) of the "mig" GPU, and the workload it runs."""

    profile: str
    gpu_instance_id: int
    profile_id: int  # nvidia-smi mig -lgip on an H100 80GB
    placement_start: int  # first of the eight memory slices it occupies
    compute_share: float  # of the GPU's seven compute slices
    memory_total_bytes: int
    process: str | None
    utilization: tuple[float, float]  # the workload's range, of the instance
    memory_used: tuple[float, float]  # of the instance's memory
    tensor_share: float = 0.0


# A shared inference box: a fine-tuning job, a model server, and a slice nobody uses at the moment.
_H100_MIGS = (
    _MigSlice("3g.40gb", 2, 9, 4, 3 / 7, 40320 * _MIB, "python3", (0.85, 0.97), (0.80, 0.88), tensor_share=0.65),
    _MigSlice("2g.20gb", 3, 14, 0, 2 / 7, 20096 * _MIB, "tritonserver", (0.30, 0.60), (0.55, 0.60), tensor_share=0.4),
    _MigSlice("1g.10gb", 9, 19, 2, 1 / 7, 9856 * _MIB, None, (0.0, 0.0), (0.0, 0.0)),
)


def _clamp(value: float, low: float = 0.0, high: float = 1.0) -> float:
    return min(high, max(low, value))


class _Wiggle:
    """Smooth deterministic noise in [-1, 1]: three incommensurate sinusoids with seeded phases."""

    def __init__(self, rng: random.Random) -> None:
        self._terms = [
            (2 * math.pi / (period * rng.uniform(0.8, 1.25)), rng.uniform(0, 2 * math.pi), weight)
            for period, weight in ((53.0, 0.25), (241.0, 0.35), (1307.0, 0.4))
        ]

    def __call__(self, t: float) -> float:
        return sum(weight * math.sin(omega * t + phase) for omega, phase, weight in self._terms)

    def between(self, t: float, low: float, high: float) -> float:
        return low + (high - low) * (0.5 + 0.5 * self(t))


@dataclass(frozen=True, slots=True)
class _Load:
    """What the workload asks of the GPU at one instant, as fractions; turned into readings later."""

    utilization: float
    memory_copy: float
    memory_used: float  # of total memory; ignored when there is no process
    power: float  # 0: idle power, 1: power limit
    pcie_rx: float  # of the link's capacity at its maximum generation
    pcie_tx: float
    nvlink: float  # of one link's bandwidth, per direction
    process: str | None  # name of the one process using the GPU
    sm_share: float = 0.0  # SM activity as a fraction of utilization: how much of the GPU a kernel fills
    tensor_share: float = 0.0  # of SM activity, the part in the tensor pipes
    decoder: float = 0.0
    restarts: int = 0  # how often that process has been restarted: it gets a new pid each time


def _load(profile: str, w: Mapping[str, _Wiggle], t: float, creep_offset: float) -> _Load:
    if profile in ("training", "lost"):
        return _Load(
            utilization=w["util"].between(t, 0.90, 0.99),
            memory_copy=w["copy"].between(t, 0.35, 0.55),
            memory_used=w["mem"].between(t, 0.85, 0.90),
            # Peaks brush the power limit, so sw_power_cap flickers as on real training nodes.
            power=w["power"].between(t, 0.80, 0.99),
            pcie_rx=w["rx"].between(t, 0.12, 0.25),
            pcie_tx=w["tx"].between(t, 0.04, 0.10),
            nvlink=w["nvlink"].between(t, 0.30, 0.60),
            process="python3",
            sm_share=0.82,
            tensor_share=0.7,
        )
    if profile == "idle-allocated":
        # A forgotten notebook kernel: most of the memory held, nothing running.
        return _Load(
            utilization=w["util"].between(t, 0.0, 0.03),
            memory_copy=w["copy"].between(t, 0.0, 0.01),
            memory_used=w["mem"].between(t, 0.70, 0.72),
            power=w["power"].between(t, 0.05, 0.08),
            pcie_rx=w["rx"].between(t, 1e-5, 5e-5),
            pcie_tx=w["tx"].between(t, 1e-5, 5e-5),
            nvlink=0.0,
            process="python3",
            sm_share=0.5,
        )
    if profile == "memory-creep":
        # An inference server that leaks: memory climbs steadily, then it is restarted and starts over.
        restarts, into = divmod(t + creep_offset, MEMORY_CREEP_PERIOD_SECONDS)
        return _Load(
            utilization=w["util"].between(t, 0.55, 0.80),
            memory_copy=w["copy"].between(t, 0.20, 0.35),
            memory_used=0.50 + 0.47 * into / MEMORY_CREEP_PERIOD_SECONDS,
            power=w["power"].between(t, 0.45, 0.65),
            pcie_rx=w["rx"].between(t, 0.03, 0.08),
            pcie_tx=w["tx"].between(t, 0.02, 0.05),
            nvlink=w["nvlink"].between(t, 0.02, 0.05),
            process="tritonserver",
            # Small request batches: kernels run most of the time but fill few SMs.
            sm_share=0.22,
            tensor_share=0.4,
            restarts=int(restarts),
        )
    if profile == "pcie-bound":
        # Streams and decodes video faster than the link can feed it: the GPU mostly waits.
        return _Load(
            utilization=w["util"].between(t, 0.20, 0.40),
            memory_copy=w["copy"].between(t, 0.10, 0.20),
            memory_used=w["mem"].between(t, 0.30, 0.40),
            power=w["power"].between(t, 0.35, 0.50),
            pcie_rx=w["rx"].between(t, 0.85, 0.95),
            pcie_tx=w["tx"].between(t, 0.05, 0.10),
            nvlink=0.0,
            process="python3",
            sm_share=0.3,
            decoder=w["codec"].between(t, 0.30, 0.50),
        )
    if profile == "idle":
        return _Load(
            utilization=0.0,
            memory_copy=0.0,
            memory_used=0.0,
            power=w["power"].between(t, 0.0, 0.02),
            pcie_rx=w["rx"].between(t, 1e-6, 5e-6),
            pcie_tx=w["tx"].between(t, 1e-6, 5e-6),
            nvlink=0.0,
            process=None,
        )
    raise AssertionError(f"unknown profile {profile!r}")


class _SimulatedGpu:
    """One GPU: fixed identity, seeded noise, and the counters it has accumulated so far."""

    def __init__(self, index: int, seed: int, node: str = "") -> None:
        # Seeded by (seed, index) alone, so GPU i looks the same however many GPUs there are, on any node.
        rng = random.Random(f"gpu-exporter-simulated/{seed}/{index}")
        self.profile = PROFILES[index % len(PROFILES)]
        self.model = model = _MODEL_OF_PROFILE.get(self.profile, _H100)
        domain, slot = divmod(index, len(_HGX_BUSES))
        self.static = GpuStatic(
            index=index,
            uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{seed}/{index}')}",
            name=model.name,
            pci_bus_id=f"{domain:08X}:{_HGX_BUSES[slot]:02X}:00.0",
            serial=f"1652{rng.randrange(10**9):09d}",
            minor_number=index,  # /dev/nvidia<index>, as the driver numbers the GPUs it finds
            mig_mode="enabled" if self.profile == "mig" else "disabled",
            clock_max_hertz=MappingProxyType({k: v * 1e6 for k, v in model.clock_max_mhz.items()}),
            pcie_max_generation=model.pcie_generation,
            pcie_max_width=model.pcie_width,
            temperature_thresholds_celsius=_THRESHOLDS,
            fan_count=model.fan_count,
            nvlink_count=model.nvlink_count,
            nvlink_links=model.nvlink_count,
            gpm_supported=model.gpm,
            architecture=model.architecture,
        )
        self._wiggles = {name: _Wiggle(rng) for name in ("util", "copy", "mem", "power", "rx", "tx", "nvlink", "codec")}
        self._creep_offset = rng.uniform(0, MEMORY_CREEP_PERIOD_SECONDS)
        self._pid = rng.randrange(2000, 400_000)
        self._link_shares = [(rng.uniform(0.9, 1.1), rng.uniform(0.9, 1.1)) for _ in range(model.nvlink_count)]
        self._replay_errors = rng.choice((0, 0, 0, 1, 3))
        self._ecc_corrected = rng.choice((0, 0, 1, 2))
        # What was added later draws from its own generators, so the readings above stay as they were.
        mig_rng = random.Random(f"gpu-exporter-simulated/{seed}/{index}/mig")
        self.migs = _H100_MIGS if self.profile == "mig" else ()
        self._mig_uuids = [
            f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{seed}/{index}/{m.gpu_instance_id}')}" for m in self.migs
        ]
        self._mig_wiggles = [{name: _Wiggle(mig_rng) for name in ("util", "mem")} for _ in self.migs]
        self._mig_pids = [mig_rng.randrange(2000, 400_000) for _ in self.migs]

        # Counters start as if the driver had been loaded days ago, as they would on a real node.
        uptime = rng.uniform(2, 30) * 86400
        self._lock = threading.Lock()
        self._last_t: float | None = None
        self._energy_joules = uptime * (model.power_idle_watts + model.power_limit_watts) / 3
        link = pcie_link_bytes_per_second(model.pcie_generation, model.pcie_width) or 0.0
        self._pcie_tx = uptime * link * rng.uniform(0.01, 0.05)
        self._pcie_rx = uptime * link * rng.uniform(0.02, 0.10)
        self._nvlink_tx = [uptime * _NVLINK_BYTES_PER_SECOND * 0.1 * tx for tx, _ in self._link_shares]
        self._nvlink_rx = [uptime * _NVLINK_BYTES_PER_SECOND * 0.1 * rx for _, rx in self._link_shares]
        self._held_back = {(name, label): uptime * _HELD_BEFORE.get(why, 0.0) for name, label, why in TIME_COUNTERS}

    def xids(self, t: float) -> dict[int, int]:
        """XID code -> events by ``t``: the "lost" GPU's XID comes shortly before each fall."""
        first = LOST_WINDOW_SECONDS[0] - XID_LEAD_SECONDS
        if self.profile != "lost" or t < first:
            return {}
        return {XID_BEFORE_LOSS: int((t - first) // LOST_PERIOD_SECONDS) + 1}

    def nvlink_errors(self, t: float) -> Mapping[str, Mapping[LinkKey, float]]:
        """An H100's NVLink error counters (Hopper's replay, recovery and crc per link): all 0 but on
        the training GPU, whose link 0 replays a flit an hour, as a slightly marginal cable does."""
        if not self.model.nvlink_count:
            return MappingProxyType({})
        replays = float(int(t // 3600)) if self.profile == "training" else 0.0
        counts: dict[LinkKey, float] = {}
        for link in range(self.model.nvlink_count):
            for _, kind in NVLINK_DL_ERRORS:
                counts[str(link), kind] = replays if (link, kind) == (0, "replay") else 0.0
        return MappingProxyType({"gpu_nvlink_errors_total": MappingProxyType(counts)})

    def recovery_action(self, t: float) -> float:
        """The driver's recovery action at ``t``: the "lost" GPU asks for a reset (1) between its XID
        and its fall, as XID 119 does on a real one; 0 otherwise."""
        start = LOST_WINDOW_SECONDS[0]
        return 1.0 if self.profile == "lost" and start - XID_LEAD_SECONDS <= t % LOST_PERIOD_SECONDS < start else 0.0

    def lost_at(self, t: float) -> bool:
        start, end = LOST_WINDOW_SECONDS
        return self.profile == "lost" and start <= t % LOST_PERIOD_SECONDS < end

    def _read_migs(self, t: float) -> tuple[MigReading, ...]:
        """The MIG devices at ``t``: each instance's memory, process and GPM activity."""
        out = []
        for i, (m, w) in enumerate(zip(self.migs, self._mig_wiggles, strict=True)):
            util = w["util"].between(t, *m.utilization)
            total = m.memory_total_bytes
            used = int(w["mem"].between(t, *m.memory_used) * total) // _MIB * _MIB if m.process else 4 * _MIB
            processes: tuple[ProcessReading, ...] = ()
            if m.process is not None:
                # nvmlDeviceGetProcessUtilization does not answer in MIG mode: no per-process utilization.
                processes = (ProcessReading(self._mig_pids[i], m.process, used, "compute",
                                            user=_USERS[(self.static.index + i) % len(_USERS)]),)  # fmt: skip
            sm = util * 0.8
            activity = Activity(graphics=util, sm=sm, sm_occupancy=sm * 0.38, tensor=sm * m.tensor_share,
                                dram=util * 0.45, fp64=0.0, fp32=sm * 0.08, fp16=sm * 0.04)  # fmt: skip
            out.append(MigReading(index=i, uuid=self._mig_uuids[i], profile=m.profile,
                                  gpu_instance_id=m.gpu_instance_id, compute_instance_id=0,
                                  gpu_instance_profile_id=m.profile_id, placement_start=m.placement_start,
                                  memory_total_bytes=total, memory_used_bytes=used, memory_free_bytes=total - used,
                                  processes=processes, activity=activity))  # fmt: skip
        return tuple(out)

    def _parent_load(self, t: float, migs: tuple[MigReading, ...]) -> _Load:
        """What the instances ask of the whole GPU, weighted by their share of its compute slices."""
        w = self._wiggles
        busy = sum(m.compute_share * ((r.activity.graphics or 0.0) if r.activity else 0.0)
                   for m, r in zip(self.migs, migs, strict=True))  # fmt: skip
        return _Load(
            utilization=busy,
            memory_copy=busy * 0.5,
            memory_used=0.0,  # the instances' own, summed by the caller
            power=_clamp(0.08 + 0.9 * busy + 0.02 * w["power"](t)),
            pcie_rx=w["rx"].between(t, 0.03, 0.08),
            pcie_tx=w["tx"].between(t, 0.02, 0.05),
            nvlink=0.0,  # a MIG-mode GPU's NVLinks carry no peer traffic
            process=next((m.process for m in self.migs if m.process), None),
            sm_share=0.8,
        )

    def read(self, static: GpuStatic, t: float) -> GpuReading:
        model, w = self.model, self._wiggles
        migs = self._read_migs(t)
        load = self._parent_load(t, migs) if migs else _load(self.profile, w, t, self._creep_offset)
        busy = load.utilization >= 0.05
        has_process = load.process is not None

        total, reserved = model.memory_total_bytes, model.memory_reserved_bytes
        # An empty card still shows a few MiB used: the driver's own bookkeeping.
        used = min(int(load.memory_used * total) // _MIB * _MIB, total - reserved) if has_process else 4 * _MIB
        if migs:
            used = sum(m.memory_used_bytes or 0 for m in migs)

        power_fraction = _clamp(load.power)
        power = model.power_idle_watts + (model.power_limit_watts - model.power_idle_watts) * power_fraction
        power_capped = power_fraction >= 0.95
        gpu_temp = _AMBIENT_CELSIUS + model.thermal_rise_celsius * power / model.power_limit_watts
        memory_temp = gpu_temp + 4 + 6 * power / model.power_limit_watts

        # With no process the driver drops to P8; with a context held it stays in P0 but idles its clocks.
        pstate = 0 if has_process else 8
        throttle = 1 - 0.12 * _clamp((power_fraction - 0.9) / 0.1)  # clocks give way near the power limit
        clocks = {
            name: mhz * throttle if busy else model.clock_idle_mhz[name] for name, mhz in model.clock_max_mhz.items()
        }
        clocks["memory"] = model.clock_max_mhz["memory"] if pstate == 0 else model.clock_idle_mhz["memory"]
        events = dict.fromkeys(_CLOCK_EVENT_REASONS, False)
        events["gpu_idle"] = not busy
        events["sw_power_cap"] = power_capped

        # Real links fall back to Gen1 when there is next to no traffic, and retrain under load.
        traffic = max(load.pcie_rx, load.pcie_tx)
        generation = model.pcie_generation if traffic >= 0.01 else 1
        full_link = pcie_link_bytes_per_second(model.pcie_generation, model.pcie_width) or 0.0
        rx_rate, tx_rate = _clamp(load.pcie_rx) * full_link, _clamp(load.pcie_tx) * full_link
        link_rates = [
            (load.nvlink * _NVLINK_BYTES_PER_SECOND * tx, load.nvlink * _NVLINK_BYTES_PER_SECOND * rx)
            for tx, rx in self._link_shares
        ]

        with self._lock:
            # Rectangle rule on the current rate: exact enough, and counters cannot go down.
            last = t if self._last_t is None else self._last_t
            dt = max(0.0, t - last)
            self._last_t = elapsed = max(t, last)
            self._energy_joules += power * dt
            self._pcie_tx += tx_rate * dt
            self._pcie_rx += rx_rate * dt
            for link, (link_tx, link_rx) in enumerate(link_rates):
                self._nvlink_tx[link] += link_tx * dt
                self._nvlink_rx[link] += link_rx * dt
            for name, label, reason in TIME_COUNTERS:
                self._held_back[name, label] += dt if events.get(reason) else 0.0
            field_values = MappingProxyType(
                {**self._held_back, ("gpu_recovery_action", ""): self.recovery_action(elapsed)}
            )
            link_field_values = self.nvlink_errors(elapsed)
            energy, pcie_tx_total, pcie_rx_total = self._energy_joules, int(self._pcie_tx), int(self._pcie_rx)
            nvlinks = tuple(
                NvLinkReading(link, True, int(self._nvlink_tx[link]), int(self._nvlink_rx[link]))
                for link in range(model.nvlink_count)
            )

        # Rare slow errors give the error panels something to show on hot cards, and stay put otherwise.
        hot = self.profile in ("training", "lost", "pcie-bound")
        corrected = self._ecc_corrected + (int(elapsed // 14400) if hot else 0)
        replays = self._replay_errors + (int(elapsed // 10800) if self.profile == "pcie-bound" else 0)

        xids = self.xids(elapsed)

        processes: tuple[ProcessReading, ...] = ()
        if migs:
            # In MIG mode the parent lists the processes of every instance.
            processes = tuple(p for m in migs for p in m.processes)
        elif load.process is not None:
            # The driver samples per process in whole percent.
            processes = (ProcessReading(self._pid + 7 * load.restarts, load.process, used, "compute",
                                        sm_utilization_ratio=round(_clamp(load.utilization), 2),
                                        memory_utilization_ratio=round(_clamp(load.memory_copy), 2),
                                        user=_USERS[static.index % len(_USERS)]),)  # fmt: skip
        activity = None
        if model.gpm and not migs:  # in MIG mode the driver may refuse the whole GPU's GPM; the simulated one does
            sm = _clamp(load.utilization * load.sm_share)
            activity = Activity(graphics=_clamp(load.utilization), sm=sm, sm_occupancy=sm * 0.38,
                                tensor=sm * load.tensor_share, dram=_clamp(load.memory_copy * 0.9), fp64=0.0,
                                fp32=sm * 0.08, fp16=sm * 0.04)  # fmt: skip

        return GpuReading(
            index=static.index,
            uuid=self.static.uuid,
            up=True,
            static=static,
            # nvmlDeviceGetUtilizationRates and the codec queries answer NOT_SUPPORTED in MIG mode.
            utilization_ratio=None if migs else _clamp(load.utilization),
            memory_copy_utilization_ratio=None if migs else _clamp(load.memory_copy),
            encoder_utilization_ratio=None if migs else 0.0,
            decoder_utilization_ratio=None if migs else _clamp(load.decoder),
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=total - used - reserved,
            memory_reserved_bytes=reserved,
            temperature_celsius=MappingProxyType({"gpu": round(gpu_temp, 1), "memory": round(memory_temp, 1)}),
            fan_speed_ratio=MappingProxyType(
                {str(fan): 0.3 + 0.6 * _clamp((gpu_temp - 35) / 45) for fan in range(model.fan_count)}
            ),
            power_usage_watts=round(power, 3),
            power_limit_watts=model.power_limit_watts,
            energy_consumed_joules_total=energy,
            clock_hertz=MappingProxyType({name: round(mhz) * 1e6 for name, mhz in clocks.items()}),
            performance_state=pstate,
            clock_event_active=MappingProxyType(events),
            field_values=field_values,
            link_field_values=link_field_values,
            pcie_tx_bytes_per_second=tx_rate,
            pcie_rx_bytes_per_second=rx_rate,
            pcie_tx_bytes_total=pcie_tx_total,
            pcie_rx_bytes_total=pcie_rx_total,
            pcie_link_generation=generation,
            pcie_link_width=model.pcie_width,
            pcie_replay_errors_total=replays,
            nvlinks=nvlinks,
            ecc_errors_total=MappingProxyType({"corrected": corrected, "uncorrected": 0}),
            # nvml.h: remapped rows are not given in MIG mode with active instances.
            remapped_rows_total=MappingProxyType({} if migs else {"correctable": 0, "uncorrectable": 0}),
            row_remap_pending=None if migs else False,
            row_remap_failure=None if migs else False,
            # An H100 SXM's NVSwitch fabric: registered and healthy in every field the driver reports.
            fabric=_HEALTHY_FABRIC if model.nvlink_count else None,
            xid_errors_total=MappingProxyType(xids),
            processes=processes,
            migs=migs,
            mig_slices=7 if migs else None,  # an H100's
            activity=activity,
        )


def _time_counters() -> tuple[tuple[str, str, str], ...]:
    """(metric, label, clock event reason) of every declared field value that counts seconds, where
    the simulated driver has its field id; the reason is what runs it (see ``POLICY_REASONS``)."""
    return tuple(
        (d.name, f.label, POLICY_REASONS.get(f.label, f.label))
        for d in FIELD_METRICS
        if d.type == "counter" and d.unit == "seconds"
        for f in d.fields
        if f.since <= _DRIVER
    )


TIME_COUNTERS = _time_counters()


def node_name() -> str:
    """The node's name as the daemon takes it where none is configured: ``$NODE_NAME``, else the hostname."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


class SimulatedBackend:
    """A ``Backend`` with ``gpus`` invented GPUs; see ``PROFILES`` for what each one does.

    Deterministic: the same ``seed`` and the same sequence of ``clock`` values give the same readings.
    ``node`` (default: ``$NODE_NAME``, else the hostname) makes the UUIDs this node's own.
    """

    def __init__(self, gpus: int = 4, *, clock: Callable[[], float] = time.monotonic, seed: int = 0,
                 node: str | None = None) -> None:  # fmt: skip
        if gpus < 1:
            raise ValueError(f"the simulator needs at least one GPU, got gpus={gpus}")
        self._clock = clock
        self._start = clock()
        self.node = node_name() if node is None else node
        self._gpus = [_SimulatedGpu(index, seed, self.node) for index in range(gpus)]

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def profile(self, index: int) -> str:
        """The workload GPU ``index`` plays, one of ``PROFILES``."""
        return self._gpu(index).profile

    def open(self) -> SystemInfo:
        return SystemInfo(driver_version=DRIVER_VERSION, cuda_version=CUDA_VERSION, gpu_count=len(self._gpus))

    def close(self) -> None:
        pass

    def count(self) -> int:
        return len(self._gpus)

    def read_static(self, index: int) -> GpuStatic:
        gpu = self._gpu(index)
        self._raise_if_lost(gpu, self._elapsed())
        return gpu.static

    def read_gpu(self, static: GpuStatic) -> GpuReading:
        gpu = self._gpu(static.index)
        t = self._elapsed()
        self._raise_if_lost(gpu, t)
        return gpu.read(static, t)

    def xid_counts(self, uuid: str) -> Mapping[int, int]:
        """The XIDs of the GPU ``uuid``, also while it does not answer (the driver's events go on)."""
        t = self._elapsed()
        return next((MappingProxyType(g.xids(t)) for g in self._gpus if g.static.uuid == uuid), MappingProxyType({}))

    def _elapsed(self) -> float:
        return self._clock() - self._start

    def _gpu(self, index: int) -> _SimulatedGpu:
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no simulated GPU {index}: there are {len(self._gpus)}")
        return self._gpus[index]

    @staticmethod
    def _raise_if_lost(gpu: _SimulatedGpu, t: float) -> None:
        if gpu.lost_at(t):
            raise GpuLost(f"GPU {gpu.static.index} has fallen off the bus (simulated)")
