"""XID events (critical driver errors) counted per GPU, each GPU by a thread and an event set of
its own.

The poller never waits on them: each poll reads the counts so far.  A GPU's thread serves the
backend's whole life, watching that GPU in the NVML session of the moment, so a registration stuck in
a hung driver holds that one thread, however often NVML restarts.

One set per GPU, not one for all: a set with a GPU that fell off the bus answers GPU_IS_LOST at every
wait (nvml.h, nvmlEventSetWait_v2), and a shared one had to be built again without it.  Between
freeing the old set and registering the new one nobody watched the healthy GPUs, and the driver
records only what occurs once a set watches ("Starts recording of events", nvmlDeviceRegisterEvents):
their XIDs of that moment were lost, and so were those still queued in the old set behind its
GPU_IS_LOST.  Now a lost GPU's set is rebuilt alone; the others' never close while their GPU answers.

An event is credited to the GPU it names (``nvmlEventData_t.device``, nvml.h: "Specific device where
the event occurred"), not to the GPU whose set it arrived in: a driver may deliver it to another set
(NVIDIA's own mock library hands every XID to whichever set waits first).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections import Counter
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import pynvml
import structlog

from ..backend import ErrorSink
from .errors import error_name

log = structlog.get_logger(__name__)

WAIT_MS = 500
REBUILD_S = 60.0  # while a GPU cannot be watched (lost, or lost again at once), how often it is tried again
PAUSE_S = 1.0  # after a wait that failed, before the next try


class XidWatcher:
    """Counts XID events per GPU UUID, for the NVML session started by :meth:`start`."""

    def __init__(self, errors: ErrorSink) -> None:
        self._errors = errors
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[int]] = {}
        self._cond = threading.Condition()
        self._session: tuple[int, int] | None = None  # (serial, GPU count) while open
        self._serial = 0
        self._busy = 0  # threads inside a session, each holding or about to hold an event set
        self._threads: dict[int, threading.Thread] = {}
        # The watched GPUs' UUIDs by their handle's address, this session: pynvml's handles are ctypes
        # pointers, equal only as the same object, so the event's handle is matched by its value.
        self._uuids: dict[int, str] = {}

    def start(self, gpu_count: int) -> None:
        """Watch the GPUs of a newly opened NVML session (each GPU's thread starts on first need)."""
        with self._cond:
            self._serial += 1
            self._session = (self._serial, gpu_count)
            with self._lock:
                self._uuids.clear()  # a new session may hand out its handles at other addresses
            self._spawn(gpu_count)
            self._cond.notify_all()

    def watch_at_least(self, gpu_count: int) -> None:
        """More GPUs than the session was started with (hot-plug, one back after a reset): watch the
        new ones too, the others' sets untouched.  The counts stay."""
        with self._cond:
            if self._session is None or self._session[1] >= gpu_count:
                return
            self._session = (self._session[0], gpu_count)
            self._spawn(gpu_count)
            self._cond.notify_all()
        log.info("xid_events_watching", gpus=gpu_count)

    def stop(self) -> None:
        """Stop watching; waits up to two waits for the threads to free their event sets before NVML
        shuts down, unless the driver holds one."""
        with self._cond:
            self._session = None
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._busy == 0, timeout=2 * WAIT_MS / 1000)

    def counts(self, uuid: str) -> Mapping[int, int]:
        """XID code -> events seen on the GPU ``uuid`` so far (by UUID: a restart of NVML may give the
        GPUs other indices, and the counts stay with their GPU)."""
        with self._lock:
            return MappingProxyType(dict(self._counts.get(uuid, {})))

    def _spawn(self, gpu_count: int) -> None:
        """With ``_cond`` held: a thread for each GPU index that has none (bounded by the GPU count)."""
        for index in range(gpu_count):
            t = self._threads.get(index)
            if t is None or not t.is_alive():
                t = self._threads[index] = threading.Thread(target=self._run, args=(index,),
                                                            name=f"xid-events-{index}", daemon=True)  # fmt: skip
                t.start()

    def _live(self, serial: int, index: int) -> bool:
        s = self._session
        return s is not None and s[0] == serial and index < s[1]

    def _run(self, index: int) -> None:
        done: int | None = None  # the session this thread last watched
        while True:
            with self._cond:
                serial = done = self._cond.wait_for(partial(self._next_session, index, done))
                assert serial is not None  # serials start at 1: wait_for returned a true value
                self._busy += 1
            try:
                self._watch(index, serial)
            except Exception:
                log.exception("xid_watch_failed", gpu=index)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _next_session(self, index: int, done: int | None) -> int | None:
        """The serial of a session other than ``done`` that has GPU ``index``, if one is open."""
        s = self._session
        return s[0] if s is not None and s[0] != done and index < s[1] else None

    def _ended(self, serial: int, index: int, timeout: float | None = None) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._live(serial, index), timeout=timeout)

    def _watch(self, index: int, serial: int) -> None:
        """Watch GPU ``index`` for the session: its set is built again only when its own GPU is lost
        (every ``REBUILD_S`` while it cannot be registered, or is lost again at once)."""
        while self._live(serial, index):
            try:
                event_set = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as e:
                log.info("xid_events_unavailable", gpu=index, reason=str(e))
                self._ended(serial, index)  # nothing to watch until NVML is opened again
                return
            try:
                uuid, lost = self._register(event_set, index)
                if uuid is None:
                    self._ended(serial, index, timeout=REBUILD_S if lost else None)
                    continue
                lost_at_once = self._wait(index, serial, event_set, uuid)
            finally:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(event_set)
            if lost_at_once is not None:
                # Lost: try again soon (a GPU back after a reset is watched again), but not at every
                # wait while it answers its identity yet is gone.
                self._ended(serial, index, timeout=REBUILD_S if lost_at_once else PAUSE_S)

    def _wait(self, index: int, serial: int, event_set: Any, uuid: str) -> bool | None:
        """Count the GPU's events until the session ends (None) or the GPU is lost: True when the very
        first wait said so."""
        first = True
        while self._live(serial, index):
            try:
                event = pynvml.nvmlEventSetWait_v2(event_set, WAIT_MS)
            except pynvml.NVMLError as e:
                if e.value == pynvml.NVML_ERROR_TIMEOUT:
                    first = False
                    continue
                self._errors("nvmlEventSetWait", error_name(e.value))
                if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    log.warning("xid_events_gpu_lost", gpu=index, uuid=uuid,
                                reason="the GPU fell off the bus; the others go on being watched")  # fmt: skip
                    return first
                self._ended(serial, index, timeout=PAUSE_S)
                first = False
                continue
            first = False
            source = self._source(event.device, uuid)
            with self._lock:
                self._counts.setdefault(source, Counter())[int(event.eventData)] += 1
        return None

    def _register(self, event_set: Any, index: int) -> tuple[str | None, bool]:
        """Register GPU ``index`` for XID events: (its UUID, or None where it cannot be; whether it is
        lost).  nvml.h lists GPU_IS_LOST among nvmlDeviceRegisterEvents' answers."""
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            with self._lock:
                self._uuids[_address(h)] = uuid  # before the set can deliver an event naming it
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
        except pynvml.NVMLError as e:
            log.info("xid_events_unavailable", gpu=index, reason=str(e))
            return None, e.value == pynvml.NVML_ERROR_GPU_IS_LOST
        return uuid, False

    def _source(self, device: Any, receiver: str) -> str:
        """The UUID of the GPU an event names: a watched GPU's by its handle, else the driver's answer
        for the handle; the receiving set's GPU (``receiver``) only where the event names none or the
        driver cannot say which (a GPU-level UUID is wanted: counts are read by GPU)."""
        address = _address(device)
        if not address:
            return receiver
        with self._lock:
            known = self._uuids.get(address)
        if known is not None:
            return known
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(device))
        except pynvml.NVMLError as e:
            log.info("xid_event_device_unknown", receiver=receiver, reason=str(e))
            return receiver
        return uuid if uuid.startswith("GPU-") else receiver


def _address(handle: Any) -> int:
    """A handle's pointer value (0 for NULL)."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
