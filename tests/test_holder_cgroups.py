"""Who runs a GPU process, from its /proc/<pid>/cgroup: each container engine's layouts (systemd and
cgroupfs drivers, rootful and rootless, nested, seen from another cgroup namespace) and Slurm's v1
and v2 layouts, laid out under a test root as the kernel shows them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_exporter.holders import cgroups
from gpu_exporter.holders.cgroups import CgroupFacts

ID = "5546aeea473f420726d9add9c89d5d9cfa8b183508fdf2f31df1f8e168b47466"  # a real podman container's ID
INNER = "0123456789abcdef" * 4
POD_UID = "9a8b7c6d-1111-2222-3333-444455556666"

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")


def v1(path: str) -> str:
    """A cgroup v1 host's file: one line per controller, the named systemd hierarchy, and the unified one."""
    lines = [f"{i + 1}:{c}:{path}" for i, c in enumerate(V1_CONTROLLERS)]
    return "\n".join([*lines, f"9:name=systemd:{path}", "0::/"]) + "\n"


def v2(path: str) -> str:
    return f"0::{path}\n"


# (layout, file contents, engine, container ID)
CONTAINERS = [
    ("docker, systemd driver (v2)", v2(f"/system.slice/docker-{ID}.scope"), "docker", ID),
    ("docker, cgroupfs driver (v1)", v1(f"/docker/{ID}"), "docker", ID),
    ("docker, cgroupfs driver (v2)", v2(f"/docker/{ID}"), "docker", ID),
    ("docker seen from the exporter's own cgroup namespace", v2(f"/../../system.slice/docker-{ID}.scope"), "docker",
     ID),
    ("docker in docker: the inner container", v2(f"/docker/{ID}/docker/{INNER}"), "docker", INNER),
    ("podman rootful, systemd (v2)", v2(f"/machine.slice/libpod-{ID}.scope"), "podman", ID),
    ("podman rootful, systemd, split cgroup", v2(f"/machine.slice/libpod-{ID}.scope/container"), "podman", ID),
    # In the user's own subtree: the user's container, kept apart from the system engine's.
    ("podman rootless", v2(f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
     "podman@1000", ID),
    ("podman in a pod", v2(f"/machine.slice/machine-libpod_pod_{INNER}.slice/libpod-{ID}.scope"), "podman", ID),
    ("podman cgroupfs (v1), as this machine's podman makes it", v1(f"/libpod_parent/libpod-{ID}"), "podman", ID),
    ("cri-o, systemd", v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}"
                          f".slice/crio-{ID}.scope"), "cri-o", ID),
    ("cri-o, cgroupfs", v1(f"/kubepods/burstable/pod{POD_UID}/crio-{ID}"), "cri-o", ID),
    ("containerd CRI, systemd", v2(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                                   f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{ID}.scope"), "containerd", ID),
    ("containerd, nerdctl with systemd", v2(f"/system.slice/nerdctl-{ID}.scope"), "containerd", ID),
    ("containerd, its cgroupfs default /<namespace>/<id>", v2(f"/default/{ID}"), "containerd", ID),
]  # fmt: skip


def layout(root: Path, pid: int, text: str | bytes) -> Path:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_bytes(text.encode() if isinstance(text, str) else text)
    return d


@pytest.mark.parametrize(("what", "text", "engine", "cid"), CONTAINERS, ids=[c[0] for c in CONTAINERS])
def test_each_engines_layout_names_its_container(tmp_path: Path, what: str, text: str, engine: str, cid: str) -> None:
    layout(tmp_path, 4242, text)
    facts = cgroups.read(4242, str(tmp_path))
    assert (facts.visible, facts.engine, facts.container_id, facts.job) == (True, engine, cid, None), what
    assert facts.kubepods == ("kubepods" in text)


@pytest.mark.parametrize(
    "text",
    [
        v2(f"/machine.slice/libpod-conmon-{ID}.scope"),  # podman's monitor, not the container
        v2(f"/system.slice/crio-conmon-{ID}.scope"),  # CRI-O's
        v2("/user.slice/user-1000.slice/session-3.scope"),  # a login session
        v2("/system.slice/docker.service"),  # the engine itself
        v2("/init.scope"),
        v1("/"),
        v2(f"/docker/{ID[:63]}"),  # one digit short: not an ID
        v2(f"/system.slice/docker-{ID}.scope.bak"),
    ],
)
def test_what_is_not_a_container_is_none(tmp_path: Path, text: str) -> None:
    layout(tmp_path, 7, text)
    assert cgroups.read(7, str(tmp_path)) == CgroupFacts(True)


SLURM = [
    ("v1, task/cgroup", v1("/slurm/uid_1001/job_4242/step_0/task_0"), "4242", 1001),
    ("v1, the batch step", v1("/slurm/uid_1001/job_4242/step_batch/task_0"), "4242", 1001),
    ("v1, an interactive step", v1("/slurm/uid_2101171/job_280678/step_interactive/task_0"), "280678", 2101171),
    ("v1, several slurmd on one host", v1("/slurm_node07/uid_1001/job_77/step_3/task_1"), "77", 1001),
    ("v2", v2("/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0"), "1392969", None),
    ("v2, the extern step (pam_slurm_adopt)", v2("/system.slice/slurmstepd.scope/job_42/step_extern/user"), "42", None),
    ("v2, several slurmd on one host", v2("/system.slice/node07_slurmstepd.scope/job_9/step_batch/user/task_special"),
     "9", None),
]  # fmt: skip


@pytest.mark.parametrize(("what", "text", "job", "uid"), SLURM, ids=[s[0] for s in SLURM])
def test_slurm_layouts_name_the_job_and_v1_its_owner(tmp_path: Path, what: str, text: str, job: str,
                                                      uid: int | None) -> None:  # fmt: skip
    layout(tmp_path, 11, text)
    facts = cgroups.read(11, str(tmp_path))
    assert (facts.job, facts.job_uid, facts.container_id) == (job, uid, None), what


@pytest.mark.parametrize(
    "text",
    [
        v2("/system.slice/slurmstepd.scope/system"),  # slurmstepd itself
        v2("/system.slice/slurmd.service"),
        v1("/slurm/system"),
        v2("/user.slice/job_4242/step_0"),  # a directory someone named job_*: no Slurm scope above it
        v1("/slurm/uid_1001/job_42x/step_0"),
    ],
)
def test_what_is_not_a_slurm_job_is_none(tmp_path: Path, text: str) -> None:
    layout(tmp_path, 12, text)
    assert cgroups.read(12, str(tmp_path)).job is None


def test_a_container_inside_a_slurm_job_gives_both_and_the_unified_line_wins(tmp_path: Path) -> None:
    """podman run inside a job (cgroupfs, nested under the job's cgroup): the cgroup says both; on a
    hybrid host the unified hierarchy, where engines and systemd put processes, is read first."""
    layout(tmp_path, 13, v2(f"/system.slice/slurmstepd.scope/job_4242/step_0/user/libpod-{ID}"))
    facts = cgroups.read(13, str(tmp_path))
    assert (facts.job, facts.engine, facts.container_id) == ("4242", "podman", ID)
    hybrid = f"4:memory:/docker/{INNER}\n0::/system.slice/docker-{ID}.scope\n"
    layout(tmp_path, 14, hybrid)
    assert cgroups.read(14, str(tmp_path)).container_id == ID


def test_a_pods_process_is_known_for_one(tmp_path: Path) -> None:
    layout(tmp_path, 15, v1(f"/kubepods/besteffort/pod{POD_UID}/{ID}"))
    facts = cgroups.read(15, str(tmp_path))
    assert facts.kubepods and facts.container_id == ID and facts.engine == "containerd"


def test_a_process_that_is_gone_or_unreadable_is_not_visible(tmp_path: Path) -> None:
    assert cgroups.read(99, str(tmp_path)) == CgroupFacts(False)  # gone before the read (ENOENT)
    layout(tmp_path, 98, b"")  # exited between open and read: the kernel shows an empty file
    assert cgroups.read(98, str(tmp_path)) == CgroupFacts(False)
    (tmp_path / "97").mkdir()
    (tmp_path / "97" / "cgroup").mkdir()  # EISDIR stands for any other read error
    assert cgroups.read(97, str(tmp_path)) == CgroupFacts(False)


def test_names_that_are_not_utf8_or_huge_are_read_safely(tmp_path: Path) -> None:
    """A cgroup's name is chosen by whoever made it: bytes that are not UTF-8, control characters and
    a file longer than the read bound cost nothing but that process's attribution."""
    raw = b"0::/system.slice/\xff\xfe\x1b[2J-" + f"docker-{ID}.scope".encode() + b"\n"
    layout(tmp_path, 16, raw)
    assert cgroups.read(16, str(tmp_path)).container_id == ID
    # Only the first MAX_BYTES are read: a container named beyond them is not seen.
    layout(tmp_path, 17, b"0::/" + b"x" * cgroups.MAX_BYTES + f"/docker-{ID}.scope\n".encode())
    facts = cgroups.read(17, str(tmp_path))
    assert facts.visible and facts.container_id is None
    # A path may itself hold a colon: only the first two separate the fields.
    layout(tmp_path, 18, f"0::/machine.slice/libpod-{ID}.scope/a:b\n")
    assert cgroups.read(18, str(tmp_path)).container_id == ID
    # A file with no line in the kernel's format says nothing, and nothing about pods either.
    assert cgroups.parse("garbage\n") == CgroupFacts(True, kubepods=False)
    assert cgroups.parse("garbage\n").kubepods is False


def test_the_real_proc_is_read() -> None:
    """The kernel's own file for this process parses (whatever cgroup the tests run in)."""
    facts = cgroups.read(os.getpid())
    assert facts.visible
    assert cgroups.parse(Path(f"/proc/{os.getpid()}/cgroup").read_text()) == facts


# Every v1 controller a 6.x kernel has, each a hierarchy of its own on a v1 host (issue 50 item 6b).
ALL_V1 = ("cpuset", "cpu", "cpuacct", "blkio", "memory", "devices", "freezer", "net_cls", "perf_event", "net_prio",
          "hugetlb", "pids", "rdma", "misc", "debug")  # fmt: skip


def test_a_deep_path_in_every_hierarchy_of_a_v1_host_is_read_whole(tmp_path: Path) -> None:
    """A user nests cgroups as deep as the kernel shows (a path just under PATH_MAX: 16 levels, 4 KB)
    in each of a v1 host's 15 controller hierarchies and systemd's; its container is named in the
    unified hierarchy, which the kernel lists last.  The file is 66 KB of 17 lines: the 64 KiB bound
    cut the last one, and the container was not attributed.  (15 levels of 3.9 KB in 15 hierarchies
    are 59 KB, which fit.)  Every hierarchy a host can have, each at the longest path, fits."""
    longest = ("/user.slice/user-1000.slice/session-1.scope/" + "/".join(["n" * 254] * 17))[: cgroups.PATH_MAX - 1]
    lines = [f"{len(ALL_V1) + 1 - i}:{c}:{longest}" for i, c in enumerate(ALL_V1)]
    lines += [f"1:name=systemd:{longest}", f"0::/system.slice/docker-{ID}.scope"]
    text = "\n".join(lines) + "\n"
    assert len(text) > 64 * 1024
    layout(tmp_path, 20, text)
    facts = cgroups.read(20, str(tmp_path))
    assert (facts.engine, facts.container_id) == ("docker", ID)
    lines = [f"{n}:c{n}:{longest}" for n in range(cgroups.MAX_HIERARCHIES, 1, -1)] + [f"1::/docker/{ID}"]
    layout(tmp_path, 21, "\n".join(lines) + "\n")
    assert cgroups.read(21, str(tmp_path)).container_id == ID


def test_a_line_cut_at_the_read_bound_is_left_out(tmp_path: Path) -> None:
    """Past the bound (only root can mount that many hierarchies) the file is read up to it; the line
    it cuts is left out, never read as a shorter path (here, one whose cut falls after a container's
    ID, inside the next component)."""
    head = "1:memory:/" + "x" * (cgroups.MAX_BYTES - 100) + "\n"
    cut = f"0::/docker/{ID}/" + "y" * 200 + "\n"
    layout(tmp_path, 22, head + cut)
    assert len(head) + len(f"0::/docker/{ID}/") < cgroups.MAX_BYTES < len(head + cut)
    facts = cgroups.read(22, str(tmp_path))
    assert facts.visible and facts.container_id is None
