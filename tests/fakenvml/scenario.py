"""Typed builders for fake-NVML scenario files.

A :class:`Scenario` is edited through typed setters and written atomically (``write``) or in
place (``write_in_place``); the C library notices either and re-reads it.  Values are in the units
the NVML API itself uses (milliwatts, millijoules, MHz, KB/s for PCIe throughput, KiB for NVLink
counters), so that unit conversions in the code under test are really exercised.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Self

from .values import (
    C2C_ERROR_KINDS,
    CLOCK_EVENT_COUNTERS,
    CLOCK_EVENT_REASONS,
    DRIVER_PROFILES,
    EVENT_XID_CRITICAL,
    FABRIC_HEALTH_SUMMARIES,
    FABRIC_STATES,
    GPU_IS_LOST,
    MAX_FANS,
    MAX_NVLINKS,
    NOT_SUPPORTED,
    NVLINK_ERROR_KINDS,
    NVML_ERRORS,
    THRESHOLDS,
    VIOLATION_POLICIES,
    Counter,
    Device,
    Err,
    Process,
    Xid,
    _check_range,
    _render,
    nvml_return_code,
)

__all__ = ["CLOCK_EVENT_REASONS", "EVENT_XID_CRITICAL", "GPU_IS_LOST", "NOT_SUPPORTED", "Counter", "Err", "Gpu",
           "MigDevice", "Process", "Scenario", "Xid"]  # fmt: skip


@dataclass
class MigDevice(Device):
    def instance(self, gpu_instance_id: int, compute_instance_id: int) -> MigDevice:
        self.set("gpu_instance_id", gpu_instance_id).set("compute_instance_id", compute_instance_id)
        return self

    def handle_error(self, err: str | Err) -> MigDevice:
        """nvmlDeviceGetMigDeviceHandleByIndex fails with ``err`` for this slot."""
        self.error("handle", err)
        return self

    def gpu_instance(
        self,
        profile_id: int | Err | None = None,
        placement_start: int | Err | None = None,
        placement_size: int | Err | None = None,
    ) -> MigDevice:
        """What nvmlGpuInstanceGetInfo says of this device's GPU instance: the profile id as
        ``nvidia-smi mig -lgip`` numbers it (A100/H100: 1g 19, 1g+me 20, 1g with two memory slices
        15, 2g 14, 3g 9, 4g 5, 7g 0) and the memory slices it occupies.  None leaves a value to the
        fake, which takes the profile from the name and the first free possible placement (README:
        "GPU instances"); an error makes nvmlGpuInstanceGetInfo fail with it."""
        _check_range("gi.profile_id", profile_id, 0, 0xFFFFFFFE)
        _check_range("gi.placement.start", placement_start, 0, 7)
        _check_range("gi.placement.size", placement_size, 1, 8)
        for key, v in (("gi.profile_id", profile_id), ("gi.placement.start", placement_start),
                       ("gi.placement.size", placement_size)):  # fmt: skip
            if v is None:
                self.values.pop(key, None)
            else:
                self.set(key, v)
        return self

    def gpu_instance_refused(self, err: str | Err = "NOT_FOUND") -> MigDevice:
        """nvmlDeviceGetGpuInstanceById fails with ``err`` for this device's GPU instance."""
        return self.error("gi.lookup", err)


