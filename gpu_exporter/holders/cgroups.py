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

**Who can make a path.**  Moving a process needs write access to the cgroup it goes to, but some
subtrees are given to their users: with systemd's delegation on cgroup v2, a user owns
``/user.slice/user-<uid>.slice/user@<uid>.service`` and may create any cgroup inside it (so may a
container whose cgroup namespace and cgroupfs are writable, inside its own).  A name there is what
that user chose.  So:

- a Slurm job is only the path slurmd or slurmstepd makes, at the top of a hierarchy: v1's
  ``/slurm/uid_<uid>/job_<id>`` only in a v1 hierarchy (Slurm's cgroup/v2 plugin never makes it in
  the unified one) and only at its root; v2's ``slurmstepd.scope`` only directly under
  ``/system.slice``.  Seen from another cgroup namespace, the part above it shows as ``/..``
  components, which stand in for root-owned ancestors.  The same names in a user's subtree or
  inside a container are no job;
- a container in a user's subtree is at most that user's own (rootless Podman or Docker):
  its engine is shown as ``<engine>@<uid>`` (``podman@1000``), so that it never shares a holder with a
  system engine's container of the same ID, nor with another user's, and the system engines'
  sockets are never asked its name;
- a container elsewhere is checked against its engine where the engine answers (``engines``: the
  container's init process must run in the same cgroup), which catches a name made inside another
  container.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import untrusted

# The read bound.  The kernel writes the file, one line per hierarchy, and refuses to show a path of
# PATH_MAX (4096) bytes or more (proc_cgroup_show: ENAMETOOLONG), so a user nesting cgroups in a
# delegated subtree makes each line at most about 4 KB.  A v1 host has up to 16 controllers' hierarchies,
# systemd's named one and the unified one: 64 KiB cut such a file short (15 controllers at 3.9 KB
# each, the unified line last, was cut off, and a container named only there was not attributed).
# Room for 32 hierarchies of the longest paths: only root can mount more, and a longer file is read
# up to here, its cut last line left out.
PATH_MAX = 4096
MAX_HIERARCHIES = 32
MAX_BYTES = MAX_HIERARCHIES * (PATH_MAX + 64)

# Anchored at the top of the path (after any /.. of another cgroup namespace): only root makes a
# cgroup there, so nobody below it (a user's delegated subtree, a container) can forge one.  A /..
# stands for an ancestor of the exporter's own cgroup (system.slice, a pod's slice: root's), which
# holds as long as the exporter does not itself run inside a user's delegated subtree.
_SLURM_V1 = re.compile(r"(?:/\.\.)*/slurm(?:_[^/]*)?/uid_(\d{1,10})/job_(\d{1,20})(?=/|$)")
_SLURM_V2 = re.compile(r"(?:(?:/\.\.)*/system\.slice|(?:/\.\.)+)/(?:[^/]*_)?slurmstepd\.scope/job_(\d{1,20})(?=/|$)")
# The subtree systemd delegates to a user (cgroup v2, and v1's name=systemd hierarchy).
_DELEGATED = re.compile(r"/user@(\d{1,10})\.service(?=/|$)")
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
    engine: str | None = None  # docker, podman, cri-o or containerd; <engine>@<uid> in a user's subtree
    container_id: str | None = None
    container_cgroup: str | None = None  # the path down to the container's own cgroup, to check with its engine


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
    job = uid = engine = cid = anchor = None
    kubepods = False
    for path in unified + v1:
        kubepods = kubepods or "kubepods" in path
        if job is None:
            # v1's layout only in a v1 hierarchy: in the unified one, slurmd never makes it.
            if path not in unified and (m := _SLURM_V1.match(path)) is not None:
                uid, job = int(m.group(1)), m.group(2)
            elif (m := _SLURM_V2.match(path)) is not None:
                job = m.group(1)
        if cid is None and (found := _container(path)) is not None:
            engine, cid, anchor = found
    return CgroupFacts(True, kubepods, job, uid, engine, cid, anchor)


def _container(path: str) -> tuple[str, str, str] | None:
    """(engine, ID, the path down to its cgroup) of the deepest container in one cgroup path."""
    best: tuple[int, int, str, str] | None = None
    for engine, pattern in _CONTAINERS:
        for m in pattern.finditer(path):
            found = next(g for g in m.groups() if g)
            if best is None or m.start() > best[0]:
                best = (m.start(), m.end(), engine, found)
    if best is None and (bare := _last(_BARE, path)) is not None:
        best = (bare.start(), bare.end(), "containerd", bare.group(1))
    if best is None:
        return None
    start, end, engine, cid = best
    # Made inside a user's delegated subtree: that user's own container, whatever its name says.  The
    # outermost subtree's uid is the host's user (one inside it is in that user's namespace).
    if (user := _DELEGATED.search(path, 0, start)) is not None:
        engine = f"{engine}@{user.group(1)}"
    return engine, cid, path[:end]


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
    if len(raw) == MAX_BYTES and not raw.endswith(b"\n"):
        raw = raw[: raw.rfind(b"\n") + 1]  # cut at the bound: its last line is not whole
    return parse(untrusted.text(raw))
