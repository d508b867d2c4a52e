"""Builds one immutable NodeSnapshot per poll, sampling all GPUs in parallel.

The poller owns the backend's lifecycle: it opens it (retrying with backoff while NVML is
unavailable), re-reads slow-changing facts on a slow interval, re-probes lost GPUs on every poll,
and keeps one failing or hung GPU from holding up the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import structlog

from ..snapshot import GpuReading, GpuStatic, NodeSnapshot
from .backend import Backend, BackendUnavailable, ErrorSink, GpuLost, SystemInfo

log = structlog.get_logger(__name__)

MAX_BACKOFF_S = 60.0


class Poller:
    def __init__(
        self,
        backend: Backend,
        *,
        errors: ErrorSink,
        static_refresh_s: float = 300.0,
        gpu_timeout_s: float = 10.0,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        attach: Callable[[tuple[GpuReading, ...]], tuple[GpuReading, ...]] | None = None,
    ) -> None:
        self._backend = backend
        self._errors = errors
        self._static_refresh_s = static_refresh_s
        self._gpu_timeout_s = gpu_timeout_s
        self._wall = wall_clock
        self._mono = monotonic
        self._attach = attach  # joins pod attribution into the readings
        self._system: SystemInfo | None = None
        self._statics: dict[int, tuple[GpuStatic, float]] = {}
        self._uuids: dict[int, str] = {}  # last known, so a lost GPU keeps its identity
        self._inflight: dict[int, Future[GpuReading]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._retry_at = 0.0
        self._backoff = 1.0
        self._down_reason: str | None = None
        self._lock = threading.Lock()  # one poll at a time, whoever calls

    def close(self) -> None:
        with self._lock:
            self._shut_backend()

    def poll(self) -> NodeSnapshot:
        with self._lock:
            return self._poll()

    def _poll(self) -> NodeSnapshot:
        taken_at, t0 = self._wall(), self._mono()
        if self._system is None and not self._open(t0):
            return NodeSnapshot(taken_at=taken_at, duration_seconds=self._mono() - t0, nvml_up=False,
                                nvml_error=self._down_reason)  # fmt: skip
        system = self._system
        assert system is not None and self._pool is not None
        futures: dict[int, Future[GpuReading]] = {}
        for index in range(system.gpu_count):
            running = self._inflight.get(index)
            if running is not None and not running.done():
                continue  # still stuck in the driver from an earlier poll; don't pile up threads
            futures[index] = self._inflight[index] = self._pool.submit(self._read, index)
        wait(futures.values(), timeout=self._gpu_timeout_s)
        readings: list[GpuReading] = []
        for index in range(system.gpu_count):
            fut = futures.get(index)
            if fut is None or not fut.done():
                why = "still waiting for the driver" if fut is None else f"no answer within {self._gpu_timeout_s:g} s"
                self._errors("poll", "timeout")
                readings.append(self._down(index, why))
                continue
            try:
                readings.append(fut.result())
            except BackendUnavailable as e:
                # The driver went away under us: every GPU is unreadable, start over.
                self._mark_down(e, t0)
                return NodeSnapshot(taken_at=taken_at, duration_seconds=self._mono() - t0, nvml_up=False,
                                    nvml_error=self._down_reason)  # fmt: skip
        gpus = tuple(readings)
        if self._attach is not None:
            try:
                gpus = self._attach(gpus)
            except Exception:  # attribution is an extra; the GPU data goes out without it
                log.exception("pod_attribution_failed")
        return NodeSnapshot(
            taken_at=taken_at,
            duration_seconds=self._mono() - t0,
            nvml_up=True,
            driver_version=system.driver_version,
            cuda_version=system.cuda_version,
            gpus=gpus,
        )

    def _read(self, index: int) -> GpuReading:
        try:
            known = self._statics.get(index)
            if known is None or self._mono() - known[1] >= self._static_refresh_s:
                static = self._backend.read_static(index)
                self._statics[index] = (static, self._mono())
                self._uuids[index] = static.uuid
            else:
                static = known[0]
            return self._backend.read_gpu(static)
        except GpuLost as e:
            # Forget the handle: the next poll re-discovers the GPU, so one that returns is picked up.
            self._statics.pop(index, None)
            return self._down(index, str(e))
        except BackendUnavailable:
            raise
        except Exception as e:  # one bad reading never takes down the daemon or the other GPUs
            log.exception("gpu_read_failed", gpu=index)
            self._errors("poll", "exception")
            self._statics.pop(index, None)
            return self._down(index, f"{type(e).__name__}: {e}")

    def _down(self, index: int, why: str) -> GpuReading:
        return GpuReading(index=index, uuid=self._uuids.get(index, ""), up=False, error=why)

    def _open(self, now: float) -> bool:
        if now < self._retry_at:
            return False
        try:
            system = self._backend.open()
        except BackendUnavailable as e:
            self._mark_down(e, now)
            return False
        except Exception as e:  # a backend bug must not kill the poller: treat it as unavailable
            log.exception("backend_open_failed")
            self._mark_down(BackendUnavailable(f"{type(e).__name__}: {e}"), now)
            return False
        if self._down_reason is not None:
            log.info("nvml_available_again", gpus=system.gpu_count)
        else:
            log.info("nvml_ready", gpus=system.gpu_count, driver=system.driver_version)
        self._system = system
        self._down_reason = None
        self._backoff = 1.0
        self._statics.clear()
        self._inflight.clear()
        self._pool = ThreadPoolExecutor(max_workers=max(system.gpu_count, 1) + 2, thread_name_prefix="gpu-read")
        return True

    def _mark_down(self, e: BackendUnavailable, now: float) -> None:
        if e.reason != self._down_reason:  # say it once, not once per retry
            log.warning("nvml_unavailable", reason=e.reason, hint=e.hint or None,
                        retry_in_s=self._backoff)  # fmt: skip
        self._down_reason = e.reason
        self._shut_backend()
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)

    def _shut_backend(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._system is not None:
            self._system = None
            try:
                self._backend.close()
            except Exception:
                log.exception("backend_close_failed")
