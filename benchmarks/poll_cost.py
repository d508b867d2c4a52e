"""CPU per poll and resident memory, this tree against another revision, side by side.

Each round starts one fresh daemon process per tree against the same fake NVML scenario (8 H100s
with 20 ms PCIe sampling and 64 real processes by default), lets it discover the GPUs, then times
``--polls`` polls one by one: process CPU (all threads) of ``poll()`` plus ``publish()`` (rules,
accounting, self-metrics; /metrics is rendered only when scraped, so not here). Rounds alternate
the trees (A B B A ...), so load from other work on the machine falls on both alike. Reported:
medians over all polls of all rounds, the ratio, RSS after the polls, and (``--profile``) a
cProfile summary of this tree's polls.

    .venv/bin/python benchmarks/poll_cost.py --against 16c1b37
    .venv/bin/python benchmarks/poll_cost.py --gpus 8 --processes 64 --profile results/poll-profile.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import ROOT, Children, log, machine, machine_line

sys.path.insert(0, str(ROOT))
from tests.fakenvml import Scenario, subprocess_env
from tests.fakenvml.presets import GIB, gpu_uuid, h100_sxm, mig_uuid

HARNESS = r"""
import cProfile, json, os, pstats, statistics, sys, time, io
from gpu_exporter.settings.config import load_settings
from gpu_exporter.daemon import Daemon
from gpu_exporter.logs import configure_logging
from gpu_exporter.sources.nvml import NvmlBackend

configure_logging("json", "warning")
polls, profile_to, extra = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
settings = load_settings({"web_listen_address": "127.0.0.1:0", "poll_interval": 3600, **extra})
d = Daemon(settings, NvmlBackend)
for _ in range(3):
    d.poll_once()  # discovery, static facts, first process names, GPM's first sample
prof = cProfile.Profile() if profile_to else None
cpus, walls, pub = [], [], []
for _ in range(polls):
    if prof: prof.enable()
    c0, w0 = time.process_time(), time.perf_counter()
    s = d.poller.poll()
    w1, cp = time.perf_counter(), time.process_time()
    d.publish(s)
    c1 = time.process_time()
    if prof: prof.disable()
    cpus.append(c1 - c0)
    walls.append(w1 - w0)
    pub.append(c1 - cp)
    time.sleep(0.02)
# Where a poll's CPU goes: the same reads made one after another in this thread, so what is left
# of the poll is the hand-over to and from the per-GPU reader threads.
one_thread = []
try:
    be, statics = d.poller._backend, [v[0] for _, v in sorted(d.poller._statics.items())]
    for _ in range(polls):
        c0 = time.process_time()
        for st in statics:
            be.read_gpu(st)
        one_thread.append(time.process_time() - c0)
        time.sleep(0.02)
except AttributeError:  # an older tree without these internals
    pass
snap = d.latest
assert snap is not None and all(g.up for g in snap.gpus), "a GPU is down"
if prof:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(40)
    with open(profile_to, "w") as f:
        f.write(s.getvalue())
rss = 0.0
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
print(json.dumps({"gpus": len(snap.gpus), "cpu_ms": [c * 1000 for c in cpus], "wall_ms": [w * 1000 for w in walls],
                  "publish_ms": [c * 1000 for c in pub], "reads_one_thread_ms": [c * 1000 for c in one_thread],
                  "rss_mib": rss, "modules": len(sys.modules)}), flush=True)
