"""The report's holders, end to end, for Slurm jobs and containers: the real daemon on the fake NVML
with a job mapping directory (and, where Podman runs, a real container holding a GPU), a real
Prometheus scraping it for a minute, and ``gpu-exporter report`` querying that Prometheus.

The busy H100 runs a process of this test's own user; the H100 left idle is allocated to job 4242 by
its mapping file and runs a real process of this test's user, so the job is that user's; the L4 is
held by the Podman container where there is one, else idle.  The report must list each holder with
its kind and labels, and tell the job's owner to give back the GPU it leaves idle.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cost_helpers import PRICING, three_gpu_node
from tests.exporter_helpers import run_daemon, wait_for
from tests.prometheus_helpers import prometheus
from tests.test_image import _missing as podman_missing
from tests.test_podman_holders import container  # noqa: F401  (the real Podman container, where podman runs)
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration

GIB = 1024**3
ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture(scope="module")
def minute_of_holders(
    tmp_path_factory: pytest.TempPathFactory, fake_nvml_lib: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Any, str | None]]:
    box = request.getfixturevalue("container") if podman_missing() is None else None
    tmp = tmp_path_factory.mktemp("holders")
    s = three_gpu_node(tmp / "node.scn")
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]  # real processes: their user is known
    try:
        s.gpu(0).processes[0].pid = sleepers[0].pid
        s.gpu(1).processes[0].pid = sleepers[1].pid
        if box is not None:
            s.gpu(2).memory(23034 * 1024**2, 4 * GIB).add_process(box.pid, 4 * GIB, name="sleep")
        s.write()
        (tmp / "job-map").mkdir()
        (tmp / "job-map" / "1").write_text("4242\n")
        cfg = tmp / "config.yaml"
        cfg.write_text(yaml.safe_dump({
            "node_name": "node-a", "pricing": PRICING,
            "slurm": {"job_mapping_dir": str(tmp / "job-map")},
            "containers": {"attribution": "on", "docker_socket": "", "podman_socket": ""},
        }))  # fmt: skip
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "1s") as d, \
                prometheus([f"127.0.0.1:{d.port}"], tmp / "prom", labels={"node": "node-a"}) as prom:  # fmt: skip
            wait_for(lambda: len(prom.query("count by (gpu) (gpu_state_seconds_total)")) == 3, timeout=NEVER_S,
                     what="the state counters of the three GPUs")  # fmt: skip
            started = time.time()
            wait_for(lambda: time.time() - started >= 68, timeout=120, interval=1, what="a minute of history")
            yield prom, (box.id[:12] if box is not None else None)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def report(prom: Any, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", prom.url, "--since",
                          "1m", "--format", "json", "--selector", '{node="node-a"}', *args],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_the_report_lists_jobs_and_containers_as_holders(minute_of_holders: tuple[Any, str | None]) -> None:
    prom, short_id = minute_of_holders
    doc = report(prom)
    holders = {h["holder"]: h for h in doc["holders"]}
    job = holders[f"job 4242 of {ME}"]
    assert (job["kind"], job["hpc_job"], job["user"], job["gpus"]) == ("job", "4242", ME, 1)
    assert job["allocated_idle_hours"] > 0 and job["busy_hours"] == 0 and job["cost"] > 0
    assert holders[f"user {ME}"]["kind"] == "user" and holders[f"user {ME}"]["busy_hours"] > 0
    if short_id is not None:
        (box,) = [h for h in doc["holders"] if h["kind"] == "container"]
        assert box["container"] == short_id and box["holder"] == f"container {short_id}" and box["gpus"] == 1
    gpus = {g["gpu"]: g for g in doc["gpus"]}
    assert gpus["1"]["holder"] == f"job 4242 of {ME}" and gpus["0"]["holder"] == f"user {ME}"


def test_the_jobs_owner_is_told_to_give_back_the_gpu_it_leaves_idle(
    minute_of_holders: tuple[Any, str | None],
) -> None:
    prom, _ = minute_of_holders
    recs = {r["gpu"]: r for r in report(prom, "--min-history", "30s")["recommendations"]}
    assert recs["1"]["kind"] == "reclaim" and recs["1"]["suggested"] == f"reclaim from job 4242 of {ME}"
    assert f"reclaiming it from job 4242 of {ME}" in recs["1"]["reason"]
