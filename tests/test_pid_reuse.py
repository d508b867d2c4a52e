"""A pid is not a process: the kernel gives a freed pid to the next process that asks, whoever's it
is.  What is learnt once per process (its name and user, its Slurm job or container, its pod) is
kept under its pid and its start time (``/proc/<pid>/stat``'s starttime), so another user's process
that gets a victim's pid between two polls is read afresh, never billed to the victim's job, and one
that keeps its start time is still served from the cache.

Processes are laid out under a test root as the kernel shows them (stat, comm, status, cgroup,
environ); the NVML paths run the real bindings against the fake driver, which lists their pids.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.holders.attribution import HolderAttributor
from gpu_exporter.kubernetes.attribution import Attributor, read_proc
from gpu_exporter.snapshot import GpuReading, JobRef, PodRef, ProcessReading
from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.poller import Poller
from gpu_exporter.sources.procfs import start_time, user_name
from tests.conftest import spawn_sleeper
from tests.exporter_helpers import ErrorLog
from tests.fakenvml import Scenario
from tests.fakenvml.presets import preset
from tests.fakenvml.runtime import advance_clock, driver_monotonic, driver_wall_clock

GIB = 1024**3
PID = 4242
VICTIM, ATTACKER = 1001, 1002  # uids
VICTIM_POD_UID = "11111111-2222-3333-4444-555555555555"
OTHER_POD_UID = "66666666-7777-8888-9999-000000000000"
A = PodRef("ml", "trainer-0", "main")  # the victim's pod
B = PodRef("ml", "notebook-7", "jupyter")  # another tenant's pod, sharing the GPU (time-slicing)


def stat_line(pid: int, comm: bytes, start: int) -> bytes:
    """``/proc/<pid>/stat`` as the kernel writes it (proc(5), fs/proc/array.c do_task_stat): the
    pid, the name in parentheses as it is, the state, then 49 numbers of which the 20th
    (field 22) is the start time."""
    numbers = [str(n) for n in range(4, 53)]  # fields 4..52, each its own number
    numbers[22 - 4] = str(start)
    return b"%d (%s) S " % (pid, comm) + " ".join(numbers).encode() + b"\n"


def lay_out(root: Path, pid: int, *, start: int, comm: str, uid: int, cgroup: str,
            environ: dict[str, str] | None = None) -> None:  # fmt: skip
    """One process under ``root``: what the exporter reads of it."""
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_bytes(stat_line(pid, comm.encode(), start))
    (d / "comm").write_text(comm + "\n")
    (d / "status").write_text(f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "cgroup").write_text(cgroup + "\n")
    env = {"PATH": "/usr/bin", **(environ or {})}
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def slurm_job(job: str) -> str:
    return f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"


def docker(cid: str) -> str:
    return f"0::/system.slice/docker-{cid}.scope"


def kubepod(uid: str) -> str:
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{'a' * 64}.scope"  # noqa: E501


def proc(pid: int = PID, start: int | None = 5000) -> ProcessReading:
    return ProcessReading(pid=pid, name="python3", used_memory_bytes=GIB, user="victim", start_time=start)


def gpu(*procs: ProcessReading) -> tuple[GpuReading, ...]:
    return (GpuReading(index=0, uuid="GPU-0", up=True, processes=procs),)


# -- the start time -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "comm",
    [
        b"python3",
        b"my trainer",  # a space: a plain split counts one field too many
        b"x) R 1 2 3 4 5",  # a name that forges fields of its own after a ")"
        b") 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 (",
        b"a)\n)b",  # a newline and two parentheses
        b"\xff\xfe)",  # not UTF-8
        b"",
    ],
)
def test_the_start_time_is_read_after_the_last_parenthesis(tmp_path: Path, comm: bytes) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_bytes(stat_line(77, comm, 123_456_789))
    assert start_time(77, str(tmp_path)) == 123_456_789


@pytest.mark.parametrize("content", [b"", b"77 (python3 S 1 2 3", b"77 (x) S 1 2 3\n", b"77 (x) S" + b" y" * 60])
def test_a_stat_file_not_in_the_kernels_format_has_no_start_time(tmp_path: Path, content: bytes) -> None:
    """Empty (the process exited while it was read), cut short, or not numbers: unknown, never 0."""
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_bytes(content)
    assert start_time(77, str(tmp_path)) is None
    assert start_time(78, str(tmp_path)) is None  # no such process


def test_the_start_time_of_a_real_thread_whose_name_forges_fields() -> None:
    """The kernel writes the name into /proc/<pid>/stat as it is; a thread may name itself (its
    /proc/self/task/<tid>/comm), and its /proc/<tid>/stat shows it like a process's."""
    started = threading.Event()
    done = threading.Event()
    tid: list[int] = []

    def run() -> None:
        tid.append(threading.get_native_id())
        started.set()
        done.wait()

    t = threading.Thread(target=run)
    t.start()
    try:
        started.wait()
        comm = Path(f"/proc/self/task/{tid[0]}/comm")
        comm.write_bytes(b"plain")
        plain = Path(f"/proc/{tid[0]}/stat").read_bytes().split()
        assert plain[1] == b"(plain)"
        want = int(plain[21])  # field 22, where the name has no space
        comm.write_bytes(b"x) R 1 2 3 4 5")  # 14 bytes: the kernel keeps up to 15
        assert b"(x) R 1 2 3 4 5)" in Path(f"/proc/{tid[0]}/stat").read_bytes()
        assert start_time(tid[0]) == want
    finally:
        done.set()
        t.join()
    own = start_time(os.getpid())
    assert own is not None and own <= want  # this process started before its thread


