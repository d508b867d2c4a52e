"""GPM (GPU Performance Monitoring, Hopper and newer) through NVML: the calls and structs, and the
reader that keeps one sample pair per GPU and per MIG GPU instance.

Which samples to diff and what the answers mean is :mod:`gpu_exporter.sources.gpm`'s job; this
module only talks to the driver.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import pynvml
import structlog

from ...snapshot import Activity
from ..gpm import METRIC_FIELDS, MetricAnswer, SamplePair, activity_of
from .device import Device
from .errors import DRIVER_GONE, UNSUPPORTED, error_name, unavailable

log = structlog.get_logger(__name__)

_GPM_IDS = tuple(METRIC_FIELDS)
# nvmlGpmMetricsGet_t's metrics[] is NVML_GPM_METRIC_MAX long: 98, 210 and 477 in different
# releases, under the same struct version 1.  A driver built with a larger maximum than the
# bindings could write past their array, so we hand it our own struct, longer than any so far.
_GPM_METRIC_SLOTS = 1024


class _GpmMetric(ctypes.Structure):
    """nvmlGpmMetric_t (nvml.h), metricInfo flattened; plain ctypes, as nvidia-ml-py's
    attribute-hooked structs cost a Python call per field read."""

    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double),
                ("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]  # fmt: skip


class _GpmMetricsGet(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint),
                ("sample1", ctypes.c_void_p), ("sample2", ctypes.c_void_p),
                ("metrics", _GpmMetric * _GPM_METRIC_SLOTS)]  # fmt: skip


class _Sample(NamedTuple):
    """A GPM sample buffer: nvidia-ml-py's handle, and its address for our metrics struct."""

    handle: Any
    address: int


class _NvmlGpmCalls:
    """GPM through nvidia-ml-py, with a metrics struct long enough for any driver, one per thread
    (each GPU is read by one thread at a time), so polls allocate nothing."""

    def __init__(self) -> None:
        self._local = threading.local()

    def alloc(self) -> _Sample:
        handle = pynvml.nvmlGpmSampleAlloc()
        return _Sample(handle, ctypes.cast(handle, ctypes.c_void_p).value or 0)

    def free(self, sample: _Sample) -> None:
        pynvml.nvmlGpmSampleFree(sample.handle)

    def metrics(self, older: _Sample, newer: _Sample, ids: tuple[int, ...]) -> dict[int, tuple[int, float]]:
        mg = getattr(self._local, "mg", None)
        if mg is None:
            mg = self._local.mg = _GpmMetricsGet()
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(ids)
        mg.sample1, mg.sample2 = older.address, newer.address
        metrics = mg.metrics
        for i, metric in enumerate(ids):
            metrics[i].metricId = metric
        try:
            pynvml.nvmlGpmMetricsGet(mg)
        except pynvml.NVMLError as e:
            e.gpm_function = "nvmlGpmMetricsGet"  # tells the caller which of the pair's calls failed
            raise
        # Read back by position: the answers are in the order asked.
        return {metric: (metrics[i].nvmlReturn, metrics[i].value) for i, metric in enumerate(ids)}


_GPM_CALLS = _NvmlGpmCalls()
# Which samples a call that refuses takes with it (any other: all of the GPU's).
Scope = Literal["all", "gpu", "migs"]
_SCOPE: dict[str, Scope] = {"nvmlGpmSampleGet": "gpu", "nvmlGpmMigSampleGet": "migs"}


