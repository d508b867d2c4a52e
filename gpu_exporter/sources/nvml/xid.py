"""XID events (critical driver errors) counted per GPU by one thread of their own.

The poller never waits on it: each poll reads the counts so far.  One thread serves the backend's
whole life, watching the NVML session of the moment, so a registration stuck in a hung driver
holds that one thread, however often NVML restarts.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pynvml
import structlog

from ..backend import ErrorSink
from .errors import error_name

log = structlog.get_logger(__name__)

WAIT_MS = 500


class XidWatcher:
    """Counts XID events per GPU index, for the NVML session started by :meth:`start`."""

    def __init__(self, errors: ErrorSink) -> None:
        self._errors = errors
        self._lock = threading.Lock()
        self._counts: dict[int, Counter[int]] = {}
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

    def stop(self) -> None:
        """Stop watching; waits up to two waits for the thread to free its event set before NVML
        shuts down, unless the driver holds it."""
        with self._cond:
            self._session = None
            self._cond.notify_all()
        self._idle.wait(timeout=2 * WAIT_MS / 1000)

    def counts(self, index: int) -> Mapping[int, int]:
        """XID code -> events seen on GPU ``index`` so far."""
        with self._lock:
            return MappingProxyType(dict(self._counts.get(index, {})))

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
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as e:
            log.info("xid_events_unavailable", reason=str(e))
            self._ended(session)  # nothing to watch until NVML is opened again
            return
        handles: list[Any] = []
        for index in range(session[1]):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(index)
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
                handles.append(h)
            except pynvml.NVMLError as e:
                log.info("xid_events_unavailable", gpu=index, reason=str(e))
        try:
            while self._session == session:
                if not handles:
                    self._ended(session)
                    break
                try:
                    event = pynvml.nvmlEventSetWait_v2(event_set, WAIT_MS)
                except pynvml.NVMLError as e:
                    if e.value != pynvml.NVML_ERROR_TIMEOUT:
                        self._errors("nvmlEventSetWait", error_name(e.value))
                        self._ended(session, timeout=1.0)
                    continue
                try:
                    index = pynvml.nvmlDeviceGetIndex(event.device)
                except pynvml.NVMLError:
                    continue
                with self._lock:
                    self._counts.setdefault(index, Counter())[int(event.eventData)] += 1
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(event_set)
