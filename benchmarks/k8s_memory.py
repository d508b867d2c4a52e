"""Memory of the daemon as the Kubernetes DaemonSet runs it: the figures its request and limit come from.

One daemon, started the way the container starts it (``python -m gpu_exporter --config ...``), in a
memory cgroup of its own, as a pod's container is. It runs with everything that costs memory on:
- pod attribution against a fake kubelet with 200 pods, time-sliced over 8 GPUs x 7 MIG devices
  (56 devices), one real process per pod (idle ``sleep``s, so that /proc has them);
- TLS on its endpoint (the exporter-toolkit web config, as deploy/k8s/examples/tls-auth sets it);
- a poll every second and a TLS scrape every second.

Phases, one after another in the same process:
1. steady: ``--steady`` seconds of polls and scrapes;
2. burst: ``--connections`` TLS connections opened at once, each completing its handshake and
   then holding the socket without a request (the "handshake-only" client), held ``--hold``
   seconds and closed; then as many again, each sending ``GET /metrics``;
3. after: ``--after`` seconds of polls and scrapes again, to see whether memory comes back.

It samples VmRSS every 0.2 s and reads the kernel's own peaks at the end: VmHWM (the process's peak
resident set) and the cgroup's ``memory.max_usage_in_bytes``, which is what a container's memory
limit is compared against (it also counts page cache and kernel memory such as socket buffers).
With ``--limit-mib N`` the cgroup gets that limit, as the pod would, and the run says whether the
daemon survived it (no OOM kill).

    .venv/bin/python benchmarks/k8s_memory.py                       # ~3 minutes; root, cgroup v1 or v2
    .venv/bin/python benchmarks/k8s_memory.py --limit-mib 192       # the same, under the DaemonSet's limit

Writes benchmarks/results/k8s-memory.md and k8s-memory.json (with --limit-mib: k8s-memory-limit.*).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trustme
import yaml
from benchlib import log, machine, machine_line

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fake_kubelet import fake_kubelet, pod  # noqa: E402
from tests.fakenvml import Scenario, subprocess_env  # noqa: E402
from tests.fakenvml.presets import gpu_uuid, mig_uuid  # noqa: E402

GIB = 1024**3
MIB = 1024**2
RESULTS = ROOT / "benchmarks" / "results"
GPUS, MIGS = 8, 7


# --- the node -------------------------------------------------------------------------------------


def node_scenario(path: Path, pids: list[int]) -> Scenario:
    """8 A100s, each split into 7 MIG devices; one process per pod, spread over the 56 devices."""
    s = Scenario(path)
    for i in range(GPUS):
        g = s.add_gpu().identity("NVIDIA A100-SXM4-80GB", gpu_uuid("k8s-mem", i))
        g.pci(f"00000000:{0x10 + i:02X}:00.0").memory(80 * GIB, 40 * GIB).mig_mode(True, max_devices=MIGS)
        g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=1000, rx_kbps=1000)
        for m in range(MIGS):
            g.add_mig("NVIDIA A100-SXM4-80GB MIG 1g.10gb", mig_uuid("k8s-mem", i, m), 7 + m, 0).memory(
                10 * GIB, 5 * GIB
            )
    for n, pid in enumerate(pids):
        gpu, mig = (n // MIGS) % GPUS, n % MIGS
        s.gpu(gpu).add_process(pid, GIB // 4, gpu_instance_id=7 + mig, compute_instance_id=0)
    s.write()
    return s


def kubelet_pods(count: int) -> list[Any]:
    """Pod n holds a time-slicing replica of MIG device n % 56 (several pods share each device)."""
    devices = GPUS * MIGS
    return [
        pod("ml", f"job-{n}", ("main", "nvidia.com/mig-1g.10gb",
                                [mig_uuid("k8s-mem", (n // MIGS) % GPUS, n % MIGS) + f"::{n // devices}"]))
        for n in range(count)
    ]  # fmt: skip


# --- the cgroup -----------------------------------------------------------------------------------


class MemoryCgroup:
    """A memory cgroup (v1 or v2) under this process's own, removed at the end."""

    def __init__(self, limit_bytes: int | None) -> None:
        self.v2 = False
        own = ""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                own = path
                break
            if hierarchy == "0" and controllers == "":
                own, self.v2 = path, True
        mount = Path("/sys/fs/cgroup/unified" if self.v2 and Path("/sys/fs/cgroup/unified").is_dir() else
                     "/sys/fs/cgroup" if self.v2 else "/sys/fs/cgroup/memory")  # fmt: skip
        self.path = mount / own.lstrip("/") / f"gpu-exporter-bench-{os.getpid()}"
        self.path.mkdir()
        if limit_bytes is not None:
            (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))

    def _read(self, v1: str, v2: str) -> str:
        return (self.path / (v2 if self.v2 else v1)).read_text()

    def usage(self) -> int:
        return int(self._read("memory.usage_in_bytes", "memory.current"))

    def peak(self) -> int | None:
        with contextlib.suppress(OSError):
            return int(self._read("memory.max_usage_in_bytes", "memory.peak"))
        return None

    def stat(self) -> dict[str, int]:
        out = {}
        for line in self._read("memory.stat", "memory.stat").splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value)
        return out

    def oom_kills(self) -> int:
        text = self._read("memory.oom_control", "memory.events")
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the cgroup, so that every page it allocates is charged here."""
        return ["/bin/sh", "-c", f'echo $$ > "{self.path / "cgroup.procs"}" && exec "$@"', "sh", *argv]

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Sampler:
    """VmRSS and the cgroup's usage every ``interval`` s, tagged with the phase running."""

    def __init__(self, pid: int, cgroup: MemoryCgroup, interval: float = 0.2) -> None:
        self.pid, self.cgroup, self.interval = pid, cgroup, interval
        self.phase = "start"
        self.samples: list[tuple[float, str, float, float]] = []  # (t, phase, rss MiB, cgroup MiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError, ValueError):
                self.samples.append((time.monotonic() - self._t0, self.phase, status_kib(self.pid, "VmRSS") / 1024,
                                     self.cgroup.usage() / MIB))  # fmt: skip

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _column(self, phase: str, column: int) -> list[float]:
        return [float(s[column]) for s in self.samples if s[1] == phase]

    def peak(self, phase: str, column: int) -> float:
        values = self._column(phase, column)
        return max(values) if values else float("nan")

    def last(self, phase: str, column: int) -> float:
        values = self._column(phase, column)
        return values[-1] if values else float("nan")


