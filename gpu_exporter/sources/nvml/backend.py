"""The NVML backend: NVML's session, the GPUs it knows, and one poll of each.

What a poll reads is in ``reads`` (with ``fields``, ``processes``, ``mig`` and ``profiling``),
the static facts in ``static``, XID events in ``xid``; this module ties them to the
:class:`~gpu_exporter.sources.backend.Backend` interface.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

import pynvml

from ...metric_defs import Collector
from ...snapshot import GpuReading, GpuStatic
from ..backend import ErrorSink, GpuLost, ResetRequired, SystemInfo
from ..cadence import Cadence
from .device import Baton, Device
from .errors import DRIVER_GONE, error_name, try_call, unavailable
from .pcie import PcieCounters, Sample
from .processes import ProcessReader
from .profiling import GpmReader
from .reads import Readers, read_quick
from .static import read_static
from .xid import XidWatcher


def _cuda_version(v: int | None) -> str | None:
    return None if v is None else f"{v // 1000}.{v % 1000 // 10}"


def _version(driver_version: str | None) -> tuple[int, ...]:
    """The driver's version as numbers ("580.82.07" -> (580, 82, 7)); () where it is not one."""
    parts = (driver_version or "").split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()


class NvmlBackend:
    """Reads GPUs through the real NVML library (libnvidia-ml.so.1) via nvidia-ml-py."""

    def __init__(
        self,
        errors: ErrorSink,
        *,
        profiling_interval: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        disabled: frozenset[str] = frozenset(),
        slow_interval: float = 30.0,  # the setting poll_slow_interval's default
        proc_root: str = "/proc",  # where processes' names, users and start times are read
        poll_interval: float = 0.0,  # the time between polls (0: unknown): the cadences keep to it
    ) -> None:
        self._errors = errors
        self._mono = monotonic
        # Collectors switched off: their queries are never made (and their series are absent).
        # GPM and per-process utilization are re-read every ``profiling_interval``: the driver's
        # own CPU cost of them (about 1.2 ms per GPM pair, 2 ms per process read, on an H200)
        # dwarfs everything else a poll does, so they get their own, slower cadence.
        self._nvlink = Collector.NVLINK not in disabled
        self._gpm = GpmReader(profiling_interval, monotonic, mig_interval=slow_interval, poll_interval=poll_interval)
        self._readers = Readers(
            clocks=Collector.CLOCKS not in disabled,
            ecc=Collector.ECC not in disabled,
            processes=(
                ProcessReader(profiling_interval, monotonic, wall, proc_root, poll_interval)
                if Collector.PROCESSES not in disabled
                else None
            ),
            gpm=self._gpm if Collector.PROFILING not in disabled else None,
            disabled=frozenset(disabled),
            slow_s=slow_interval,
            poll_s=poll_interval,
        )
        self._devices: dict[int, Device] = {}
        self._lock = threading.Lock()
        self._baton = Baton()
        self._xids = XidWatcher(errors)
        self._open = False

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> SystemInfo:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise unavailable(e) from e
        self._open = True
        driver = try_call(pynvml.nvmlSystemGetDriverVersion)
        cuda = try_call(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        # Some declared field ids mean what they say only from some driver version on (reads.py).
        self._readers = replace(self._readers, driver_version=_version(driver))
        if self._readers.processes is not None:
            self._readers.processes.driver_changed()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            self.close()
            raise unavailable(e) from e
        self._xids.start(count)
        return SystemInfo(driver_version=driver, cuda_version=_cuda_version(cuda), gpu_count=count)

    def count(self) -> int | None:
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as e:
            if e.value in DRIVER_GONE:
                raise unavailable(e) from e
            self._errors("nvmlDeviceGetCount", error_name(e.value))
            return None
        self._xids.watch_at_least(count)  # a GPU that appeared since the start is watched too
        return count

    def xid_counts(self, uuid: str) -> Mapping[int, int]:
        return self._xids.counts(uuid)

    def close(self) -> None:
        self._xids.stop()
        with self._lock:
            devices = list(self._devices.values())
            self._devices.clear()
        for dev in devices:
            self._gpm.free(dev)
        if self._open:
            self._open = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    # -- static facts -------------------------------------------------------------------------
    def read_static(self, index: int) -> GpuStatic:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as e:
            self._errors("nvmlDeviceGetHandleByIndex", error_name(e.value))
            self._forget(index)
            if e.value == pynvml.NVML_ERROR_RESET_REQUIRED:
                raise ResetRequired(f"GPU {index}: the driver will not hand out its handle until it is reset") from e
            raise GpuLost(f"GPU {index}: {e}") from e
        dev = Device(index, handle, self._errors, self._mono)
        uuid = dev.call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID)
        if uuid is None:
            self._forget(index)
            if dev.reset_required:
                raise ResetRequired(f"GPU {index}: the driver will not say its UUID until it is reset")
            raise GpuLost(f"GPU {index}: its UUID cannot be read")
        static = read_static(dev, uuid, clocks=self._readers.clocks, nvlink=self._nvlink, gpm=self._readers.gpm)
        with self._lock:
            old = self._devices.get(index)
            self._devices[index] = dev
        if old is not None:
            if old.uuid_seen == uuid and not old.lost:
                self._carry_over(old, dev)
            else:
                self._gpm.free(old)
        if dev.pcie is None:
            dev.pcie = PcieCounters()
        dev.uuid_seen = uuid
        return static

    def _forget(self, index: int) -> None:
        """GPU ``index`` cannot be read at discovery: whatever comes back there later is a new device
        (its counters and samples started again), never diffed against this one's."""
        with self._lock:
            old = self._devices.pop(index, None)
        if old is not None:
            old.lost = True
            self._gpm.free(old)

    @staticmethod
    def _carry_over(old: Device, dev: Device) -> None:
        """A static refresh of the same GPU keeps its GPM samples and PCIe counts, so activity and
        throughput have no gap; the PCIe counters are checked against the driver's sample again.  The
        slow reads and per-process utilization keep their last values and their plans: a refresh is
        not a read of theirs, which would put them off their cadence (the slow reads are taken at once
        where the refresh found other links)."""
        dev.gpm, dev.mig_gpm = old.gpm, old.mig_gpm
        dev.slow, dev.pcie_sampled = old.slow, old.pcie_sampled
        dev.process_util_at, dev.process_util_due = old.process_util_at, old.process_util_due
        dev.process_util_seen, dev.process_util = old.process_util_seen, old.process_util
        dev.pcie, old.pcie = old.pcie, None
        if dev.pcie is not None:
            dev.pcie.recheck()
        old.gpm, old.mig_gpm = None, {}
        for pair in [dev.gpm, *dev.mig_gpm.values()]:
            if pair is not None:
                pair.unsupported.clear()  # asked again after each static refresh, as other queries are
        if dev.gpm is not None and dev.gpm.closed:
            dev.gpm = None
        dev.mig_gpm = {k: v for k, v in dev.mig_gpm.items() if not v.closed}

    # -- per poll -------------------------------------------------------------------------------
    def _paced_sample(self, dev: Device) -> tuple[Sample, bool]:
        return _paced(dev, self._readers.slow)

    def read_gpu(self, static: GpuStatic) -> GpuReading:
        with self._lock:
            dev = self._devices.get(static.index)
        if dev is None:
            raise GpuLost(f"GPU {static.index} has not been discovered")
        # The quick calls one GPU at a time: each ctypes call lets go of the GIL, and eight readers
        # doing them at once hand it to each other on every call (a thread switch each, which
        # cost more than the calls).  Only the blocking PCIe reads below run side by side.
        with self._baton.hold():
            reading = read_quick(dev, static, self._readers, self._xids.counts(static.uuid))
        # The rate from the byte counters where they can be trusted (pcie.py), else the driver's
        # sample; the sample blocks, so it runs outside the baton, beside the other GPUs' reads.
        pcie = dev.pcie or PcieCounters()
        # Without byte counters (R535, GeForce), or with narrow ones that cannot be trusted (a busy
        # L40S), the rate is the driver's sample, two 20 ms waits: taken at the slow cadence, the last
        # one shown meanwhile.  The first poll and a static refresh's check take it at once.
        rates, totals = pcie.poll(dev.pcie_counts, partial(_pcie_sample, dev), partial(self._paced_sample, dev))
        if rates is None and totals is None:
            return reading
        tx, rx = rates or (None, None)
        total_tx, total_rx = totals or (None, None)
        return replace(reading, pcie_tx_bytes_per_second=tx, pcie_rx_bytes_per_second=rx,
                       pcie_tx_bytes_total=total_tx, pcie_rx_bytes_total=total_rx)  # fmt: skip


def _paced(dev: Device, slow: Cadence) -> tuple[Sample, bool]:
    """The driver's sample on the slow cadence: (the sample, whether it was taken just now)."""
    now = dev.monotonic()
    last = dev.pcie_sampled
    planned = slow.take(last[0] if last is not None else None, now)
    if planned is None and last is not None:
        return last[1], False
    taken = _pcie_sample(dev)
    dev.pcie_sampled = (planned if planned is not None else now, taken)
    return taken, True


def _pcie_sample(dev: Device) -> Sample:
    """The driver's own throughput sample, each direction blocking ~20 ms (and 0.7 ms of CPU on an
    H200) while it watches the link; KB/s, so x 1024."""
    N = pynvml
    c = dev.call
    tx = c("nvmlDeviceGetPcieThroughput(tx)", N.nvmlDeviceGetPcieThroughput, N.NVML_PCIE_UTIL_TX_BYTES)
    rx = c("nvmlDeviceGetPcieThroughput(rx)", N.nvmlDeviceGetPcieThroughput, N.NVML_PCIE_UTIL_RX_BYTES)
    if tx is None and rx is None:
        return None
    return (tx * 1024 if tx is not None else None, rx * 1024 if rx is not None else None)