# -- jobs and containers (holders) --------------------------------------------------------------


def test_a_reused_pid_is_attributed_to_its_new_job_at_the_next_poll(tmp_path: Path) -> None:
    """The victim's process in job 4242 ends; the attacker's process gets its pid before the next
    poll, in job 4300.  Keyed by pid alone, the attacker's GPU time went on being job 4242's."""
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=slurm_job("4242"))
    a = HolderAttributor(job_from_cgroup=True, proc_root=str(tmp_path), user_of_uid=str)
    (g,) = a.attach(gpu(proc(start=5000)))
    assert g.processes[0].job == JobRef("4242", "victim") and [j.job for j in g.jobs] == ["4242"]
    lay_out(tmp_path, PID, start=6000, comm="mine", uid=ATTACKER, cgroup=slurm_job("4300"))
    (g,) = a.attach(gpu(proc(start=6000)))
    assert g.processes[0].job is not None and g.processes[0].job.job == "4300"
    assert [j.job for j in g.jobs] == ["4300"]  # the victim's job holds nothing any more


def test_a_reused_pid_outside_any_job_is_no_jobs(tmp_path: Path) -> None:
    """The new process is a login session's, in no job and no container: its user's."""
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=slurm_job("4242"))
    a = HolderAttributor(job_from_cgroup=True, containers=True, proc_root=str(tmp_path))
    assert a.attach(gpu(proc(start=5000)))[0].processes[0].job == JobRef("4242", "victim")
    lay_out(tmp_path, PID, start=6000, comm="mine", uid=ATTACKER,
            cgroup="0::/user.slice/user-1002.slice/session-3.scope")  # fmt: skip
    (g,) = a.attach(gpu(proc(start=6000)))
    assert g.processes[0].job is None and g.processes[0].container is None and g.jobs == ()


def test_a_reused_pid_is_attributed_to_its_new_container(tmp_path: Path) -> None:
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=docker("a" * 64))
    a = HolderAttributor(containers=True, proc_root=str(tmp_path))
    assert a.attach(gpu(proc(start=5000)))[0].processes[0].container.id == "a" * 64  # type: ignore[union-attr]
    lay_out(tmp_path, PID, start=6000, comm="mine", uid=ATTACKER, cgroup=docker("b" * 64))
    (g,) = a.attach(gpu(proc(start=6000)))
    assert g.processes[0].container is not None and g.processes[0].container.id == "b" * 64
    assert [c.id for c in g.containers] == ["b" * 64]


def test_a_process_that_keeps_its_start_time_is_read_once(tmp_path: Path) -> None:
    """The caches exist for cost: a process listed again with the same start time is not read again
    (its cgroup changing under it would show if it were)."""
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=slurm_job("4242"))
    a = HolderAttributor(job_from_cgroup=True, proc_root=str(tmp_path))
    a.attach(gpu(proc(start=5000)))
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=slurm_job("9999"))
    for _ in range(3):
        assert a.attach(gpu(proc(start=5000)))[0].processes[0].job == JobRef("4242", "victim")