"""


def build(path: Path, gpus: int, processes: int, pids: list[int], mig: int = 0) -> Scenario:
    s = Scenario(path)
    per_gpu = processes // gpus if gpus else 0
    extra = processes - per_gpu * gpus
    k = 0
    for i in range(gpus):
        g = s.add_gpu()
        n = per_gpu + (1 if i < extra else 0)
        if mig:
            g.identity("NVIDIA A100-SXM4-80GB", gpu_uuid("cost-mig", i))
            g.pci(f"00000000:{i // 256:02X}:{i % 256:02X}.0").memory(80 * GIB, 40 * GIB).mig_mode(True, max_devices=7)
            g.pcie(gen=4, max_gen=4, width=16, max_width=16, tx_kbps=1000, rx_kbps=1000)
            g.temperature(50).power(300_000, 400_000)
            for m in range(mig):
                g.add_mig("NVIDIA A100-SXM4-80GB MIG 1g.10gb", mig_uuid("cost-mig", i, m), 7 + m, 0).memory(
                    10 * GIB, 5 * GIB
                )
            for p in range(n):
                g.add_process(pids[k], GIB, gpu_instance_id=7 + p % mig, compute_instance_id=0)
                k += 1
        else:
            h100_sxm(g, "cost", i, util=60 + i % 30, mem_used=60 * GIB, power_mw=500_000)
            for p in range(n):
                g.add_process(pids[k], 64 * 1024**2 * (1 + p))
                k += 1
    s.write()
    return s


def checkout(rev: str, into: Path) -> Path:
    """The package of ``rev``, extracted (no work tree of the repository is touched)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gpu_exporter"], check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def measure(children: Children, tree: Path, scn: Scenario, polls: int, profile_to: str,
            extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    env = subprocess_env(scn.path)
    env["PYTHONPATH"] = str(tree)
    with tempfile.TemporaryFile() as err:
        proc = children.start([sys.executable, "-c", HARNESS, str(polls), profile_to, json.dumps(extra)], env=env,
                              stdout=subprocess.PIPE, stderr=err, cwd=tree)  # fmt: skip
        out, _ = proc.communicate(timeout=120 + polls * 2)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(err.read().decode(errors="replace")[-3000:])
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def compare(trees: dict[str, Path], *, gpus: int, processes: int, mig: int, polls: int, rounds: int,
            extra: dict[str, Any], profile: Path | None) -> dict[str, Any]:  # fmt: skip
    names = list(trees)
    keys = ("cpu_ms", "wall_ms", "publish_ms", "reads_one_thread_ms")
    samples: dict[str, dict[str, list[float]]] = {n: {k: [] for k in (*keys, "rss_mib")} for n in names}
    with tempfile.TemporaryDirectory(prefix="poll-cost-") as tmp, Children() as children:
        pids = [children.start(["sleep", "3600"]).pid for _ in range(processes)]
        scn = build(Path(tmp) / "cost.scn", gpus, processes, pids, mig)
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for n in order:
                prof = str(profile) if profile is not None and n == names[0] and r == 0 else ""
                res = measure(children, trees[n], scn, polls, prof, extra)
                for k in keys:
                    samples[n][k] += res.get(k, [])
                samples[n]["rss_mib"].append(res["rss_mib"])
                log(f"poll_cost: {n} round {r}: cpu {statistics.median(res['cpu_ms']):.2f} ms/poll, "
                    f"rss {res['rss_mib']:.1f} MiB")  # fmt: skip
    out: dict[str, Any] = {"gpus": gpus, "processes": processes, "mig": mig, "polls": polls, "rounds": rounds}
    for n in names:
        out[n] = {k: statistics.median(v) for k, v in samples[n].items() if v}
        out[n]["cpu_p90_ms"] = sorted(samples[n]["cpu_ms"])[int(0.9 * len(samples[n]["cpu_ms"]))]
    if len(names) == 2:
        out["cpu_ratio"] = out[names[0]]["cpu_ms"] / out[names[1]]["cpu_ms"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", help="git revision to compare with (extracted with git archive)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes", type=int, default=64)
    ap.add_argument("--mig", type=int, default=0, help="MIG devices per GPU (A100s)")
    ap.add_argument("--polls", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--profile", type=Path, help="write a cProfile summary of this tree's first round here")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="poll-cost-rev-") as revdir:
        trees = {"this tree": ROOT}
        if args.against:
            trees[args.against] = checkout(args.against, Path(revdir))
        res = compare(trees, gpus=args.gpus, processes=args.processes, mig=args.mig, polls=args.polls,
                      rounds=args.rounds, extra={}, profile=args.profile)  # fmt: skip
    res["machine"] = machine()
    print(machine_line(res["machine"]))
    print(json.dumps({k: v for k, v in res.items() if k != "machine"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --- the benchmarks/run stage: the targets of issue 17, and the scale curve -------------------------

CURVE = ((1, 8, 0), (8, 64, 0), (16, 128, 0), (64, 512, 0), (128, 1024, 0), (8, 56, 7))  # GPUs, processes, MIG
CPU_PER_POLL_MS = 3.0  # 8 GPUs, 64 processes


def stage(*, against: str, polls: int, rounds: int, out_svg: Path) -> dict[str, Any]:
    """Side by side with ``against`` at 8 GPUs and 64 processes, then the curve for this tree alone."""
    res: dict[str, Any] = {"against": against}
    with tempfile.TemporaryDirectory(prefix="poll-cost-rev-") as revdir:
        trees = {"this tree": ROOT, against: checkout(against, Path(revdir))}
        res["side_by_side"] = compare(trees, gpus=8, processes=64, mig=0, polls=polls, rounds=rounds, extra={},
                                      profile=None)  # fmt: skip
    curve = []
    for gpus, processes, mig in CURVE:
        r = compare({"this tree": ROOT}, gpus=gpus, processes=processes, mig=mig, polls=polls, rounds=1,
                    extra={}, profile=None)  # fmt: skip
        curve.append({"gpus": gpus, "processes": processes, "mig": mig, **r["this tree"]})
    res["curve"] = curve
    plain = [c for c in curve if not c["mig"]]
    per_gpu = [c["cpu_ms"] / c["gpus"] for c in plain if c["gpus"] >= 8]
    res["per_gpu_spread"] = max(per_gpu) / min(per_gpu)
    write_svg(curve, out_svg)
    ours = res["side_by_side"]["this tree"]["cpu_ms"]
    res["targets"] = {
        "cpu_per_poll": {"met": ours <= CPU_PER_POLL_MS, "target": f"<= {CPU_PER_POLL_MS:g} ms CPU per poll, 8 GPUs, "
                         "64 processes (poll + rules + books; no scrape)",
                         "figure": f"{ours:.2f} ms (before, {against}: "
                                   f"{res['side_by_side'][against]['cpu_ms']:.2f} ms; ratio "
                                   f"{res['side_by_side']['cpu_ratio']:.2f}x)"},
        "scale_linear": {"met": res["per_gpu_spread"] <= 1.5, "target": "CPU per poll linear in GPUs (8 to 128), "
                         "no step: CPU per GPU within 1.5x across sizes",
                         "figure": ", ".join(f"{c['gpus']}: {c['cpu_ms'] / c['gpus']:.2f} ms/GPU" for c in plain)
                                   + f" (spread {res['per_gpu_spread']:.2f}x)"},
    }  # fmt: skip
    return res


def write_svg(curve: list[dict[str, Any]], out: Path) -> None:
    """CPU per poll against GPUs, as a plain SVG (no plotting library needed)."""
    plain = [c for c in curve if not c["mig"]]
    w, h, m = 560, 360, 50
    xmax = max(c["gpus"] for c in plain)
    ymax = max(c["cpu_ms"] for c in curve) * 1.1

    def xy(g: float, ms: float) -> tuple[float, float]:
        return m + (w - 2 * m) * g / xmax, h - m - (h - 2 * m) * ms / ymax

    pts = " ".join("{:.1f},{:.1f}".format(*xy(c["gpus"], c["cpu_ms"])) for c in plain)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             'font-size="11">', f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
             f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">GPUs (H100, 8 processes each)</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">'
             'CPU per poll, ms (median)</text>',
             f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="13">gpu-exporter: CPU per poll vs GPUs '
             '(fake NVML)</text>']  # fmt: skip
    for c in curve:
        x, y = xy(c["gpus"], c["cpu_ms"])
        colour = "#d62728" if c["mig"] else "#1f77b4"
        label = f"{c['gpus']}x{c['mig']} MIG" if c["mig"] else str(c["gpus"])
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>')
        parts.append(f'<text x="{x + 6:.1f}" y="{y - 6:.1f}" fill="{colour}">{label}: {c["cpu_ms"]:.1f} ms</text>')
    for i in range(5):
        ms = ymax * i / 4
        parts.append(f'<text x="{m - 6}" y="{xy(0, ms)[1] + 4:.1f}" text-anchor="end">{ms:.0f}</text>')
    parts.append("</svg>")
    out.write_text("\n".join(parts) + "\n")


def markdown(res: dict[str, Any], svg: str | None) -> list[str]:
    sbs = res["side_by_side"]
    a = res["against"]
    lines = [
        "## CPU per poll (issue 17)",
        "",
        f"Fresh daemons against the same fake NVML (8 H100s, 20 ms PCIe sampling, 64 real processes), this tree "
        f"and {a} alternately, {sbs['rounds']} rounds of {sbs['polls']} polls each; process CPU (all threads) of "
        "one poll plus its publication (rules, books, self-metrics). /metrics is rendered only when scraped, so "
        "not here. Medians.",
        "",
        "| tree | CPU per poll (p90) | poll wall | RSS after the polls |",
        "|---|---|---|---|",
    ]
    for name in ("this tree", a):
        t = sbs[name]
        lines.append(f"| {name} | {t['cpu_ms']:.2f} ms ({t['cpu_p90_ms']:.2f}) | {t['wall_ms']:.1f} ms | "
                     f"{t['rss_mib']:.1f} MiB |")  # fmt: skip
    t = sbs["this tree"]
    lines += [
        "",
        f"Ratio this tree / {a}: {sbs['cpu_ratio']:.2f}x.",
        "",
        "Where this tree's CPU per poll goes (medians of the same rounds):",
        "",
        "| part | CPU |",
        "|---|---|",
        f"| reading the GPUs: the same reads one after another in one thread | {t['reads_one_thread_ms']:.2f} ms |",
        f"| handing the reads to the per-GPU reader threads and back (poll minus the above) | "
        f"{t['cpu_ms'] - t['publish_ms'] - t['reads_one_thread_ms']:.2f} ms |",
        f"| publishing: rules, books, self-metrics | {t['publish_ms']:.2f} ms |",
        "",
        "| GPUs | processes | MIG per GPU | CPU per poll | per GPU | poll wall |",
        "|---|---|---|---|---|---|",
    ]
    for c in res["curve"]:
        lines.append(f"| {c['gpus']} | {c['processes']} | {c['mig']} | {c['cpu_ms']:.2f} ms | "
                     f"{c['cpu_ms'] / c['gpus']:.3f} ms | {c['wall_ms']:.1f} ms |")  # fmt: skip
    if svg:
        lines += ["", f"![CPU per poll vs GPUs]({svg})"]
    lines += ["", "| target | figure | met |", "|---|---|---|"]
    for name, t in res["targets"].items():
        lines.append(f"| {name}: {t['target']} | {t['figure']} | {'yes' if t['met'] else '**no**'} |")
    return lines