# --- clients --------------------------------------------------------------------------------------


def scrape(url: str, ctx: ssl.SSLContext) -> bytes:
    with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
        body: bytes = r.read()
    return body


async def _burst(port: int, ctx: ssl.SSLContext, connections: int, hold: float, request: bool) -> dict[str, int]:
    """``connections`` TLS connections open at once; each holds its socket (or sends one request)."""
    opened: list[asyncio.StreamWriter] = []
    counts = {"handshakes": 0, "failed": 0, "ok_200": 0, "other_status": 0}
    gate = asyncio.Semaphore(64)  # handshakes in flight from this client at a time

    async def one() -> None:
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"), 30
                )
            except (OSError, ssl.SSLError, TimeoutError):
                counts["failed"] += 1
                return
        counts["handshakes"] += 1
        opened.append(writer)
        if request:
            try:
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
                status = await asyncio.wait_for(reader.readline(), 30)
                counts["ok_200" if b" 200 " in status else "other_status"] += 1
            except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError):
                counts["failed"] += 1

    await asyncio.gather(*(one() for _ in range(connections)))
    await asyncio.sleep(hold)
    for w in opened:
        w.close()
    for w in opened:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(w.wait_closed(), 2)
    return counts


def burst(port: int, ctx: ssl.SSLContext, connections: int, hold: float, request: bool) -> dict[str, int]:
    return asyncio.run(_burst(port, ctx, connections, hold, request))


