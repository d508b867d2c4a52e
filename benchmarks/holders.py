"""CPU cost of attributing Slurm jobs and containers: 8 GPUs, 64 processes, every source on.

The join runs once per poll on the poller's thread (never on a scrape). Measured with the thread's
own CPU clock (``time.thread_time``), so the fake engine's thread and the machine's other work do
not count:

- **steady**: the same 64 processes poll after poll (their cgroups and environments already read,
  their containers' names known); the mapping files are read every poll;
- **churn**: 8 of the 64 processes are new each poll (a job or container ending and another
  starting on every poll, far more than a real node sees), their files read and names asked;
- **first sight**: all 64 processes new at once (the exporter's first poll), 32 container names
  asked of an engine over a real unix socket;
- **real /proc**: 64 sleeping processes of this machine, read through the real /proc, steady.

The processes: 8 Slurm jobs (v2 layout, 3 processes each, their environment carrying the job's
account) and 8 more in v1 layout, 16 Docker and 16 Podman containers; 8 mapping files, one job each.
Target: about 1 ms of CPU per poll for 64 processes.

    .venv/bin/python benchmarks/holders.py [--polls 500]

Writes benchmarks/results/holders.md and holders.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import machine, machine_line  # noqa: E402

from gpu_exporter.holders.attribution import HolderAttributor  # noqa: E402
from gpu_exporter.holders.engines import EngineNames  # noqa: E402
from gpu_exporter.holders.slurm import JobMappingDir  # noqa: E402
from gpu_exporter.logs import configure_logging  # noqa: E402
from gpu_exporter.snapshot import GpuReading, ProcessReading  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GPUS, PER_GPU = 8, 8
FIRST_PID = 10_000
GIB = 1024**3


def cgroup_of(i: int) -> tuple[str, dict[str, str]]:
    """Process i's cgroup file and environment: jobs on GPUs 0-3, containers on 4-7."""
    gpu = i // PER_GPU
    if gpu < 3:
        job = 5000 + i // 3
        env = {"SLURM_JOB_ID": str(job), "SLURM_JOB_ACCOUNT": "ml", "SLURM_JOB_PARTITION": "gpu"}
        return f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_{i % 3}\n", env
    if gpu == 3:
        lines = [f"{n}:{c}:/slurm/uid_1000/job_{6000 + i}/step_0/task_0" for n, c in enumerate(("memory", "cpu"), 1)]
        return "\n".join([*lines, "0::/"]) + "\n", {}
    cid = f"{i:064x}"
    if gpu < 6:
        return f"0::/system.slice/docker-{cid}.scope\n", {}
    return f"0::/machine.slice/libpod-{cid}.scope/container\n", {}


def lay_out(root: Path, pids: list[int], offset: int = 0) -> None:
    for n, pid in enumerate(pids):
        text, env = cgroup_of(n)
        d = root / str(pid + offset)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(text)
        blob = b"PATH=/usr/bin\0HOME=/home/u\0LANG=C.UTF-8\0" + b"".join(
            f"{k}={v}".encode() + b"\0" for k, v in env.items()
        )
        (d / "environ").write_bytes(blob + b"X=" + b"y" * 2000 + b"\0")  # a realistic 2 KB environment


def readings(pids: list[int]) -> tuple[GpuReading, ...]:
    return tuple(
        GpuReading(index=g, uuid=f"GPU-{g}", up=True,
                   processes=tuple(ProcessReading(pid, "python3", GIB, user="alice", sm_utilization_ratio=0.5)
                                   for pid in pids[g * PER_GPU:(g + 1) * PER_GPU]))
        for g in range(GPUS)
    )  # fmt: skip


