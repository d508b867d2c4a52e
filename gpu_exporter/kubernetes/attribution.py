"""Joins the kubelet's device assignments into a snapshot: which pod holds each GPU, MIG device
and process.

The kubelet's PodResources API says which containers hold which device IDs. It knows nothing of
processes, and it does not give pod UIDs. A process is therefore attributed like this:
- Its ``/proc/<pid>/cgroup`` tells whether it runs in a pod at all (``kubepods``). Node processes
  such as Xorg or a monitoring agent are never given a pod.
- If one pod holds the device, the process is that pod's.
- If several pods share the device (time-slicing), the process's ``HOSTNAME`` (which the kubelet
  sets to the pod's name in every container) picks the pod among the holders.  A tenant sets its
  own environment, so that name is only a claim, checked against the pod UID that the process's
  cgroup path carries (which a tenant cannot choose): every process of one pod UID must claim the
  same name, no other pod UID may claim it, and a name once given to a UID stays that UID's while
  the pod holds the device.  A claim that fails any of these is refused (the process gets no pod,
  and the conflict is logged): a tenant can leave its own processes, or both sides of a conflict,
  unattributed, but cannot have its work billed to another pod.

Without ``hostPID`` the exporter cannot see other containers' /proc entries. Processes on a device
held by one pod are still attributed to it, but processes on a shared device are left without a
pod.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import structlog

from .. import untrusted
from ..snapshot import GpuReading, PodRef, ProcessReading

log = structlog.get_logger(__name__)

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
        self._bound: dict[str, str] = {}  # pod UID -> the pod name its processes were believed for
        self._refused: set[tuple[str, str]] = set()  # (uid, name) conflicts already logged

    def attach(self, gpus: tuple[GpuReading, ...]) -> tuple[GpuReading, ...]:
        mapping = self._devices()
        seen: set[int] = set()
        for g in gpus:  # every process's facts first: claims are judged across the node
            for p in (*g.processes, *(p for m in g.migs for p in m.processes)):
                seen.add(p.pid)
                if p.pid not in self._cache:
                    self._cache[p.pid] = self._proc(p.pid)
        for pid in list(self._cache):
            if pid not in seen:
                del self._cache[pid]
        trusted = self._trusted_claims(mapping)
        out = []
        for g in gpus:
            pods = _holders(mapping, g.uuid, f"index:{g.index}")
            migs = tuple(
                replace(m, pods=(mp := _holders(mapping, m.uuid, f"index:{g.index}:{m.index}")),
                        processes=self._processes(m.processes, mp, trusted))
                for m in g.migs
            )  # fmt: skip
            # A process of the parent GPU may run in a MIG device: its holders count too.
            every = tuple(sorted(set(pods) | {r for m in migs for r in m.pods}, key=_order))
            out.append(replace(g, pods=pods, migs=migs, processes=self._processes(g.processes, every, trusted)))
        return tuple(out)

    def _trusted_claims(self, mapping: DeviceMap) -> dict[str, str]:
        """Pod UID -> the pod name its processes may be attributed to by HOSTNAME (see the module)."""
        names: dict[str, set[str]] = defaultdict(set)  # uid -> names its processes claim
        for info in self._cache.values():
            if info.pod_uid is not None and info.hostname:
                names[info.pod_uid].add(info.hostname)
        holding = {r.pod for refs in mapping.values() for r in refs}
        # A name stays bound to its UID while that pod holds a device.
        self._bound = {uid: name for uid, name in self._bound.items() if name in holding}
        claimants: dict[str, set[str]] = defaultdict(set)  # name -> uids claiming it
        for uid, claimed in names.items():
            for name in claimed:
                claimants[name].add(uid)
        trusted: dict[str, str] = {}
        for uid, claimed in names.items():
            name = next(iter(claimed))
            owner = next((u for u, n in self._bound.items() if n == name), uid)
            if len(claimed) > 1 or len(claimants[name]) > 1 or owner != uid:
                self._refuse(uid, claimed, claimants, owner)
                continue
            trusted[uid] = name
            if name in holding:
                self._bound[uid] = name
        return trusted

    def _refuse(self, uid: str, claimed: set[str], claimants: dict[str, set[str]], owner: str) -> None:
        for name in claimed:
            if (uid, name) in self._refused:
                continue
            self._refused.add((uid, name))
            others = sorted((claimants[name] | {owner}) - {uid})
            log.warning("pod_attribution_claim_refused", pod_uid=uid, hostname=name, also_claimed_by=others,
                        reason="a process's HOSTNAME names a pod that another pod UID claims or owns, or its "
                               "pod's processes disagree; its GPU time is not given to either")  # fmt: skip
        if len(self._refused) > 10_000:  # bounded; a conflict logged again after this is no harm
            self._refused.clear()

    def _processes(self, procs: tuple[ProcessReading, ...], holders: tuple[PodRef, ...],
                   trusted: dict[str, str]) -> tuple[ProcessReading, ...]:  # fmt: skip
        if not holders:
            return procs
        return tuple(replace(p, pod=_pick(holders, self._cache[p.pid], trusted)) for p in procs)


def _order(r: PodRef) -> tuple[str, str, str]:
    return (r.namespace, r.pod, r.container)


def _holders(mapping: DeviceMap, *keys: str) -> tuple[PodRef, ...]:
    refs = {r for k in keys for r in mapping.get(k, ())}
    return tuple(sorted(refs, key=_order))


def _pick(holders: tuple[PodRef, ...], info: ProcInfo, trusted: Mapping[str, str]) -> PodRef | None:
    if info.visible and not info.in_pod:
        return None  # a node process (Xorg, a host agent): no pod, whoever holds the device
    pods = {(r.namespace, r.pod) for r in holders}
    if len(pods) == 1:
        chosen = holders
    elif info.pod_uid is not None and info.pod_uid in trusted:
        chosen = tuple(r for r in holders if r.pod == trusted[info.pod_uid])
    else:
        return None  # no claim, or one that was refused (a process without a pod UID cannot be checked)
    containers = {r.container for r in chosen}
    if not chosen:
        return None
    first = chosen[0]
    # Several containers of the pod hold the device: the process's container is not known.
    return first if len(containers) == 1 else PodRef(first.namespace, first.pod, "")
