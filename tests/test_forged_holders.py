"""A tenant cannot forge a holder: cgroup paths that a user (systemd's delegation of
``user@<uid>.service`` on cgroup v2) or a container (its own writable cgroupfs) may create never
make a Slurm job, never take a system engine's container, and a container's claim is checked with
its engine where it answers.

Processes are laid out under a test root as the kernel shows them; the engine is a unix-socket
server in this process (tests/test_engine_names.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpu_exporter.holders import cgroups
from gpu_exporter.holders.attribution import HolderAttributor
from gpu_exporter.holders.engines import EngineNames, Inspected, Known
from gpu_exporter.snapshot import ContainerRef, GpuReading, ProcessReading, container_holder, user_holder
from tests.test_engine_names import engine, http
from tests.test_holder_cgroups import v1, v2
from tests.timing import NEVER_S

GIB = 1024**3
VICTIM = "5546aeea473f420726d9add9c89d5d9cfa8b183508fdf2f31df1f8e168b47466"
OTHER = "0123456789abcdef" * 4
USER = "/user.slice/user-1000.slice/user@1000.service"


def layout(root: Path, pid: int, text: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(text)


def facts(tmp_path: Path, text: str) -> cgroups.CgroupFacts:
    layout(tmp_path, 4242, text)
    return cgroups.read(4242, str(tmp_path))


# -- Slurm jobs: only where slurmd or slurmstepd makes them --------------------------------------------

FORGED_JOBS = [
    ("v2 scope in a user's delegated subtree", v2(f"{USER}/slurmstepd.scope/job_4242/step_0/user/task_0")),
    ("v2 scope with a system.slice of the user's own", v2(f"{USER}/system.slice/slurmstepd.scope/job_4242")),
    ("v2 scope inside a container", v2(f"/system.slice/docker-{OTHER}.scope/system.slice/slurmstepd.scope/job_4242")),
    ("v2 scope under another service", v2("/system.slice/tenant.service/slurmstepd.scope/job_4242")),
    ("v2 scope seen from another namespace, in a user's subtree", v2(f"/../..{USER}/slurmstepd.scope/job_4242")),
    ("v1 layout in the user's subtree of name=systemd", v1(f"{USER}/slurm/uid_0/job_4242")),
    ("v1 layout below the root of a v1 hierarchy", v1(f"/docker/{OTHER}/slurm/uid_0/job_4242")),
    ("v1 layout in the unified hierarchy", v2("/slurm/uid_0/job_4242/step_0")),
]  # fmt: skip


@pytest.mark.parametrize(("what", "text"), FORGED_JOBS, ids=[f[0] for f in FORGED_JOBS])
def test_a_job_path_someone_below_root_made_is_no_job(tmp_path: Path, what: str, text: str) -> None:
    found = facts(tmp_path, text)
    assert (found.job, found.job_uid) == (None, None), what


REAL_JOBS = [
    ("v2", v2("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")),
    ("v2, several slurmd", v2("/system.slice/node07_slurmstepd.scope/job_4242/step_batch")),
    ("v2 seen from the exporter's own cgroup namespace in system.slice", v2("/../slurmstepd.scope/job_4242/step_0")),
    ("v2 seen from a pod's cgroup namespace", v2("/../../../system.slice/slurmstepd.scope/job_4242/step_0")),
    ("v1", v1("/slurm/uid_1001/job_4242/step_0/task_0")),
    ("v1 seen from another cgroup namespace", v1("/../../slurm/uid_1001/job_4242/step_0")),
]  # fmt: skip


@pytest.mark.parametrize(("what", "text"), REAL_JOBS, ids=[r[0] for r in REAL_JOBS])
def test_the_paths_slurm_makes_are_still_jobs(tmp_path: Path, what: str, text: str) -> None:
    assert facts(tmp_path, text).job == "4242", what


def test_a_job_names_its_owner_only_from_a_v1_hierarchy_at_its_root(tmp_path: Path) -> None:
    """A hybrid host: the v1 controllers say the job and its owner; a unified line of the same shape,
    read first, is not believed (and does not hide the v1 lines)."""
    text = "0::/slurm/uid_0/job_1\n4:memory:/slurm/uid_1001/job_4242/step_0\n"
    found = facts(tmp_path, text)
    assert (found.job, found.job_uid) == ("4242", 1001)


# -- Containers in a user's subtree: at most the user's own --------------------------------------------


@pytest.mark.parametrize(
    ("text", "engine", "anchor"),
    [
        (v2(f"{USER}/app.slice/docker-{VICTIM}.scope"), "docker@1000", f"{USER}/app.slice/docker-{VICTIM}.scope"),
        (v2(f"{USER}/user.slice/libpod-{VICTIM}.scope/container"), "podman@1000",
         f"{USER}/user.slice/libpod-{VICTIM}.scope"),
        (v2(f"/../..{USER}/docker/{VICTIM}"), "docker@1000", f"/../..{USER}/docker/{VICTIM}"),
        (v2(f"/user.slice/user-1000.slice/user@1000.service/x/user@0.service/docker-{VICTIM}.scope"), "docker@1000",
         f"/user.slice/user-1000.slice/user@1000.service/x/user@0.service/docker-{VICTIM}.scope"),
        # Seen from a cgroup namespace rooted at the user's slice: the subtree is the path's first part.
        (v2(f"/user@1000.service/app.slice/docker-{VICTIM}.scope"), "docker@1000",
         f"/user@1000.service/app.slice/docker-{VICTIM}.scope"),
        # A container above the user's subtree (systemd running in it) is still the system engine's.
        (v2(f"/system.slice/docker-{VICTIM}.scope{USER}/app.slice"), "docker", f"/system.slice/docker-{VICTIM}.scope"),
        # The user's session is not the delegated subtree: root makes it.
        (v2(f"/user.slice/user-1000.slice/session-3.scope/docker-{VICTIM}.scope"), "docker",
         f"/user.slice/user-1000.slice/session-3.scope/docker-{VICTIM}.scope"),
        (v2(f"/system.slice/user@1000.service.d/docker-{VICTIM}.scope"), "docker",
         f"/system.slice/user@1000.service.d/docker-{VICTIM}.scope"),
    ],
)  # fmt: skip
def test_a_container_in_a_users_subtree_is_that_users_own(tmp_path: Path, text: str, engine: str, anchor: str) -> None:
    found = facts(tmp_path, text)
    assert (found.engine, found.container_id, found.container_cgroup) == (engine, VICTIM, anchor)


def gpu(*procs: ProcessReading) -> GpuReading:
    return GpuReading(index=0, uuid="GPU-0", up=True, processes=procs)


def proc(pid: int, user: str) -> ProcessReading:
    return ProcessReading(pid=pid, name="python3", used_memory_bytes=GIB, user=user)


def docker_knows(containers: dict[str, tuple[str, int]]) -> Callable[[bytes], bytes]:
    """Docker's inspect answer: Name, and State.Pid, the container's init process."""

    def answer(request: bytes) -> bytes:
        cid = request.split(b" ")[1].decode().removeprefix("/containers/").removesuffix("/json")
        if cid not in containers:
            return http("404 Not Found", "{}")
        name, pid = containers[cid]
        return http("200 OK", json.dumps({"Id": cid, "Name": f"/{name}", "State": {"Running": True, "Pid": pid}}))

    return answer


def test_a_users_forged_docker_scope_never_takes_the_victims_name_or_holder(tmp_path: Path) -> None:
    """bob (uid 1000) makes docker-<victim>.scope in his own subtree: his process is his own
    container's, never the victim's, and the system engine is never asked for it."""
    root = tmp_path / "proc"
    layout(root, 100, v2(f"/system.slice/docker-{VICTIM}.scope"))  # the victim's init
    layout(root, 200, v2(f"{USER}/app.slice/docker-{VICTIM}.scope"))
    with engine(tmp_path, docker_knows({VICTIM: ("payroll", 100)})) as e:
        names = EngineNames({"docker": str(e.path)}, proc_root=str(root))
        a = HolderAttributor(containers=True, names=names, proc_root=str(root), name_budget=NEVER_S)
        (g,) = a.attach((gpu(proc(100, "root"), proc(200, "bob")),))
        names.close()
    victim, forged = g.processes[0].container, g.processes[1].container
    assert victim == ContainerRef("docker", VICTIM, "payroll")
    assert forged == ContainerRef("docker@1000", VICTIM, "")
    assert container_holder(forged) != container_holder(victim)
    assert len(e.requests) == 1  # the victim's, once; the user's own container is not the system engine's


# -- A container's claim, checked with its engine -------------------------------------------------------


def test_a_container_named_inside_another_is_refused_by_its_engine(tmp_path: Path) -> None:
    """A container that may write its cgroupfs makes docker-<victim>.scope inside its own: the
    engine says the victim runs elsewhere, so that process is refused (its user's), said once."""
    root = tmp_path / "proc"
    layout(root, 100, v2(f"/system.slice/docker-{VICTIM}.scope"))  # the victim's init
    layout(root, 101, v2(f"/system.slice/docker-{VICTIM}.scope/worker"))  # the victim's, in a child cgroup
    layout(root, 300, v2(f"/system.slice/docker-{OTHER}.scope"))  # the tenant's init
    layout(root, 301, v2(f"/system.slice/docker-{OTHER}.scope/docker-{VICTIM}.scope"))  # its forgery
    answer = docker_knows({VICTIM: ("payroll", 100), OTHER: ("tenant", 300)})
    with engine(tmp_path, answer) as e, capture_logs() as logs:
        names = EngineNames({"docker": str(e.path)}, proc_root=str(root))
        a = HolderAttributor(containers=True, names=names, proc_root=str(root), name_budget=NEVER_S)
        procs = (proc(100, "root"), proc(101, "root"), proc(300, "eve"), proc(301, "eve"))
        (g,) = a.attach((gpu(*procs),))
        (again,) = a.attach((gpu(*procs),))
        names.close()
    payroll, tenant = ContainerRef("docker", VICTIM, "payroll"), ContainerRef("docker", OTHER, "tenant")
    assert [p.container for p in g.processes] == [payroll, payroll, tenant, None]
    assert g.processes[3].holder == user_holder("eve")
    assert g.containers == (tenant, payroll) and again == g  # by engine and ID
    assert len(e.requests) == 2  # one inspect per container, the init's cgroup cached with the name
    refused = [entry for entry in logs if entry["event"] == "container_claim_refused"]
    assert [(r["container_id"], r["pid"]) for r in refused] == [(VICTIM[:12], 301)]


@pytest.mark.parametrize(
    ("init", "pid", "holds"),
    [
        (v2(f"/system.slice/docker-{VICTIM}.scope"), 100, True),
        (v2(f"/system.slice/docker-{VICTIM}.scope/init"), 100, True),  # the init in a child: same container
        (v2(f"/system.slice/docker-{OTHER}.scope/docker-{VICTIM}.scope"), 100, False),  # init elsewhere
        (v2(f"/system.slice/docker-{OTHER}.scope"), 100, False),  # the init is another container's
        (v2("/system.slice/docker.service"), 100, False),  # no container at all
        (None, 100, False),  # the init cannot be read (gone)
        (v2(f"/system.slice/docker-{VICTIM}.scope"), 0, False),  # the engine gave no init (not running)
    ],
)
def test_the_engine_vouches_only_for_its_init_process_cgroup(
    tmp_path: Path, init: str | None, pid: int, holds: bool
) -> None:
    root = tmp_path / "proc"
    if init is not None:
        layout(root, 100, init)
    names = EngineNames({"docker": "/run/docker.sock"}, proc_root=str(root),
                        ask=lambda path, cid, timeout: Inspected("payroll", pid))  # fmt: skip
    assert names.name("docker", VICTIM) == "payroll"
    known = names.lookup("docker", VICTIM)
    assert known is not None
    layout(root, 200, v2(f"/system.slice/docker-{VICTIM}.scope/sub"))
    assert known.holds(cgroups.read(200, str(root))) is holds


def test_no_init_cgroup_vouches_for_nothing() -> None:
    assert not Known("payroll", None).holds(cgroups.parse(v2("/")))
