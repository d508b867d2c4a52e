"""dcgm-exporter's HPC job mapping files, as a Slurm prolog and epilog write them: which files and
lines count, a directory or file that cannot be read (the last good jobs kept for a bound, then
dropped), and files rewritten while the daemon reads them (never a torn or empty answer)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpu_exporter.config import ConfigError, load_settings
from gpu_exporter.holders.slurm import JobMappingDir, check_directory, read_claim


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
    write(tmp_path, "1", "4243\n4244\n\n4243\n")  # two jobs share GPU 1; a blank line and a repeat
    write(tmp_path, "2.1", "4245_7\n")  # MIG GPU instance 1 of GPU 2; an array task
    write(tmp_path, "3", "")  # no job (an epilog that empties rather than removes)
    write(tmp_path, "README", "not a GPU\n")  # dcgm-exporter ignores other names, and so do we
    write(tmp_path, "0.tmp", "9999\n")
    (tmp_path / "4").mkdir()  # a directory named like a GPU: ignored
    jobs = settled(str(tmp_path)).read()
    assert dict(jobs) == {(0, None): ("4242",), (1, None): ("4243", "4244"), (2, 1): ("4245_7",)}


def test_a_line_that_is_not_a_job_id_is_skipped_and_said_once(tmp_path: Path) -> None:
    write(tmp_path, "0", "4242\nhello world\n\x1b]0;pwned\x07\n4243+1\nother\n")
    reader = settled(str(tmp_path))
    with capture_logs() as logs:
        assert reader.read()[(0, None)] == ("4242", "4243+1")
        reader.read()
    skipped = [e for e in logs if e["event"] == "slurm_job_mapping_line_skipped"]
    assert [e["line"] for e in skipped] == [2, 3, 5]  # each once, with where it is
    assert all(e["path"] == str(tmp_path / "0") for e in skipped)


def test_a_missing_directory_is_said_and_gives_no_jobs_until_it_appears(tmp_path: Path) -> None:
    where = tmp_path / "dcgm-job-map"
    assert check_directory(str(where)) == (
        f"{where} does not exist (yet): GPUs get no job from mapping files until a prolog makes it"
    )
    reader = settled(str(where))
    with capture_logs() as logs:
        assert reader.read() == {}
        assert reader.read() == {}
    assert [e["event"] for e in logs] == ["slurm_job_mapping_dir_unreadable"]  # once, not per poll
    assert logs[0]["path"] == str(where) and "No such file" in logs[0]["error"]
    where.mkdir()
    write(where, "0", "4242\n")
    with capture_logs() as logs:
        assert reader.read() == {(0, None): ("4242",)}
    assert [e["event"] for e in logs] == ["slurm_job_mapping_readable"]
    assert check_directory(str(where)) is None


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
    events = [e["event"] for e in logs]
    assert events == ["slurm_job_mapping_file_unreadable", "slurm_job_mapping_expired"]
    assert logs[0]["path"] == str(tmp_path / "0") and logs[0]["error"] == "not a regular file"
    assert reader.errors == 3
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
    assert [e["event"] for e in logs] == ["slurm_job_mapping_expired"]


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
    wall[0] += 1.0  # now it has settled: an emptied file is an empty file, a line without a newline a job
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
    reader = JobMappingDir(str(tmp_path), settle=1.0)
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
    assert read_claim(7, str(tmp_path)).job == ""  # gone, or not ours to read
