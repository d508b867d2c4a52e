"""The cadences slower than the poll (profiling every 10 s, slow values every 30 s), each on a clock of
its own.

Paced by "has the period passed since the last read", a read slipped a poll whenever a GPU's reader
got to it a little sooner after its poll began than the time before (a few milliseconds decide): with
5 s polls, profiling came every 10 or 15 s and the slow reads every 30 or 35 s.  A cadence plans each
read a whole period after the previous plan, not after the read, and takes it at the first poll less
than half a poll interval before its plan:

- polls that divide the period (5 s polls, 10 s and 30 s cadences): a read exactly every period;
- polls that do not (7 s polls, a 10 s cadence): each read at the poll nearest its plan, so reads are
  7 or 14 s apart, on the grid of 10 s, 360 an hour, never drifting;
- a read that fell a whole period behind (polls missed, a GPU that hung) starts the grid again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cadence:
    """A read every ``every`` seconds, taken at most ``slack`` seconds before its plan."""

    every: float
    slack: float = 0.0

    @classmethod
    def of(cls, every: float, poll_interval: float) -> Cadence:
        """``every`` seconds with polls ``poll_interval`` apart (0: unknown, a read never early): half
        a poll of slack, at most half the period, so one poll never takes two reads' turns."""
        return cls(every, max(0.0, min(poll_interval, every) / 2))

    def take(self, planned: float | None, now: float) -> float | None:
        """At ``now``, for a read planned at ``planned`` (None: never read, due at once): the plan of
        the next read if this one is due, else None."""
        if planned is not None and now < planned - self.slack:
            return None
        following = now + self.every if planned is None else planned + self.every
        if following - self.slack <= now:  # a whole period behind: the grid starts again from now
            following = now + self.every
        return following
