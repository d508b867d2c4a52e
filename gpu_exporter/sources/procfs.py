"""Who runs a GPU process: its user, from ``/proc/<pid>/status``.

Shared servers and workstations have no pods; their GPUs are held by Unix users.  The user is the
process's real uid, named as this machine's passwd names it.  In a container whose passwd does not
know the host's users, the uid's number stands in, so the label stays exact and bounded by the
users the machine has.
"""

from __future__ import annotations

import functools
import pwd

from .. import untrusted


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
