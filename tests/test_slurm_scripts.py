"""The Slurm prolog and epilog shipped in deploy/slurm/, run by a real shell as slurmd runs them (its
environment: SLURM_JOB_ID, SLURM_JOB_GPUS), read back by the exporter's own reader of the mapping
files: jobs sharing a GPU, jobs starting at once, a job that ends, and what a failure must not do
(fail the job)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpu_exporter.holders.slurm import JobMappingDir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PROLOG = ROOT / "deploy" / "slurm" / "gpu-job-map-prolog.sh"
EPILOG = ROOT / "deploy" / "slurm" / "gpu-job-map-epilog.sh"


def run(script: Path, where: Path, job: int, gpus: str, var: str = "SLURM_JOB_GPUS") -> int:
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": str(job), var: gpus, "GPU_JOB_MAP_DIR": str(where)}
    return subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, timeout=60).returncode


def jobs(where: Path) -> dict[int, tuple[str, ...]]:
    return {gpu: ids for (gpu, _), ids in JobMappingDir(str(where), settle=0.0).read().items()}


def test_the_prolog_writes_each_gpus_file_and_the_epilog_takes_the_job_out(tmp_path: Path) -> None:
    where = tmp_path / "gpu-job-map"
    assert run(PROLOG, where, 4242, "0,1") == 0
    assert run(PROLOG, where, 4243, "1") == 0  # two jobs share GPU 1 (sharding, or --oversubscribe)
    assert jobs(where) == {0: ("4242",), 1: ("4242", "4243")}
    assert run(EPILOG, where, 4242, "0,1") == 0
    assert jobs(where) == {1: ("4243",)}
    assert not (where / "0").exists()  # the last job gone: the file too
    assert run(EPILOG, where, 4243, "1") == 0
    assert jobs(where) == {} and sorted(p.name for p in where.iterdir()) == [".lock"]


def test_older_slurm_gives_the_gpus_in_cuda_visible_devices(tmp_path: Path) -> None:
    assert run(PROLOG, tmp_path, 77, "2,3", var="CUDA_VISIBLE_DEVICES") == 0
    assert jobs(tmp_path) == {2: ("77",), 3: ("77",)}


def test_a_prolog_run_twice_lists_the_job_once(tmp_path: Path) -> None:
    run(PROLOG, tmp_path, 4242, "0")
    run(PROLOG, tmp_path, 4242, "0")  # slurmd retries, or PrologFlags makes it run per step
    assert (tmp_path / "0").read_text() == "4242\n"


def test_jobs_starting_at_once_on_one_gpu_are_all_written(tmp_path: Path) -> None:
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda j: run(PROLOG, tmp_path, j, "0"), range(1000, 1032)))
    assert codes == [0] * 32
    assert sorted(jobs(tmp_path)[0]) == [str(j) for j in range(1000, 1032)]


def test_a_job_without_gpus_and_a_directory_that_cannot_be_made_fail_nothing(tmp_path: Path) -> None:
    assert run(PROLOG, tmp_path / "m", 1, "") == 0 and jobs(tmp_path / "m") == {}
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert run(PROLOG, blocked / "m", 1, "0") == 0  # cannot be made: the job still starts
    assert run(EPILOG, tmp_path / "never-made", 1, "0") == 0
