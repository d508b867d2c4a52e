"""Writing the report to ``--output FILE``, safely for root in a directory someone else can write.

The report is written to a new file beside FILE and renamed into place, so a reader never sees half
a report.  Everything after the directory is found is done on descriptors, never by name: the
directory is opened once, the new file is created relative to it (``O_EXCL | O_NOFOLLOW``), its
mode is set with ``fchmod`` and the rename is relative to the directory.  A name can be swapped
under us between two calls (the directory's owner renames the new file away and puts a link to a
root-only file in its place, woken by inotify); a descriptor cannot, so that swap changes nothing
but the name the directory's owner sees in their own directory.

Links are followed as the kernel's ``fs.protected_symlinks`` would have them, on every component of
the path and not only the last: one owned by the caller or by root is followed, one that another
user planted is refused, naming it and its owner.  A directory that others may write without the
sticky bit (mode ``o+w`` or ``g+w``, not ``+t``) is refused too: anyone could replace the report
there after it is written.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
from pathlib import Path

# How many links one path may pass through, as the kernel's MAXSYMLINKS (40 since Linux 4.2).
MAX_LINKS = 40


class OutputError(Exception):
    """``--output`` names a file the report must not be written to, or cannot be."""


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0)


def _refuse_link(shown: str, st: os.stat_result) -> OutputError:
    return OutputError(
        f"refusing to write {shown}: it passes through a symbolic link owned by uid {st.st_uid}, not by you "
        f"(uid {os.geteuid()}) nor root; remove it, or name the file it points to"
    )


def _open_dir(path: Path) -> int:
    """A descriptor of the directory ``path``, walked one component at a time without letting the
    kernel follow any link: each link met is judged by its owner, then read and walked in turn."""
    parts = list(path.parts)
    fd = os.open("/" if path.is_absolute() else ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if path.is_absolute():
        parts = parts[1:]
    links = 0
    walked: list[str] = []  # for messages: the path as walked so far
    try:
        while parts:
            name = parts.pop(0)
            if name in ("", "."):
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            shown = "/".join([*walked, name]) if not path.is_absolute() else "/" + "/".join([*walked, name])
            if stat.S_ISLNK(st.st_mode):
                if not _trusted(st):
                    raise _refuse_link(shown, st)
                links += 1
                if links > MAX_LINKS:
                    raise OutputError(f"cannot write under {path}: more than {MAX_LINKS} symbolic links")
                target = Path(os.readlink(name, dir_fd=fd))
                if target.is_absolute():
                    os.close(fd)
                    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    walked = []
                    parts = list(target.parts[1:]) + parts
                else:
                    parts = list(target.parts) + parts
                continue
            # O_NOFOLLOW: had the name become a link since the look above, the open fails, never follows.
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if name == "..":
                walked = walked[:-1]
            else:
                walked.append(name)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_dir(fd: int, shown: Path) -> None:
    st = os.fstat(fd)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise OutputError(
            f"refusing to write into {shown}: others may write to it (mode {stat.S_IMODE(st.st_mode):04o}) and it "
            "has no sticky bit, so anyone could replace the report in it; write it elsewhere, or chmod +t the directory"
        )


def _final(output: Path, dir_fd: int) -> str:
    """The name to replace in the opened directory: FILE's own, or where the caller's own link at FILE
    points (judged like every other link on the path)."""
    try:
        st = os.stat(output.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return output.name
    if not stat.S_ISLNK(st.st_mode):
        return output.name
    if st.st_uid != os.geteuid():
        raise OutputError(
            f"refusing to write {output}: it is a symbolic link owned by uid {st.st_uid}, not by you "
            f"(uid {os.geteuid()}); remove it, or name the file it points to"
        )
    return ""  # the caller's own link: written where it leads (see write)


def write(text: str, output: Path | None) -> None:
    """Print the report, or write it to ``output`` as described in this module's docstring."""
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    for _ in range(MAX_LINKS):
        if output.name in ("", ".", ".."):
            raise OutputError(f"cannot write {output}: it names a directory, not a file")
        try:
            dir_fd = _open_dir(output.parent)
        except FileNotFoundError as e:
            raise OutputError(f"cannot write {output}: no such directory ({e.filename or output.parent})") from e
        except OSError as e:
            raise OutputError(f"cannot write {output}: {e.strerror or e}") from e
        try:
            name = _final(output, dir_fd)
            if not name:  # follow the caller's own link, walking its target's path in turn
                target = Path(os.readlink(output.name, dir_fd=dir_fd))
                output = target if target.is_absolute() else output.parent / target
                continue
            _check_dir(dir_fd, output.parent)
            _replace(text, dir_fd, name)
            return
        except OSError as e:
            raise OutputError(f"cannot write {output}: {e.strerror or e}") from e
        finally:
            os.close(dir_fd)
    raise OutputError(f"cannot write {output}: more than {MAX_LINKS} symbolic links")


def _replace(text: str, dir_fd: int, name: str) -> None:
    tmp = f".{name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            umask = os.umask(0)
            os.umask(umask)
            # On the descriptor: the name may already be someone else's file or link (see the docstring).
            os.fchmod(f.fileno(), 0o666 & ~umask)  # 0600 would hide the report from whoever it is for
            mine = os.fstat(f.fileno())
            _still_mine(tmp, dir_fd, mine)  # renamed away and replaced: put nothing of theirs at FILE
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        _still_mine(name, dir_fd, mine)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _still_mine(name: str, dir_fd: int, mine: os.stat_result) -> None:
    """Refuse a name in the directory that is no longer the file written (someone swapped it)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is None or (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
        raise OutputError(
            f"the report's new file {name!r} was replaced by someone else while it was written (the directory's "
            "owner or a writer of it); nothing of theirs was followed; write the report to a directory only you "
            "can write"
        )
