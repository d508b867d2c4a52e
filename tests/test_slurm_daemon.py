"""Slurm jobs through the real daemon and ``--once`` against the fake NVML: a job mapping file
rewritten in place, as fast as a writer can, while the daemon polls and serves it, never takes the
job off its GPU; ``--once`` on a Slurm node names the job on each GPU; a directory that does not
exist yet is said at start, one that is a file stops it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.exporter_helpers import run_daemon, wait_for
from tests.fakenvml import Scenario, subprocess_env
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration

GIB = 1024**3


def node(scenario: Scenario) -> None:
    for i in range(2):
        g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", f"GPU-0000000{i}-2222-3333-4444-555555555555")
        g.utilization(90 if i == 0 else 0, 10).memory(80 * GIB, 40 * GIB if i == 0 else 0).temperature(50)
        if i == 0:
            g.add_process(424242, 40 * GIB, name="python3", sm=90)  # not in this machine's /proc
    scenario.write()


def config(tmp_path: Path, where: Path) -> Path:
    cfg = tmp_path / "slurm.yml"
    cfg.write_text(f"slurm:\n  job_mapping_dir: {where}\n")
    return cfg


def test_a_file_rewritten_in_place_while_the_daemon_serves_never_loses_its_job(
    scenario: Scenario, tmp_path: Path
) -> None:
    node(scenario)
    where = tmp_path / "gpu-job-map"
    where.mkdir()
    (where / "0").write_text("4242\n")
    os.utime(where / "0", (1.0, 1.0))
    with run_daemon(scenario.path, "--config", str(config(tmp_path, where)), "--poll.interval", "0.05s") as d:

        def jobs() -> dict[str, str]:
            return {dict(ls)["gpu"]: dict(ls)["hpc_job"] for (n, ls) in d.metrics() if n == "gpu_up"}

        wait_for(lambda: jobs().get("0") == "4242", timeout=NEVER_S, what="the job on GPU 0")
        stop = threading.Event()
        rewrites = [0]

        def writer() -> None:  # what `echo $SLURM_JOB_ID > 0` does: truncate, then write
            while not stop.is_set():
                fd = os.open(where / "0", os.O_WRONLY | os.O_TRUNC)
                os.write(fd, b"42")
                os.write(fd, b"42\n")
                os.close(fd)
                rewrites[0] += 1

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        seen: list[str] = []
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                seen.append(jobs()["0"])
        finally:
            stop.set()
            t.join(timeout=10)
        assert rewrites[0] > 100 and len(seen) > 10
        assert set(seen) == {"4242"}, seen  # never empty, never "42"
        books = {dict(ls)["hpc_job"] for (n, ls), v in d.metrics().items() if n == "gpu_state_seconds_total" and v
                 and dict(ls)["gpu"] == "0"}  # fmt: skip
        assert books == {"4242"}  # GPU 0's time went to the job alone
        (where / "0").unlink()  # the epilog: the job left
        wait_for(lambda: jobs().get("0") == "", timeout=NEVER_S, what="the job gone from GPU 0")


def test_once_on_a_slurm_node_names_the_job_on_each_gpu(scenario: Scenario, tmp_path: Path) -> None:
    node(scenario)
    where = tmp_path / "gpu-job-map"
    where.mkdir()
    (where / "0").write_text("4242\n")
    (where / "1").write_text("4250\n")
    run = [sys.executable, "-m", "gpu_exporter", "--once", "--config", str(config(tmp_path, where))]
    out = subprocess.run(run, env=subprocess_env(scenario.path), capture_output=True, text=True, timeout=NEVER_S)
    rows = [line for line in out.stdout.splitlines() if line.startswith(("   0  ", "   1  "))]
    assert rows[0].rstrip().endswith("job 4242") and rows[1].rstrip().endswith("job 4250"), out.stdout
    out = subprocess.run([*run, "--format", "json"], env=subprocess_env(scenario.path), capture_output=True,
                         text=True, timeout=NEVER_S)  # fmt: skip
    gpus = json.loads(out.stdout)["gpus"]
    assert [g["gpu_holder_info"][0]["hpc_job"] for g in gpus] == ["4242", "4250"]
    assert gpus[0]["gpu_process_memory_used_bytes"][0]["hpc_job"] == "4242"  # the GPU's one job: its process's


def test_a_missing_directory_is_said_at_start_and_a_file_stops_it(scenario: Scenario, tmp_path: Path) -> None:
    node(scenario)
    missing = tmp_path / "not-yet"
    with run_daemon(scenario.path, "--config", str(config(tmp_path, missing)), "--poll.interval", "0.1s") as d:
        wait_for(lambda: any(e.get("event") == "slurm_job_mapping_dir" for e in d.log), timeout=NEVER_S,
                 what="the missing directory said")  # fmt: skip
        said = next(e for e in d.log if e.get("event") == "slurm_job_mapping_dir")
        assert said["path"] == str(missing) and "does not exist (yet)" in str(said["detail"])
        missing.mkdir()
        (missing / "1").write_text("77\n")
        wait_for(lambda: {dict(ls)["hpc_job"] for (n, ls) in d.metrics() if n == "gpu_up"} == {"", "77"},
                 timeout=NEVER_S, what="the job once the prolog made the directory")  # fmt: skip
    a_file = tmp_path / "map"
    a_file.write_text("")
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "--config", str(config(tmp_path, a_file))],
                         env=subprocess_env(scenario.path), capture_output=True, text=True,
                         timeout=NEVER_S)  # fmt: skip
    assert out.returncode == 2 and "slurm.job_mapping_dir" in out.stderr and "is not a directory" in out.stderr
