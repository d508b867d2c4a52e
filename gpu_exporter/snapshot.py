"""Immutable snapshots of a node's GPUs: the one thing metrics, rules and ``--once`` read.

Values are already in base units (ratios 0-1, bytes, celsius, watts, joules, hertz). ``None`` (or
a missing key) means the GPU does not support the value; it is left out of every output, never
shown as 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

_EMPTY: Mapping[str, float] = MappingProxyType({})

# Per-lane transfer rate (GT/s) and line-code efficiency for each PCIe generation.
_PCIE_LANE = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130),
              6: (64.0, 242 / 256)}  # fmt: skip


def pcie_link_bytes_per_second(generation: int | None, width: int | None) -> float | None:
    """Usable bandwidth of one direction of a link: GT/s x encoding efficiency / 8 bits x lanes."""
    if generation is None or width is None or generation not in _PCIE_LANE or width <= 0:
        return None
    gts, efficiency = _PCIE_LANE[generation]
    return gts * 1e9 * efficiency / 8 * width


@dataclass(frozen=True, slots=True)
class ProcessReading:
    pid: int
    name: str
    used_memory_bytes: int | None  # None: the driver does not say (WDDM, no permission)
    kind: str = "compute"  # or "graphics"
    pod: PodRef | None = None
    # The driver's latest per-process sample (nvmlDeviceGetProcessUtilization); 0 when the process
    # was idle since the previous poll, None where the driver cannot say (MIG, older GPUs).
    sm_utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    # Who runs it: the user name of its real uid (/proc/<pid>/status), the uid's number where the
    # exporter's passwd does not know it, None where /proc does not show the process.
    user: str | None = None
    # The Slurm job and the container it runs in, from its /proc/<pid>/cgroup (see gpu_exporter.holders).
    job: JobRef | None = None
    container: ContainerRef | None = None
    # When it started, in clock ticks after boot (/proc/<pid>/stat's starttime), None where /proc does
    # not show it: with the pid, what tells it from a later process given the same pid.  What is
    # learnt once per process (its name, user, job, container, pod) is kept under both.
    start_time: int | None = None

    @property
    def holder(self) -> Holder:
        """Who answers for it: its pod, else its Slurm job, else its container, else its user."""
        if self.pod is not None:
            return pod_holder(self.pod)
        if self.job is not None:
            return job_holder(self.job)
        if self.container is not None:
            return container_holder(self.container)
        return user_holder(self.user or UNKNOWN_USER)


@dataclass(frozen=True, slots=True)
class Activity:
    """Profiling-grade activity between the previous poll and this one, from NVML's GPM (GPU
    Performance Monitoring, Hopper and newer).  Ratios 0-1; None where a metric is not supported.

    Unlike GPU-Util, which reads 100% when any kernel ran, these say how much of the GPU worked:
    the fraction of SMs busy, of warp slots occupied, of time the tensor or FP pipes ran, and of
    DRAM bandwidth used.
    """

    graphics: float | None = None  # any graphics or compute engine active
    sm: float | None = None  # SMs with at least one warp resident
    sm_occupancy: float | None = None  # resident warps / the SMs' maximum
    tensor: float | None = None  # any tensor pipe active
    dram: float | None = None  # DRAM bandwidth used / peak
    fp64: float | None = None
    fp32: float | None = None
    fp16: float | None = None


@dataclass(frozen=True, slots=True)
class PodRef:
    """The Kubernetes container that holds a device, from the kubelet's PodResources API.

    Beyond who it is (the first three, all that names a holder): the DRA resource claim it holds the
    device through, where it does, and the pod's UID where its processes' cgroups give one (the
    kubelet does not say it); both only for ``gpu_holder_info``."""

    namespace: str
    pod: str
    container: str
    # Not part of who it is: equal refs are one holder, whatever the claim or UID (compare=False).
    claim_name: str = field(default="", compare=False)
    claim_namespace: str = field(default="", compare=False)
    uid: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class JobRef:
    """A Slurm job holding a device or running a process: its ID, and where known its user, account
    and partition (see gpu_exporter.holders for where each comes from)."""

    job: str
    user: str = ""
    account: str = ""
    partition: str = ""


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """A container (Docker, Podman, containerd, CRI-O) running a process: its engine, its full ID from
    the cgroup path and, where the engine's API said, its name."""

    engine: str
    id: str
    name: str = ""

    @property
    def short_id(self) -> str:
        return self.id[:12]

    @property
    def display(self) -> str:
        """Its name, else its short ID (what ``docker ps`` shows)."""
        return self.name or self.short_id