def steady(url: str, ctx: ssl.SSLContext, seconds: float) -> int:
    """One TLS scrape a second (a new connection each, the costlier case) for ``seconds``."""
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        t = time.monotonic()
        scrape(url, ctx)
        n += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    return n


# --- the run --------------------------------------------------------------------------------------


@contextlib.contextmanager
def sleepers(count: int) -> Iterator[list[int]]:
    procs = [subprocess.Popen(["sleep", "3600"]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def wait_listening(logfile: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in logfile.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("event") == "listening":
                    return int(entry["port"])
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited ({proc.returncode}):\n{logfile.read_text()[-3000:]}")
        time.sleep(0.05)
    raise SystemExit("the daemon did not start listening")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--connections", type=int, default=1024, help="TLS connections in the burst (the server's cap)")
    ap.add_argument("--steady", type=float, default=60.0)
    ap.add_argument("--hold", type=float, default=5.0)
    ap.add_argument("--after", type=float, default=30.0)
    ap.add_argument("--limit-mib", type=int, default=None, help="put this memory limit on the cgroup")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("benchmarks/k8s_memory.py needs root (it makes a memory cgroup)")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A container's default is far above 1024 (containerd: 1048576); so is the daemon's here.
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 2 * args.connections + 256:
        raise SystemExit(f"the hard limit on open files ({hard}) is too low for {args.connections} connections")

    cgroup = MemoryCgroup(args.limit_mib * MIB if args.limit_mib else None)
    result: dict[str, Any] = {"machine": machine(), "pods": args.pods, "gpus": GPUS, "mig_devices": GPUS * MIGS,
                              "connections": args.connections, "limit_mib": args.limit_mib}  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="k8s-mem-") as tmpdir, sleepers(args.pods) as pids:
            tmp = Path(tmpdir)
            s = node_scenario(tmp / "node.scn", pids)
            ca = trustme.CA()
            leaf = ca.issue_cert("127.0.0.1")
            leaf.private_key_and_cert_chain_pem.write_to_path(str(tmp / "tls.key"))
            leaf.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
            (tmp / "web.yml").write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "tls.crt",
                                                                                "key_file": "tls.key"}}))  # fmt: skip
            ctx = ssl.create_default_context()
            ca.configure_trust(ctx)
            with fake_kubelet(tmp) as kubelet:
                kubelet.pods = kubelet_pods(args.pods)
                config = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "config.yaml").read_text())
                config["web_listen_address"] = "127.0.0.1:0"
                config["poll_interval"] = "1s"
                config["kubernetes"] = {"pod_attribution": "on", "pod_resources_socket": str(kubelet.socket_path),
                                        "refresh_interval": "1s"}  # fmt: skip
                (tmp / "config.yaml").write_text(yaml.safe_dump(config))
                logfile = tmp / "daemon.log"
                argv = [sys.executable, "-m", "gpu_exporter", "--config", str(tmp / "config.yaml"),
                        "--web.config.file", str(tmp / "web.yml")]  # fmt: skip
                env = subprocess_env(s.path, extra={"NODE_NAME": "bench-node"})
                with open(logfile, "wb") as f:
                    proc = subprocess.Popen(cgroup.wrap(argv), env=env, stderr=f, stdout=subprocess.DEVNULL,
                                            cwd=tmp, start_new_session=True)  # fmt: skip
                try:
                    port = wait_listening(logfile, proc)
                    url = f"https://127.0.0.1:{port}/metrics"
                    with Sampler(proc.pid, cgroup) as sampler:
                        deadline = time.monotonic() + 60
                        while b'pod="job-' not in scrape(url, ctx):
                            if time.monotonic() > deadline:
                                raise SystemExit("no pod labels on /metrics after 60 s")
                            time.sleep(0.5)
                        body = scrape(url, ctx)
                        result["series"] = sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))
                        result["series_with_pod_labels"] = body.count(b'pod="job-')
                        sampler.phase = "steady"
                        log(f"steady: {args.steady:g} s of polls and TLS scrapes, {args.pods} pods")
                        result["steady_scrapes"] = steady(url, ctx, args.steady)
                        sampler.phase = "burst"
                        log(f"burst: {args.connections} handshake-only TLS connections")
                        result["burst_handshake_only"] = burst(port, ctx, args.connections, args.hold, request=False)
                        log(f"burst: {args.connections} TLS connections with a request each")
                        result["burst_with_request"] = burst(port, ctx, args.connections, args.hold, request=True)
                        sampler.phase = "after"
                        log(f"after: {args.after:g} s of polls and TLS scrapes")
                        result["after_scrapes"] = steady(url, ctx, args.after)
                        alive = proc.poll() is None
                    result["survived"] = alive
                    result["oom_kills"] = cgroup.oom_kills()
                    result["vm_hwm_mib"] = status_kib(proc.pid, "VmHWM") / 1024 if alive else None
                    result["cgroup_peak_mib"] = (cgroup.peak() or 0) / MIB or None
                    stat = cgroup.stat()
                    kinds = ("rss", "cache", "anon", "file", "kernel")
                    result["cgroup_stat_end_mib"] = {k: round(stat[k] / MIB, 1) for k in kinds if k in stat}
                    for phase in ("start", "steady", "burst", "after"):
                        result[f"{phase}_rss_peak_mib"] = sampler.peak(phase, 2)
                        result[f"{phase}_cgroup_peak_mib"] = sampler.peak(phase, 3)
                    result["start_rss_mib"] = sampler.samples[0][2] if sampler.samples else None
                    result["end_rss_mib"] = sampler.last("after", 2)
                    result["end_cgroup_mib"] = sampler.last("after", 3)
                finally:
                    if proc.poll() is None:
                        proc.terminate()
                        try:
                            proc.wait(timeout=10)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            proc.wait()
    finally:
        cgroup.remove()
    write(result)
    return 0 if result.get("survived") else 1


