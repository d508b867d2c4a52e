"""Jobs and containers joined onto a poll's readings: which source wins for a process, which jobs
hold a GPU, what a job's labels come from, and what a process that cannot be read gets.

Processes are laid out under a test root (their cgroup and environ files, as the kernel shows them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpu_exporter.holders import attribution, slurm
from gpu_exporter.holders.attribution import HolderAttributor
from gpu_exporter.holders.engines import EngineNames, Inspected
from gpu_exporter.holders.slurm import JobClaim, JobMappingDir
from gpu_exporter.snapshot import (
    ContainerRef,
    GpuReading,
    JobRef,
    MigReading,
    PodRef,
    ProcessReading,
    container_holder,
    device_holders,
    job_holder,
    pod_holder,
    user_holder,
)
from tests.timing import NEVER_S

GIB = 1024**3
ID = "5546aeea473f420726d9add9c89d5d9cfa8b183508fdf2f31df1f8e168b47466"
POD_UID = "9a8b7c6d-1111-2222-3333-444455556666"


def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir(exist_ok=True)
    return root


def process(root: Path, pid: int, cgroup: str, environ: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup + "\n")
    env = {"PATH": "/usr/bin", **(environ or {})}
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def mapping(tmp_path: Path, files: dict[str, str]) -> JobMappingDir:
    d = tmp_path / "map"
    d.mkdir(exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return JobMappingDir(str(d), settle=0.0)


def proc(pid: int, user: str = "alice", memory: int = GIB, **kw: object) -> ProcessReading:
    return ProcessReading(pid=pid, name="python3", used_memory_bytes=memory, user=user, **kw)  # type: ignore[arg-type]


def gpu(index: int, *procs: ProcessReading, migs: tuple[MigReading, ...] = ()) -> GpuReading:
    return GpuReading(index=index, uuid=f"GPU-{index}", up=True, processes=procs, migs=migs)


def slurm_v2(job: str) -> str:
    return f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"


def test_a_jobs_process_is_named_by_its_cgroup_and_the_gpu_by_both_sources(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    process(
        root, 100, slurm_v2("4242"), {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "ml", "SLURM_JOB_PARTITION": "gpu"}
    )
    process(root, 101, "0::/user.slice/user-1000.slice/session-4.scope")  # a login shell's CUDA test
    a = HolderAttributor(mapping=mapping(tmp_path, {"0": "4242\n", "1": "4250\n"}), job_from_cgroup=True,
                         proc_root=str(root))  # fmt: skip
    g0, g1 = a.attach((gpu(0, proc(100), proc(101, user="bob")), gpu(1)))
    job = JobRef("4242", "alice", "ml", "gpu")
    assert g0.processes[0].job == job and g0.processes[0].holder == job_holder(job)
    # The files give GPU 0 to the job, but bob's process is in no job: a node process keeps its user.
    assert g0.processes[1].job is None and g0.processes[1].holder == user_holder("bob")
    assert g0.jobs == (job,)
    assert g1.jobs == (JobRef("4250"),)  # allocated, nothing runs yet: a job without a user so far
    assert device_holders(g1, pod_mode=False) == (job_holder(JobRef("4250")),)
    assert device_holders(g0, pod_mode=False) == (job_holder(job), user_holder("bob"))


def test_the_cgroup_wins_over_the_files_and_the_disagreement_is_said_once(tmp_path: Path) -> None:
    """A stale file (an epilog that did not run) says GPU 0 is job 4242's; the process runs in 4300."""
    root = proc_root(tmp_path)
    process(root, 100, slurm_v2("4300"))
    a = HolderAttributor(mapping=mapping(tmp_path, {"0": "4242\n"}), job_from_cgroup=True, proc_root=str(root))
    with capture_logs() as logs:
        (g,) = a.attach((gpu(0, proc(100)),))
        a.attach((gpu(0, proc(100)),))
    assert g.processes[0].job == JobRef("4300", "alice")
    assert [j.job for j in g.jobs] == ["4242", "4300"]  # both hold it: the allocation and what runs
    assert [e["event"] for e in logs] == ["slurm_job_not_in_mapping"]
    assert logs[0]["job"] == "4300" and logs[0]["allocated"] == ["4242"]


