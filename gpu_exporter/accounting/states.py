"""Which state a GPU is in at one poll, and who holds it.

- ``busy``: the activity signal is at or above the idle threshold.  The signal is SM activity
  where the GPU has GPM, else GPU-Util, chosen exactly as GpuUnderutilized chooses it
  (:func:`~gpu_exporter.snapshot.select_activity`); the threshold is that rule's.
- ``allocated_idle``: below the threshold, but a process holds memory, or a pod or Slurm job holds the
  GPU.
- ``allocated_unknown``: held, but the driver gives no activity to judge it by (a MIG slice of an
  A100 or A30, which have no GPM, or a GPU that answers neither GPU-Util nor GPM): neither busy
  nor idle, so that no waste is claimed and none hidden.
- ``idle``: below the threshold and nobody holds it (with no activity signal: nobody holds it).
- ``down``: lost or unreadable.

A GPU in MIG mode has books per GPU instance (:func:`parts`): each slice its own state from its own
activity (GPM per GPU instance, the ``gpu_mig_sm_active_ratio`` series) and its own holders, its
time weighted by its share of the card (its compute slices out of the card's: a 1g of 7 is 1/7),
so that a card's parts add up to its time and hours x the card's price is each slice's cost.  The
compute slices no GPU instance takes are idle, held by nobody.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
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
    MigReading,
    PodRef,
    ProcessReading,
    activity_now,
    holds_memory,
    job_holder,
)

BUSY: Final = "busy"
ALLOCATED_IDLE: Final = "allocated_idle"
ALLOCATED_UNKNOWN: Final = "allocated_unknown"
IDLE: Final = "idle"
DOWN: Final = "down"
STATES: Final = (BUSY, ALLOCATED_IDLE, ALLOCATED_UNKNOWN, IDLE, DOWN)
HELD_STATES: Final = (BUSY, ALLOCATED_IDLE, ALLOCATED_UNKNOWN)
WASTE_STATES: Final = (ALLOCATED_IDLE, IDLE)
WHOLE: Final = ""  # the gpu_instance_id of a whole GPU's books, and of a MIG card's unused slices

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
    return _state(activity, is_held(g), threshold)


def _state(activity: float | None, held: bool, threshold: float) -> str:
    if activity is None:
        return ALLOCATED_UNKNOWN if held else IDLE
    if activity >= threshold:
        return BUSY
    return ALLOCATED_IDLE if held else IDLE


_BUSIEST: Final = (BUSY, ALLOCATED_UNKNOWN, ALLOCATED_IDLE, IDLE, DOWN)


def card_state(cut: Iterable[Part]) -> str:
    """A card's one state, from its parts: its busiest part's (a MIG card with one busy slice is busy)."""
    return min((p.state for p in cut), key=_BUSIEST.index, default=DOWN)


@dataclass(frozen=True)
class Part:
    """A part of a GPU with books of its own: the whole GPU, or one GPU instance of a card in MIG mode
    (``instance``: its id; ``WHOLE`` for the whole GPU or the slices no instance takes)."""

    instance: str
    share: float  # of the card's time
    state: str
    holders: list[tuple[Holder, float]]


# "1g.10gb", "1g.10gb+me", "2g.20gb"; a compute instance's "1c.7g.80gb" names its GPU instance's 7g.
_SLICES = re.compile(r"(?:^|\.)(\d+)g\.")


def slices_of(profile: str) -> int | None:
    """The compute slices of the GPU instance a MIG device's profile names, None where it names none."""
    m = _SLICES.search(profile)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def parts(g: GpuReading, threshold: float, signal: str = "auto", pod_mode: bool = False) -> list[Part]:
    """The parts of ``g`` that keep books, each with its state and holders (shares of its time).

    A GPU in MIG mode is cut into its GPU instances, each with its compute instances' activity (GPM
    gives it per GPU instance, on one of them) and holders.  Where the cut cannot be told (the card's
    slices or an instance's id or profile unknown, or instances that add up to more than the card),
    the card keeps one book, as any GPU, judged on what it gives as a whole (in MIG mode no
    activity at all: ``allocated_unknown`` while held).
    """
    whole = [Part(WHOLE, 1.0, classify(g, threshold, signal), holders(g, pod_mode))]
    if not g.up or g.reset_required or not g.migs or not g.mig_slices:
        return whole
    instances: dict[int, list[MigReading]] = {}
    for m in g.migs:
        if m.gpu_instance_id is None or slices_of(m.profile) is None:
            return whole
        instances.setdefault(m.gpu_instance_id, []).append(m)
    shares = {gi: (slices_of(ms[0].profile) or 0) / g.mig_slices for gi, ms in instances.items()}
    rest = 1.0 - sum(shares.values())
    if rest < -1e-9:
        return whole
    out = []
    for gi, ms in sorted(instances.items()):
        # The instance as a GPU of its own: its MIG devices, and nothing of the parent's (in MIG mode the
        # parent lists every instance's processes).
        view = replace(g, migs=tuple(ms), processes=(), pods=(), jobs=(), containers=())
        sm = next((m.activity.sm for m in ms if m.activity is not None and m.activity.sm is not None), None)
        activity = None if signal == "gpu_utilization" else sm  # no GPU-Util is given per MIG device
        out.append(Part(str(gi), shares[gi], _state(activity, is_held(view), threshold), holders(view, pod_mode)))
    if rest > 1e-9:
        out.append(Part(WHOLE, rest, IDLE, [(NOBODY, 1.0)]))
    return out


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
