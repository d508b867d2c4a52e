"""Which state a GPU is in at one poll, and who holds it.

- ``busy``: the activity signal is at or above the idle threshold.  The signal is SM activity
  where the GPU has GPM, else GPU-Util, chosen exactly as GpuUnderutilized chooses it
  (:func:`~gpu_exporter.snapshot.select_activity`); the threshold is that rule's.
- ``allocated_idle``: below the threshold, but a process holds memory, or a pod or Slurm job holds the
  GPU.
- ``idle``: below the threshold and nobody holds it.
- ``down``: lost or unreadable.

A GPU with no activity signal at all (MIG mode before Hopper: NVML gives neither GPU-Util nor GPM)
counts as ``busy`` while held and ``idle`` otherwise: waste that cannot be seen is not claimed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ..snapshot import (
    CONTAINER,
    JOB,
    NOBODY,
    POD,
    UNKNOWN_USER,
    USER,
    ContainerRef,
    GpuReading,
    Holder,
    JobRef,
    PodRef,
    ProcessReading,
    activity_now,
    holds_memory,
    job_holder,
)

BUSY: Final = "busy"
ALLOCATED_IDLE: Final = "allocated_idle"
IDLE: Final = "idle"
DOWN: Final = "down"
STATES: Final = (BUSY, ALLOCATED_IDLE, IDLE, DOWN)
WASTE_STATES: Final = (ALLOCATED_IDLE, IDLE)

__all__ = ["NOBODY", "UNKNOWN_USER", "Holder"]  # the holder model, as the books use it
OTHER_USER = "other"
# Holders beyond a GPU's bound (see Accountant.max_users) count as one "other" of their kind.
OTHERS: Final = {
    USER: Holder(USER, (OTHER_USER,)),
    JOB: Holder(JOB, (OTHER_USER, "", "", "")),
    CONTAINER: Holder(CONTAINER, ("", "", OTHER_USER)),
}


def pods_of(g: GpuReading) -> tuple[PodRef, ...]:
    """Every container holding the GPU or one of its MIG devices."""
    refs = set(g.pods) | {r for m in g.migs for r in m.pods}
    return tuple(sorted(refs, key=lambda r: (r.namespace, r.pod, r.container)))


def jobs_of(g: GpuReading) -> tuple[JobRef, ...]:
    """Every Slurm job holding the GPU or one of its MIG devices."""
    return tuple(sorted(set(g.jobs) | {j for m in g.migs for j in m.jobs}, key=lambda j: (j.job, j.user)))


def containers_of(g: GpuReading) -> tuple[ContainerRef, ...]:
    """Every container running a process on the GPU or one of its MIG devices."""
    return tuple(sorted(set(g.containers) | {c for m in g.migs for c in m.containers}, key=lambda c: (c.engine, c.id)))


def processes_of(g: GpuReading) -> tuple[ProcessReading, ...]:
    """The GPU's processes and those of its MIG devices, each once."""
    seen: dict[int, ProcessReading] = {p.pid: p for m in g.migs for p in m.processes}
    seen.update((p.pid, p) for p in g.processes)
    return tuple(seen.values())


def is_held(g: GpuReading) -> bool:
    return holds_memory(g) or bool(pods_of(g)) or bool(jobs_of(g))


def classify(g: GpuReading, threshold: float, signal: str = "auto") -> str:
    if not g.up or g.reset_required:  # one the driver will not use until it is reset: nobody can
        return DOWN
    activity, _ = activity_now(g, signal)
    held = is_held(g)
    if activity is None:
        return BUSY if held else IDLE
    if activity >= threshold:
        return BUSY
    return ALLOCATED_IDLE if held else IDLE


def _split(weights: dict[Holder, float | None]) -> list[tuple[Holder, float]]:
    """Shares by per-process utilization where every holder's is known and some is non-zero, else even."""
    if not weights:
        return [(NOBODY, 1.0)]
    known = [w for w in weights.values() if w is not None]
    total = sum(known)
    if len(known) == len(weights) and total > 0:
        return [(h, (w or 0.0) / total) for h, w in sorted(weights.items())]
    return [(h, 1.0 / len(weights)) for h in sorted(weights)]


def _add(weights: dict[Holder, float | None], holder: Holder, utilization: float | None) -> None:
    if holder not in weights:
        weights[holder] = utilization
    elif utilization is not None:
        weights[holder] = (weights[holder] or 0.0) + utilization


def holders(g: GpuReading, pod_mode: bool) -> list[tuple[Holder, float]]:
    """Who holds the GPU now, and each one's share of its time (shares sum to 1).

    With pod attribution (``pod_mode``) the holders are the pods the kubelet assigned the GPU or its
    MIG devices to.  Otherwise the Slurm jobs it is allocated to, and the holder of each process
    holding memory on it (its job, else its container, else its user).  Several holders (a
    time-sliced GPU) share its time by the SM utilization of their processes where the driver
    gives it for every holder, and evenly otherwise.
    """
    if not g.up:
        return [(NOBODY, 1.0)]
    procs = processes_of(g)
    weights: dict[Holder, float | None] = {}
    if pod_mode:
        containers: dict[tuple[str, ...], list[str]] = {}
        for ref in pods_of(g):
            containers.setdefault((ref.namespace, ref.pod), []).append(ref.container)
        for ns, pod in containers:
            mine = [p for p in procs if p.pod is not None and (p.pod.namespace, p.pod.pod) == (ns, pod)]
            _add(weights, Holder(POD, (ns, pod, "")), _utilization(mine))
        # A pod's containers that hold the device together split the pod's share evenly.
        return [(Holder(POD, (*key, c)), share / len(containers[key]))
                for h, share in _split(weights) if (key := (h.values[:2])) in containers
                for c in containers[key]] or [(NOBODY, 1.0)]  # fmt: skip
    for job in jobs_of(g):  # allocated: held whether or not a process runs (a process's utilization adds below)
        weights.setdefault(job_holder(job), None)
    for p in procs:
        if p.used_memory_bytes:  # a process without memory on the GPU holds nothing
            _add(weights, p.holder, p.sm_utilization_ratio)
    return _split(weights)


def _utilization(procs: Iterable[ProcessReading]) -> float | None:
    values = [p.sm_utilization_ratio for p in procs]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)