def test_with_files_only_a_process_on_a_gpu_of_one_job_is_that_jobs(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    process(root, 100, "0::/user.slice")  # not read for jobs: the cgroup source is off
    a = HolderAttributor(mapping=mapping(tmp_path, {"0": "4242\n", "1": "4243\n4244\n"}), proc_root=str(root))
    g0, g1 = a.attach((gpu(0, proc(100)), gpu(1, proc(200, user="carol"))))
    assert g0.processes[0].job == JobRef("4242", "alice")
    assert g0.jobs == (JobRef("4242", "alice"),)  # the job learned its user from its process
    # Two jobs share GPU 1 and nothing says which one runs pid 200: neither is given it.
    assert g1.processes[0].job is None and g1.processes[0].holder == user_holder("carol")
    assert [j.job for j in g1.jobs] == ["4243", "4244"]


def test_a_process_that_cannot_be_read_gets_only_what_its_device_says(tmp_path: Path) -> None:
    """Exited between NVML's list and the read, or in another PID namespace: no cgroup to read."""
    root = proc_root(tmp_path)
    a = HolderAttributor(mapping=mapping(tmp_path, {"0": "4242\n", "1": "4243\n4244\n"}), job_from_cgroup=True,
                         containers=True, proc_root=str(root))  # fmt: skip
    g0, g1 = a.attach((gpu(0, proc(300, user=None)), gpu(1, proc(301, user=None))))  # type: ignore[arg-type]
    assert g0.processes[0].job == JobRef("4242") and g0.processes[0].container is None
    assert g1.processes[0].job is None and g1.processes[0].container is None


def test_v1_gives_the_jobs_owner_from_the_path(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    process(root, 100, "4:memory:/slurm/uid_1001/job_77/step_0/task_0\n0::/")
    a = HolderAttributor(job_from_cgroup=True, proc_root=str(root), user_of_uid=lambda uid: f"uid{uid}")
    (g,) = a.attach((gpu(0, proc(100, user="root")),))  # a setuid helper: the job's owner still wins
    assert g.processes[0].job == JobRef("77", "uid1001")


def test_a_jobs_account_is_its_first_processes_claim_and_no_other(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    process(root, 100, slurm_v2("4242"), {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "ml"})
    process(root, 101, slurm_v2("4242"), {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "finance"})
    # A process of job 4243 that claims to be job 4242's, with an account: not believed for either.
    process(root, 102, slurm_v2("4243"), {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "finance"})
    a = HolderAttributor(job_from_cgroup=True, proc_root=str(root))
    with capture_logs() as logs:
        (g,) = a.attach((gpu(0, proc(100), proc(101), proc(102, user="mallory")),))
    assert [p.job for p in g.processes] == [JobRef("4242", "alice", "ml"), JobRef("4242", "alice", "ml"),
                                            JobRef("4243", "mallory")]  # fmt: skip
    assert [e["event"] for e in logs] == ["slurm_job_claim_refused"]
    assert logs[0]["claimed_account"] == "finance" and logs[0]["account"] == "ml"


def test_a_jobs_labels_stay_while_it_holds_a_gpu_and_go_with_it(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    process(root, 100, slurm_v2("4242"), {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "ml"})
    m = mapping(tmp_path, {"0": "4242\n"})
    a = HolderAttributor(mapping=m, job_from_cgroup=True, proc_root=str(root))
    a.attach((gpu(0, proc(100)),))
    (g,) = a.attach((gpu(0),))  # the process ended; the job still holds the GPU
    assert g.jobs == (JobRef("4242", "alice", "ml"),)
    os.unlink(tmp_path / "map" / "0")
    (g,) = a.attach((gpu(0),))
    assert g.jobs == ()
    (tmp_path / "map" / "0").write_text("4242\n")  # the ID again (another cluster's, say): learned afresh
    (g,) = a.attach((gpu(0),))
    assert g.jobs == (JobRef("4242"),)


def test_containers_are_named_by_the_engine_else_by_short_id(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    process(root, 100, f"0::/system.slice/docker-{ID}.scope")
    process(root, 101, f"0::/machine.slice/libpod-{'c' * 64}.scope")
    names = EngineNames(
        {"docker": "/x.sock", "podman": "/y.sock"},
        proc_root=str(root),
        ask=lambda path, cid, t: Inspected("trainer", 100) if path == "/x.sock" else Inspected(""),
    )
    a = HolderAttributor(containers=True, names=names, proc_root=str(root), name_budget=NEVER_S)  # fmt: skip
    (g,) = a.attach((gpu(0, proc(100), proc(101)),))
    docker, podman = g.processes[0].container, g.processes[1].container
    assert docker == ContainerRef("docker", ID, "trainer") and docker.display == "trainer"
    assert podman == ContainerRef("podman", "c" * 64, "") and podman.display == "c" * 12
    assert g.containers == (docker, podman)
    assert g.processes[0].holder == container_holder(docker)
    assert container_holder(docker).labels() == {"container_engine": "docker", "container_id": ID[:12],
                                                 "container_name": "trainer"}  # fmt: skip


def test_on_kubernetes_pods_stay_the_holder(tmp_path: Path) -> None:
    """With pod attribution on, a pod's process gets no container (the pod holds it, counted once),
    whether or not its pod was found; a process outside any pod may still run in a container."""
    root = proc_root(tmp_path)
    pod_slice = f"kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice"
    process(root, 100, f"0::/kubepods.slice/kubepods-besteffort.slice/{pod_slice}/cri-containerd-{ID}.scope")
    process(root, 101, f"0::/kubepods.slice/kubepods-besteffort.slice/{pod_slice}/cri-containerd-{'d' * 64}.scope")
    process(root, 102, f"0::/system.slice/docker-{'e' * 64}.scope")
    a = HolderAttributor(containers=True, pod_mode=True, proc_root=str(root))
    pod = PodRef("ml", "train-0", "main")
    (g,) = a.attach((gpu(0, proc(100, pod=pod), proc(101), proc(102)),))
    assert g.processes[0].container is None and g.processes[0].holder == pod_holder(pod)
    assert g.processes[1].container is None  # a pod's, its pod not known: still not a container
    assert g.processes[2].container == ContainerRef("docker", "e" * 64)
    # Without pod attribution, the same process is its container's.
    (g,) = HolderAttributor(containers=True, proc_root=str(root)).attach((gpu(0, proc(101)),))
    assert g.processes[0].container == ContainerRef("containerd", "d" * 64)


def test_a_job_wins_over_a_container_inside_it(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    process(root, 100, f"0::/system.slice/slurmstepd.scope/job_4242/step_0/user/libpod-{ID}")
    a = HolderAttributor(job_from_cgroup=True, containers=True, proc_root=str(root))
    (g,) = a.attach((gpu(0, proc(100)),))
    p = g.processes[0]
    assert p.job == JobRef("4242", "alice") and p.container is not None and p.holder == job_holder(p.job)


def test_mig_instances_have_their_own_files_and_the_gpus_file_serves_the_rest(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    m1 = MigReading(index=0, uuid="MIG-1", profile="3g.40gb", gpu_instance_id=1, compute_instance_id=0,
                    processes=(proc(100),))  # fmt: skip
    m2 = MigReading(index=1, uuid="MIG-2", profile="3g.40gb", gpu_instance_id=2, compute_instance_id=0,
                    processes=(proc(101, user="bob"),))  # fmt: skip
    a = HolderAttributor(mapping=mapping(tmp_path, {"0.1": "4242\n", "0": "4300\n"}), proc_root=str(root))
    (g,) = a.attach((gpu(0, proc(100), proc(101, user="bob"), migs=(m1, m2)),))
    assert g.migs[0].jobs == (JobRef("4242", "alice"),) and g.migs[0].processes[0].job == JobRef("4242", "alice")
    # GPU instance 2 has no file: its process is the GPU's one job's.
    assert g.migs[1].processes[0].job == JobRef("4300", "bob") and g.migs[1].jobs == (JobRef("4300", "bob"),)
    # The parent lists every instance's processes, each attributed as its instance's.
    assert [p.job for p in g.processes] == [JobRef("4242", "alice"), JobRef("4300", "bob")]


def test_processes_are_read_once_while_listed(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    process(root, 100, slurm_v2("4242"))
    a = HolderAttributor(job_from_cgroup=True, proc_root=str(root))
    a.attach((gpu(0, proc(100)),))
    process(root, 100, slurm_v2("9999"))  # would be another job if it were read again
    assert a.attach((gpu(0, proc(100)),))[0].processes[0].job == JobRef("4242", "alice")
    a.attach((gpu(0),))  # gone from the list: forgotten
    assert a.attach((gpu(0, proc(100)),))[0].processes[0].job == JobRef("9999", "alice")  # a new process


def test_a_lost_gpu_passes_through_and_errors_are_counted_by_source(tmp_path: Path) -> None:
    lost = GpuReading(index=0, uuid="GPU-0", up=False, error="GPU is lost")
    a = HolderAttributor(mapping=JobMappingDir(str(tmp_path / "none")), containers=True,
                         names=EngineNames({"docker": str(tmp_path / "none.sock")}))  # fmt: skip
    assert a.attach((lost,)) == (lost,)
    assert a.errors() == {"job_mapping": 1, "engine_api": 0}
    assert a.jobs and HolderAttributor(containers=True).errors() == {}


def test_a_jobs_environment_is_read_only_where_a_job_can_come_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = proc_root(tmp_path)
    process(root, 100, slurm_v2("4242"), {"SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "ml"})
    read: list[int] = []
    real = slurm.read_claim

    def spy(pid: int, root: str) -> JobClaim:
        read.append(pid)
        return real(pid, root)

    monkeypatch.setattr(attribution, "read_claim", spy)
    HolderAttributor(containers=True, proc_root=str(root)).attach((gpu(0, proc(100)),))
    assert read == []  # containers only: no job to claim an account for
    (g,) = HolderAttributor(job_from_cgroup=True, proc_root=str(root)).attach((gpu(0, proc(100)),))
    assert read == [100] and g.processes[0].job == JobRef("4242", "alice", "ml")