UNKNOWN_USER: Final = "unknown"
POD, JOB, CONTAINER, USER = "pod", "job", "container", "user"
HOLDER_KINDS: Final = (POD, JOB, CONTAINER, USER)
# The labels of each kind of holder, in the order they are written.  ``user`` is shared: a job's
# user, or the Unix user who holds the GPU.
HOLDER_LABELS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({
    POD: ("namespace", "pod", "container"),
    JOB: ("hpc_job", "user", "slurm_account", "slurm_partition"),
    CONTAINER: ("container_engine", "container_id", "container_name"),
    USER: ("user",),
})  # fmt: skip


@dataclass(frozen=True, slots=True, order=True)
class Holder:
    """Who holds a GPU: a kind (pod, job, container or user) and that kind's label values.

    The one model every place that shows holders reads: per-GPU and per-process series, the books of
    GPU time, ``--once``, the alerts and the report's labels.  ``Holder("", ())`` is nobody.
    """

    kind: str
    values: tuple[str, ...] = ()

    def labels(self) -> dict[str, str]:
        """Label name -> value, the kind's own labels only."""
        return dict(zip(HOLDER_LABELS.get(self.kind, ()), self.values, strict=True))

    def get(self, label: str) -> str:
        return self.labels().get(label, "")

    @property
    def name(self) -> str:
        """In words, for people: ``pod ml/train``, ``job 4242 of alice``, ``container trainer``, ``user alice``."""
        v = self.values
        if self.kind == POD:
            return f"pod {v[0]}/{v[1]}"
        if self.kind == JOB:
            return f"job {v[0]}" + (f" of {v[1]}" if v[1] else "")
        if self.kind == CONTAINER:
            return f"container {v[2]}"  # its name, else its short ID
        return f"user {v[0]}" if self.kind == USER else ""


NOBODY: Final = Holder("")


def pod_holder(ref: PodRef) -> Holder:
    return Holder(POD, (ref.namespace, ref.pod, ref.container))


def job_holder(ref: JobRef) -> Holder:
    return Holder(JOB, (ref.job, ref.user, ref.account, ref.partition))


def container_holder(ref: ContainerRef) -> Holder:
    return Holder(CONTAINER, (ref.engine, ref.short_id, ref.display))


