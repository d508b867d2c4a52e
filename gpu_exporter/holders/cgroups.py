"""What a process's cgroup says about who runs it: a Kubernetes pod, a Slurm job, a container.

``/proc/<pid>/cgroup`` has one line per hierarchy, ``ID:controllers:path``: one line ``0::/path``
with cgroup v2, one per controller with v1, both on a hybrid system.  The paths are made by the
scheduler, the container engine and systemd, never by the process (moving a process to another
cgroup needs write access to that cgroup, which a job or a container is not given), so they are
trusted as the kubelet's pod UIDs are.

Slurm's cgroup plugins (proctrack/cgroup, task/cgroup):

- v1: ``/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>`` in each controller's hierarchy
  (``/slurm_<node>/…`` where one host runs several slurmd);
- v2: ``/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>``
  (``<node>_slurmstepd.scope`` likewise), without the uid.

Containers, by engine (``<id>`` is 64 hex digits):

- Docker: ``docker-<id>.scope`` (systemd cgroup driver), ``/docker/<id>`` (cgroupfs);
- Podman: ``libpod-<id>.scope`` (systemd; rootless under ``user@<uid>.service``; possibly with a
  ``/container`` child), ``/libpod_parent/libpod-<id>`` (cgroupfs); ``libpod-conmon-<id>`` is
  podman's monitor, not the container;
- CRI-O: ``crio-<id>.scope`` or ``crio-<id>``, not ``crio-conmon-<id>``;
- containerd: ``cri-containerd-<id>.scope`` (the CRI plugin), ``nerdctl-<id>.scope`` (nerdctl with
  systemd), ``/<namespace>/<id>`` (its cgroupfs default, e.g. ``/default/<id>``).

A path seen from inside another cgroup namespace starts with ``/..``; the names above are looked
for anywhere in it, and the deepest wins (a container started inside another is the inner one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import untrusted

MAX_BYTES = 64 * 1024  # a process in every v1 hierarchy of a deep tree stays far below this

_SLURM_V1 = re.compile(r"/slurm(?:_[^/]*)?/uid_(\d{1,10})/job_(\d{1,20})(?=/|$)")
_SLURM_V2 = re.compile(r"slurmstepd\.scope/job_(\d{1,20})(?=/|$)")
_ID = "([0-9a-f]{64})"
_CONTAINERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("docker", re.compile(rf"(?:docker-{_ID}\.scope|/docker/{_ID})(?=/|$)")),
    ("podman", re.compile(rf"libpod-{_ID}(?:\.scope)?(?=/|$)")),
    ("cri-o", re.compile(rf"crio-{_ID}(?:\.scope)?(?=/|$)")),
    ("containerd", re.compile(rf"(?:cri-containerd-{_ID}\.scope|nerdctl-{_ID}\.scope)(?=/|$)")),
)
# containerd's cgroupfs default: its namespace, then the ID.  Looked for only where no engine above
# matched (/docker/<id> has the same shape).
_BARE = re.compile(rf"/[A-Za-z0-9._-]+/{_ID}(?=/|$)")


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    """What one process's cgroup paths say; ``visible`` False where they could not be read."""

    visible: bool
    kubepods: bool = False  # a Kubernetes pod's process (its pod comes from the kubelet)
    job: str | None = None  # the Slurm job it runs in
    job_uid: int | None = None  # the job's owner, where the path says (Slurm's v1 layout)
    engine: str | None = None  # docker, podman, cri-o or containerd
    container_id: str | None = None


def parse(text: str) -> CgroupFacts:
    """The facts of the contents of a ``/proc/<pid>/cgroup`` file."""
    unified: list[str] = []
    v1: list[str] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if sep:
            (unified if hierarchy == "0" and not controllers else v1).append(path)
    # The unified hierarchy first: on a hybrid system it is where systemd and the engines put
    # processes, and a v1 controller's path may be the root.
    paths = unified + v1
    job = uid = engine = cid = None
    kubepods = False
    for path in paths:
        kubepods = kubepods or "kubepods" in path
        if job is None:
            if (m := _SLURM_V1.search(path)) is not None:
                uid, job = int(m.group(1)), m.group(2)
            elif (m := _SLURM_V2.search(path)) is not None:
                job = m.group(1)
        if cid is None:
            engine, cid = container_of(path)
    return CgroupFacts(True, kubepods, job, uid, engine, cid)


def container_of(path: str) -> tuple[str | None, str | None]:
    """(engine, ID) of the deepest container named in one cgroup path; (None, None) for none."""
    best: tuple[int, str, str] | None = None
    for engine, pattern in _CONTAINERS:
        for m in pattern.finditer(path):
            found = next(g for g in m.groups() if g)
            if best is None or m.start() > best[0]:
                best = (m.start(), engine, found)
    if best is None and (bare := _last(_BARE, path)) is not None:
        best = (bare.start(), "containerd", bare.group(1))
    return (best[1], best[2]) if best is not None else (None, None)


def _last(pattern: re.Pattern[str], path: str) -> re.Match[str] | None:
    found: re.Match[str] | None = None
    for m in pattern.finditer(path):
        found = m
    return found


def read(pid: int, proc_root: str = "/proc") -> CgroupFacts:
    """The facts of process ``pid``; not visible where it has exited (also while being read), lives
    in another PID namespace, or its file cannot be read."""
    try:
        # Bytes: a cgroup's name is chosen by whoever made it and need not be UTF-8.
        with open(f"{proc_root}/{pid}/cgroup", "rb") as f:
            raw = f.read(MAX_BYTES)
    except OSError:  # ENOENT, ESRCH: gone; EACCES: not ours to read
        return CgroupFacts(False)
    if not raw:  # a process that exited between open and read shows an empty file
        return CgroupFacts(False)
    return parse(untrusted.text(raw))