def test_a_process_that_vanished_from_proc_keeps_no_job(tmp_path: Path) -> None:
    """Its start time is unknown now (the reading says None): it is no longer the process read, and
    with no /proc entry it is nobody's job (no mapping file names one for its GPU)."""
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=slurm_job("4242"))
    a = HolderAttributor(job_from_cgroup=True, proc_root=str(tmp_path))
    a.attach(gpu(proc(start=5000)))
    for f in (tmp_path / str(PID)).iterdir():
        f.unlink()
    (tmp_path / str(PID)).rmdir()
    (g,) = a.attach(gpu(proc(start=None)))
    assert g.processes[0].job is None and g.jobs == ()


# -- pods (kubernetes) --------------------------------------------------------------------------


def test_a_reused_pid_is_attributed_to_its_new_pod_at_the_next_poll(tmp_path: Path) -> None:
    """Two pods share the GPU; each process's HOSTNAME picks its pod, checked against the pod UID in
    its cgroup.  The victim's process (pod A) ends and the other tenant's (pod B) gets its pid."""
    mapping = {"GPU-0": (A, B)}
    a = Attributor(lambda: mapping, lambda pid: read_proc(pid, str(tmp_path)))
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=kubepod(VICTIM_POD_UID),
            environ={"HOSTNAME": A.pod})  # fmt: skip
    (g,) = a.attach(gpu(proc(start=5000)))
    assert g.processes[0].pod is not None and g.processes[0].pod.pod == A.pod
    lay_out(tmp_path, PID, start=6000, comm="mine", uid=ATTACKER, cgroup=kubepod(OTHER_POD_UID),
            environ={"HOSTNAME": B.pod})  # fmt: skip
    (g,) = a.attach(gpu(proc(start=6000)))
    assert g.processes[0].pod is not None and g.processes[0].pod.pod == B.pod
    assert g.processes[0].pod.uid == OTHER_POD_UID


def test_a_reused_pid_of_a_node_process_gets_no_pod(tmp_path: Path) -> None:
    """One pod holds the GPU; the pid goes to a node process (an agent, outside kubepods)."""
    mapping = {"GPU-0": (A,)}
    a = Attributor(lambda: mapping, lambda pid: read_proc(pid, str(tmp_path)))
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=kubepod(VICTIM_POD_UID))
    assert a.attach(gpu(proc(start=5000)))[0].processes[0].pod is not None
    lay_out(tmp_path, PID, start=6000, comm="agent", uid=0, cgroup="0::/system.slice/agent.service")
    assert a.attach(gpu(proc(start=6000)))[0].processes[0].pod is None


def test_a_pod_process_that_keeps_its_start_time_is_read_once(tmp_path: Path) -> None:
    reads: list[int] = []

    def reader(pid: int) -> Any:
        reads.append(pid)
        return read_proc(pid, str(tmp_path))

    a = Attributor(lambda: {"GPU-0": (A,)}, reader)
    lay_out(tmp_path, PID, start=5000, comm="train", uid=VICTIM, cgroup=kubepod(VICTIM_POD_UID))
    for _ in range(3):
        assert a.attach(gpu(proc(start=5000)))[0].processes[0].pod is not None
    assert reads == [PID]
    a.attach(gpu(proc(start=6000)))
    assert reads == [PID, PID]  # another process: read again
    a.attach(gpu(proc(start=None)))
    assert reads == [PID, PID, PID]  # vanished from /proc: not the process read before either


# -- names, users and utilization, through NVML ------------------------------------------------


@pytest.fixture
def poller(tmp_path: Path, scenario: Scenario, nvml: Any) -> Iterator[Poller]:
    """A poller on the fake driver listing ``PID`` (busy: 70% SM), which reads processes under
    ``tmp_path / "proc"``; per-process utilization every 10 s of the driver's clock."""
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
    g.process_utilization(50).add_process(PID, 30 * GIB, name="from-nvml", sm=70, mem=25)
    scenario.write()
    errors = ErrorLog()
    backend = NvmlBackend(errors, profiling_interval=10.0, monotonic=driver_monotonic, wall=driver_wall_clock,
                          slow_interval=0.0, proc_root=str(tmp_path / "proc"))  # fmt: skip
    p = Poller(backend, errors=errors)
    try:
        yield p
    finally:
        p.close()


