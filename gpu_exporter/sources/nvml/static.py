"""Facts of a GPU that rarely change (name, bus id, maxima, thresholds, fans, NVLink links, GPM
support), read at discovery and on every static refresh."""

from __future__ import annotations

from types import MappingProxyType

import pynvml
import structlog

from ...snapshot import GpuStatic
from .device import Device
from .profiling import GpmReader

log = structlog.get_logger(__name__)

CLOCKS = {"graphics": pynvml.NVML_CLOCK_GRAPHICS, "sm": pynvml.NVML_CLOCK_SM, "memory": pynvml.NVML_CLOCK_MEM,
          "video": pynvml.NVML_CLOCK_VIDEO}  # fmt: skip
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
        nvlink_count=count_nvlinks(dev) if nvlink else 0,
        gpm_supported=gpm.supported(dev) if gpm is not None else False,
    )


def count_nvlinks(dev: Device) -> int:
    """Links answer GetNvLinkState from 0 upwards; the first that does not is past the last."""
    n = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            pynvml.nvmlDeviceGetNvLinkState(dev.handle, link)
        except pynvml.NVMLError as e:
            if link == 0 and e.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                # An empty NVLink panel needs a visible reason: this driver lacks the call.
                dev.errors("nvmlDeviceGetNvLinkState", "function_not_found")
                log.warning("nvlink_state_unavailable", gpu=dev.index,
                            reason="the driver has no nvmlDeviceGetNvLinkState; links are not listed")  # fmt: skip
            break
        n += 1
    return n