@contextmanager
def fake_engine(path: Path) -> Iterator[None]:
    """Answers Docker's inspect call with a name, on a unix socket, from its own thread."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(64)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                cid = request.split(b" ", 2)[1].split(b"/")[2].decode() if request else ""
                # The container's init is the process laid out with its ID (cgroup_of): the engine
                # vouches for the processes whose cgroup is that process's.
                init = FIRST_PID + int(cid, 16) if cid else 0
                body = json.dumps({"Id": cid, "Name": f"/c-{cid[-4:]}", "State": {"Pid": init},
                                   "Config": {"Env": ["X=" + "y" * 4000]}})  # fmt: skip
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        server.close()


def attributor(root: Path, maps: Path, sock: Path) -> HolderAttributor:
    names = EngineNames({"docker": str(sock), "podman": str(sock)}, proc_root=str(root))
    return HolderAttributor(mapping=JobMappingDir(str(maps), settle=0.0), job_from_cgroup=True, containers=True,
                            names=names, proc_root=str(root), user_of_uid=lambda uid: f"u{uid}")  # fmt: skip


def cpu_ms(fn: Any) -> float:
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) * 1000


def summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": statistics.median(xs), "p90_ms": xs[int(len(xs) * 0.9) - 1], "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--polls", type=int, default=500)
    args = ap.parse_args()
    configure_logging("json", "error")
    results: dict[str, Any] = {"machine": machine(), "gpus": GPUS, "processes": GPUS * PER_GPU}
    with tempfile.TemporaryDirectory(prefix="holders-bench-") as tmp:
        root, maps, sock = Path(tmp) / "proc", Path(tmp) / "map", Path(tmp) / "engine.sock"
        maps.mkdir()
        for g in range(GPUS):
            (maps / str(g)).write_text(f"{5000 + g * 3}\n" if g < 3 else "")
        pids = list(range(FIRST_PID, FIRST_PID + GPUS * PER_GPU))
        lay_out(root, pids)
        with fake_engine(sock):
            # First sight: a fresh attributor each time, every process and name new.
            first, first_all, named = [], [], 0
            for _ in range(30):
                new = attributor(root, maps, sock)
                t0 = time.process_time()
                first.append(cpu_ms(lambda new=new: new.attach(readings(pids))))
                # The names come from the engine worker's thread: its CPU counts in the process's.
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    seen = new.attach(readings(pids))
                    named = sum(1 for g in seen for p in g.processes if p.container and p.container.name)
                    if named == 32:
                        break
                    time.sleep(0.01)
                first_all.append((time.process_time() - t0) * 1000)
                new.close()
            a = attributor(root, maps, sock)
            snapshot = readings(pids)
            a.attach(snapshot)
            steady = [cpu_ms(lambda: a.attach(snapshot)) for _ in range(args.polls)]
            # Churn: 8 new processes each poll, laid out beforehand (the writing is not the exporter's).
            batches = []
            for k in range(1, args.polls // 5 + 1):
                fresh = [p + k * 1000 for p in pids[:8]]
                for n, pid in enumerate(fresh):
                    text, env = cgroup_of(n)
                    d = root / str(pid)
                    d.mkdir(parents=True, exist_ok=True)
                    (d / "cgroup").write_text(text)
                    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
                batches.append(readings(fresh + pids[8:]))
            churn = [cpu_ms(lambda b=b: a.attach(b)) for b in batches]
            a.close()
        # Real /proc: 64 sleeping children of this process, steady.
        children = [subprocess.Popen(["sleep", "600"]) for _ in range(GPUS * PER_GPU)]
        try:
            real = HolderAttributor(mapping=JobMappingDir(str(maps), settle=0.0), job_from_cgroup=True,
                                    containers=True, names=EngineNames({}))  # fmt: skip
            snap = readings([c.pid for c in children])
            real_first = cpu_ms(lambda: real.attach(snap))
            real_steady = [cpu_ms(lambda: real.attach(snap)) for _ in range(args.polls)]
        finally:
            for c in children:
                c.kill()
                c.wait()
    results["figures"] = {
        "steady": summary(steady),
        "churn_8_new_per_poll": summary(churn),
        "first_sight_64_new_32_names": summary(first),
        "first_sight_until_32_named_process_cpu": summary(first_all),
        "named_at_first_sight": named,
        "real_proc_steady": summary(real_steady),
        "real_proc_first_sight_ms": real_first,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "holders.json").write_text(json.dumps(results, indent=2) + "\n")
    f = results["figures"]
    m = results["machine"]
    lines = [
        "# Cost of attributing Slurm jobs and containers",
        "",
        "8 GPUs, 64 processes (24 in Slurm jobs, v2 layout; 8 in v1; 16 Docker, 16 Podman containers), 8 mapping "
        "files; CPU of the poller's thread (`time.thread_time`), medians.",
        "",
        f"Machine: {machine_line(m)}.",
        "",
        "| poll | median | p90 | polls |",
        "|---|---|---|---|",
        f"| steady: the same 64 processes, the 8 files read | {f['steady']['median_ms']:.3f} ms | "
        f"{f['steady']['p90_ms']:.3f} ms | {f['steady']['n']} |",
        f"| churn: 8 of 64 processes new each poll | {f['churn_8_new_per_poll']['median_ms']:.3f} ms | "
        f"{f['churn_8_new_per_poll']['p90_ms']:.3f} ms | {f['churn_8_new_per_poll']['n']} |",
        f"| first sight: 64 new, 32 names asked over a unix socket by the engine worker | "
        f"{f['first_sight_64_new_32_names']['median_ms']:.2f} ms | {f['first_sight_64_new_32_names']['p90_ms']:.2f} ms "
        f"| {f['first_sight_64_new_32_names']['n']} |",
        f"| first sight until all {f['named_at_first_sight']} containers are named, the whole process's CPU "
        f"(the worker's asks and init cgroups included) | "
        f"{f['first_sight_until_32_named_process_cpu']['median_ms']:.2f} ms | "
        f"{f['first_sight_until_32_named_process_cpu']['p90_ms']:.2f} ms | "
        f"{f['first_sight_until_32_named_process_cpu']['n']} |",
        f"| real /proc, 64 sleeping processes, steady | {f['real_proc_steady']['median_ms']:.3f} ms | "
        f"{f['real_proc_steady']['p90_ms']:.3f} ms | {f['real_proc_steady']['n']} (first sight {real_first:.2f} ms) |",
        "",
        "Target: about 1 ms of CPU per poll for 64 processes. Per-process facts are read once per process and "
        "names once per container (asked by the engine worker, off the poll), "
        "so a poll costs the mapping files and a lookup per process; the first sight "
        "of a process costs reading its cgroup and environment. Nothing of this runs on a scrape.",
        "",
    ]
    (RESULTS / "holders.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
