"""A tenant cannot forge a holder: cgroup paths that a user (systemd's delegation of
``user@<uid>.service`` on cgroup v2) or a container (its own writable cgroupfs) may create never
make a Slurm job, never take a system engine's container, and a container's claim is checked with
its engine where it answers.

Processes are laid out under a test root as the kernel shows them; the engine is a unix-socket
server in this process (tests/test_engine_names.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter.holders import cgroups
from tests.test_holder_cgroups import v1, v2

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
