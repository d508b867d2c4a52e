"""The one adapter past nvidia-ml-py's public API (``sources/nvml/bindings.py``), against every
nvidia-ml-py version the project allows: the oldest (``.venv/nvidia-ml-py-oldest``, installed by
.ci/setup) and the newest, each as released and as a release that renamed its private function
lookup would be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakenvml import Scenario, subprocess_env
from tests.test_gpm import OLDEST_NVML, oldest_bindings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import json, pynvml
from gpu_exporter.sources.nvml import bindings
from tests.exporter_helpers import make_poller
out = {"bindings": pynvml.__file__, "private": hasattr(pynvml, "_nvmlGetFunctionPointer")}
pynvml.nvmlInit()
try:
    bindings.c_function("nvmlDeviceGetNoSuchThing")
except pynvml.NVMLError as e:
    out["missing"] = [type(e).__name__, e.value]
try:
    bindings.check(pynvml.NVML_ERROR_NOT_SUPPORTED)
except pynvml.NVMLError as e:
    out["check"] = type(e).__name__
bindings.check(pynvml.NVML_SUCCESS)
pynvml.nvmlShutdown()
poller, errors = make_poller()
g = poller.poll().gpus[0]
poller.close()
out.update(up=g.up, error=g.error, memory_temperature=g.temperature_celsius.get("memory"),
           pcie_total=g.pcie_tx_bytes_total, errors={f"{f}/{e}": n for (f, e), n in errors.counts.items()})
print(json.dumps(out))
"""


def renamed(source: Path, into: Path) -> Path:
    """A copy of the bindings whose private lookup has another name, as a later release may give it."""
    into.mkdir()
    text = (source / "pynvml.py").read_text().replace("_nvmlGetFunctionPointer", "_nvmlFunctionPointerOf")
    (into / "pynvml.py").write_text(text)
    return into


@pytest.mark.parametrize("private", ["as released", "renamed"])
@pytest.mark.parametrize("version", ["newest", "oldest"])
def test_the_adapter_works_with_every_allowed_bindings_version(tmp_path: Path, version: str, private: str) -> None:
    s = Scenario(tmp_path / "node.scn")
    g = s.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-1").temperature(60, memory=71)
    g.pcie(tx_bytes=4096, rx_bytes=1)
    g.violations(power=0, thermal=0, sync_boost=0, board_limit=0, low_utilization=0, reliability=0)
    s.write()
    env = subprocess_env(s.path)
    if version == "newest":
        import pynvml

        source = Path(pynvml.__file__).parent
    else:
        source = oldest_bindings()
    path = source if private == "as released" else renamed(source, tmp_path / "bindings")
    if version == "oldest" or private == "renamed":
        env["PYTHONPATH"] = str(path)
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["bindings"].startswith(str(path))
    assert result["private"] == (private == "as released")
    assert (str(OLDEST_NVML) in result["bindings"]) == (version == "oldest" and private == "as released")
    assert result["missing"] == ["NVMLError_FunctionNotFound", 13]
    assert result["check"] == "NVMLError_NotSupported"
    assert result["up"], result["error"]
    assert (result["memory_temperature"], result["pcie_total"]) == (71.0, 4096)  # read through the adapter
    assert not [k for k in result["errors"] if k.startswith("nvmlDeviceGetFieldValues")], result["errors"]


def test_nothing_else_reaches_past_the_public_api() -> None:
    """Only bindings.py names a private nvidia-ml-py function."""
    offenders = []
    for path in (ROOT / "gpu_exporter").rglob("*.py"):
        text = path.read_text()
        if path.name != "bindings.py" and ("pynvml._" in text or "N._" in text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