def user_holder(user: str) -> Holder:
    return Holder(USER, (user,))


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device of a GPU in MIG mode.  Only GPM gives its utilization (``activity``)."""

    index: int
    uuid: str
    profile: str  # e.g. "1g.10gb", from the device name
    gpu_instance_id: int | None
    compute_instance_id: int | None
    # The GPU instance's profile id and the first memory slice it occupies (nvmlGpuInstanceGetInfo):
    # with the parent's minor number they are how NVIDIA's DRA driver names a MIG device.
    gpu_instance_profile_id: int | None = None
    placement_start: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    processes: tuple[ProcessReading, ...] = ()
    pods: tuple[PodRef, ...] = ()
    activity: Activity | None = None  # GPM per GPU instance; the only utilization NVML gives per MIG
    jobs: tuple[JobRef, ...] = ()  # as GpuReading.jobs
    containers: tuple[ContainerRef, ...] = ()  # as GpuReading.containers


@dataclass(frozen=True, slots=True)
class NvLinkReading:
    link: int
    up: bool | None
    tx_bytes_total: int | None = None
    rx_bytes_total: int | None = None


LinkKey = str | tuple[str, str]  # a per-link series' label values: the link, or the link and one more


@dataclass(frozen=True, slots=True)
class FabricReading:
    """The GPU's place in its NVLink fabric (nvmlDeviceGetGpuFabricInfoV: NVSwitch and GB200
    systems), where the driver reports one; None where a value is not reported."""

    state: int | None = None  # nvml.h NVML_GPU_FABRIC_STATE_*: 1 not started, 2 in progress, 3 completed
    health_summary: int | None = None  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*: 1 healthy, 2 unhealthy, 3 limited
    # metric_defs.FABRIC_ISSUES label -> whether the fabric reports it now; absent where not reported.
    issues: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class GpuStatic:
    """Facts that rarely change, read at discovery and refreshed on a slow interval."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str | None = None
    mig_mode: str = "unsupported"  # "enabled", "disabled" or "unsupported"
    clock_max_hertz: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    temperature_thresholds_celsius: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    fan_count: int = 0  # from nvmlDeviceGetNumFans; -1: that call is missing, read one fan the old way
    nvlink_count: int = 0
    # The same count where it was asked (the NVLink collector on), 0 included; None: not asked, so unknown.
    nvlink_links: int | None = None
    gpm_supported: bool = False  # nvmlGpmQueryDeviceSupport said yes
    # nvmlDeviceGetArchitecture: nvml.h NVML_DEVICE_ARCH_* (9 Hopper, 10 Blackwell); None where unknown.
    architecture: int | None = None
    # N of /dev/nvidiaN (nvmlDeviceGetMinorNumber): how GKE's device plugin and NVIDIA's DRA driver
    # name a GPU to the kubelet ("nvidia0", "gpu-0").  None where the driver does not say (Windows).
    minor_number: int | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one poll.  ``up`` False means it did not answer; only identity is then known."""

    index: int
    uuid: str
    up: bool
    static: GpuStatic | None = None
    error: str | None = None  # why it is down, in words
    utilization_ratio: float | None = None
    memory_copy_utilization_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    temperature_celsius: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # sensor -> value
    fan_speed_ratio: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # fan index -> ratio
    power_usage_watts: float | None = None
    power_limit_watts: float | None = None
    energy_consumed_joules_total: float | None = None
    clock_hertz: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    performance_state: int | None = None
    clock_event_active: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))
    # The values metrics declare as NVML field values (metric_defs.FieldValue), in base units:
    # (metric name, label value or "") -> value; a field the GPU does not have is not there.
    field_values: Mapping[tuple[str, str], float] = field(default_factory=lambda: MappingProxyType({}))
    # The same for per-link field values (FieldValue.per_link): metric name -> {(link, label): value},
    # the label values as the series carry them ("0", or ("0", "crc")).
    link_field_values: Mapping[str, Mapping[str | tuple[str, str], float]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_tx_bytes_total: int | None = None
    pcie_rx_bytes_total: int | None = None
    pcie_link_generation: int | None = None
    pcie_link_width: int | None = None
    pcie_replay_errors_total: int | None = None
    nvlinks: tuple[NvLinkReading, ...] = ()
    ecc_errors_total: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # corrected/uncorrected
    remapped_rows_total: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    # Queries answered NVML_ERROR_RESET_REQUIRED in this poll: the GPU answers (its identity), but the
    # driver says it must be reset before it can be used again; its other values are then unknown.
    reset_required: bool = False
    fabric: FabricReading | None = None  # None: no NVLink fabric (PCIe cards, A100), or not asked
    xid_errors_total: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    processes: tuple[ProcessReading, ...] = ()
    migs: tuple[MigReading, ...] = ()
    # The card's compute slices in MIG mode (nvmlDeviceGetMaxMigDeviceCount: the most MIG devices it
    # can hold, one per slice: 7 on A100 and H100, 4 on A30); None out of MIG mode or where not given.
    mig_slices: int | None = None
    pods: tuple[PodRef, ...] = ()  # every container holding the GPU (several with time-slicing)
    activity: Activity | None = None  # None until two GPM samples exist, or where GPM is not supported
    # The Slurm jobs holding it: those the job mapping files list for it, and those its processes
    # run in; and the containers its processes run in (gpu_exporter.holders).
    jobs: tuple[JobRef, ...] = ()
    containers: tuple[ContainerRef, ...] = ()

    @property
    def pcie_link_max_bytes_per_second(self) -> float | None:
        return pcie_link_bytes_per_second(self.pcie_link_generation, self.pcie_link_width)

    @property
    def memory_used_ratio(self) -> float | None:
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Every GPU of the node at one poll."""

    taken_at: float  # unix seconds, when the poll started: for timestamps shown to people and Prometheus
    duration_seconds: float
    nvml_up: bool
    nvml_error: str | None = None  # why NVML is down, in words a person understands
    # Let go of on request (SIGUSR1: a GPU reset or a driver upgrade waits for no client): down on
    # purpose, which no alert on a lost NVML is to fire for.
    nvml_released: bool = False
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[GpuReading, ...] = ()
    # Monotonic seconds when the poll started, for every interval (``for``, windows, accounting
    # deltas, retention): the wall clock can step either way.  None in snapshots made by hand.
    monotonic_at: float | None = None

    @property
    def steady_at(self) -> float:
        """The poll's time on a clock that never steps: ``monotonic_at``, else ``taken_at``."""
        return self.taken_at if self.monotonic_at is None else self.monotonic_at


def pod_label_values(pods: Iterable[PodRef]) -> tuple[str, str, str]:
    """The ``namespace``, ``pod`` and ``container`` label values of the containers holding a device.

    One container gives its own names.  Several (time-slicing) give each name joined with commas, in
    a stable order; ``gpu_pod_info`` lists them one by one for exact joins.  Metrics and alerts both
    label with this, so the two always agree."""
    refs = sorted(set(pods), key=lambda r: (r.namespace, r.pod, r.container))
    return (
        ",".join(dict.fromkeys(r.namespace for r in refs)),
        ",".join(dict.fromkeys(r.pod for r in refs)),
        ",".join(dict.fromkeys(r.container for r in refs)),
    )


