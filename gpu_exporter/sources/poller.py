"""Builds one immutable NodeSnapshot per poll, sampling all GPUs in parallel.

The poller owns the backend's lifecycle: it opens it (retrying with backoff while NVML is
unavailable), re-reads slow-changing facts on a slow interval (and looks for GPUs that appeared),
re-probes lost GPUs on every poll, and keeps one failing or hung GPU from holding up the others.
On request it lets go of NVML for a while (``release``): an open NVML holds the driver's device
files, and while any client holds them ``nvidia-smi -r`` refuses to reset a GPU and a driver
upgrade cannot unload the module.

A hung driver call holds its thread until the driver lets go, so threads are bounded by design:
each GPU has one reader thread for the life of the poller, and a GPU whose reader is still stuck is
not asked again, whether the poll comes next or after NVML was initialised again.  The readers are
daemon threads: a stuck one never delays the exit of ``--once`` or of the daemon.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import replace
from functools import partial
from types import MappingProxyType
from typing import Any

import structlog

from ..snapshot import GpuReading, GpuStatic, NodeSnapshot
from .backend import Backend, BackendUnavailable, ErrorSink, GpuLost, ResetRequired, StaticChanged, SystemInfo
from .missing import KnownGpus

log = structlog.get_logger(__name__)

MAX_BACKOFF_S = 60.0
# A failure this long after the previous one starts the backoff afresh; a sooner one, after an
# initialisation that seemed to work, goes on doubling it.
STABLE_S = 2 * MAX_BACKOFF_S
LOG_EVERY_S = 300.0  # the same warning at most this often, with how many were held back


class _Reader:
    """One GPU's reader thread: reads that GPU, one read at a time, for the life of the poller."""

    def __init__(self, index: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], GpuReading], Future[GpuReading]] | None] = queue.SimpleQueue()
        self._current: Future[GpuReading] | None = None
        self._thread = threading.Thread(target=self._run, name=f"gpu-read-{index}", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._current is not None and not self._current.done()

    def submit(self, read: Callable[[], GpuReading]) -> Future[GpuReading]:
        fut: Future[GpuReading] = Future()
        self._current = fut
        self._jobs.put((read, fut))
        return fut

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            read, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(read())
            except BaseException as e:  # handed to the poll that asked
                fut.set_exception(e)


class _Throttle:
    """Lets the first of a repeated log line through, then one per ``every`` seconds."""

    def __init__(self, clock: Callable[[], float], every: float = LOG_EVERY_S) -> None:
        self._clock = clock
        self._every = every
        self._last: dict[tuple[Any, ...], tuple[float, int]] = {}

    def __call__(self, *key: Any) -> int | None:
        """None to stay quiet; else how many of these were held back since the last one said."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self._every:
            self._last[key] = (last[0], last[1] + 1)
            return None
        self._last[key] = (now, 0)
        if len(self._last) > 1000:  # keys are bounded (GPUs, reasons); this is only a backstop
            self._last.clear()
        return last[1] if last is not None else 0


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
        self._generation = 0  # one per successful open; a read from an older one is stale
        self._counted_at = 0.0
        self._statics: dict[int, tuple[GpuStatic, float]] = {}
        self._uuids: dict[int, str] = {}  # last known, so a lost GPU keeps its identity
        self._known = KnownGpus(backend.xid_counts)  # every GPU seen: one the driver stops listing stays down
        self._readers: dict[int, _Reader] = {}
        self._retry_at = 0.0
        self._backoff = 1.0
        self._down_reason: str | None = None
        self._last_failure: tuple[str, float] | None = None  # reason, when
        self._say = _Throttle(monotonic)
        self._lock = threading.Lock()  # one poll at a time, whoever calls
        self._released_until: float | None = None  # monotonic; inf: until resume()

    def release(self, for_s: float) -> None:
        """Let go of NVML (nvmlShutdown, the driver's files closed) and keep off it for ``for_s``
        seconds (0: until ``resume``); the polls meanwhile say so.  Waits for a poll under way, which
        a GPU stuck in the driver ends after the GPU timeout; a reader still stuck there holds the
        driver whatever we do, and the log says so."""
        with self._lock:
            now = self._mono()
            self._released_until = now + for_s if for_s > 0 else float("inf")
            self._shut_backend()
            stuck = sorted(i for i, r in self._readers.items() if r.busy)
            log.warning("nvml_released", for_s=for_s or None, stuck_gpus=stuck or None,
                        detail="NVML let go of on request: the GPUs are not read until SIGUSR2"
                               + (f" or {for_s:g} s from now" if for_s > 0 else ""))  # fmt: skip

    def resume(self) -> None:
        """Take NVML again at the next poll, after ``release``."""
        with self._lock:
            if self._released_until is not None:
                self._end_release("on request")
            else:
                log.info("nvml_not_released", detail="asked to take NVML again, which was not let go of")

    def _end_release(self, why: str) -> None:
        self._released_until = None
        self._retry_at = 0.0  # opened at this very poll, not after a backoff left from before
        log.info("nvml_resumed", reason=why)

    def close(self) -> None:
        with self._lock:
            self._shut_backend()
            for reader in self._readers.values():
                reader.stop()
            self._readers.clear()

    def poll(self) -> NodeSnapshot:
        with self._lock:
            return self._poll()

    def _poll(self) -> NodeSnapshot:
        taken_at, t0 = self._wall(), self._mono()
        if self._released_until is not None:
            if t0 < self._released_until:
                return NodeSnapshot(taken_at=taken_at, monotonic_at=t0, duration_seconds=self._mono() - t0,
                                    nvml_up=False, nvml_released=True,
                                    nvml_error="released on request (SIGUSR1); SIGUSR2 takes it again")  # fmt: skip
            self._end_release("the release ran out")
        if self._system is None and not self._open(t0):
            return self._nvml_down(taken_at, t0)
        if t0 - self._counted_at >= self._static_refresh_s and not self._recount(t0):
            return self._nvml_down(taken_at, t0)
        system = self._system
        assert system is not None
        futures: dict[int, Future[GpuReading]] = {}
        generation = self._generation
        for index in range(system.gpu_count):
            reader = self._readers.get(index)
            if reader is None:
                reader = self._readers[index] = _Reader(index)
            elif reader.busy:
                continue  # still stuck in the driver from an earlier poll: asking again adds nothing
            futures[index] = reader.submit(partial(self._read, index, generation))
        wait(futures.values(), timeout=self._gpu_timeout_s)
        readings: list[GpuReading] = []
        for index in range(system.gpu_count):
            fut = futures.get(index)
            if fut is None or not fut.done():
                why = "still waiting for the driver" if fut is None else f"no answer within {self._gpu_timeout_s:g} s"
                self._errors("poll", "timeout")
                if (held := self._say("gpu_not_answering", index)) is not None:
                    log.warning("gpu_not_answering", gpu=index, reason=why, repeated=held or None)
                readings.append(self._down(index, why))
                continue
            try:
                readings.append(fut.result())
            except BackendUnavailable as e:
                # The driver went away under us: every GPU is unreadable, start over.
                self._mark_down(e, t0)
                return self._nvml_down(taken_at, t0)
        gpus = tuple(readings)
        if self._attach is not None:
            try:
                gpus = self._attach(gpus)
            except Exception:  # attribution is an extra; the GPU data goes out without it
                if self._say("pod_attribution_failed") is not None:
                    log.exception("pod_attribution_failed")
        # After attribution: a GPU the driver no longer lists holds nothing, whatever its old index's files say.
        gpus = self._known.complete(gpus)
        return NodeSnapshot(
            taken_at=taken_at,
            monotonic_at=t0,
            duration_seconds=self._mono() - t0,
            nvml_up=True,
            driver_version=system.driver_version,
            cuda_version=system.cuda_version,
            gpus=gpus,
        )

    def _nvml_down(self, taken_at: float, t0: float) -> NodeSnapshot:
        return NodeSnapshot(taken_at=taken_at, monotonic_at=t0, duration_seconds=self._mono() - t0, nvml_up=False,
                            nvml_error=self._down_reason)  # fmt: skip

    def _read(self, index: int, generation: int) -> GpuReading:
        try:
            known = self._statics.get(index)
            if known is None or self._mono() - known[1] >= self._static_refresh_s:
                static = self._backend.read_static(index)
                if generation == self._generation:  # not from before a re-initialisation
                    self._statics[index] = (static, self._mono())
                    self._uuids[index] = static.uuid
            else:
                static = known[0]
            try:
                return self._backend.read_gpu(static)
            except StaticChanged:
                # A MIG mode switched on or off: this poll shows it, not the next static refresh
                # minutes later (its MIG devices, and the GPU-wide values MIG mode withholds).
                static = self._backend.read_static(index)
                if generation == self._generation:
                    self._statics[index] = (static, self._mono())
                return self._backend.read_gpu(static)
        except ResetRequired as e:
            return self._needs_reset(index, str(e))
        except GpuLost as e:
            # Forget the handle: the next poll re-discovers the GPU, so one that returns is picked up.
            self._statics.pop(index, None)
            return self._down(index, str(e))
        except BackendUnavailable:
            raise
        except Exception as e:  # one bad reading never takes down the daemon or the other GPUs
            if (held := self._say("gpu_read_failed", index, type(e).__name__)) is not None:
                log.exception("gpu_read_failed", gpu=index, repeated=held or None)
            self._errors("poll", "exception")
            self._statics.pop(index, None)
            return self._down(index, f"{type(e).__name__}: {e}")

    def _needs_reset(self, index: int, why: str) -> GpuReading:
        """The driver refuses the GPU's handle or UUID until it is reset: it keeps what was last read of
        it (asked again at every poll, so a reset shows at once) and says it needs a reset, not that
        it is lost; nobody can use it meanwhile, which the books count as down."""
        known = self._statics.get(index)
        static = known[0] if known is not None else None
        uuid = static.uuid if static is not None else self._uuids.get(index, "")
        xids = self._backend.xid_counts(uuid) if uuid else {}
        return GpuReading(index=index, uuid=uuid, up=True, static=static, error=why, reset_required=True,
                          xid_errors_total=MappingProxyType(dict(xids)))  # fmt: skip

    def _down(self, index: int, why: str) -> GpuReading:
        """A GPU that does not answer keeps its last identity and its XID counts: its XID 79 arrives
        as it falls off the bus, and must be on /metrics beside gpu_up 0, not after a reboot."""
        uuid = self._uuids.get(index, "")
        xids = self._backend.xid_counts(uuid) if uuid else {}
        return GpuReading(index=index, uuid=uuid, up=False, error=why, xid_errors_total=MappingProxyType(dict(xids)))

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
            if (held := self._say("nvml_available_again")) is not None:
                log.info("nvml_available_again", gpus=system.gpu_count, repeated=held or None)
        else:
            log.info("nvml_ready", gpus=system.gpu_count, driver=system.driver_version)
        # The backoff is not reset here: if the same failure follows, it goes on doubling.
        self._system = system
        self._generation += 1
        self._counted_at = now
        self._down_reason = None
        self._statics.clear()
        return True

    def _recount(self, now: float) -> bool:
        """Look for GPUs that appeared (hot-plug, a driver reload); False if NVML went away."""
        assert self._system is not None
        self._counted_at = now
        try:
            count = self._backend.count()
        except BackendUnavailable as e:
            self._mark_down(e, now)
            return False
        if count is not None and count > self._system.gpu_count:
            log.info("gpus_appeared", gpus=count, before=self._system.gpu_count)
            self._system = replace(self._system, gpu_count=count)
        elif count is not None and count < self._system.gpu_count:
            # Indices may have shifted; the missing ones show as down until NVML starts afresh.
            log.warning("gpus_disappeared", gpus=count, before=self._system.gpu_count)
        return True

    def _mark_down(self, e: BackendUnavailable, now: float) -> None:
        last = self._last_failure
        if last is None or last[0] != e.reason or now - last[1] >= STABLE_S:
            self._backoff = 1.0  # a new kind of failure, or the first in a long while
        if (held := self._say("nvml_unavailable", e.reason)) is not None:
            log.warning("nvml_unavailable", reason=e.reason, hint=e.hint or None, retry_in_s=self._backoff,
                        repeated=held or None)  # fmt: skip
        self._last_failure = (e.reason, now)
        self._down_reason = e.reason
        self._shut_backend()
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)

    def _shut_backend(self) -> None:
        if self._system is not None:
            self._system = None
            try:
                self._backend.close()
            except Exception:
                log.exception("backend_close_failed")
