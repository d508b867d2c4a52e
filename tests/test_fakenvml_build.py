"""The fake library builds warning-free from the source, and the cache is keyed on its inputs."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import Scenario, build_library
from tests.fakenvml.build import SONAME


@pytest.mark.slow  # a from-scratch gcc build: the whole suite runs it, --fast leaves it out
def test_builds_from_scratch_without_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_BUILD_DIR", str(tmp_path))
    lib = build_library()  # raises BuildError on any gcc warning (-Werror) or message
    assert lib.name == SONAME and lib.parent.parent == tmp_path
    stamp = lib.stat().st_mtime_ns
    assert build_library() == lib and lib.stat().st_mtime_ns == stamp  # cached, not rebuilt


def test_a_missing_compiler_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakenvml import BuildError

    monkeypatch.setenv("FAKE_NVML_BUILD_DIR", str(tmp_path))
    with pytest.raises(BuildError, match="no-such-cc"):
        build_library(compiler="no-such-cc")


def test_unversioned_and_versioned_init_symbols(scenario: Scenario, nvml: Any) -> None:
    """pynvml uses nvmlInitWithFlags; older consumers call nvmlInit or nvmlInit_v2 directly."""
    N = nvml
    scenario.add_gpu().identity("x", "GPU-00000000-0000-0000-0000-000000000001")
    scenario.write()
    lib = ctypes.CDLL(SONAME)
    for symbol in ("nvmlInit", "nvmlInit_v2"):
        assert getattr(lib, symbol)() == N.NVML_SUCCESS
        count = ctypes.c_uint()
        assert lib.nvmlDeviceGetCount(ctypes.byref(count)) == N.NVML_SUCCESS and count.value == 1
        assert lib.nvmlShutdown() == N.NVML_SUCCESS