def write(r: dict[str, Any]) -> None:
    def mib(v: Any) -> str:
        return f"{v:.1f} MiB" if isinstance(v, float) and v == v else "-"

    name = "k8s-memory-limit" if r["limit_mib"] else "k8s-memory"
    limit = f" under a {r['limit_mib']} MiB cgroup limit" if r["limit_mib"] else ""
    text = "\n".join([
        "# Daemon memory as the DaemonSet runs it",
        "",
        f"{machine_line(r['machine'])}.",
        f"One daemon in its own memory cgroup{limit}: pod attribution with {r['pods']} pods on {r['gpus']} GPUs x 7 MIG"
        f" devices (fake NVML, fake kubelet), TLS on, a poll and a TLS scrape every second;"
        f" {r.get('series', '?')} series, {r.get('series_with_pod_labels', '?')} of them with pod labels.",
        "",
        "| phase | peak RSS | peak cgroup usage |",
        "|---|---|---|",
        f"| start (until pod labels show) | {mib(r.get('start_rss_peak_mib'))} |"
        f" {mib(r.get('start_cgroup_peak_mib'))} |",
        f"| steady, {r.get('steady_scrapes', '?')} scrapes | {mib(r.get('steady_rss_peak_mib'))} |"
        f" {mib(r.get('steady_cgroup_peak_mib'))} |",
        f"| burst of {r['connections']} TLS connections, twice | {mib(r.get('burst_rss_peak_mib'))} |"
        f" {mib(r.get('burst_cgroup_peak_mib'))} |",
        f"| after the burst | {mib(r.get('after_rss_peak_mib'))} (end {mib(r.get('end_rss_mib'))}) |"
        f" {mib(r.get('after_cgroup_peak_mib'))} |",
        "",
        f"Kernel peaks: VmHWM {mib(r.get('vm_hwm_mib'))}, cgroup max usage {mib(r.get('cgroup_peak_mib'))}"
        f" (cgroup memory at the end: {r.get('cgroup_stat_end_mib')}).",
        f"Burst, handshake only: {r.get('burst_handshake_only')}; with a request: {r.get('burst_with_request')}.",
        f"Daemon survived: {r.get('survived')}; OOM kills in its cgroup: {r.get('oom_kills')}.",
        "",
    ])  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(r, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
