"""Slurm jobs: dcgm-exporter's job mapping files, and what a job's processes say of it.

**Mapping files** (dcgm-exporter's ``--hpc-job-mapping-dir``): a directory holding one file per GPU,
named by its index (``0``, ``1``), or per MIG GPU instance, named ``<gpu>.<gpu instance id>``
(``2.1``); each line of a file is the ID of a job the device is allocated to.  Slurm's prolog
writes a job's lines and its epilog removes them.  Other names (and directories) are ignored, as
dcgm-exporter ignores them.  Unlike dcgm-exporter, blank lines are skipped and a line that is not a
job ID (a digit, then letters, digits, ``_ . + -``; at most 64) is skipped with a warning naming the
file and line.

The files are read on every poll, on the poller's thread (a handful of small reads, never on the
scrape path).  A writer may be rewriting a file while it is read:

- a file whose size or modification time changed during the read is read again (three times at
  most, then treated as unreadable this time);
- a file written in place (``echo $SLURM_JOB_ID > 0`` truncates, then writes) can be caught empty,
  or with its last line cut: content that does not end in a newline, or is empty, and was modified
  less than ``settle`` seconds ago is not believed yet; the device keeps its previous jobs until the
  next poll reads it settled.  An atomic writer (a temporary file renamed over the old one) is never
  caught half-way.

A directory or file that cannot be read (missing, no permission, an I/O error) is logged once per
reason; the jobs last read from it stay for ``keep_last_good_for`` seconds since that read, then
are dropped (logged once), so that a hiccup changes no label, and labels never name jobs long gone.

**A job's own processes** carry ``SLURM_JOB_ID``, ``SLURM_JOB_ACCOUNT`` and ``SLURM_JOB_PARTITION``
in their environment, set by slurmd.  The job's owner can change its own environment, so these are
claims: taken only from a process that the cgroup or the files already place in that job, only when
its ``SLURM_JOB_ID`` names that job, and bound to the job by the first process that claims them (a
later process of the job that claims another account is not believed, and logged).  The account and
partition are therefore what the owner said of its own job, never of another's.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import structlog

from .. import untrusted
from ..settings.yamlfile import open_regular

log = structlog.get_logger(__name__)

DEFAULT_KEEP_LAST_GOOD_FOR_S = 300.0
DEFAULT_SETTLE_S = 1.0
MAX_FILE_BYTES = 64 * 1024
MAX_FILES = 4096
MAX_JOBS_PER_FILE = 64
MAX_ENVIRON_BYTES = 1024 * 1024  # the kernel's ARG_MAX-bound environment, read once per process
READ_TRIES = 3

# Slurm's job IDs are numbers (an array task 4242_7, a heterogeneous component 4242+1); other
# schedulers' start with one too (PBS: 4242.server).  A leading digit also keeps any ID apart from
# the books' "other".
JOB_ID = re.compile(r"[0-9][0-9A-Za-z_.+-]{0,63}")
_FILE_NAME = re.compile(r"(\d{1,6})(?:\.(\d{1,6}))?")
_CLAIM_VALUE = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.+@-]{0,63}")

# (GPU index, GPU instance id or None) -> job IDs, in the file's order
DeviceKey = tuple[int, int | None]
JobMap = Mapping[DeviceKey, tuple[str, ...]]


class _Unsettled(Exception):
    """The file is being written: its content is not believed yet."""


@dataclass
class _Kept:
    jobs: tuple[str, ...]
    read_at: float  # monotonic, the last good read


class JobMappingDir:
    """The jobs each GPU is allocated to, from a directory of dcgm-exporter mapping files.

    ``clock`` is monotonic seconds (the bound on the last good mapping), ``wall`` the clock files'
    modification times are compared with; tests drive both.
    """

    def __init__(
        self,
        path: str,
        *,
        keep_last_good_for: float = DEFAULT_KEEP_LAST_GOOD_FOR_S,
        settle: float = DEFAULT_SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.keep_last_good_for = keep_last_good_for
        self.settle = settle
        self._clock = clock
        self._wall = wall
        self._kept: dict[str, _Kept] = {}  # file name -> the jobs last read from it
        self._dir_ok_at: float | None = None
        self._said: set[tuple[str, str]] = set()  # (what, detail) already logged
        self.errors = 0  # reads that failed, for the exporter's own metrics

    def read(self) -> JobMap:
        """Device -> job IDs now (see the module for what a failed or unsettled read keeps)."""
        now = self._clock()
        try:
            names = self._names()
        except OSError as e:
            self._failed("slurm_job_mapping_dir_unreadable", _why(e), path=self.path)
            if self._dir_ok_at is not None and now - self._dir_ok_at >= self.keep_last_good_for:
                self._expire(list(self._kept), "the directory")
                self._dir_ok_at = None
            return self._map()
        if self._dir_ok_at is None and self._said:
            log.info("slurm_job_mapping_readable", path=self.path, files=len(names))
            self._said = {s for s in self._said if s[0] != "slurm_job_mapping_dir_unreadable"}
        self._dir_ok_at = now
        for name in list(self._kept):
            if name not in names:  # removed by the epilog: the job left the device
                del self._kept[name]
        for name in names:
            self._read_file(name, now)
        return self._map()

    def _names(self) -> set[str]:
        names: set[str] = set()
        with os.scandir(self.path) as entries:
            for entry in entries:
                if _FILE_NAME.fullmatch(entry.name) and not entry.is_dir():
                    names.add(entry.name)
                    if len(names) >= MAX_FILES:
                        break
        return names

    def _read_file(self, name: str, now: float) -> None:
        path = os.path.join(self.path, name)
        try:
            jobs = self._jobs(path)
        except _Unsettled:
            return  # being written: the jobs read before stay until a settled read
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                self._kept.pop(name, None)  # removed between the listing and the read
                return
            self._failed("slurm_job_mapping_file_unreadable", _why(e), path=path)
            kept = self._kept.get(name)
            if kept is not None and now - kept.read_at >= self.keep_last_good_for:
                self._expire([name], path)
            return
        self._kept[name] = _Kept(jobs, now)

    def _jobs(self, path: str) -> tuple[str, ...]:
        for _ in range(READ_TRIES):
            # Non-blocking: a FIFO put there by mistake must not hold the poller until someone writes.
            # Not following a link: one to a file outside the directory (/etc/shadow) would put its
            # lines into hpc_job labels; open() refuses it with ELOOP, said as a link below.
            fd, before = open_regular(path, follow=False)  # before the read, for the settle check
            with open(fd, "rb") as f:
                raw = f.read(MAX_FILE_BYTES)
                after = os.fstat(fd)
            if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
                continue  # written while read: again
            age = self._wall() - after.st_mtime_ns / 1e9
            if (not raw or not raw.endswith(b"\n")) and 0 <= age < self.settle:
                raise _Unsettled
            return self._parse(path, raw)
        raise OSError(f"rewritten while read, {READ_TRIES} times in a row")

    def _parse(self, path: str, raw: bytes) -> tuple[str, ...]:
        jobs: list[str] = []
        for number, line in enumerate(raw.split(b"\n"), start=1):
            text = untrusted.text(line).strip()
            if not text:
                continue
            if not JOB_ID.fullmatch(text):
                # Where and how long, never what: the line may be anything a linked or misplaced file holds.
                self._say("slurm_job_mapping_line_skipped", f"{path}:{number}", path=path, line=number,
                          length=len(text), detail="a line of a job mapping file must be one job ID")  # fmt: skip
                continue
            if text not in jobs and len(jobs) < MAX_JOBS_PER_FILE:
                jobs.append(text)
        return tuple(jobs)

    def _map(self) -> JobMap:
        out: dict[DeviceKey, tuple[str, ...]] = {}
        for name, kept in sorted(self._kept.items()):
            m = _FILE_NAME.fullmatch(name)
            if m is not None and kept.jobs:
                out[(int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None)] = kept.jobs
        return MappingProxyType(out)

    def _expire(self, names: list[str], where: str) -> None:
        dropped = [n for n in names if n in self._kept]
        for n in dropped:
            del self._kept[n]
        if dropped:
            log.warning("slurm_job_mapping_expired", path=where, files=sorted(dropped),
                        detail=f"not readable for {self.keep_last_good_for:g} s: the jobs last read from it are "
                               "dropped until it can be read again")  # fmt: skip

    def _failed(self, what: str, why: str, **fields: object) -> None:
        self.errors += 1
        self._say(what, f"{fields.get('path')}:{why}", error=why, **fields,
                  detail=f"keeping the jobs last read for up to {self.keep_last_good_for:g} s")  # fmt: skip

    def _say(self, what: str, key: str, **fields: object) -> None:
        if (what, key) in self._said:
            return
        if len(self._said) > 10_000:  # bounded: a message said again after this is no harm
            self._said.clear()
        self._said.add((what, key))
        log.warning(what, **fields)


def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "a symbolic link: job mapping files are read only as themselves, never through a link"
    return e.strerror or str(e)


def check_directory(path: str) -> str | None:
    """Why ``path`` cannot serve as the mapping directory right now, in words; None when it can.

    A directory that does not exist yet is not an error to refuse a start for (Slurm's first prolog
    on a freshly booted node makes it under /run), but it is said at start."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{path} does not exist (yet): GPUs get no job from mapping files until a prolog makes it"
    except OSError as e:
        return f"{path} cannot be read: {_why(e)}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    return None  # one it may not read is said at the first read, with the reason


@dataclass(frozen=True, slots=True)
class JobClaim:
    """What a process's environment says of its job (``SLURM_JOB_*``); "" where it says nothing."""

    job: str = ""
    account: str = ""
    partition: str = ""


def read_claim(pid: int, proc_root: str) -> JobClaim:
    """The ``SLURM_JOB_*`` variables of a process; empty where it has none, has exited (also while
    being read) or its environment is not ours to read."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            raw = f.read(MAX_ENVIRON_BYTES)
    except OSError:
        return JobClaim()
    found: dict[bytes, str] = {}
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (b"SLURM_JOB_ID", b"SLURM_JOB_ACCOUNT", b"SLURM_JOB_PARTITION"):
            text = untrusted.text(value)
            found[key] = text if _CLAIM_VALUE.fullmatch(text) else ""
    return JobClaim(found.get(b"SLURM_JOB_ID", ""), found.get(b"SLURM_JOB_ACCOUNT", ""),
                    found.get(b"SLURM_JOB_PARTITION", ""))  # fmt: skip
