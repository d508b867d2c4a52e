"""The poll schedule: apscheduler's interval job, held to the steady clock.

apscheduler 3 plans runs on the wall clock (its triggers work in datetimes) and sleeps for the
wait it computed.  Set the wall clock back an hour and the next poll waits an hour; set it forward
and runs come due at once.  So the job is coalesced, never dropped as misfired, and a watchdog
thread, which waits on the steady clock, checks every interval:

- a poll that should have started more than an interval ago (and is not running) is started now,
  which also re-plans apscheduler from the new wall time;
- a step of the wall clock against the steady one is logged once, with its size.

``stalled()`` says how long polling has been stuck (a poll running, or none started, for longer
than its bound), for ``/healthz``: Kubernetes then restarts a daemon that can no longer poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

log = structlog.get_logger(__name__)

STEP_S = 1.0  # a change of wall minus steady time beyond this is a step, not drift
_JOB = "poll"


class PollSchedule:
    """Calls ``poll`` every ``interval`` seconds, one at a time; ``stalled_after`` bounds one poll."""

    def __init__(
        self,
        poll: Callable[[], None],
        interval: float,
        *,
        stalled_after: float,
        wall: Callable[[], float] = time.time,
        steady: Callable[[], float] = time.monotonic,
    ) -> None:
        self._poll = poll
        self.interval = interval
        self.stalled_after = stalled_after
        self._wall = wall
        self._steady = steady
        self._scheduler = BackgroundScheduler(timezone="UTC")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running_since: float | None = None  # steady, while a poll runs
        self._last_start: float | None = None  # steady
        self._started_at = steady()
        self._offset = wall() - steady()
        self._watchdog = threading.Thread(target=self._watch, name="poll-watchdog", daemon=True)
        self.steps = 0  # wall-clock steps seen

    def start(self) -> None:
        self._scheduler.add_job(self._run, "interval", seconds=self.interval, id=_JOB, coalesce=True,
                                max_instances=1, misfire_grace_time=None,
                                next_run_time=datetime.fromtimestamp(self._wall(), UTC))  # fmt: skip
        self._scheduler.start()
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        self._scheduler.shutdown(wait=False)

    def _run(self) -> None:
        with self._lock:
            self._running_since = self._last_start = self._steady()
        try:
            self._poll()
        finally:
            with self._lock:
                self._running_since = None

    # -- the watchdog ---------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.interval):  # Event.wait times out on the monotonic clock
            try:
                self.check()
            except Exception:  # the watchdog must outlive whatever it meets
                log.exception("poll_watchdog_failed")

    def check(self) -> None:
        """One look: log a wall-clock step, and start a poll that is overdue."""
        offset = self._wall() - self._steady()
        if abs(offset - self._offset) > STEP_S:
            self.steps += 1
            log.warning("wall_clock_stepped", seconds=round(offset - self._offset, 3),
                        effect="intervals stay on the monotonic clock; timestamps follow the wall clock")  # fmt: skip
            self._offset = offset
        with self._lock:
            running, last = self._running_since, self._last_start
        now = self._steady()
        if running is None and now - (last if last is not None else self._started_at) > 2 * self.interval:
            self._due_now()

    def _due_now(self) -> None:
        # "Now" as apscheduler reads it (the wall clock, after the step): a run planned there is due
        # at once, and the runs after it are planned from it.
        now = datetime.fromtimestamp(self._wall(), UTC)
        try:
            self._scheduler.modify_job(_JOB, next_run_time=now)  # wakes the scheduler
        except Exception:  # stopped meanwhile, or not started: nothing to wake
            log.debug("poll_not_rescheduled", exc_info=True)

    # -- health ---------------------------------------------------------------------------------
    def stalled(self) -> float | None:
        """Seconds polling has been stuck beyond its bound, or None while it keeps up."""
        now = self._steady()
        with self._lock:
            running, last = self._running_since, self._last_start
        if running is not None:
            age = now - running  # one poll stuck in the driver, past every GPU's timeout
        else:
            age = now - (last if last is not None else self._started_at) - self.interval
        return age if age > self.stalled_after else None
