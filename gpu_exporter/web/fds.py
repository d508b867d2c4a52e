"""File descriptors: each client costs one, so the server raises the soft limit and keeps below it."""

from __future__ import annotations

import contextlib
import resource


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def connection_cap(requested: int, reserve: int = 64) -> int:
    """At most ``requested`` connections, and few enough that ``accept`` never runs out of files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return requested
    return max(16, min(requested, soft - reserve))