def test_a_reused_pid_gets_its_own_name_user_job_and_no_borrowed_utilization(tmp_path: Path, poller: Poller) -> None:
    """From the driver's list to the holder: the pid's start time changes between two polls while
    its name, uid and cgroup change; the next poll shows the new process's, end to end."""
    root = tmp_path / "proc"
    lay_out(root, PID, start=5000, comm="victim-train", uid=VICTIM, cgroup=slurm_job("4242"))
    holders = HolderAttributor(job_from_cgroup=True, proc_root=str(root), user_of_uid=str)
    (g,) = holders.attach(poller.poll().gpus)
    (p,) = g.processes
    assert (p.name, p.user, p.start_time) == ("victim-train", user_name(VICTIM), 5000)
    assert p.sm_utilization_ratio == pytest.approx(0.70) and p.job == JobRef("4242", user_name(VICTIM))

    lay_out(root, PID, start=6000, comm="attacker", uid=ATTACKER, cgroup=slurm_job("4300"))
    advance_clock(1.0)  # within the 10 s of per-process utilization: that is not read again
    (g,) = holders.attach(poller.poll().gpus)
    (p,) = g.processes
    assert (p.name, p.user, p.start_time) == ("attacker", user_name(ATTACKER), 6000)
    assert p.job is not None and p.job.job == "4300"
    # The victim's samples are not the attacker's: unknown until the next read.
    assert p.sm_utilization_ratio is None and p.memory_utilization_ratio is None


def test_a_process_listed_with_its_start_time_unchanged_is_not_read_again(tmp_path: Path, poller: Poller) -> None:
    root = tmp_path / "proc"
    lay_out(root, PID, start=5000, comm="victim-train", uid=VICTIM, cgroup=slurm_job("4242"))
    poller.poll()
    lay_out(root, PID, start=5000, comm="renamed", uid=ATTACKER, cgroup=slurm_job("4242"))
    advance_clock(1.0)
    (p,) = poller.poll().gpus[0].processes
    assert (p.name, p.user) == ("victim-train", user_name(VICTIM))  # from the cache
    assert p.sm_utilization_ratio == pytest.approx(0.70)  # the read of 1 s ago, kept for 10 s


def test_a_real_process_that_exits_keeps_neither_its_name_nor_its_user(scenario: Scenario, nvml: Any) -> None:
    """The driver still lists a pid whose process has gone from /proc (a real one, killed between
    two polls): its name is what the driver says and its user unknown, not the dead process's."""
    sleeper = spawn_sleeper()
    try:
        g = scenario.add_gpu().identity("NVIDIA L40S", "GPU-00000000-0000-0000-0000-000000000001")
        g.add_process(sleeper.pid, 3 * GIB)
        scenario.write()
        errors = ErrorLog()
        poller = Poller(NvmlBackend(errors), errors=errors)
        (p,) = poller.poll().gpus[0].processes
        assert p.name.startswith("python") and p.user == user_name(os.getuid()) and p.start_time is not None
    finally:
        sleeper.kill()
        sleeper.wait()
    try:
        (p,) = poller.poll().gpus[0].processes
    finally:
        poller.close()
    assert (p.name, p.user, p.start_time) == ("unknown", None, None)  # the fake reads /proc/<pid>/cmdline too


def test_a_reused_pid_on_a_mig_device_gets_its_own_name_and_user(tmp_path: Path, scenario: Scenario, nvml: Any) -> None:
    """MIG devices keep their processes' names apart from the parent GPU's: keyed the same way."""
    preset("a100-mig", scenario.path).write()
    root = tmp_path / "proc"
    lay_out(root, 30003, start=5000, comm="victim-train", uid=VICTIM, cgroup=slurm_job("4242"))
    errors = ErrorLog()
    poller = Poller(NvmlBackend(errors, proc_root=str(root)), errors=errors)
    try:
        (p,) = (p for m in poller.poll().gpus[0].migs for p in m.processes if p.pid == 30003)
        assert (p.name, p.user, p.start_time) == ("victim-train", user_name(VICTIM), 5000)
        lay_out(root, 30003, start=6000, comm="attacker", uid=ATTACKER, cgroup=slurm_job("4300"))
        (p,) = (p for m in poller.poll().gpus[0].migs for p in m.processes if p.pid == 30003)
    finally:
        poller.close()
    assert (p.name, p.user, p.start_time) == ("attacker", user_name(ATTACKER), 6000)
