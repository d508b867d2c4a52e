"""A golden /metrics page (issue 51, item 4): the shape of what one H100 node serves, checked in at
tests/golden/metrics_h100.txt, so that a change to any metric (a name, its HELP, its type, its labels,
how many series it has) is one reviewed diff in the change that makes it, not a surprise on a
dashboard.  The values are left out: they follow the clock.

After a deliberate change, write the page anew and review its diff:

    GOLDEN_UPDATE=1 .venv/bin/python -m pytest tests/test_metrics_golden.py
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from gpu_exporter.cli import make_backend
from gpu_exporter.daemon import Daemon
from gpu_exporter.settings.config import load_settings
from tests.fakenvml import Scenario
from tests.fakenvml.presets import GIB, h100_sxm

GOLDEN = Path(__file__).resolve().parent / "golden" / "metrics_h100.txt"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def node(scenario: Scenario) -> None:
    """One H100 SXM at work: 8 processes, as the README's series table counts them."""
    g = h100_sxm(scenario.add_gpu(), "golden", 0, util=80, mem_used=60 * GIB, power_mw=500_000)
    # Pids above Linux's PID_MAX_LIMIT (2^22): never a process of the host, whose user the exporter would
    # read from /proc (CI's machine had one of 20,000-20,007, and the page a second holder).
    for p in range(8):
        g.add_process(4_198_700 + p, GIB * (1 + p), name="python3", sm=50, mem=20)
    scenario.write()


def shape(body: str) -> str:
    """Each family's HELP and TYPE, then each set of label names its samples carry, with how many
    samples carry it: everything of the page but the values and label values."""
    out: list[str] = []
    counts: dict[str, int] = defaultdict(int)
    for line in body.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            out += [f"{name} {n}" for name, n in sorted(counts.items())]
            counts.clear()
            out.append(line)
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = ",".join(sorted(_LABEL.findall(m.group(3) or "")))
        counts[f"  {m.group(1)}{{{labels}}}"] += 1
    out += [f"{name} {n}" for name, n in sorted(counts.items())]
    return "\n".join(out) + "\n"


def test_the_metrics_page_of_an_h100_node_is_the_reviewed_one(nvml: Any, scenario: Scenario) -> None:
    node(scenario)
    settings = load_settings({"profiling_interval": 0.1, "node_name": "golden-node"})
    daemon = Daemon(settings, lambda errors: make_backend(settings, errors))
    try:
        for i in range(2):
            if i:
                time.sleep(0.15)  # GPM diffs two samples at least 0.1 s apart
            snap = daemon.poll_once()
            assert snap.nvml_up and all(g.up for g in snap.gpus)
        got = shape(daemon.exposition.body().decode())
    finally:
        daemon.poller.close()
    if os.environ.get("GOLDEN_UPDATE"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(got)
    want = GOLDEN.read_text()
    assert got == want, (
        "the /metrics page changed: if that is meant, write it anew with GOLDEN_UPDATE=1 (module docstring) and "
        "review the diff of tests/golden/metrics_h100.txt"
    )


def test_the_shape_keeps_names_labels_and_counts_but_no_values() -> None:
    page = (
        '# HELP gpu_x_ratio X.\n# TYPE gpu_x_ratio gauge\ngpu_x_ratio{gpu="0",uuid="GPU-a"} 0.5\n'
        'gpu_x_ratio{gpu="1",uuid="GPU-b"} 0.7\ngpu_x_ratio{gpu="1"} 1\n'
        '# HELP gpu_y_total Y.\n# TYPE gpu_y_total counter\ngpu_y_total{gpu="0",why="a \\" b"} 3\n'
    )
    assert shape(page) == (
        "# HELP gpu_x_ratio X.\n# TYPE gpu_x_ratio gauge\n  gpu_x_ratio{gpu,uuid} 2\n  gpu_x_ratio{gpu} 1\n"
        "# HELP gpu_y_total Y.\n# TYPE gpu_y_total counter\n  gpu_y_total{gpu,why} 1\n"
    )
