"""dcgm-exporter's HPC job mapping files, as a Slurm prolog and epilog write them: which files and
lines count, a directory or file that cannot be read (the last good jobs kept for a bound, then
dropped), and files rewritten while the daemon reads them (never a torn or empty answer)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from gpu_exporter.holders import slurm
from gpu_exporter.holders.slurm import JobClaim, JobMappingDir, check_directory, read_claim
from gpu_exporter.settings.config import ConfigError, load_settings
from tests import assert_mentions


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def write(d: Path, name: str, text: str) -> None:
    """As a careful prolog does: a temporary file renamed over the old one."""
    tmp = d / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, d / name)


def settled(path: str, **kw: object) -> JobMappingDir:
    """A reader whose files are all old enough to be believed (``settle`` 0)."""
    return JobMappingDir(path, settle=0.0, **kw)  # type: ignore[arg-type]


def test_one_file_per_gpu_and_per_mig_instance_each_line_a_job(tmp_path: Path) -> None:
    write(tmp_path, "0", "4242\n")
    write(tmp_path, "1", "4243\n\n4244\n4243\n")  # two jobs share GPU 1; a blank line and a repeat
    write(tmp_path, "2.1", "4245_7\n")  # MIG GPU instance 1 of GPU 2; an array task
    write(tmp_path, "3", "")  # no job (an epilog that empties rather than removes)
    write(tmp_path, "README", "not a GPU\n")  # dcgm-exporter ignores other names, and so do we
    write(tmp_path, "0.tmp", "9999\n")
    (tmp_path / "4").mkdir()  # a directory named like a GPU: ignored
    (tmp_path / "5").write_bytes(b"\n" * (70 * 1024) + b"4246\n")  # only the first 64 KiB are read
    reader = settled(str(tmp_path))
    with capture_logs() as logs:
        jobs = reader.read()
    assert dict(jobs) == {(0, None): ("4242",), (1, None): ("4243", "4244"), (2, 1): ("4245_7",)}
    assert logs == [] and reader.errors == 0  # nothing ignored was read as a failure


def test_the_files_and_lines_read_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "MAX_FILES", 3)
    monkeypatch.setattr(slurm, "MAX_JOBS_PER_FILE", 2)
    for gpu in range(5):
        write(tmp_path, str(gpu), "1\n2\n3\n")
    jobs = settled(str(tmp_path)).read()
    assert len(jobs) == 3 and set(jobs.values()) == {("1", "2")}


def test_a_line_that_is_not_a_job_id_is_skipped_and_said_once(tmp_path: Path) -> None:
    write(tmp_path, "0", "4242\nhello world\n\x1b]0;pwned\x07\n4243+1\nother\n")
    reader = settled(str(tmp_path))
    with capture_logs() as logs:
        assert reader.read()[(0, None)] == ("4242", "4243+1")
        reader.read()
    path = str(tmp_path / "0")
    detail = "a line of a job mapping file must be one job ID"
    assert logs == [  # each once, with where it is and how long, never what it holds (issue 38)
        {"event": "slurm_job_mapping_line_skipped", "log_level": "warning", "path": path, "line": 2,
         "length": 11, "detail": detail},
        {"event": "slurm_job_mapping_line_skipped", "log_level": "warning", "path": path, "line": 3,
         "length": 10, "detail": detail},
        {"event": "slurm_job_mapping_line_skipped", "log_level": "warning", "path": path, "line": 5,
         "length": 5, "detail": detail},
    ]  # fmt: skip


def test_a_file_linked_out_of_the_directory_is_not_read_and_its_lines_never_logged(tmp_path: Path) -> None:
    """Issue 38: a mapping file that is a link to a root-only file put a password-hash line in the log
    and an ID-shaped line in an hpc_job label.  A link is not followed: no jobs from it, said as a link,
    and nothing of what it points to is logged; a regular file beside it is read as before."""
    secret = tmp_path / "shadow"
    secret.write_text("4242\nroot:$6$saltsalt$hash:19000:0:99999:7:::\n")
    d = tmp_path / "map"
    d.mkdir()
    (d / "0").symlink_to(secret)
    write(d, "1", "4243\n")
    reader = settled(str(d))
    with capture_logs() as logs:
        jobs = reader.read()
    assert dict(jobs) == {(1, None): ("4243",)}
    (said,) = [e for e in logs if e["event"] == "slurm_job_mapping_file_unreadable"]
    assert said["path"] == str(d / "0") and "symbolic link" in said["error"]
    assert "saltsalt" not in repr(logs), logs
    # A line that is not a job ID in a regular file: its place and length, not its text.
    write(d, "1", "root:$6$saltsalt$hash\n")
    with capture_logs() as logs:
        reader.read()
    assert "saltsalt" not in repr(logs) and any(e.get("length") == 21 for e in logs), logs


def test_a_missing_directory_is_said_and_gives_no_jobs_until_it_appears(tmp_path: Path) -> None:
    where = tmp_path / "dcgm-job-map"
    said = check_directory(str(where))
    assert said is not None and said.startswith(str(where))
    assert_mentions(said, "does not exist", "no job", "until a prolog makes it")
    reader = settled(str(where))
    with capture_logs() as logs:
        assert reader.read() == {}
        assert reader.read() == {}
    assert logs == [{"event": "slurm_job_mapping_dir_unreadable", "log_level": "warning", "path": str(where),
                     "error": "No such file or directory",
                     "detail": "keeping the jobs last read for up to 300 s"}]  # once, not per poll  # fmt: skip
    where.mkdir()
    write(where, "0", "4242\n")
    with capture_logs() as logs:
        assert reader.read() == {(0, None): ("4242",)}
    assert logs == [{"event": "slurm_job_mapping_readable", "log_level": "info", "path": str(where), "files": 1}]
    assert check_directory(str(where)) is None
    where.rename(tmp_path / "away")  # gone again: said again, once
    with capture_logs() as logs:
        reader.read()
        reader.read()
    assert [e["event"] for e in logs] == ["slurm_job_mapping_dir_unreadable"]
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert check_directory(str(blocked / "map")) == f"{blocked / 'map'} cannot be read: Not a directory"


def test_a_file_for_a_directory_is_refused_at_start_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "map").write_text("")
    assert check_directory(str(tmp_path / "map")) == f"{tmp_path / 'map'} is not a directory"
    with pytest.raises(ConfigError, match=r"slurm\.job_mapping_dir .*is not a directory"):
        load_settings({"slurm": {"job_mapping_dir": str(tmp_path / "map")}})
    with pytest.raises(ConfigError, match=r"slurm\.job_mapping_dir"):
        load_settings({"slurm": {"job_mapping_dir": " "}})


def test_the_options_are_off_by_default() -> None:
    s = load_settings({})
    assert s.slurm.job_mapping_dir is None and not s.slurm.job_from_cgroup and not s.slurm.enabled()


def test_an_unreadable_file_keeps_its_last_jobs_for_the_bound_then_drops_them(tmp_path: Path) -> None:
    clock = Clock()
    reader = settled(str(tmp_path), keep_last_good_for=300.0, clock=clock)
    write(tmp_path, "0", "4242\n")
    write(tmp_path, "1", "4243\n")
    assert reader.read() == {(0, None): ("4242",), (1, None): ("4243",)}
    # GPU 0's file becomes something that cannot be read as a file (a FIFO left by a broken
    # prolog: opening it must not block the poller either).
    os.unlink(tmp_path / "0")
    os.mkfifo(tmp_path / "0")
    with capture_logs() as logs:
        for _ in range(3):
            clock.t += 100.0
            got = reader.read()
            if clock.t - 1000.0 < 300.0:
                assert got == {(0, None): ("4242",), (1, None): ("4243",)}  # a hiccup changes no label
    assert got == {(1, None): ("4243",)}  # 300 s after the last good read: dropped
    assert logs == [
        {"event": "slurm_job_mapping_file_unreadable", "log_level": "warning", "path": str(tmp_path / "0"),
         "error": "a named pipe, not a regular file", "detail": "keeping the jobs last read for up to 300 s"},
        {"event": "slurm_job_mapping_expired", "log_level": "warning", "path": str(tmp_path / "0"), "files": ["0"],
         "detail": "not readable for 300 s: the jobs last read from it are dropped until it can be read again"},
    ]  # fmt: skip
    assert reader.errors == 3
    os.unlink(tmp_path / "1")
    os.mkfifo(tmp_path / "1")  # a second file that cannot be read: said for itself
    with capture_logs() as logs:
        reader.read()
    assert [e["path"] for e in logs] == [str(tmp_path / "1")]
    os.unlink(tmp_path / "1")
    os.unlink(tmp_path / "0")
    write(tmp_path, "0", "4250\n")
    assert reader.read()[(0, None)] == ("4250",)


def test_a_directory_that_vanishes_keeps_the_last_jobs_for_the_bound(tmp_path: Path) -> None:
    clock = Clock()
    where = tmp_path / "map"
    where.mkdir()
    write(where, "0", "4242\n")
    reader = settled(str(where), keep_last_good_for=60.0, clock=clock)
    assert reader.read() == {(0, None): ("4242",)}
    hidden = tmp_path / "hidden"
    where.rename(hidden)  # as if /run were remounted under the daemon
    clock.t += 59.0
    assert reader.read() == {(0, None): ("4242",)}
    clock.t += 1.0
    with capture_logs() as logs:
        assert reader.read() == {}
    assert logs == [{"event": "slurm_job_mapping_expired", "log_level": "warning", "path": "the directory",
                     "files": ["0"], "detail": "not readable for 60 s: the jobs last read from it are dropped until "
                     "it can be read again"}]  # fmt: skip
    hidden.rename(where)
    with capture_logs() as logs:
        assert reader.read() == {(0, None): ("4242",)}
    assert [e["event"] for e in logs] == ["slurm_job_mapping_readable"]


def test_a_removed_file_takes_its_jobs_with_it_at_once(tmp_path: Path) -> None:
    write(tmp_path, "0", "4242\n")
    reader = settled(str(tmp_path))
    assert reader.read() == {(0, None): ("4242",)}
    (tmp_path / "0").unlink()  # the epilog: the job left GPU 0
    assert reader.read() == {}


def test_a_file_caught_half_written_is_not_believed_until_it_settles(tmp_path: Path) -> None:
    """``echo 4243 > 0`` truncates, then writes: a read in between sees an empty file, or the first
    bytes of a line.  Such content, modified less than ``settle`` ago, keeps the jobs read before."""
    wall = [2000.0]
    reader = JobMappingDir(str(tmp_path), settle=1.0, wall=lambda: wall[0])
    write(tmp_path, "0", "4242\n")
    os.utime(tmp_path / "0", (1000.0, 1000.0))
    assert reader.read() == {(0, None): ("4242",)}
    for partial in ("", "42"):
        (tmp_path / "0").write_text(partial)
        os.utime(tmp_path / "0", (wall[0] - 0.5, wall[0] - 0.5))  # modified half a second ago
        assert reader.read() == {(0, None): ("4242",)}, partial
    (tmp_path / "0").write_text("42")
    os.utime(tmp_path / "0", (wall[0], wall[0]))  # modified this very moment: not settled either
    assert reader.read() == {(0, None): ("4242",)}
    wall[0] += 1.0  # settled exactly now: an emptied file is an empty file, a line without a newline a job
    assert reader.read() == {(0, None): ("42",)}
    (tmp_path / "0").write_text("")
    os.utime(tmp_path / "0", (wall[0] - 5, wall[0] - 5))
    assert reader.read() == {}
    (tmp_path / "0").write_text("4243\n")  # a whole line: believed at once, however fresh
    os.utime(tmp_path / "0", (wall[0], wall[0]))
    assert reader.read() == {(0, None): ("4243",)}


@pytest.mark.parametrize("how", ["in place", "by rename", "line by line"])
def test_files_rewritten_while_the_daemon_reads_them_never_give_a_torn_answer(tmp_path: Path, how: str) -> None:
    """A writer rewrites GPU 0's file as fast as it can while the reader reads it on and on: every
    answer is one the writer wrote whole, never an empty file or half a line."""
    contents = (b"4242\n", b"4243\n4244\n")
    (tmp_path / "0").write_bytes(contents[0])
    os.utime(tmp_path / "0", (1.0, 1.0))
    # An hour's settle: a file the writer truncated and then, starved of the GIL on a loaded machine,
    # left empty for over a second is rightly believed empty with the default; this test is about torn
    # reads, so no half-written content here may count as settled, however slow the writer.
    reader = JobMappingDir(str(tmp_path), settle=3600.0)
    assert reader.read() == {(0, None): ("4242",)}
    stop = threading.Event()
    writes = [0]

    def writer() -> None:
        path = tmp_path / "0"
        while not stop.is_set():
            data = contents[writes[0] % 2]
            if how == "by rename":
                write(tmp_path, "0", data.decode())
            else:
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                try:
                    if how == "in place":
                        os.write(fd, data)
                    else:  # one line at a time, and the second cut in two
                        first, _, rest = data.partition(b"\n")
                        os.write(fd, first[:2])
                        os.write(fd, first[2:] + b"\n")
                        if rest:
                            os.write(fd, rest)
                finally:
                    os.close(fd)
            writes[0] += 1

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    seen: set[tuple[str, ...]] = set()
    deadline = time.monotonic() + 60
    try:
        while (len(seen) < 2 or writes[0] < 200) and time.monotonic() < deadline:
            for _ in range(200):
                seen.add(reader.read().get((0, None), ()))
    finally:
        stop.set()
        t.join(timeout=10)
    whole = {("4242",), ("4243", "4244")}
    if how == "line by line":
        whole.add(("4243",))  # the first line written whole, the second not yet begun
    assert seen <= whole, seen
    assert ("4243", "4244") in seen or ("4243",) in seen  # the reader did see the writer's work


def test_a_jobs_environment_claims_are_read_and_bounded(tmp_path: Path) -> None:
    env = b"PATH=/usr/bin\0SLURM_JOB_ID=4242\0SLURM_JOB_ACCOUNT=ml-team\0SLURM_JOB_PARTITION=gpu\0HOME=/x\0"
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "environ").write_bytes(env)
    claim = read_claim(5, str(tmp_path))
    assert (claim.job, claim.account, claim.partition) == ("4242", "ml-team", "gpu")
    # A value that is no account name (spaces, escapes, bytes that are not UTF-8) is no claim.
    (tmp_path / "6").mkdir()
    (tmp_path / "6" / "environ").write_bytes(
        b"SLURM_JOB_ID=1\0SLURM_JOB_ACCOUNT=a b\x1b[2J\0SLURM_JOB_PARTITION=\xff\0"
    )
    claim = read_claim(6, str(tmp_path))
    assert (claim.job, claim.account, claim.partition) == ("1", "", "")
    assert read_claim(7, str(tmp_path)) == JobClaim()  # gone, or not ours to read
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "environ").write_bytes(b"PATH=/bin\0SLURM_JOB_ID\0")  # no job's environment
    assert read_claim(8, str(tmp_path)) == JobClaim()
    (tmp_path / "9").mkdir()  # an environment of 1 MiB and more: what lies beyond is not read
    (tmp_path / "9" / "environ").write_bytes(b"X=" + b"y" * (1024 * 1024) + b"\0SLURM_JOB_ID=5\0")
    assert read_claim(9, str(tmp_path)) == JobClaim()


def test_a_file_written_during_a_read_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's size or time differs after a read from before it: read again, three times at most,
    then it counts as unreadable this time (the jobs read before stay)."""
    write(tmp_path, "0", "4242\n")
    real = os.fstat
    calls = [0]
    changed_reads = [0]  # how many of the next reads see the file change while they read it

    def fstat(fd: int) -> Any:
        st = real(fd)
        calls[0] += 1
        if calls[0] % 2 == 0 and changed_reads[0] > 0:  # the look after a read
            changed_reads[0] -= 1
            return SimpleNamespace(st_mode=st.st_mode, st_size=st.st_size, st_mtime_ns=st.st_mtime_ns + 1)
        return st

    monkeypatch.setattr(os, "fstat", fstat)
    reader = settled(str(tmp_path))
    changed_reads[0] = 2
    assert reader.read() == {(0, None): ("4242",)} and reader.errors == 0  # the third read was whole
    write(tmp_path, "0", "4243\n")
    changed_reads[0] = 3
    with capture_logs() as logs:
        assert reader.read() == {(0, None): ("4242",)}  # never read whole: the jobs read before stay
    assert logs[0]["error"] == "rewritten while read, 3 times in a row" and reader.errors == 1
    assert reader.read() == {(0, None): ("4243",)}


def test_a_file_removed_between_the_listing_and_its_read_takes_its_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "0", "4242\n")
    reader = settled(str(tmp_path))
    assert reader.read() == {(0, None): ("4242",)}
    os.unlink(tmp_path / "0")
    monkeypatch.setattr(reader, "_names", lambda: {"0", "1"})  # listed, then gone (and "1" never read before)
    with capture_logs() as logs:
        assert reader.read() == {}
    assert logs == [] and reader.errors == 0  # the epilog removed them: no failure