class GpmReader:
    """Activity of GPUs and MIG GPU instances, one sample pair each, re-sampled every ``interval``."""

    def __init__(
        self,
        interval: float,
        monotonic: Callable[[], float] = time.monotonic,
        mig_interval: float = 0.0,
        poll_interval: float = 0.0,
    ) -> None:
        self._interval = interval
        self._slack = poll_interval / 2  # a sample taken at the poll nearest its plan (cadence.py)
        self._mono = monotonic
        # A MIG GPU instance's pair at the slow cadence, if longer: seven instances would otherwise
        # cost seven sample-and-metrics pairs (1.2 ms each on an H200) every profiling interval.
        self._mig_interval = max(interval, mig_interval)

    def supported(self, dev: Device) -> bool:
        support = dev.call("nvmlGpmQueryDeviceSupport", pynvml.nvmlGpmQueryDeviceSupport)
        if support is None:
            return False
        if not support.isSupportedDevice:
            # Not an error of the card: a GPU before Hopper.  Counted once, like other unsupported queries.
            dev.errors("nvmlGpmQueryDeviceSupport", "not_supported")
            log.debug("gpm_unsupported", gpu=dev.index)
            return False
        return True

    def gpu_activity(self, dev: Device) -> Activity | None:
        return self._activity(dev, dev.gpm, lambda s: pynvml.nvmlGpmSampleGet(dev.handle, s.handle))

    def mig_activity(self, dev: Device, gi: int, uuid: str, profile: str) -> Activity | None:
        """One GPU instance's activity; ``uuid`` and ``profile`` (of the MIG device it is shown on) tell
        a re-created instance under the same id apart."""
        key = (gi, uuid, profile)
        pair = dev.mig_gpm.get(key)
        if pair is None and "nvmlGpmMigSampleGet" not in dev.unsupported:
            pair = self._new_pair(dev, self._mig_interval)
            if pair is not None:
                dev.mig_gpm[key] = pair
        return self._activity(
            dev, pair, lambda s: pynvml.nvmlGpmMigSampleGet(dev.handle, gi, s.handle), what="nvmlGpmMigSampleGet"
        )

    def forget_migs(self, dev: Device, live: set[tuple[int | None, str, str]]) -> None:
        """An instance that is gone, or re-created under another identity, loses its samples: a new
        one is never diffed against the old one's counters."""
        for key in [k for k in dev.mig_gpm if k not in live]:
            dev.mig_gpm.pop(key).close()

    def free(self, dev: Device, which: Scope = "all") -> None:
        """Free the device's samples: ``all`` of them, the whole ``gpu``'s, or its ``migs``' ones."""
        pairs: list[SamplePair[Any]] = []
        if which != "gpu":
            pairs += dev.mig_gpm.values()
            dev.mig_gpm = {}
        if which != "migs" and dev.gpm is not None:
            pairs.append(dev.gpm)
            dev.gpm = None
        for pair in pairs:
            try:
                if not pair.close():
                    log.warning("gpm_samples_leaked", gpu=dev.index, reason="a call on this GPU is stuck")
            except pynvml.NVMLError as e:
                dev.errors("nvmlGpmSampleFree", error_name(e.value))

    def _new_pair(self, dev: Device, interval: float | None = None) -> SamplePair[Any] | None:
        try:
            return SamplePair(_GPM_CALLS, self._mono, self._interval if interval is None else interval, self._slack)
        except pynvml.NVMLError as e:
            self._failed(dev, "nvmlGpmSampleAlloc", e)
            return None

    def _activity(
        self, dev: Device, pair: SamplePair[Any] | None, fill: Callable[[Any], Any], what: str = "nvmlGpmSampleGet"
    ) -> Activity | None:
        """One GPM sample of a GPU or GPU instance, diffed against the previous poll's."""
        if what in dev.unsupported or "nvmlGpmMetricsGet" in dev.unsupported:
            return None
        if pair is None and what == "nvmlGpmSampleGet":
            pair = dev.gpm = self._new_pair(dev)
        if pair is None:
            return None
        ids = tuple(i for i in _GPM_IDS if i not in pair.unsupported)
        if not ids:
            pair.close()  # this device has none of the metrics: keep no buffers for it
            return None
        try:
            answers, fresh = pair.take(fill, ids)
        except pynvml.NVMLError as e:
            self._failed(dev, getattr(e, "gpm_function", what), e)
            return None
        if answers is None:
            return None
        if fresh:
            _checked(dev, pair, answers)
            pair.activity = activity_of(answers)
        return pair.activity

    def _failed(self, dev: Device, function: str, e: pynvml.NVMLError) -> None:
        if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise dev.lost_on(function) from e
        if e.value in DRIVER_GONE:
            dev.errors(function, error_name(e.value))
            raise unavailable(e) from e
        if e.value in UNSUPPORTED or e.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
            # A version mismatch means this driver and these bindings disagree on the struct:
            # treated as unsupported (as gpud does), said once, until the next static refresh.
            dev.unsupported.add(function)
            dev.errors(function, error_name(e.value) if e.value != pynvml.NVML_ERROR_NOT_SUPPORTED else "not_supported")
            log.info("gpm_unavailable", gpu=dev.index, function=function, reason=str(e))
            # Only the samples of what refused: a parent that has no GPM in MIG mode leaves its GPU
            # instances' pairs alone (freeing them cost an interval or two at every static refresh).
            self.free(dev, _SCOPE.get(function, "all"))
            return
        dev.errors(function, error_name(e.value))


def _checked(dev: Device, pair: SamplePair[Any], answers: dict[int, MetricAnswer]) -> None:
    for metric, a in answers.items():
        if a.ratio is not None:
            continue
        if a.error in UNSUPPORTED:
            pair.unsupported.add(metric)  # not asked again until the next static refresh
            dev.errors("nvmlGpmMetricsGet", "not_supported")
        elif a.error:
            dev.errors("nvmlGpmMetricsGet", error_name(a.error))
        else:
            dev.errors("nvmlGpmMetricsGet", "out_of_range")
