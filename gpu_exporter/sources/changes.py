"""What changed for each GPU between two snapshots, said once in the log at warning.

An operator reading ``journalctl … | jq 'select(.level != "info")'`` must see a GPU stop answering,
come back, need a reset, or report an XID: the events an alert is about, in the log beside the
daemon's other warnings.  Each change is logged once, when it is first seen, not at every poll while
it lasts; a snapshot taken while NVML is down says nothing of single GPUs and changes nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import structlog

from ..snapshot import GpuReading, NodeSnapshot
from .missing import MISSING

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Change:
    """One change of one GPU: ``event`` is the log event's name, ``fields`` what it says."""

    event: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class _Seen:
    uuid: str
    up: bool
    reset_required: bool
    xids: Mapping[int, int]
    since: float  # steady time of the snapshot that saw it go down
    model: str | None  # as last read: a GPU that stops answering has no static reading
    index: int = -1  # where it was last listed
    missing: bool = False  # down because the driver no longer lists it (missing.py says that change itself)


_NONE: Mapping[int, int] = MappingProxyType({})


def _changes(before: _Seen | None, g: GpuReading, now: float) -> list[Change]:
    who: dict[str, Any] = {"gpu": g.index, "uuid": g.uuid or None}
    if (model := g.static.name if g.static is not None else before.model if before else None) is not None:
        who["model"] = model
    out: list[Change] = []
    was_up = True if before is None else before.up
    # A GPU the driver stopped listing, and its return, are said by missing.py (gpu_missing,
    # gpu_missing_answers_again): once, not twice.
    if was_up and not g.up and g.error != MISSING:
        out.append(Change("gpu_lost", {**who, "error": g.error}))
    elif not was_up and g.up and not (before is not None and before.missing):
        out.append(Change("gpu_back", {**who, "down_s": round(now - before.since, 1) if before else None}))
    was_reset = False if before is None else before.reset_required
    if g.reset_required and not was_reset:
        out.append(Change("gpu_reset_required", {**who, "hint": "reset it: nvidia-smi -r -i <gpu> (after SIGUSR1)"}))
    elif was_reset and not g.reset_required and g.up:
        out.append(Change("gpu_reset_cleared", who))
    # XID counters count from the exporter's start (the driver's events it saw), so the first
    # snapshot's counts are news too.
    old = before.xids if before is not None else _NONE
    for code, count in sorted(g.xid_errors_total.items()):
        if count > old.get(code, 0):
            out.append(Change("gpu_xid", {**who, "xid": code, "new": count - old.get(code, 0), "total": count}))
    return out


class GpuChanges:
    """Compares each snapshot with the last one NVML answered, and logs what changed."""

    def __init__(self) -> None:
        # By UUID where it was read: after a reload a missing GPU's down reading and the GPU that moved
        # into its index share the index (missing.py).
        self._seen: dict[str | int, _Seen] = {}

    def observe(self, snapshot: NodeSnapshot) -> list[Change]:
        if not snapshot.nvml_up:  # no GPU was asked: nothing is known of any one of them
            return []
        now = snapshot.steady_at
        out: list[Change] = []
        seen: dict[str | int, _Seen] = {}
        for g in snapshot.gpus:
            key: str | int = g.uuid or g.index
            before = self._seen.get(key)
            if before is None and g.uuid:
                before = self._seen.get(g.index)  # its UUID read late: the same card as the index's
                if before is not None and before.uuid and before.uuid != g.uuid:
                    before = None  # another card in that index: its own first sighting
            out += _changes(before, g, now)
            went_down = not g.up and (before is None or before.up)
            since = now if went_down or before is None else before.since
            model = g.static.name if g.static is not None else before.model if before else None
            seen[key] = _Seen(g.uuid, g.up, g.reset_required, dict(g.xid_errors_total), since, model, g.index,
                              not g.up and g.error == MISSING)  # fmt: skip
        for key, before in self._seen.items():
            if key not in seen and (not before.uuid or before.uuid not in seen):
                # the driver lists fewer GPUs, and this one never had a UUID to be remembered by (missing.py
                # keeps those that had): as lost as one that fails
                if before.up:
                    said = {"gpu": before.index, "uuid": before.uuid or None, "model": before.model}
                    out.append(Change("gpu_lost", {**said, "error": "no longer listed by the driver"}))
                seen[key] = _Seen(before.uuid, False, before.reset_required, before.xids,
                                  now if before.up else before.since, before.model, before.index)  # fmt: skip
        self._seen = seen
        for c in out:
            log.warning(c.event, **c.fields)
        return out