@dataclass
class Gpu(Device):
    processes: list[Process] = field(default_factory=list)
    xids: list[Xid] = field(default_factory=list)
    migs: list[MigDevice] = field(default_factory=list)

    def pci(self, bus_id: str, device_id: int | None = None, subsystem_id: int | None = None) -> Gpu:
        self.set("pci.bus_id", bus_id)
        if device_id is not None:
            self.set("pci.device_id", f"0x{device_id:08X}")
        if subsystem_id is not None:
            self.set("pci.subsystem_id", f"0x{subsystem_id:08X}")
        return self

    def serial(self, serial: str | Err) -> Gpu:
        self.set("serial", serial)
        return self

    def minor_number(self, n: int | Err) -> Gpu:
        """N of /dev/nvidiaN (nvmlDeviceGetMinorNumber); unset, the fake answers the GPU's index."""
        self.set("minor_number", n)
        return self

    def codec(self, encoder: int | Err, decoder: int | Err, period_us: int = 167000) -> Gpu:
        _check_range("encoder.util", encoder, 0, 100)
        _check_range("decoder.util", decoder, 0, 100)
        self.set("encoder.util", encoder).set("encoder.period_us", period_us)
        self.set("decoder.util", decoder).set("decoder.period_us", period_us)
        return self

    def temperature(self, gpu: int | Err, memory: int | Err | None = None, memory_value_type: int | None = None) -> Gpu:
        """``memory_value_type``: the valueType field 82 answers with (NVML_VALUE_TYPE_*; 1 when unset)."""
        self.set("temperature.gpu", gpu)
        if memory is not None:
            self.set("temperature.memory", memory)
        if memory_value_type is not None:
            self.set("temperature.memory_type", memory_value_type)
        return self

    def thresholds(self, **celsius: int | Err) -> Gpu:
        for k, v in celsius.items():
            if k not in THRESHOLDS:
                raise ValueError(f"unknown temperature threshold {k!r}; known: {THRESHOLDS}")
            self.set(f"temperature.threshold.{k}", v)
        return self

    def fans(self, *percent: int | Err) -> Gpu:
        """Fan speeds in percent, one per fan; no fans at all is a passively cooled card."""
        if len(percent) > MAX_FANS:
            raise ValueError(f"at most {MAX_FANS} fans")
        for i in range(MAX_FANS):
            self.values.pop(f"fan.{i}", None)
        for i, p in enumerate(percent):
            _check_range(f"fan.{i}", p, 0, 1000)  # nvml.h: the speed "may exceed 100% in certain cases"
            self.set(f"fan.{i}", p)
        if percent:
            self.set("fan.count", len(percent))
        else:
            self.values.pop("fan.count", None)
        return self

    def power(self, usage_mw: int | Err, limit_mw: int | Err | None = None) -> Gpu:
        self.set("power.usage_mw", usage_mw)
        if limit_mw is not None:
            self.set("power.limit_mw", limit_mw)
        return self

    def energy(self, millijoules: int | Counter | Err) -> Gpu:
        return self.set("energy_mj", millijoules)

    def pstate(self, p: int | Err) -> Gpu:
        _check_range("pstate", p, 0, 32)
        return self.set("pstate", p)

    def clocks_event_reasons(self, *names: str) -> Gpu:
        mask = 0
        for n in names:
            if n not in CLOCK_EVENT_REASONS:
                raise ValueError(f"unknown clock event reason {n!r}; known: {sorted(CLOCK_EVENT_REASONS)}")
            mask |= CLOCK_EVENT_REASONS[n]
        return self.set("clocks_event_reasons", f"0x{mask:x}")

    def violations(self, **nanoseconds: int | Counter | Err) -> Gpu:
        """NVML's perf-policy counters (field values 74-79): nanoseconds the clocks were held back, per
        policy (power, thermal, sync_boost, board_limit, low_utilization, reliability)."""
        for k, v in nanoseconds.items():
            if k not in VIOLATION_POLICIES:
                raise ValueError(f"unknown violation policy {k!r}; known: {VIOLATION_POLICIES}")
            self.set(f"violation.{k}_ns", v)
        return self

    def recovery_action(self, code: int | Err) -> Gpu:
        """The driver's recovery action (field value 230, R570 and newer): an nvmlDeviceGpuRecoveryAction_t
        code, 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, ... (nvml.h)."""
        self.set("recovery_action", code)
        return self

    def clock_event_counters(self, **nanoseconds: int | Counter | Err) -> Gpu:
        """NVML's clock event reason counters (field values 269-271, R580 and newer): nanoseconds the
        clocks were slowed, per reason (sw_thermal, hw_thermal, hw_power_brake)."""
        for k, v in nanoseconds.items():
            if k not in CLOCK_EVENT_COUNTERS:
                raise ValueError(f"unknown clock event counter {k!r}; known: {CLOCK_EVENT_COUNTERS}")
            self.set(f"clock_event.{k}_ns", v)
        return self

    def pcie(
        self,
        *,
        gen: int | Err | None = None,
        max_gen: int | Err | None = None,
        width: int | Err | None = None,
        max_width: int | Err | None = None,
        tx_kbps: int | Err | None = None,
        rx_kbps: int | Err | None = None,
        sample_ms: float | None = None,
        replay: int | Counter | Err | None = None,
        tx_bytes: int | Counter | Err | None = None,
        rx_bytes: int | Counter | Err | None = None,
        counter_bits: int | None = None,
    ) -> Gpu:
        """``tx_kbps``/``rx_kbps`` are what nvmlDeviceGetPcieThroughput returns: KB per second.
        ``counter_bits=32``: the byte counters wrap at 2^32 (still answered as unsigned long long)."""
        given = {
            "gen": gen,
            "max_gen": max_gen,
            "width": width,
            "max_width": max_width,
            "tx_kbps": tx_kbps,
            "rx_kbps": rx_kbps,
            "sample_ms": sample_ms,
            "replay": replay,
            "tx_bytes": tx_bytes,
            "rx_bytes": rx_bytes,
            "counter_bits": counter_bits,
        }
        for k, v in given.items():
            if v is not None:
                self.set(f"pcie.{k}", v)
        return self

    def nvlink_errors(self, link: int, **counts: int | Counter | Err) -> Gpu:
        """One link's NVLink error counters, by the kinds gpu_nvlink_errors_total declares: replay,
        recovery, crc (fields 161-163, NVLink 4 and older) or NVLink 5's (206-221, Blackwell).  A
        generation's counters not given answer 0; the other generation's answer NOT_SUPPORTED."""
        for kind, v in counts.items():
            if kind not in NVLINK_ERROR_KINDS:
                raise ValueError(f"unknown NVLink error kind {kind!r}; known: {sorted(NVLINK_ERROR_KINDS)}")
            self.set(f"nvlink.{link}.errors.{kind}", v)
        return self

    def c2c(self, enabled: bool | Err = True, **errors: int | Counter | Err) -> Gpu:
        """NVLink-C2C, the GPU's link to a Grace CPU (GH200, GB200): its error counters (fields 231-233,
        R575 and newer) by kind (crc, replay, replay_b2b), 0 where not given.  A GPU without C2C answers
        them NOT_SUPPORTED (Hopper and newer) or INVALID_ARGUMENT (older), as real drivers do."""
        self.set("c2c.enabled", enabled if isinstance(enabled, Err) else int(enabled))
        for kind, v in errors.items():
            if kind not in C2C_ERROR_KINDS:
                raise ValueError(f"unknown C2C error kind {kind!r}; known: {C2C_ERROR_KINDS}")
            self.set(f"c2c.errors.{kind}", v)
        return self

    def arch(self, arch: int | Err) -> Gpu:
        """nvmlDeviceGetArchitecture's answer (nvml.h NVML_DEVICE_ARCH_*: 9 Hopper, 10 Blackwell); by
        default the fake tells it from the name, and an unknown name is NVML_DEVICE_ARCH_UNKNOWN."""
        return self.set("arch", arch)

    def nvlink(
        self,
        link: int,
        up: bool | Err = True,
        tx_kib: int | Counter | Err | None = None,
        rx_kib: int | Counter | Err | None = None,
    ) -> Gpu:
        """One NVLink link; its throughput counters are in KiB, as NVML's field values report them."""
        if not 0 <= link < MAX_NVLINKS:
            raise ValueError(f"NVLink link {link} is outside 0..{MAX_NVLINKS - 1}")
        self.set(f"nvlink.{link}.state", up if isinstance(up, Err) else int(up))
        if tx_kib is not None:
            self.set(f"nvlink.{link}.tx_kib", tx_kib)
        if rx_kib is not None:
            self.set(f"nvlink.{link}.rx_kib", rx_kib)
        return self

    def nvlinks(self, count: int | Err, beyond: int | Err | None = None) -> Gpu:
        """The link count field 91 answers (A100 12, H100 18, L40S and T4 0), and what a link at or past
        it answers: ``None`` INVALID_ARGUMENT, ``0`` an inactive link with zero counters, or an error."""
        self.set("nvlink.count", count)
        if beyond is None:
            self.values.pop("nvlink.beyond", None)
        else:
            self.set("nvlink.beyond", beyond)
        return self

    def fields_accumulate(self, on: bool = True) -> Gpu:
        """nvmlDeviceGetFieldValues adds each value to what the caller's struct held (go-nvml #46)."""
        return self.set("fields.accumulate", int(on))

    def events_wait_lost(self, on: bool = True) -> Gpu:
        """While this GPU is lost, nvmlEventSetWait_v2 on a set holding it answers GPU_IS_LOST."""
        return self.set("events.wait_lost", int(on))

    def events_via(self, gpu: int) -> Gpu:
        """This GPU's XID events arrive in the event sets that watch GPU ``gpu``, not in its own; the
        event still names this GPU (nvmlEventData_t.device), as NVIDIA's mock library delivers."""
        return self.set("events.via", gpu)

    def gpm_parent_in_mig(self, err: str | Err | None = "NOT_SUPPORTED") -> Gpu:
        """In MIG mode, nvmlGpmSampleGet on the whole GPU fails with ``err`` (None: it works)."""
        if err is None:
            self.values.pop("gpm.parent_in_mig", None)
            return self
        return self.error("gpm.parent_in_mig", err)

    def process_util_race(self, times: int = 1) -> Gpu:
        """The next ``times`` reads of per-process utilization find a sample more than they were sized
        for (INSUFFICIENT_SIZE on nvidia-ml-py's second call)."""
        return self.set("process_util.race", times)

    def ecc(
        self,
        corrected: int | Counter | Err,
        uncorrected: int | Counter | Err,
        corrected_volatile: int | Counter | Err | None = None,
        uncorrected_volatile: int | Counter | Err | None = None,
    ) -> Gpu:
        """Aggregate (lifetime) counts; the volatile ones default to the same values."""
        self.set("ecc.corrected.aggregate", corrected).set("ecc.uncorrected.aggregate", uncorrected)
        self.set("ecc.corrected.volatile", corrected if corrected_volatile is None else corrected_volatile)
        self.set("ecc.uncorrected.volatile", uncorrected if uncorrected_volatile is None else uncorrected_volatile)
        return self

    def remapped_rows(
        self, correctable: int = 0, uncorrectable: int = 0, pending: bool = False, failure: bool = False
    ) -> Gpu:
        self.set("rows.correctable", correctable).set("rows.uncorrectable", uncorrectable)
        self.set("rows.pending", int(pending)).set("rows.failure", int(failure))
        return self

    def mig_mode(self, enabled: bool, pending: bool | None = None, max_devices: int | None = None) -> Gpu:
        self.set("mig.mode", int(enabled))
        if pending is not None:
            self.set("mig.pending", int(pending))
        if max_devices is not None:
            self.set("mig.max_devices", max_devices)
        return self

    def gpu_instances_refused(self, err: str | Err = "NO_PERMISSION") -> Gpu:
        """nvmlDeviceGetGpuInstanceById fails with ``err`` for every GPU instance of this GPU: a caller
        neither root nor granted the mig/monitor capability (nvml.h: "Requires privileged user")."""
        return self.error("gi.lookup", err)

    def add_mig(
        self,
        name: str,
        uuid: str,
        gpu_instance_id: int,
        compute_instance_id: int = 0,
        *,
        profile_id: int | Err | None = None,
        placement_start: int | Err | None = None,
    ) -> MigDevice:
        """A MIG device.  Its GPU instance's ``profile_id`` and ``placement_start``, None: what the fake
        derives (the profile from the ``Ng`` of ``name``, the first free start; see ``gpu_instance``)."""
        mig = MigDevice()
        mig.identity(name, uuid)
        mig.instance(gpu_instance_id, compute_instance_id)
        mig.gpu_instance(profile_id, placement_start)
        self.migs.append(mig)
        return mig

    def gpm_supported(self, supported: bool | Err | None = True) -> Gpu:
        """nvmlGpmQueryDeviceSupport's answer (Hopper and newer: True); None: NOT_SUPPORTED."""
        if supported is None:
            self.values.pop("gpm.supported", None)
            return self
        return self.set("gpm.supported", supported if isinstance(supported, Err) else int(supported))

    def process_utilization(self, sample_ms: float | Err | None = 166) -> Gpu:
        """Turn on nvmlDeviceGetProcessUtilization (the driver samples every ``sample_ms``)."""
        if sample_ms is None:
            self.values.pop("process_util.sample_ms", None)
            return self
        return self.set("process_util.sample_ms", sample_ms)

    def supported_events(self, mask: int | Err) -> Gpu:
        return self.set("events.supported", mask if isinstance(mask, Err) else f"0x{mask:x}")

    def fabric(
        self, state: str | Err = "completed", status: str = "SUCCESS", health_mask: int = 0,
        health_summary: str | None = None, clique_id: int = 0,
    ) -> Gpu:  # fmt: skip
        """nvmlDeviceGetGpuFabricInfoV (R550 and newer): the registration ``state`` (nvml.h's
        NVML_GPU_FABRIC_STATE_* names: not_supported, not_started, in_progress, completed), the probe's
        ``status`` (an nvmlReturn_t name), a ``health_mask`` (values.fabric_health_mask) and, for the
        v3 struct of R580 and newer, a ``health_summary`` (healthy, unhealthy, limited_capacity).
        Without this call the GPU has no fabric: NOT_SUPPORTED, as on PCIe cards and A100s."""
        if not isinstance(state, Err) and state not in FABRIC_STATES:
            raise ValueError(f"unknown fabric state {state!r}; known: {sorted(FABRIC_STATES)}")
        if health_summary is not None and health_summary not in FABRIC_HEALTH_SUMMARIES:
            raise ValueError(
                f"unknown fabric health summary {health_summary!r}; known: {sorted(FABRIC_HEALTH_SUMMARIES)}"
            )
        self.set("fabric.state", state if isinstance(state, Err) else FABRIC_STATES[state])
        self.set("fabric.status", nvml_return_code(status))
        self.set("fabric.health_mask", health_mask)
        if health_summary is not None:
            self.set("fabric.health_summary", FABRIC_HEALTH_SUMMARIES[health_summary])
        return self.set("fabric.clique_id", clique_id)

    def reset_required(self) -> Gpu:
        """Answer every query but its identity (name, UUID, serial, PCI, index, minor number) with
        NVML_ERROR_RESET_REQUIRED, as a GPU the driver will not use until it is reset."""
        self.values.pop("lost_after_s", None)
        self.values.pop("lost_until_s", None)
        self.set("state", "reset_required")
        return self

    def lookup_refused(self, err: str | Err | None = "RESET_REQUIRED") -> Gpu:
        """nvmlDeviceGetHandleByIndex and nvmlDeviceGetHandleByUUID fail with ``err`` for this GPU (None:
        they answer again); handles given out before go on answering (README: "Quirks, per GPU")."""
        if err is None:
            return self.unset("lookup")
        return self.error("lookup", err)

    def lost(self, after_s: float | None = None, until_s: float | None = None) -> Gpu:
        """Fall off the bus: now, or ``after_s`` seconds after the library first loaded the scenario."""
        self.values.pop("state", None)
        self.values.pop("lost_after_s", None)
        self.values.pop("lost_until_s", None)
        if after_s is None:
            self.set("state", "lost")
        else:
            self.set("lost_after_s", after_s)
            if until_s is not None:
                self.set("lost_until_s", until_s)
        return self

    def recovered(self) -> Gpu:
        for k in ("state", "lost_after_s", "lost_until_s"):
            self.values.pop(k, None)
        return self

    def add_process(
        self,
        pid: int,
        used_bytes: int | None,
        *,
        kind: Literal["compute", "graphics", "mps"] = "compute",
        name: str | Err | None = None,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
        sm: int = 0,
        mem: int = 0,
        enc: int = 0,
        dec: int = 0,
    ) -> Gpu:
        """A running process; ``sm``/``mem``/``enc``/``dec`` are its utilization in percent.

        ``kind="mps"``: a client of an MPS server, listed by nvmlDeviceGetMPSComputeRunningProcesses
        only; the server itself (nvidia-cuda-mps-server) is a ``compute`` process of its own.  A pid
        added under two kinds is in both lists."""
        self.processes.append(
            Process(pid, used_bytes, kind, name, gpu_instance_id, compute_instance_id, (sm, mem, enc, dec))
        )
        return self

    def add_xid(
        self,
        code: int,
        after_s: float | None = None,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> Gpu:
        self.xids.append(Xid(code, after_s, gpu_instance_id, compute_instance_id))
        return self


@dataclass
class Scenario:
    """A whole node: the [system] section and GPUs 0..N-1."""

    path: Path
    driver_version: str | Err = "550.54.15"
    nvml_version: str | Err = "12.550.54.15"
    cuda_version: int | Err = 12040
    init_error: str | None = None  # e.g. "DRIVER_NOT_LOADED", "NO_PERMISSION"
    driver_branch: int | None = None  # the driver profile; None: the major number of driver_version
    unknown_field: Err | None = None  # what a field id the branch does not know answers (INVALID_ARGUMENT)
    gpus: list[Gpu] = field(default_factory=list)
    comment: str = ""

    def driver(self, branch: int) -> Self:
        """A driver of ``branch`` (535, 550, 570, 580) with a real release's version strings."""
        if branch not in DRIVER_PROFILES:
            raise ValueError(f"no driver profile {branch}; known: {sorted(DRIVER_PROFILES)}")
        self.driver_version, self.nvml_version, self.cuda_version = DRIVER_PROFILES[branch]
        self.driver_branch = None
        return self

    def add_gpu(self) -> Gpu:
        g = Gpu()
        self.gpus.append(g)
        return g

    def gpu(self, index: int) -> Gpu:
        return self.gpus[index]

    def render(self) -> str:
        if self.init_error is not None and self.init_error not in NVML_ERRORS:
            raise ValueError(f"unknown init_error {self.init_error!r}")
        out: list[str] = []
        if self.comment:
            out += [f"# {line}".rstrip() for line in self.comment.splitlines()]
        out += [
            "[system]",
            f"driver_version = {_render(self.driver_version)}",
            f"nvml_version = {_render(self.nvml_version)}",
            f"cuda_version = {_render(self.cuda_version)}",
        ]
        if self.init_error:
            out.append(f"init_error = {self.init_error}")
        if self.driver_branch is not None:
            out.append(f"driver_branch = {self.driver_branch}")
        if self.unknown_field is not None:
            out.append(f"unknown_field = {self.unknown_field}")
        for i, g in enumerate(self.gpus):
            out += ["", f"[gpu {i}]"]
            out += [f"{k} = {_render(v)}" for k, v in g.values.items()]
            out += [f"process = {p.render()}" for p in g.processes]
            out += [f"xid = {x.render()}" for x in g.xids]
            for m, mig in enumerate(g.migs):
                out += ["", f"[gpu {i} mig {m}]"]
                out += [f"{k} = {_render(v)}" for k, v in mig.values.items()]
        out += ["", "end", ""]
        return "\n".join(out)

    def write(self) -> Path:
        """Write atomically (temp file + rename), as a careful tool would."""
        text = self.render()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)
        return self.path

    def write_in_place(self) -> Path:
        """Truncate and rewrite the same inode, as an editor or ``echo >`` would."""
        with open(self.path, "w") as f:
            f.write(self.render())
        return self.path
