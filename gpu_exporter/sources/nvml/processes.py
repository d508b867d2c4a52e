"""The processes on a GPU or MIG device: who they are (pid, name, user), the memory they hold, and
their share of the SMs and memory from the driver's per-process samples."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pynvml

from ... import untrusted
from ...snapshot import ProcessReading
from ..cadence import Cadence
from ..procfs import process_user, start_time
from . import process_records
from .device import Device, raise_error

_NO_UTIL: tuple[float | None, float | None] = (None, None)
# One process: its pid and start time (``procfs.start_time``).  A pid alone may be a later process's.
ProcessKey = tuple[int, int | None]


STEPPED_US = 1_000_000  # the wall clock went back by more than this: it was stepped


class ProcessReader:
    """Reads process lists every poll, and per-process utilization every ``interval`` seconds: the
    driver spends about 2 ms of CPU per read on an H200, so it gets its own, slower cadence."""

    def __init__(
        self,
        interval: float,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        proc_root: str = "/proc",
        poll_interval: float = 0.0,
    ) -> None:
        self._cadence = Cadence.of(interval, poll_interval)  # on the poll nearest each plan (cadence.py)
        self._mono = monotonic
        self._wall = wall  # the clock of the driver's sample timestamps (nvml.h: "CPU Timestamp")
        self.proc_root = proc_root
        self._layout: process_records.Layout | None = None  # this driver's record size (process_records)

    def driver_changed(self) -> None:
        """NVML was opened again, perhaps on another driver: its process records are judged anew."""
        self._layout = None

    def processes(
        self,
        dev: Device,
        names: dict[ProcessKey, str],
        users: dict[ProcessKey, str | None],
        util: dict[ProcessKey, tuple[float | None, float | None]] | None = None,
    ) -> tuple[ProcessReading, ...]:
        """Compute, MPS client and graphics processes, each once; ``names`` and ``users`` are those
        already looked up, by pid and start time, ``util`` the per-process utilization last read.

        Each process's start time is read every poll (one small file), before anything else of it:
        a pid whose start time changed is another process, whose name and user are read again; one
        read whose pid was reused between the two reads is put right at the next poll.

        The clients of an MPS server are only in the MPS list: the compute list shows the server
        (nvidia-cuda-mps-server), which owns the CUDA context (NVIDIA's MPS guide).  A client is a CUDA
        program like any other, so it counts as ``compute``; a pid in several lists is read from the
        first.  The lists are read in the record size the driver writes (``process_records``), not
        the one the installed nvidia-ml-py assumes; a driver without a list says FUNCTION_NOT_FOUND,
        which ``Device.call`` remembers, as the NOT_SUPPORTED of a card before Volta (nvml.h), until
        the next static refresh, so neither is asked again every poll and the other lists go on.
        """
        if self._layout is None:
            self._layout = process_records.choose(dev.handle)
        found: dict[int, ProcessReading] = {}
        lists = (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                 ("compute", "nvmlDeviceGetMPSComputeRunningProcesses"),
                 ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"))  # fmt: skip
        for kind, what in lists:
            for p in dev.call(what, process_records.running, what, self._layout) or ():
                if p.pid in found:
                    continue
                key = (p.pid, start_time(p.pid, self.proc_root))
                name = names.get(key) or process_name(p.pid, self.proc_root)
                user = users[key] if key in users else process_user(p.pid, self.proc_root)
                sm, mem = util.get(key, _NO_UTIL) if util else _NO_UTIL
                found[p.pid] = ProcessReading(pid=p.pid, name=name, used_memory_bytes=p.used_memory, kind=kind,
                                              user=user, sm_utilization_ratio=sm,
                                              memory_utilization_ratio=mem, start_time=key[1])  # fmt: skip
        return tuple(found.values())

    def utilization(self, dev: Device, processes: tuple[ProcessReading, ...]) -> tuple[ProcessReading, ...]:
        """Per-process SM and memory utilization, from the driver's samples since the previous read.

        A process without a sample was idle since then (the driver keeps samples only of busy
        processes), so it reads 0; where the call is not supported, the fields stay None.
        """
        what = "nvmlDeviceGetProcessUtilization"
        if what in dev.unsupported:
            return _without_util(processes) if dev.process_util else processes
        now = self._mono()
        planned = self._cadence.take(dev.process_util_due if dev.process_util_at is not None else None, now)
        if planned is None:
            # Not due: ``processes`` filled in the values read last time (a new process waits).
            return processes
        since = dev.process_util_seen
        if dev.process_util_at is not None:
            # The driver hands the samples stamped after ``since``, on the wall clock.  Stepped back
            # (NTP, ``date -s``), that clock stamps the next hour's samples below the newest seen, and
            # asking since it would read every process idle for that hour: so never since later than
            # the previous read was, by the monotonic time gone since then on today's wall clock.  A
            # second's slack: the sample read last time is not taken for a new one (the two clocks
            # are read microseconds apart, and the driver stamps a sample after the read began).
            previous_read = int((self._wall() - (now - dev.process_util_at)) * 1e6)
            if previous_read < since - STEPPED_US:
                since = previous_read
        dev.process_util_at, dev.process_util_due = now, planned
        try:
            samples = _process_utilization(dev, since)
        except pynvml.NVMLError as e:
            # NOT_FOUND: no process was busy since the last read.  nvidia-ml-py raises even on
            # SUCCESS when the driver had nothing to report.
            if e.value not in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):
                dev.call(what, raise_error, e)  # counts it, and remembers NOT_SUPPORTED, as every query does
                return _without_util(processes)
            samples = []
        latest: dict[int, Any] = {}
        dev.process_util_seen = since
        for sample in samples:
            seen = latest.get(sample.pid)
            if seen is None or sample.timeStamp > seen.timeStamp:
                latest[sample.pid] = sample
            dev.process_util_seen = max(dev.process_util_seen, int(sample.timeStamp))
        out = []
        dev.process_util = {}
        for p in processes:
            sample = latest.get(p.pid)
            sm = dev.ratio(what, sample.smUtil) if sample is not None else 0.0
            mem = dev.ratio(what, sample.memUtil) if sample is not None else 0.0
            dev.process_util[(p.pid, p.start_time)] = (sm, mem)
            out.append(replace(p, sm_utilization_ratio=sm, memory_utilization_ratio=mem))
        return tuple(out)


def _process_utilization(dev: Device, since: int) -> Any:
    """The driver's samples since the last one read.  nvidia-ml-py sizes its buffer with a first call;
    a sample the driver takes before the second finds the buffer one short (INSUFFICIENT_SIZE, nvml.h:
    the count "may differ from a previously read value"), so that read is made once more."""
    try:
        return pynvml.nvmlDeviceGetProcessUtilization(dev.handle, since)
    except pynvml.NVMLError as e:
        if e.value != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise
    return pynvml.nvmlDeviceGetProcessUtilization(dev.handle, since)


def _without_util(processes: tuple[ProcessReading, ...]) -> tuple[ProcessReading, ...]:
    return tuple(replace(p, sm_utilization_ratio=None, memory_utilization_ratio=None) for p in processes)


def process_name(pid: int, proc_root: str = "/proc") -> str:
    """The process's name from /proc when this container can see it, else as NVML knows it.

    Its owner chose it: the bytes need not be UTF-8 (the kernel cuts a name at 15 bytes, in the
    middle of a character if need be), so they are decoded leniently, here and for NVML's answer.
    """
    try:
        with open(f"{proc_root}/{pid}/comm", "rb") as f:
            name = untrusted.text(f.read().strip())
        if name:
            return name
    except OSError:
        pass
    try:
        full: str | bytes = pynvml.nvmlSystemGetProcessName(pid)
    except pynvml.NVMLError:
        return "unknown"
    except UnicodeDecodeError as e:  # the bindings decode strictly; the bytes they read are in the error
        full = e.object
    full = untrusted.text(full)
    return os.path.basename(full.split(" ", 1)[0]) or "unknown"
