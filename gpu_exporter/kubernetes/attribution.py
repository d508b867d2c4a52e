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

A device is found under every key it may be listed by (``devices.gpu_keys``/``mig_keys``: its UUID,
its index, its minor number, its GPU instance id or DRA placement).  A listed device no GPU of the
node has (a minor number, a UUID of another node) is counted as ``no_such_device`` and logged once.

A pod's UID is not in the kubelet's answer.  A process attributed to a pod whose ``HOSTNAME`` is
that pod's name vouches for the pod UID its cgroup path carries; where every such process of the
pod vouches for the same UID, and no other pod's processes for it, that UID is the pod's
(``gpu_holder_info``'s ``uid``, the label OpenCost joins on).  Anything else leaves it unsaid: a
process of another pod on the device (its HOSTNAME is its own pod's), processes that disagree, or
a pod with its own ``hostname``.

A process's cgroup and HOSTNAME are read once and kept under its pid and start time (the reading's
``start_time``, from ``/proc/<pid>/stat``): the kernel gives a pid that was freed to the next
process, whoever's it is, so a pid whose start time changed (or that vanished from /proc) is read
again, and never inherits the pod of the process that had it before.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import structlog

from .. import untrusted
from ..snapshot import GpuReading, MigReading, PodRef, ProcessReading
from .devices import NO_SUCH_DEVICE, REASONS, Unattributed, gpu_keys, mig_keys

log = structlog.get_logger(__name__)

DeviceMap = Mapping[str, tuple[PodRef, ...]]
ProcKey = tuple[int, int | None]  # a process: its pid and start time (see the module)
MAX_LOGGED_UNMATCHED = 1024

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
    """Adds pods to readings.  Per-process facts are cached by pid and start time for the life of the
    process."""

    def __init__(
        self,
        devices: Callable[[], DeviceMap],
        proc: Callable[[int], ProcInfo] = read_proc,
        unattributed: Callable[[], Sequence[Unattributed]] = tuple,
    ) -> None:
        self._devices = devices
        self._unattributed = unattributed
        self._counts: Mapping[str, int] = dict.fromkeys(REASONS, 0)
        self._unmatched_logged: set[str] = set()
        self._proc = proc
        self._cache: dict[ProcKey, ProcInfo] = {}
        self._bound: dict[str, str] = {}  # pod UID -> the pod name its processes were believed for
        self._refused: set[tuple[str, str]] = set()  # (uid, name) conflicts already logged

    def attach(self, gpus: tuple[GpuReading, ...]) -> tuple[GpuReading, ...]:
        mapping = self._devices()
        seen: set[ProcKey] = set()
        for g in gpus:  # every process's facts first: claims are judged across the node
            for p in (*g.processes, *(p for m in g.migs for p in m.processes)):
                seen.add(key := (p.pid, p.start_time))
                if key not in self._cache:
                    self._cache[key] = self._proc(p.pid)
        # Gone, or its pid now another process's: its facts (and its HOSTNAME claim) go with it.
        for key in list(self._cache):
            if key not in seen:
                del self._cache[key]
        trusted = self._trusted_claims(mapping)
        out = []
        matched: set[str] = set()
        for g in gpus:
            minor = g.static.minor_number if g.static is not None else None
            pods = _holders(mapping, matched, gpu_keys(g.index, g.uuid, minor))
            migs = tuple(
                replace(m, pods=(mp := _holders(mapping, matched, _mig_keys(g.index, minor, m))),
                        processes=self._processes(m.processes, mp, trusted))
                for m in g.migs
            )  # fmt: skip
            # A process of the parent GPU may run in a MIG device: its holders count too.
            every = tuple(sorted(set(pods) | {r for m in migs for r in m.pods}, key=_order))
            out.append(replace(g, pods=pods, migs=migs, processes=self._processes(g.processes, every, trusted)))
        self._count(mapping, matched, gpus)
        return _with_uids(tuple(out))

    def unattributed(self) -> Mapping[str, int]:
        """Devices of the last answer held by a container but given to no GPU at the last poll, by
        reason (``devices.REASONS``), for gpu_exporter_pod_attribution_unattributed_devices."""
        return self._counts

    def _count(self, mapping: DeviceMap, matched: set[str], gpus: tuple[GpuReading, ...]) -> None:
        counts = Counter(u.reason for u in self._unattributed())
        # A GPU that is down still has its UUID and index: its devices are not "no such device".
        unmatched = [k for k in mapping if k not in matched]
        counts[NO_SUCH_DEVICE] += len(unmatched)
        self._counts = {reason: counts.get(reason, 0) for reason in REASONS}
        for key in unmatched:
            if key in self._unmatched_logged or len(self._unmatched_logged) >= MAX_LOGGED_UNMATCHED:
                continue
            self._unmatched_logged.add(key)
            log.warning("pod_attribution_device_unattributed", reason=NO_SUCH_DEVICE, device=key,
                        holders=[f"{r.namespace}/{r.pod}" for r in mapping[key]], gpus=len(gpus),
                        detail="the kubelet lists a device no GPU of this node has (its UUID, index, minor number "
                               "or MIG placement): its pods are given no GPU")  # fmt: skip

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
        for name in sorted(claimed):  # a stable order: the log reads the same on every run
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
        return tuple(replace(p, pod=_pick(holders, self._cache[(p.pid, p.start_time)], trusted)) for p in procs)


def _order(r: PodRef) -> tuple[str, str, str]:
    return (r.namespace, r.pod, r.container)


def _mig_keys(gpu_index: int, minor: int | None, m: MigReading) -> tuple[str, ...]:
    return mig_keys(gpu_index, minor, m.index, m.uuid, m.gpu_instance_id, m.gpu_instance_profile_id, m.placement_start)


def _holders(mapping: DeviceMap, matched: set[str], keys: tuple[str, ...]) -> tuple[PodRef, ...]:
    found = [k for k in keys if k in mapping]
    matched.update(found)
    refs = {r for k in found for r in mapping[k]}
    return tuple(sorted(refs, key=_order))


def _with_uids(gpus: tuple[GpuReading, ...]) -> tuple[GpuReading, ...]:
    """Each pod's UID, where the cgroups of all the processes attributed to it agree on one."""
    uids: dict[tuple[str, str], set[str]] = defaultdict(set)
    for g in gpus:
        for p in (*g.processes, *(p for m in g.migs for p in m.processes)):
            if p.pod is not None and p.pod.uid:
                uids[(p.pod.namespace, p.pod.pod)].add(p.pod.uid)
    pods_of = Counter(uid for u in uids.values() for uid in u)
    known = {pod: uid for pod, u in uids.items() if len(u) == 1 and pods_of[uid := next(iter(u))] == 1}

    def mark(refs: tuple[PodRef, ...]) -> tuple[PodRef, ...]:
        return tuple(replace(r, uid=known.get((r.namespace, r.pod)) or "") for r in refs)

    def proc(p: ProcessReading) -> ProcessReading:
        return replace(p, pod=mark((p.pod,))[0]) if p.pod is not None else p

    return tuple(
        replace(g, pods=mark(g.pods), processes=tuple(map(proc, g.processes)),
                migs=tuple(replace(m, pods=mark(m.pods), processes=tuple(map(proc, m.processes))) for m in g.migs))
        for g in gpus
    )  # fmt: skip


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
    # The process vouches for its pod UID only as its pod's own (see the module); _with_uids judges.
    uid = info.pod_uid if info.pod_uid and info.hostname == first.pod else ""
    # Several containers of the pod hold the device: the process's container is not known.
    if len(containers) == 1:
        return replace(first, uid=uid)
    return PodRef(first.namespace, first.pod, "", uid=uid)
