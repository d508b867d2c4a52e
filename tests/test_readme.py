"""The README's first commands, and the metrics reference (docs/metrics.md), which lists exactly the metrics the code
can emit."""

from __future__ import annotations

import re
from pathlib import Path

from gpu_exporter.serving.metrics import METRICS

README = Path(__file__).resolve().parent.parent / "README.md"
METRICS_DOC = README.parent / "docs" / "metrics.md"


def test_metrics_reference_matches_the_code() -> None:
    section = METRICS_DOC.read_text().split("# Metrics reference", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (\w+) \| [^|]* \| (.*) \|$", section, flags=re.MULTILINE)
    documented = {name: (mtype, meaning) for name, mtype, meaning in rows}
    assert len(rows) == len(documented), "a metric is listed twice"
    assert documented.keys() == METRICS.keys()
    assert documented == {n: (d.type, d.help) for n, d in METRICS.items()}


def first_commands() -> list[str]:
    first_block = README.read_text().split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in first_block.splitlines() if line and not line.startswith("#")]


def test_readme_leads_with_the_two_commands() -> None:
    """One sets up only what running needs and runs; one sets up everything and runs the tests, as CI does."""
    assert first_commands() == [
        "bash .ci/setup --run-only && .venv/bin/gpu-exporter --simulate",
        "bash .ci/setup && .venv/bin/python -m pytest",
    ]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash .ci/setup\n" in ci and ".venv/bin/python -m pytest" in ci
