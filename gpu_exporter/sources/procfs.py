"""Who runs a GPU process: its user, from ``/proc/<pid>/status``; and which process a pid is, by
its start time, from ``/proc/<pid>/stat``.

Shared servers and workstations have no pods; their GPUs are held by Unix users.  The user is the
process's real uid, named as this machine's passwd names it.  In a container whose passwd does not
know the host's users, the uid's number stands in, so the label stays exact and bounded by the
users the machine has.

A pid names a process only while it runs: once it exits, the kernel gives the number to the next
process that needs one, whoever's it is (an unprivileged user goes through a 32,768-pid space in
about 4 s).  What is looked up once per process is therefore kept under the pid *and* its start
time (:func:`start_time`), which a later process with the same pid does not share.
"""

from __future__ import annotations

import functools
import pwd

from .. import untrusted

# /proc/<pid>/stat is one line: the pid, the name and 50 more fields, well under 1 KiB.
STAT_MAX_BYTES = 4096
# proc(5): starttime is field 22; counted from field 3, the first after the name.
_START_TIME = 22 - 3


def start_time(pid: int, proc_root: str = "/proc") -> int | None:
    """When ``pid`` started, in clock ticks after boot (``starttime``, the 22nd field of
    ``/proc/<pid>/stat``, proc(5)); None where /proc does not show the process (another PID
    namespace, gone).  With the pid, it tells one process from a later one given the same pid.

    Field 2 is the process's name in parentheses, which its owner chose (``prctl(PR_SET_NAME)``):
    the kernel writes it as it is, so it may hold spaces, parentheses and fields of its own
    (``x) R 1 1``).  The fields are counted after the *last* ``)``, which is the kernel's: the
    ones after the name are numbers and never hold one.
    """
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            raw = f.read(STAT_MAX_BYTES)
    except OSError:  # ENOENT, ESRCH: gone, or not in this PID namespace
        return None
    _, paren, rest = raw.rpartition(b")")
    fields = rest.split()
    if not paren or len(fields) <= _START_TIME or not fields[_START_TIME].isdigit():
        return None  # not the kernel's format (empty: it exited while being read)
    return int(fields[_START_TIME])


def process_uid(pid: int, proc_root: str = "/proc") -> int | None:
    """The real uid of ``pid``, or None where /proc does not show the process (another PID
    namespace, gone, no permission)."""
    try:
        # Bytes: the file's Name: line is the process's own name, which need not be UTF-8.
        with open(f"{proc_root}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@functools.lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    """The passwd name of ``uid``, else its number.  A name that is not UTF-8 (a Latin-1 passwd
    entry, which ``pwd`` hands over with surrogate escapes) is decoded leniently."""
    try:
        return untrusted.text(pwd.getpwuid(uid).pw_name)
    except (KeyError, OverflowError):
        return str(uid)


def process_user(pid: int, proc_root: str = "/proc") -> str | None:
    uid = process_uid(pid, proc_root)
    return None if uid is None else user_name(uid)