@dataclass(frozen=True)
class HolderLabels:
    """Which holders name the per-GPU series and the alerts, as labels after ``gpu`` and ``uuid``:
    the pods (under their configured label names), the Slurm jobs (``hpc_job``, dcgm-exporter's
    name) and the containers (``container_name``).  Several holders of one kind (a shared GPU) give
    their values joined with commas, in a stable order; ``gpu_holder_info`` lists them one by one."""

    pods: tuple[str, str, str] | None = None  # the names of the namespace, pod and container labels
    jobs: bool = False
    containers: bool = False
    # The Unix users holding it (``user``): on alerts only, where no pod names the holder; per-GPU
    # series keep the label sets they had (``gpu_holder_info`` names users).
    users: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return (*(self.pods or ()), *(("hpc_job",) if self.jobs else ()),
                *(("container_name",) if self.containers else ()), *(("user",) if self.users else ()))  # fmt: skip

    def values(
        self, pods: Iterable[PodRef], jobs: Iterable[JobRef] = (), containers: Iterable[ContainerRef] = ()
    ) -> tuple[str, ...]:
        """The values of :attr:`names` for a device (or a process) held by these."""
        out: tuple[str, ...] = pod_label_values(pods) if self.pods else ()
        if self.jobs:
            out += (",".join(sorted({j.job for j in jobs})),)
        if self.containers:
            out += (",".join(sorted({c.display for c in containers})),)
        return out

    def of(self, d: GpuReading | MigReading) -> tuple[str, ...]:
        out = self.values(d.pods, d.jobs, d.containers)
        if self.users:  # those who hold it as themselves (not through a job or a container), by name
            users = {h.values[0] for h in device_holders(d, False) if h.kind == USER} - {UNKNOWN_USER}
            out += (",".join(sorted(users)),)
        return out

    def _detail(self) -> tuple[str, ...]:
        return (*(HOLDER_LABELS[POD] if self.pods else ()), *(("hpc_job", "slurm_account", "slurm_partition")
                if self.jobs else ()), *(HOLDER_LABELS[CONTAINER] if self.containers else ()), "user")  # fmt: skip

    @property
    def detail_names(self) -> tuple[str, ...]:
        """Every label of one holder, for series that carry one holder each (``gpu_state_seconds_total``,
        ``gpu_holder_info``): the pods' (as configured), the jobs', the containers' and ``user``."""
        return (*(self.pods or ()), *self._detail()[3 if self.pods else 0 :])

    def detail_values(self, h: Holder) -> tuple[str, ...]:
        labels = h.labels()
        return tuple(labels.get(name, "") for name in self._detail())


def device_holders(d: GpuReading | MigReading, pod_mode: bool, *, migs: bool = True) -> tuple[Holder, ...]:
    """Who holds a GPU (with its MIG devices', unless ``migs`` is False) or MIG device now, one by
    one, in a stable order.

    With pod attribution (``pod_mode``), the pods the kubelet assigned it.  Otherwise the Slurm jobs
    it is allocated to (the job mapping files, and the jobs of its processes) and the holder of each
    process holding memory on it: its job, else its container, else its user."""
    parts: tuple[GpuReading | MigReading, ...] = (d, *d.migs) if isinstance(d, GpuReading) and migs else (d,)
    if pod_mode:
        found = {pod_holder(r) for x in parts for r in x.pods}
    else:
        found = {job_holder(j) for x in parts for j in x.jobs}
        found |= {p.holder for x in parts for p in x.processes if p.used_memory_bytes}
    return tuple(sorted(found))


def holds_memory(g: GpuReading) -> bool:
    """A process holds memory on the GPU (or one of its MIG devices): it is allocated to someone."""
    return any((p.used_memory_bytes or 0) > 0 for p in g.processes) or any(
        (p.used_memory_bytes or 0) > 0 for m in g.migs for p in m.processes
    )


ACTIVITY_SIGNALS = ("auto", "gpu_utilization", "sm_active")


def select_activity(signal: str, sm_active: float | None, utilization: float | None) -> tuple[float | None, str]:
    """The activity signal and its name, from SM activity (GPM) and GPU-Util, as ``signal`` says.

    ``auto`` takes SM activity where there is any (a GPU with GPM), else GPU-Util: the same choice
    as the PromQL ``gpu_sm_active_ratio or gpu_utilization_ratio``.  The alert rules apply it to
    windowed means, the accounting of GPU time to each poll's values, so both judge "idle" alike.
    """
    if signal != "gpu_utilization" and (sm_active is not None or signal == "sm_active"):
        return sm_active, "SM activity"
    return utilization, "GPU utilization"


def activity_now(g: GpuReading, signal: str) -> tuple[float | None, str]:
    """This poll's activity signal of a GPU (see :func:`select_activity`)."""
    return select_activity(signal, g.activity.sm if g.activity is not None else None, g.utilization_ratio)
