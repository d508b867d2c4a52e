"""Facts of a GPU that rarely change (name, bus id, minor number, maxima, thresholds, fans, NVLink
links, GPM support), read at discovery and on every static refresh."""

from __future__ import annotations

from types import MappingProxyType

import pynvml
import structlog

from ...snapshot import GpuStatic
from .device import Device
from .fields import FI_NVLINK_LINK_COUNT, read_one
from .profiling import GpmReader

log = structlog.get_logger(__name__)

CLOCKS = {"graphics": pynvml.NVML_CLOCK_GRAPHICS, "sm": pynvml.NVML_CLOCK_SM, "memory": pynvml.NVML_CLOCK_MEM,
          "video": pynvml.NVML_CLOCK_VIDEO}  # fmt: skip
# The names under which each link's state query is remembered, built once: more links than any GPU
# has (NVML_NVLINK_MAX_LINKS is 18 in nvml.h up to R580, 36 since).
NVLINK_STATE = tuple(f"nvmlDeviceGetNvLinkState({link})" for link in range(64))
THRESHOLDS = {
    "shutdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    "slowdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    "mem_max": pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
    "gpu_max": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
}


def read_static(dev: Device, uuid: str, *, clocks: bool, nvlink: bool, gpm: GpmReader | None) -> GpuStatic:
    """The static facts of ``dev``, whose UUID has been read; ``clocks``/``nvlink``/``gpm`` say which
    collectors are on (``gpm`` None: profiling is off)."""
    N = pynvml
    c = dev.call
    pci = c("nvmlDeviceGetPciInfo", N.nvmlDeviceGetPciInfo)
    mig = c("nvmlDeviceGetMigMode", N.nvmlDeviceGetMigMode)
    fans = c("nvmlDeviceGetNumFans", N.nvmlDeviceGetNumFans)
    if fans is None and "nvmlDeviceGetNumFans" in dev.missing:
        fans = -1  # an older driver: fall back to the one-fan nvmlDeviceGetFanSpeed
    return GpuStatic(
        index=dev.index,
        uuid=uuid,
        name=c("nvmlDeviceGetName", N.nvmlDeviceGetName) or "unknown",
        pci_bus_id=pci.busId if pci is not None else "",
        serial=c("nvmlDeviceGetSerial", N.nvmlDeviceGetSerial),
        mig_mode="unsupported" if mig is None else ("enabled" if mig[0] else "disabled"),
        clock_max_hertz=MappingProxyType(
            {
                name: mhz * 1e6
                for name, kind in CLOCKS.items()
                if clocks
                and (mhz := c(f"nvmlDeviceGetMaxClockInfo({name})", N.nvmlDeviceGetMaxClockInfo, kind)) is not None
            }
        ),
        pcie_max_generation=c("nvmlDeviceGetMaxPcieLinkGeneration", N.nvmlDeviceGetMaxPcieLinkGeneration),
        pcie_max_width=c("nvmlDeviceGetMaxPcieLinkWidth", N.nvmlDeviceGetMaxPcieLinkWidth),
        temperature_thresholds_celsius=MappingProxyType(
            {
                name: float(t)
                for name, kind in THRESHOLDS.items()
                if (t := c(f"nvmlDeviceGetTemperatureThreshold({name})", N.nvmlDeviceGetTemperatureThreshold, kind))
                is not None
            }
        ),
        fan_count=fans or 0,
        nvlink_count=(links := count_nvlinks(dev) if nvlink else 0),
        nvlink_links=links if nvlink else None,
        gpm_supported=gpm.supported(dev) if gpm is not None else False,
        # nvml.h: "Supported only for Linux"; elsewhere NOT_SUPPORTED, remembered like any other.
        minor_number=c("nvmlDeviceGetMinorNumber", N.nvmlDeviceGetMinorNumber),
        architecture=_architecture(c("nvmlDeviceGetArchitecture", N.nvmlDeviceGetArchitecture)),
    )


def _architecture(arch: int | None) -> int | None:
    """nvml.h: NVML_DEVICE_ARCH_UNKNOWN (0xffffffff) is "anything else, presumably something newer":
    no architecture to go by."""
    return None if arch is None or arch == getattr(pynvml, "NVML_DEVICE_ARCH_UNKNOWN", 0xFFFFFFFF) else int(arch)


def count_nvlinks(dev: Device) -> int:
    """How many NVLink links the GPU has, as the driver says (``NVML_FI_DEV_NVLINK_LINK_COUNT``): an
    A100 12, an H100 18, an L40S or T4 none.  Never probed by asking link after link: past the last
    link a driver may answer INVALID_ARGUMENT (TensorRT-LLM #17060), or an inactive link (what a mock
    of the driver answered for an A100's links 12-17); and an inactive port answers NOT_SUPPORTED
    part-way through the list (H100 NVL, DataDog's NVML check), a gap that must hide no later link."""
    n = read_one(dev, (FI_NVLINK_LINK_COUNT, 0), "nvmlDeviceGetFieldValues(link count)")
    if not isinstance(n, int) or n <= 0:
        return 0  # no NVLink (field 91 unsupported, or 0), or a value that is no count
    if n > len(NVLINK_STATE):
        dev.errors("nvmlDeviceGetFieldValues", "out_of_range")
        return 0
    try:
        pynvml.nvmlDeviceGetNvLinkState(dev.handle, 0)
    except pynvml.NVMLError as e:
        if e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            # An NVLink panel without states needs a visible reason: this driver lacks the call.  The
            # traffic counters (field values) still come; the states are not asked for, link by link.
            dev.errors("nvmlDeviceGetNvLinkState", "function_not_found")
            dev.unsupported.update(NVLINK_STATE[:n])
            log.warning("nvlink_state_unavailable", gpu=dev.index,
                        reason="the driver has no nvmlDeviceGetNvLinkState; link states are not shown")  # fmt: skip
    return n
