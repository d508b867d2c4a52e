"""Joins the kubelet's device assignments into a snapshot: which pod holds each GPU, MIG device
and process.

The kubelet's PodResources API says which containers hold which device IDs. It knows nothing of
processes, and it does not give pod UIDs. A process is therefore attributed like this:
- Its ``/proc/<pid>/cgroup`` tells whether it runs in a pod at all (``kubepods``). Node processes
  such as Xorg or a monitoring agent are never given a pod.
- If one pod holds the device, the process is that pod's.
- If several pods share the device (time-slicing), the process's ``HOSTNAME`` (which the kubelet
  sets to the pod's name in every container) picks the pod among the holders.

Without ``hostPID`` the exporter cannot see other containers' /proc entries. Processes on a device
held by one pod are still attributed to it, but processes on a shared device are left without a
pod.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from .. import untrusted
from ..snapshot import GpuReading, PodRef, ProcessReading

DeviceMap = Mapping[str, tuple[PodRef, ...]]

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True, slots=True)
class ProcInfo:
    visible: bool  # could /proc/<pid> be read at all
    in_pod: bool = False
    pod_uid: str | None = None
    hostname: str | None = None


def read_proc(pid: int, proc_root: str = "/proc") -> ProcInfo:
    try:
        # Bytes: a cgroup's path is named by whoever made it, and need not be UTF-8.
        with open(f"{proc_root}/{pid}/cgroup", "rb") as f:
            cgroup = untrusted.text(f.read())
    except OSError:
        return ProcInfo(visible=False)
    m = _POD_UID.search(cgroup)
    hostname = None
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"HOSTNAME="):
                    hostname = untrusted.text(item[9:])
                    break
    except OSError:
        pass
    return ProcInfo(
        visible=True,
        in_pod="kubepods" in cgroup,
        pod_uid=m.group(1).replace("_", "-") if m else None,
        hostname=hostname,
    )


class Attributor:
    """Adds pods to readings.  Per-process facts are cached by pid for the life of the process."""

    def __init__(self, devices: Callable[[], DeviceMap], proc: Callable[[int], ProcInfo] = read_proc) -> None:
        self._devices = devices
        self._proc = proc
        self._cache: dict[int, ProcInfo] = {}

    def attach(self, gpus: tuple[GpuReading, ...]) -> tuple[GpuReading, ...]:
        mapping = self._devices()
        seen: set[int] = set()
        out = []
        for g in gpus:
            pods = _holders(mapping, g.uuid, f"index:{g.index}")
            migs = tuple(
                replace(m, pods=(mp := _holders(mapping, m.uuid, f"index:{g.index}:{m.index}")),
                        processes=self._processes(m.processes, mp, seen))
                for m in g.migs
            )  # fmt: skip
            # A process of the parent GPU may run in a MIG device: its holders count too.
            every = tuple(sorted(set(pods) | {r for m in migs for r in m.pods}, key=_order))
            out.append(replace(g, pods=pods, migs=migs, processes=self._processes(g.processes, every, seen)))
        for pid in list(self._cache):
            if pid not in seen:
                del self._cache[pid]
        return tuple(out)

    def _processes(self, procs: tuple[ProcessReading, ...], holders: tuple[PodRef, ...],
                   seen: set[int]) -> tuple[ProcessReading, ...]:  # fmt: skip
        if not holders:
            return procs
        out = []
        for p in procs:
            seen.add(p.pid)
            info = self._cache.get(p.pid)
            if info is None:
                info = self._cache[p.pid] = self._proc(p.pid)
            out.append(replace(p, pod=_pick(holders, info)))
        return tuple(out)


def _order(r: PodRef) -> tuple[str, str, str]:
    return (r.namespace, r.pod, r.container)


def _holders(mapping: DeviceMap, *keys: str) -> tuple[PodRef, ...]:
    refs = {r for k in keys for r in mapping.get(k, ())}
    return tuple(sorted(refs, key=_order))


def _pick(holders: tuple[PodRef, ...], info: ProcInfo) -> PodRef | None:
    if info.visible and not info.in_pod:
        return None  # a node process (Xorg, a host agent): no pod, whoever holds the device
    pods = {(r.namespace, r.pod) for r in holders}
    if len(pods) == 1:
        chosen = holders
    elif info.hostname:
        chosen = tuple(r for r in holders if r.pod == info.hostname)
    else:
        return None
    containers = {r.container for r in chosen}
    if not chosen:
        return None
    first = chosen[0]
    # Several containers of the pod hold the device: the process's container is not known.
    return first if len(containers) == 1 else PodRef(first.namespace, first.pod, "")
