"""The MIG devices of a GPU in MIG mode: memory, processes and GPM activity.

GPU-Util and most other values are only per parent GPU (NVML answers NOT_SUPPORTED on a MIG
handle), so they are not asked for here; GPM is the one utilization per GPU instance.  What the MIG
handles cannot do is learnt once for all of them, apart from what the parent cannot do.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pynvml

from ...snapshot import MigReading
from .device import Device
from .processes import ProcessReader
from .profiling import GpmReader

_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")


def mig_profile(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` -> ``1g.10gb``."""
    m = _MIG_PROFILE.search(name)
    return m.group(1) if m else "unknown"


def read_migs(dev: Device, processes: ProcessReader | None, gpm: GpmReader | None) -> tuple[MigReading, ...]:
    """Every MIG device of ``dev``; ``processes``/``gpm`` None where that collector is off or the
    GPU has no GPM."""
    N = pynvml
    count = dev.call("nvmlDeviceGetMaxMigDeviceCount", N.nvmlDeviceGetMaxMigDeviceCount) or 0
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
        found.append(MigReading(
            index=i,
            uuid=uuid,
            profile=mig_profile(name),
            gpu_instance_id=gi,
            compute_instance_id=ci,
            memory_total_bytes=mem.total if mem is not None else None,
            memory_used_bytes=mem.used if mem is not None else None,
            memory_free_bytes=mem.free if mem is not None else None,
            processes=processes.processes(mig, dev.mig_process_names, dev.process_users) if processes else (),
        ))  # fmt: skip
    dev.mig_process_names = {p.pid: p.name for m in found for p in m.processes}
    if gpm is None:
        return tuple(found)
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
    return tuple(replace(m, activity=activity[m.index]) if m.index in activity else m for m in found)
