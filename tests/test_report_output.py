"""``gpu-exporter report --output FILE`` run by root where someone else can write (issue 50, item 1).

Each attack is made by ``nobody`` (uid 65534) in a process of its own, against root's write in this
process.  The temp-name swap is the one round five found: the directory's owner, woken by inotify
when the report's new file appears, renames it away and puts a link to a root-only file under its
name; the old code then ran ``chmod`` by name and left the root-only file 0644.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_exporter.report.output import OutputError, write

pytestmark = [
    pytest.mark.integration,  # nobody's side runs in a process of its own
    pytest.mark.skipif(os.geteuid() != 0, reason="acting as root and nobody needs root (CI runs as root)"),
]

NOBODY = 65534


def as_nobody(work: Callable[[], object]) -> tuple[int, int]:
    """Fork, become nobody, run ``work``; its lines go to the returned pipe.  (The venv's Python is under
    /root, which nobody may not run, so nobody's side is a fork of this process, not a new program.)"""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            os.dup2(w, 1)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            work()
            code = 0
        except BaseException as e:
            os.write(1, f"{type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def finished(pid: int, r: int) -> tuple[int, str]:
    with os.fdopen(r) as f:
        out = f.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out


def swap_first_new_file(directory: Path, secret: Path) -> None:
    """nobody's side of the swap: inotify on the directory (libc through ctypes), and at the first new
    file named like the report's, rename it away and link its name to the secret."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init()
    assert libc.inotify_add_watch(fd, str(directory).encode(), 0x100) >= 0, ctypes.get_errno()  # IN_CREATE
    os.write(1, b"watching\n")
    while True:
        data = os.read(fd, 4096)
        at = 0
        while at < len(data):
            size = struct.unpack_from("iIII", data, at)[3]
            name = data[at + 16 : at + 16 + size].rstrip(b"\0").decode()
            at += 16 + size
            if name.startswith(".report.txt."):
                os.rename(directory / name, directory / "stolen")
                os.symlink(secret, directory / name)
                os.write(1, b"swapped\n")
                return


@pytest.fixture
def tmp_path(world: Path) -> Path:
    """One nobody can reach: pytest's own is under a root-only /tmp/pytest-of-root."""
    return world


def secret_file(tmp_path: Path) -> Path:
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "shadow"
    secret.write_text("root:hash\n")
    secret.chmod(0o600)
    return secret


def test_the_temp_name_swap_never_changes_the_file_it_links_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = secret_file(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)  # nobody's own directory, mode 0755: root may write a report there
    tmp_path.chmod(0o755)
    pid, r = as_nobody(lambda: swap_first_new_file(theirs, secret))
    first = os.read(r, 9)
    assert first == b"watching\n", first
    said: list[bytes] = []
    fchmod = os.fchmod

    def after_the_swap(fd: int, mode: int) -> None:
        # The race made certain on a busy machine: the mode is set once nobody has swapped the name.
        said.append(os.read(r, 8))
        fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", after_the_swap)
    with pytest.raises(OutputError) as e:
        write("x" * (1 << 20), theirs / "report.txt")
    assert said == [b"swapped\n"] and finished(pid, r) == (0, "")
    assert "replaced by someone else" in str(e.value)
    assert secret.read_text() == "root:hash\n"
    assert (secret.stat().st_mode & 0o777) == 0o600 and secret.stat().st_uid == 0
    assert not (theirs / "report.txt").exists()  # nothing of theirs was put at FILE


def test_a_parent_link_someone_else_planted_is_refused(tmp_path: Path) -> None:
    """nobody's link in a sticky /tmp-like directory, to a root-only directory: root's report through
    it would land among root's files; refused, naming the link and its owner, and nothing written."""
    secret = secret_file(tmp_path)
    public = tmp_path / "public"
    public.mkdir()
    public.chmod(0o1777)
    planted = public / "reports"
    assert finished(*as_nobody(lambda: planted.symlink_to(secret.parent))) == (0, "")
    assert planted.lstat().st_uid == NOBODY
    with pytest.raises(OutputError) as e:
        write("the report\n", planted / "shadow")
    assert str(planted) in str(e.value) and f"uid {NOBODY}" in str(e.value)
    assert secret.read_text() == "root:hash\n" and (secret.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in secret.parent.iterdir()) == ["shadow"]


def test_links_of_root_and_the_caller_are_followed_on_the_whole_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "deep").mkdir(parents=True)
    (tmp_path / "via").symlink_to("real")  # relative, root's own
    (tmp_path / "abs").symlink_to(real / "deep")  # absolute
    write("one\n", tmp_path / "via" / "deep" / "a.txt")
    write("two\n", tmp_path / "abs" / "b.txt")
    assert (real / "deep" / "a.txt").read_text() == "one\n" and (real / "deep" / "b.txt").read_text() == "two\n"
    assert not [p for p in (real / "deep").iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_sticky_world_writable_directory_is_used_and_one_without_the_bit_refused(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    old = os.umask(0o022)
    try:
        write("in /tmp\n", sticky / "report.txt")
    finally:
        os.umask(old)
    st = (sticky / "report.txt").stat()
    assert (sticky / "report.txt").read_text() == "in /tmp\n" and (st.st_mode & 0o777) == 0o644 and st.st_uid == 0
    # nobody may not rename root's file out of a sticky directory, so the report stays root's.
    code, said = finished(*as_nobody(lambda: (sticky / "report.txt").rename(sticky / "x")))
    assert code == 1 and said.startswith("PermissionError"), said
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(OutputError) as e:
        write("anyone could swap it\n", loose / "report.txt")
    assert str(loose) in str(e.value) and "0777" in str(e.value) and "sticky" in str(e.value)
    assert list(loose.iterdir()) == []


def test_a_report_as_nobody_into_roots_directory_is_refused_by_the_kernel_and_named(tmp_path: Path) -> None:
    """The other way round: nobody running the report cannot write where only root can, and is told
    so with the path, exit 2, not a traceback."""
    tmp_path.chmod(0o755)

    def report() -> None:
        try:
            write("x\n", tmp_path / "r.txt")
        except OutputError as e:
            os.write(1, f"{e}\n".encode())

    code, said = finished(*as_nobody(report))
    assert code == 0 and str(tmp_path / "r.txt") in said and "Permission denied" in said, said
    assert not (tmp_path / "r.txt").exists()
