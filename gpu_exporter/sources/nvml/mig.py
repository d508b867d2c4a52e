"""The MIG devices of a GPU in MIG mode: memory, processes and GPM activity.

GPU-Util and most other values are only per parent GPU (NVML answers NOT_SUPPORTED on a MIG
handle), so they are not asked for here; GPM is the one utilization per instance.
"""

from __future__ import annotations

import re

import pynvml

from ...snapshot import MigReading
from ..backend import GpuLost
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
    out = []
    for i in range(count):
        try:
            handle = N.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"GPU {dev.index}: MIG device {i}: {e}") from e
            continue  # NOT_FOUND: an empty slot
        mig = Device(dev.index, handle, dev.errors)
        mig.unsupported = dev.unsupported  # learnt once per GPU, not per MIG device
        uuid = mig.call("nvmlDeviceGetUUID(mig)", N.nvmlDeviceGetUUID)
        if uuid is None:
            continue
        name = mig.call("nvmlDeviceGetName(mig)", N.nvmlDeviceGetName) or ""
        mem = mig.call("nvmlDeviceGetMemoryInfo(mig)", N.nvmlDeviceGetMemoryInfo)
        gi = mig.call("nvmlDeviceGetGpuInstanceId", N.nvmlDeviceGetGpuInstanceId)
        profile = mig_profile(name)
        out.append(
            MigReading(
                index=i,
                uuid=uuid,
                profile=profile,
                gpu_instance_id=gi,
                compute_instance_id=mig.call("nvmlDeviceGetComputeInstanceId", N.nvmlDeviceGetComputeInstanceId),
                memory_total_bytes=mem.total if mem is not None else None,
                memory_used_bytes=mem.used if mem is not None else None,
                memory_free_bytes=mem.free if mem is not None else None,
                processes=processes.processes(mig, dev.mig_process_names, dev.process_users) if processes else (),
                activity=gpm.mig_activity(dev, gi, uuid, profile) if gpm else None,
            )
        )
    dev.mig_process_names = {p.pid: p.name for m in out for p in m.processes}
    if gpm is not None:
        gpm.forget_migs(dev, {(m.gpu_instance_id, m.uuid, m.profile) for m in out})
    return tuple(out)
