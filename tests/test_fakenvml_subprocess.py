"""The fake as a subprocess sees it: found through LD_LIBRARY_PATH, or not there at all."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fakenvml import Scenario, build_library, run_python, start, subprocess_env
from tests.fakenvml.build import SONAME
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration


def one_gpu(scenario: Scenario) -> Scenario:
    scenario.add_gpu().identity("NVIDIA T4", "GPU-00000000-0000-0000-0000-000000000001").utilization(42, 7)
    scenario.write()
    return scenario


def test_library_is_found_through_ld_library_path_by_its_soname(scenario: Scenario) -> None:
    one_gpu(scenario)
    out = run_python(
        "import pynvml as N; N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0);"
        "print(N.nvmlDeviceGetName(h), N.nvmlDeviceGetUtilizationRates(h).gpu)",
        scenario.path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "NVIDIA T4 42"


def test_soname(fake_nvml_lib: Path) -> None:
    readelf = shutil.which("readelf")
    assert readelf, "binutils' readelf comes with gcc"
    dyn = subprocess.run([readelf, "-d", str(fake_nvml_lib)], capture_output=True, text=True, check=True).stdout
    assert f"Library soname: [{SONAME}]" in dyn


def test_no_library_at_all_then_the_driver_is_installed(scenario: Scenario, tmp_path: Path) -> None:
    """No libnvidia-ml.so.1 anywhere: LIBRARY_NOT_FOUND; once it appears, the same process recovers."""
    one_gpu(scenario)
    empty = tmp_path / "driver"
    empty.mkdir()
    code = textwrap.dedent("""
        import pynvml as N, sys
        try:
            N.nvmlInit()
        except N.NVMLError_LibraryNotFound:
            print("not found", flush=True)
        sys.stdin.readline()   # the test installs the library meanwhile
        N.nvmlInit()
        print(N.nvmlDeviceGetCount())
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=subprocess_env(scenario.path, library_dir=empty),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "not found"
    shutil.copy(build_library(), empty / SONAME)
    out, err = proc.communicate("\n", timeout=NEVER_S)
    assert proc.returncode == 0, err
    assert out.strip() == "1"


def test_driver_not_loaded_and_no_permission_at_init(scenario: Scenario) -> None:
    one_gpu(scenario)
    for err in ("DRIVER_NOT_LOADED", "NO_PERMISSION"):
        scenario.init_error = err
        scenario.write()
        out = run_python(
            "import pynvml as N\ntry:\n    N.nvmlInit()\nexcept N.NVMLError as e:\n    print(e.value, e)", scenario.path
        )
        assert out.returncode == 0, out.stderr
        code = {"DRIVER_NOT_LOADED": 9, "NO_PERMISSION": 4}[err]
        text = {"DRIVER_NOT_LOADED": "Driver Not Loaded", "NO_PERMISSION": "Insufficient Permissions"}[err]
        assert out.stdout.strip() == f"{code} {text}"


def test_a_running_process_sees_the_scenario_change(scenario: Scenario) -> None:
    one_gpu(scenario)
    code = textwrap.dedent("""
        import pynvml as N, sys
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        for line in sys.stdin:
            print(N.nvmlDeviceGetUtilizationRates(h).gpu, flush=True)
    """)
    proc = start([sys.executable, "-c", code], scenario.path, stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "42"
        scenario.gpu(0).utilization(99, 1)
        scenario.write()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "99"
    finally:
        proc.kill()
        proc.communicate(timeout=NEVER_S)


def test_malformed_file_in_a_subprocess_reports_on_stderr(scenario: Scenario) -> None:
    one_gpu(scenario)
    scenario.path.write_text(scenario.path.read_text().replace("util.gpu = 42", "util.gpu = 4 2"))
    # An init that waited for the file to be fixed would miss run_python's timeout (NEVER_S).
    out = run_python("import pynvml as N\nN.nvmlInit()", scenario.path, timeout=NEVER_S)
    assert out.returncode != 0
    assert f"{scenario.path}:" in out.stderr and "util.gpu" in out.stderr
    assert "NVMLError_Unknown" in out.stderr
