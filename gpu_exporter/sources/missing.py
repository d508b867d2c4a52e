"""Every GPU seen since the start: one the driver no longer lists stays on the books as down.

After a driver reload, or when NVML is let go of (SIGUSR1) and taken again, the driver numbers the
GPUs it finds afresh: a node that comes back with 3 of its 4 GPUs lists GPUs 0-2, the missing one
not at all, and the one after it under the missing one's index.  A snapshot of only what the driver
lists would make the missing GPU vanish: its ``gpu_up`` series would end rather than say 0, and
its ``GpuLost`` would be resolved though nothing was fixed.  So each UUID read since the start is
remembered with the index it last answered at, and one missing from a poll is added to it as down,
under those labels, until it answers again (under any index).  A restart forgets them all: that is
how an operator says a GPU was taken out for good (docs/troubleshooting.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import structlog

from ..snapshot import GpuReading

log = structlog.get_logger(__name__)

# Why it is down, in GpuLost's description: what happened, and what to do if nothing is to be fixed.
MISSING = (
    "the driver no longer lists it since NVML was opened again (a driver reload, or SIGUSR2); it stays down "
    "until it answers: if it was removed for good, restart gpu-exporter to forget it"
)


class KnownGpus:
    """The UUIDs read since the start, each with the index it last answered at (or was shown down at)."""

    def __init__(self, xid_counts: Callable[[str], Mapping[int, int]]) -> None:
        self._xid_counts = xid_counts
        self._last_index: dict[str, int] = {}
        self._missing: set[str] = set()

    def complete(self, readings: Iterable[GpuReading]) -> tuple[GpuReading, ...]:
        """``readings`` (one poll, every GPU the driver lists), then a down reading for each GPU seen
        before that none of them is, under its last index and UUID."""
        listed = tuple(readings)
        present = {g.uuid for g in listed if g.uuid}
        for g in listed:
            if g.uuid:
                self._last_index[g.uuid] = g.index
        missing = sorted((index, uuid) for uuid, index in self._last_index.items() if uuid not in present)
        now_missing = {uuid for _, uuid in missing}
        # Each change said once, at warning: a GPU that vanished is a hardware or driver event someone must look at.
        for index, uuid in missing:
            if uuid not in self._missing:
                log.warning("gpu_missing", gpu=index, uuid=uuid,
                            detail="the driver no longer lists this GPU: it is shown down, and GpuLost fires, until "
                                   "it answers again or gpu-exporter is restarted")  # fmt: skip
        for uuid in sorted(self._missing - now_missing):
            log.warning("gpu_missing_answers_again", gpu=self._last_index[uuid], uuid=uuid)
        self._missing = now_missing
        return (*listed, *(self._down(index, uuid) for index, uuid in missing))

    def _down(self, index: int, uuid: str) -> GpuReading:
        xids = MappingProxyType(dict(self._xid_counts(uuid)))
        return GpuReading(index=index, uuid=uuid, up=False, error=MISSING, xid_errors_total=xids)
