"""Cost of pod attribution: 8 GPUs x 7 MIG devices and 100 pods, against a fake kubelet.

Polls the fake NVML with attribution off and on, alternately in one run, and times the join
itself. The target is < 5 ms added to a poll and nothing added to a scrape: the join runs once
per poll on the poller's thread, and a scrape copies the bytes rendered then.

    .venv/bin/python benchmarks/attribution.py [--polls 60]

Writes benchmarks/results/attribution.md and attribution.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_exporter.kubernetes.attribution import Attributor  # noqa: E402
from gpu_exporter.kubernetes.kubelet import PodResourcesWatcher  # noqa: E402
from gpu_exporter.logs import configure_logging  # noqa: E402
from gpu_exporter.serving.metrics import RenderOptions, gpu_families  # noqa: E402
from gpu_exporter.sources.nvml import NvmlBackend  # noqa: E402
from gpu_exporter.sources.poller import Poller  # noqa: E402
from tests.fake_kubelet import fake_kubelet, pod  # noqa: E402
from tests.fakenvml import Scenario, load_in_process  # noqa: E402
from tests.fakenvml.presets import gpu_uuid, mig_uuid  # noqa: E402

GIB = 1024**3
RESULTS = ROOT / "benchmarks" / "results"


def scenario(path: Path, pids: list[int]) -> Scenario:
    s = Scenario(path)
    for i in range(8):
        g = s.add_gpu().identity("NVIDIA A100-SXM4-80GB", gpu_uuid("bench-mig", i))
        g.pci(f"00000000:{0x10 + i:02X}:00.0").memory(80 * GIB, 40 * GIB).mig_mode(True, max_devices=7)
        g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=1000, rx_kbps=1000)
        for m in range(7):
            g.add_mig("NVIDIA A100-SXM4-80GB MIG 1g.10gb", mig_uuid("bench-mig", i, m), 7 + m, 0).memory(
                10 * GIB, 5 * GIB
            )
    # 100 pods over the 56 MIG devices (time-sliced where two share one), one process each.
    for n, pid in enumerate(pids):
        gpu, mig = (n // 7) % 8, n % 7
        s.gpu(gpu).add_process(pid, GIB, gpu_instance_id=7 + mig, compute_instance_id=0)
    s.write()
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--polls", type=int, default=60)
    args = ap.parse_args()
    configure_logging("json", "warning")
    load_in_process()
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(100)]  # real PIDs: /proc is read for each
    try:
        with tempfile.TemporaryDirectory() as tmp:
            s = scenario(Path(tmp) / "node.scn", [p.pid for p in sleepers])
            os.environ["FAKE_NVML_SCENARIO"] = str(s.path)
            with fake_kubelet(Path(tmp)) as kubelet:
                kubelet.pods = [
                    pod("ml", f"job-{n}", ("main", "nvidia.com/mig-1g.10gb",
                                           [mig_uuid("bench-mig", (n // 7) % 8, n % 7) + f"::{n // 56}"]))
                    for n in range(100)
                ]  # fmt: skip
                watcher = PodResourcesWatcher(str(kubelet.socket_path))
                assert watcher.refresh()
                attributor = Attributor(watcher.devices)
                plain = Poller(NvmlBackend(lambda f, e: None), errors=lambda f, e: None)
                joined = Poller(NvmlBackend(lambda f, e: None), errors=lambda f, e: None, attach=attributor.attach)
                plain.poll()
                joined.poll()
                off: list[float] = []
                on: list[float] = []
                join: list[float] = []
                render_off: list[float] = []
                render_on: list[float] = []
                for _ in range(args.polls):
                    t = time.perf_counter()
                    snap_off = plain.poll()
                    off.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    snap_on = joined.poll()
                    on.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    attributor.attach(snap_off.gpus)
                    join.append(time.perf_counter() - t)
                    for snap, opts, out in ((snap_off, RenderOptions(), render_off),
                                            (snap_on, RenderOptions(pod_labels=("namespace", "pod", "container")),
                                             render_on)):  # fmt: skip
                        t = time.perf_counter()
                        sum(1 for fam in gpu_families(snap, opts) for _ in fam.samples)
                        out.append(time.perf_counter() - t)
                attributed = sum(1 for g in snap_on.gpus for m in g.migs for _ in m.pods)
                plain.close()
                joined.close()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    ms = 1000
    res: dict[str, Any] = {
        "gpus": 8,
        "mig_devices": 56,
        "pods": 100,
        "mig_pod_assignments_in_snapshot": attributed,
        "poll_median_ms_off": statistics.median(off) * ms,
        "poll_median_ms_on": statistics.median(on) * ms,
        "join_median_ms": statistics.median(join) * ms,
        "join_p90_ms": sorted(join)[int(len(join) * 0.9)] * ms,
        "render_median_ms_off": statistics.median(render_off) * ms,
        "render_median_ms_on": statistics.median(render_on) * ms,
        "polls": args.polls,
    }
    text = "\n".join([
        "# Pod attribution cost",
        "",
        f"8 GPUs x 7 MIG devices, 100 pods (time-sliced MIG devices), fake kubelet; {args.polls} polls each way,"
        " alternating.",
        "",
        "| figure | median |",
        "|---|---|",
        f"| poll, attribution off | {res['poll_median_ms_off']:.1f} ms |",
        f"| poll, attribution on | {res['poll_median_ms_on']:.1f} ms |",
        f"| the join alone (p90 {res['join_p90_ms']:.2f} ms) | {res['join_median_ms']:.2f} ms |",
        f"| rendering, without / with pod labels (once per poll, not per scrape) | "
        f"{res['render_median_ms_off']:.1f} / {res['render_median_ms_on']:.1f} ms |",
        "",
        "Target: attribution adds < 5 ms to a poll. A scrape serves the bytes rendered at the poll, so it"
        " costs the same either way.",
        "",
    ])  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "attribution.json").write_text(json.dumps(res, indent=2))
    (RESULTS / "attribution.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
