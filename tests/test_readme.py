"""The README's first commands, and the metrics reference (docs/metrics.md), generated from the metric declarations."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_exporter.metric_defs import METRICS, reference_table

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parent.parent / "README.md"
METRICS_DOC = README.parent / "docs" / "metrics.md"


def test_metrics_reference_is_generated_from_the_declarations() -> None:
    """docs/metrics.md's table is written by docs/generate.py; a stale one fails here (and so in CI)."""
    out = subprocess.run([sys.executable, str(README.parent / "docs" / "generate.py"), "--check"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = METRICS_DOC.read_text()
    section = text.split("<!-- BEGIN generated", 1)[1].split("<!-- END generated -->", 1)[0]
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (\w+) \|", section, flags=re.MULTILINE)
    assert [name for name, _ in rows] == list(METRICS), "every declared metric, once, in declaration order"
    assert all(mtype == METRICS[name].type for name, mtype in rows)


def test_a_stale_reference_is_caught(tmp_path: Path) -> None:
    """The check compares the whole table: one changed help text makes it fail."""
    spec = importlib.util.spec_from_file_location("generate", README.parent / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = f"intro\n{gen.BEGIN}| `gpu_up` | gauge | old words |\n{gen.END}after\n"
    fresh = gen.generated(text, reference_table())
    assert fresh != text and fresh.startswith("intro\n") and fresh.endswith(f"{gen.END}after\n")
    assert gen.generated(fresh, reference_table()) == fresh


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
