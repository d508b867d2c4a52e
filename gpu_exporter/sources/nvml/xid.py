"""XID events (critical driver errors) counted per GPU by one thread of their own.

The poller never waits on it: each poll reads the counts so far.  One thread serves the backend's
whole life, watching the NVML session of the moment, so a registration stuck in a hung driver
holds that one thread, however often NVML restarts.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections import Counter
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import pynvml
import structlog

from ..backend import ErrorSink
from .errors import error_name, try_call

log = structlog.get_logger(__name__)

WAIT_MS = 500
REBUILD_S = 60.0  # while a GPU is left out of the event set, how often it is tried again
PAUSE_S = 1.0  # after a wait that failed at once, before the next try


class XidWatcher:
    """Counts XID events per GPU UUID, for the NVML session started by :meth:`start`."""

    def __init__(self, errors: ErrorSink) -> None:
        self._errors = errors
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[int]] = {}
        self._cond = threading.Condition()
        self._session: tuple[int, int] | None = None  # (serial, GPU count) while open
        self._serial = 0
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    def start(self, gpu_count: int) -> None:
        """Watch the GPUs of a newly opened NVML session (the thread starts on the first call)."""
        with self._cond:
            self._serial += 1
            self._session = (self._serial, gpu_count)
            self._cond.notify_all()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)
            self._thread.start()

    def watch_at_least(self, gpu_count: int) -> None:
        """More GPUs than the session was started with (hot-plug, one back after a reset): build the
        event set again with them, so that the new GPU's XIDs are counted too.  The counts stay."""
        with self._cond:
            if self._session is None or self._session[1] >= gpu_count:
                return
            self._serial += 1
            self._session = (self._serial, gpu_count)
            self._cond.notify_all()
        log.info("xid_events_watching", gpus=gpu_count)

    def stop(self) -> None:
        """Stop watching; waits up to two waits for the thread to free its event set before NVML
        shuts down, unless the driver holds it."""
        with self._cond:
            self._session = None
            self._cond.notify_all()
        self._idle.wait(timeout=2 * WAIT_MS / 1000)

    def counts(self, uuid: str) -> Mapping[int, int]:
        """XID code -> events seen on the GPU ``uuid`` so far (by UUID: a restart of NVML may give the
        GPUs other indices, and the counts stay with their GPU)."""
        with self._lock:
            return MappingProxyType(dict(self._counts.get(uuid, {})))

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._session is not None)
                session = self._session
                self._idle.clear()
            assert session is not None
            try:
                self._watch(session)
            except Exception:
                log.exception("xid_watch_failed")
            finally:
                self._idle.set()

    def _ended(self, session: tuple[int, int], timeout: float | None = None) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._session != session, timeout=timeout)

    def _watch(self, session: tuple[int, int]) -> None:
        """Watch the session's GPUs, building the event set again without a GPU that fell off the bus
        (nvml.h: nvmlEventSetWait_v2 then answers GPU_IS_LOST, and would go on answering it, so the
        healthy GPUs' XIDs would never come), and every ``REBUILD_S`` while a GPU is left out."""
        while self._session == session:
            try:
                event_set = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as e:
                log.info("xid_events_unavailable", reason=str(e))
                self._ended(session)  # nothing to watch until NVML is opened again
                return
            try:
                uuids, left_out = _register(event_set, session[1])
                if not uuids:
                    self._ended(session, timeout=REBUILD_S if left_out else None)
                    continue
                if self._wait(session, event_set, uuids, time.monotonic() + REBUILD_S if left_out else None):
                    self._ended(session, timeout=PAUSE_S)  # lost again at once: a GPU answers yet is gone
            finally:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(event_set)

    def _wait(self, session: tuple[int, int], event_set: Any, uuids: dict[int | None, str],
              rebuild_at: float | None) -> bool:  # fmt: skip
        """Count events until the session ends, a GPU is lost, or it is time to rebuild; True when the
        very first wait said a GPU is lost."""
        first = True
        while self._session == session:
            try:
                event = pynvml.nvmlEventSetWait_v2(event_set, WAIT_MS)
            except pynvml.NVMLError as e:
                if e.value == pynvml.NVML_ERROR_TIMEOUT:
                    if rebuild_at is not None and time.monotonic() >= rebuild_at:
                        return False
                    first = False
                    continue
                self._errors("nvmlEventSetWait", error_name(e.value))
                if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    log.warning("xid_events_gpu_lost", reason="a GPU fell off the bus; watching the others")
                    return first
                self._ended(session, timeout=PAUSE_S)
                first = False
                continue
            first = False
            uuid = uuids.get(_address(event.device))
            if uuid is None:
                uuid = try_call(partial(pynvml.nvmlDeviceGetUUID, event.device))
                if uuid is None:
                    continue
            with self._lock:
                self._counts.setdefault(uuid, Counter())[int(event.eventData)] += 1
        return False


def _register(event_set: Any, gpus: int) -> tuple[dict[int | None, str], bool]:
    """Register every GPU that answers for XID events: (handle address -> UUID, whether one was left out).
    A GPU off the bus is left out: nvml.h lists GPU_IS_LOST among nvmlDeviceRegisterEvents' answers."""
    uuids: dict[int | None, str] = {}
    left_out = False
    for index in range(gpus):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
        except pynvml.NVMLError as e:
            left_out |= e.value == pynvml.NVML_ERROR_GPU_IS_LOST
            log.info("xid_events_unavailable", gpu=index, reason=str(e))
            continue
        uuids[_address(h)] = uuid.decode() if isinstance(uuid, bytes) else uuid
    return uuids, left_out


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value
