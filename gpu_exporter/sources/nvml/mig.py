"""The MIG devices of a GPU in MIG mode: memory, processes and GPM activity.

GPU-Util and most other values are only per parent GPU (NVML answers NOT_SUPPORTED on a MIG
handle), so they are not asked for here; GPM is the one utilization per GPU instance.  What the MIG
handles cannot do is learnt once for all of them, apart from what the parent cannot do.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pynvml

from ...snapshot import MigReading
from .device import Device
from .errors import SENTINELS
from .processes import ProcessReader
from .profiling import GpmReader

_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")


def mig_profile(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` -> ``1g.10gb``."""
    m = _MIG_PROFILE.search(name)
    return m.group(1) if m else "unknown"


def read_migs(
    dev: Device, processes: ProcessReader | None, gpm: GpmReader | None
) -> tuple[tuple[MigReading, ...], int | None]:
    """Every MIG device of ``dev``, and the most it can hold (its compute slices: the books share
    the card by them); ``processes``/``gpm`` None where that collector is off or the GPU has no GPM."""
    N = pynvml
    most = dev.call("nvmlDeviceGetMaxMigDeviceCount", N.nvmlDeviceGetMaxMigDeviceCount)
    count = most or 0
    found = []
    for i in range(count):
        try:
            handle = N.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_GPU_IS_LOST:
                raise dev.lost_on("nvmlDeviceGetMigDeviceHandleByIndex") from e
            continue  # NOT_FOUND: an empty slot
        mig = dev.mig(handle)
        uuid = mig.call("nvmlDeviceGetUUID(mig)", N.nvmlDeviceGetUUID)
        if uuid is None:
            continue
        name = mig.call("nvmlDeviceGetName(mig)", N.nvmlDeviceGetName) or ""
        mem = mig.call("nvmlDeviceGetMemoryInfo(mig)", N.nvmlDeviceGetMemoryInfo)
        gi = mig.call("nvmlDeviceGetGpuInstanceId", N.nvmlDeviceGetGpuInstanceId)
        ci = mig.call("nvmlDeviceGetComputeInstanceId", N.nvmlDeviceGetComputeInstanceId)
        profile_id, start = gpu_instance(dev, gi, uuid) if gi is not None else (None, None)
        found.append(MigReading(
            index=i,
            uuid=uuid,
            profile=mig_profile(name),
            gpu_instance_id=gi,
            compute_instance_id=ci,
            gpu_instance_profile_id=profile_id,
            placement_start=start,
            memory_total_bytes=mem.total if mem is not None else None,
            memory_used_bytes=mem.used if mem is not None else None,
            memory_free_bytes=mem.free if mem is not None else None,
            processes=processes.processes(mig, dev.mig_process_names, dev.process_users) if processes else (),
        ))  # fmt: skip
    dev.mig_process_names = {(p.pid, p.start_time): p.name for m in found for p in m.processes}
    seen = {(m.gpu_instance_id, m.uuid) for m in found}
    dev.gpu_instances = {k: v for k, v in dev.gpu_instances.items() if k in seen}
    slices = most if most and most > 0 else None
    if gpm is None:
        return tuple(found), slices
    # GPM is per GPU instance: sampled once for each, and shown on one of its MIG devices (the one
    # with the lowest compute instance id), so a sum over MIG devices counts each instance once.
    shown: dict[int, MigReading] = {}
    for m in found:
        if m.gpu_instance_id is not None:
            first = shown.get(m.gpu_instance_id)
            if first is None or (m.compute_instance_id or 0) < (first.compute_instance_id or 0):
                shown[m.gpu_instance_id] = m
    activity = {m.index: gpm.mig_activity(dev, gi, m.uuid, m.profile) for gi, m in shown.items()}
    gpm.forget_migs(dev, {(m.gpu_instance_id, m.uuid, m.profile) for m in shown.values()})
    return tuple(replace(m, activity=activity[m.index]) if m.index in activity else m for m in found), slices


def gpu_instance(dev: Device, gi: int, uuid: str) -> tuple[int | None, int | None]:
    """The profile id and placement start of GPU instance ``gi`` of ``dev`` (the parent), for its MIG
    device ``uuid``: nvmlDeviceGetGpuInstanceById, then nvmlGpuInstanceGetInfo.

    Read once per instance: both are fixed while it exists, and an instance destroyed and made again
    gives its MIG devices new UUIDs.  A failure leaves both None and is asked again next poll, except
    what ``Device.call`` remembers until the static refresh: NO_PERMISSION (nvml.h: the lookup
    "Requires privileged user", i.e. root or the mig/monitor capability), NOT_SUPPORTED, a missing
    function.  The profile id is the device's own (``nvidia-smi mig -lgip``: 19 for an H100's 1g.10gb),
    which NVIDIA's DRA driver puts in a MIG device's name, with the placement start.
    """
    key = (gi, uuid)
    known = dev.gpu_instances.get(key)
    if known is not None:
        return known
    handle = dev.call("nvmlDeviceGetGpuInstanceById", pynvml.nvmlDeviceGetGpuInstanceById, gi)
    info = dev.call("nvmlGpuInstanceGetInfo", _gpu_instance_info, handle) if handle is not None else None
    if info is None:
        return None, None
    profile_id, start = int(info.profileId), int(info.placement.start)
    found: tuple[int | None, int | None] = (profile_id, start)
    if profile_id in SENTINELS or start in SENTINELS:  # INVALID_GPU_INSTANCE_PROFILE_ID and the like
        dev.errors("nvmlGpuInstanceGetInfo", "out_of_range")  # once: the answer is as fixed as a good one
        found = (None, None)
    dev.gpu_instances[key] = found
    return found


def _gpu_instance_info(_device: Any, gpu_instance: Any) -> Any:
    """For ``Device.call``, which passes the device handle first: nvmlGpuInstanceGetInfo takes the
    GPU instance's alone."""
    return pynvml.nvmlGpuInstanceGetInfo(gpu_instance)
