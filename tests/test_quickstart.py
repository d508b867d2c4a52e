"""The README's first command, from a fresh checkout: a virtualenv that can run the exporter and holds
no test tools, set up in seconds, saying what it does.

The one test here that creates a virtualenv and installs into it (pip's cache or index must be reachable).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_readme import README, first_commands

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
TEST_TOOLS = ("pytest", "mypy", "ruff", "checkov", "kubectl", "mutmut", "hypothesis")


def fresh_checkout(dest: Path) -> Path:
    """The files a clone has (tracked, as they are in the work tree), nothing built."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())
            (dest / name).chmod(src.stat().st_mode)
    return dest


def test_the_run_only_setup_installs_what_running_needs_and_nothing_more(tmp_path: Path) -> None:
    run_cmd = first_commands()[0]
    setup, _, exporter = run_cmd.partition(" && ")
    assert setup == "bash .ci/setup --run-only" and exporter == ".venv/bin/gpu-exporter --simulate"
    repo = fresh_checkout(tmp_path / "gpu-exporter")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    t0 = time.monotonic()
    out = subprocess.run(["bash", "-c", setup], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    said = out.stdout.splitlines()
    assert said[0].startswith("setup: creating a virtualenv in .venv"), said
    assert any("runtime dependencies" in line for line in said) and "setup: done in" in out.stdout
    assert f'export PATH="{repo}/.venv/bin:$PATH"' in out.stdout, "it says how to put gpu-exporter on PATH"
    assert "project.license" not in out.stderr, "setuptools' license warning is gone"
    bin_dir = repo / ".venv" / "bin"
    assert (bin_dir / "gpu-exporter").exists()
    assert not [t for t in TEST_TOOLS if (bin_dir / t).exists()], "test tools in the run-only virtualenv"
    no_pytest = subprocess.run([bin_dir / "python", "-c", "import pytest"], capture_output=True, timeout=60)
    assert no_pytest.returncode != 0
    # The exporter runs from it, without activating anything, from another directory.
    once = subprocess.run([bin_dir / "gpu-exporter", "--once", "--simulate", "--format", "json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert once.returncode in (0, 1, 2), once.stderr
    assert '"nvml_up": true' in once.stdout
    print(f"run-only setup took {took:.0f} s")  # shown with -s; the README quotes a measured figure
    assert README.read_text().count("bash .ci/setup --run-only") >= 1
