"""What ``benchmarks/run`` runs: gpu-exporter vs nvitop-exporter, scale curves, a simulated fleet.

    .venv/bin/python benchmarks/suite.py --bench-python PY [--py-spy PATH] [--full] [--only STAGE ...]

``--bench-python`` is an interpreter with nvitop-exporter (and optionally matplotlib) installed,
kept apart from the project's virtualenv; benchmarks/run makes it. Writes
benchmarks/results/run.md, run.json and scale.png (run-full.md, run-full.json and scale-full.png
with ``--full``). ``--only`` reruns some stages and keeps the others' results from the last JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import attribution_memory
import fleet
import poll_cost
import scale
import vs_nvitop
from benchlib import RESULTS, ROOT, exit_on_sigterm, log, machine, machine_line, tempdir, which

sys.path.insert(0, str(ROOT))
from tests.fakenvml import build_library

STAGES = ("vs-nvitop", "poll-cost", "attribution-memory", "scale", "fleet")
AGAINST = "16c1b37"  # before issue 17


@dataclass(frozen=True)
class Plan:
    mode: str
    window_s: float  # steady state, side by side
    wrk_s: float  # per wrk cell, side by side
    scale_polls: int
    scale_wrk_s: float
    fleet_nodes: int
    fleet_scrape_s: int
    fleet_window_s: float
    fleet_history_h: float  # backfilled before Prometheus starts; the dashboard's range
    attribution_s: int  # RSS with pod attribution off and on, side by side


SHORT = Plan("short", window_s=40, wrk_s=2, scale_polls=20, scale_wrk_s=2, fleet_nodes=10, fleet_scrape_s=15,
             fleet_window_s=45, fleet_history_h=1, attribution_s=60)  # fmt: skip
FULL = Plan("full", window_s=180, wrk_s=10, scale_polls=60, scale_wrk_s=5, fleet_nodes=50, fleet_scrape_s=15,
            fleet_window_s=240, fleet_history_h=3, attribution_s=180)  # fmt: skip


def fleet_note(plan: dict[str, Any]) -> str:
    if plan["mode"] == "full":
        return ""
    return (f"Short run: {plan['fleet_nodes']} daemons, {plan['fleet_window_s']:g} s and "
            f"{plan.get('fleet_history_h', 0):g} h of "
            "history; `benchmarks/run --full` runs 50 daemons (400 GPUs) for 4 minutes over 3 h of history. "
            "Per-node and per-GPU figures do not depend on the count; rates and query times grow with it.")  # fmt: skip


def report(res: dict[str, Any]) -> str:
    lines = ["# gpu-exporter benchmarks (`benchmarks/run`)", ""]
    for stage in STAGES:
        r = res.get(stage)
        if not r:
            continue
        lines += [
            f"<!-- {stage}: {r['plan']['mode']} run -->",
            "",
            f"Machine: {machine_line(r['machine'])}. Mode: {r['plan']['mode']}.",
            "",
        ]
        if stage == "vs-nvitop":
            lines += vs_nvitop.markdown(r["result"])
        elif stage == "scale":
            lines += scale.markdown(r["result"], r.get("plot"))
        elif stage == "poll-cost":
            lines += poll_cost.markdown(r["result"], r.get("plot"))
        elif stage == "attribution-memory":
            lines += attribution_memory.markdown(r["result"]).replace("# RSS with", "## RSS with", 1).splitlines()
        else:
            lines += fleet.markdown(r["result"], fleet_note(r["plan"]))
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-python", type=Path, required=True, help="interpreter with nvitop-exporter installed")
    ap.add_argument("--py-spy", type=Path, default=None, help="py-spy, to profile where a target is missed")
    ap.add_argument("--full", action="store_true", help="the longer run (about 15 minutes)")
    ap.add_argument("--only", action="append", choices=STAGES, help="run only these stages (repeatable)")
    args = ap.parse_args()
    exit_on_sigterm()
    for tool in ("wrk", "prometheus"):
        which(tool)
    plan = FULL if args.full else SHORT
    stages = args.only or list(STAGES)
    build_library()
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "run-full" if args.full else "run"  # a full run does not overwrite the short run's results
    out_json = RESULTS / f"{stem}.json"
    res: dict[str, Any] = json.loads(out_json.read_text()) if args.only and out_json.exists() else {}
    for stage in stages:
        log(f"stage {stage} ({plan.mode})")
        entry: dict[str, Any] = {"machine": machine(), "plan": asdict(plan)}
        with tempdir(f"gpu-exporter-bench-{stage}-") as tmp:
            if stage == "vs-nvitop":
                entry["result"] = vs_nvitop.run(tmp, window_s=plan.window_s, wrk_s=plan.wrk_s,
                                                bench_python=args.bench_python, py_spy=args.py_spy)  # fmt: skip
            elif stage == "poll-cost":
                svg = RESULTS / f"poll-cost{'-full' if args.full else ''}.svg"
                entry["result"] = poll_cost.stage(against=AGAINST, polls=plan.scale_polls,
                                                  rounds=4 if args.full else 2, out_svg=svg)  # fmt: skip
                entry["plot"] = svg.name
            elif stage == "attribution-memory":
                settings = argparse.Namespace(seconds=plan.attribution_s, pods=200, h100=False, flat_limit=0.1)
                entry["result"] = attribution_memory.run(settings, tmp)
            elif stage == "scale":
                entry["result"] = scale.run(tmp, polls=plan.scale_polls, wrk_s=plan.scale_wrk_s)
                png = RESULTS / f"scale{'-full' if args.full else ''}.png"
                if scale.plot(entry["result"], args.bench_python, tmp, png):
                    entry["plot"] = png.name
            else:
                entry["result"] = fleet.run(tmp, nodes=plan.fleet_nodes, scrape_s=plan.fleet_scrape_s,
                                            window_s=plan.fleet_window_s, history_h=plan.fleet_history_h)  # fmt: skip
        res[stage] = entry
        out_json.write_text(json.dumps(res, indent=2, default=str))  # after each stage: a timeout keeps the rest
    text = report(res)
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
