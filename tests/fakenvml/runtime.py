"""Running code against the fake library: in this process, or in a subprocess (the daemon)."""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .build import SONAME, build_library

SCENARIO_ENV = "FAKE_NVML_SCENARIO"

_loaded_in_process: Path | None = None


def load_in_process(library: Path | None = None) -> Path:
    """Make ``CDLL("libnvidia-ml.so.1")`` in this process resolve to the fake.

    LD_LIBRARY_PATH is read once, when a process starts, so it cannot redirect this process.
    Loading the fake by path first works instead: the dynamic loader matches the later load by
    soname against the objects it already has.  Which scenario it serves is read from
    ``$FAKE_NVML_SCENARIO`` at each first ``nvmlInit``.
    """
    global _loaded_in_process
    lib = library or build_library()
    if _loaded_in_process is None:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        _loaded_in_process = lib
    elif _loaded_in_process != lib:
        raise RuntimeError(f"a different fake NVML build is already loaded: {_loaded_in_process}")
    return lib


def subprocess_env(
    scenario: Path,
    *,
    library_dir: Path | None = None,
    base: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """An environment in which a child process finds the fake library and the scenario.

    ``library_dir`` overrides where the library is looked for: an empty directory models a host
    with no NVIDIA driver at all (pynvml then raises LIBRARY_NOT_FOUND).
    """
    env = dict(os.environ if base is None else base)
    lib_dir = library_dir if library_dir is not None else build_library().parent
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    env[SCENARIO_ENV] = str(scenario)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def start(
    args: Sequence[str],
    scenario: Path,
    *,
    library_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    **popen: object,
) -> subprocess.Popen[str]:
    """Start a process (typically the daemon) that talks to the fake NVML."""
    full_env = subprocess_env(scenario, library_dir=library_dir, extra=env)
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        list(args), env=full_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen
    )


def run_python(
    code: str, scenario: Path, *, library_dir: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet in a fresh interpreter against the fake."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env(scenario, library_dir=library_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def install_library(directory: Path, library: Path | None = None) -> Path:
    """Copy the fake library into ``directory`` under its soname: a driver being installed."""
    src = library or build_library()
    directory.mkdir(parents=True, exist_ok=True)
    dst = directory / SONAME
    tmp = directory / f".{SONAME}.tmp"
    tmp.write_bytes(src.read_bytes())
    tmp.replace(dst)
    return dst


def call_count(prefix: str) -> int:
    """How many calls the fake loaded in this process answered of functions named ``prefix``…"""
    lib = ctypes.CDLL(SONAME)
    lib.fakeNvmlCallCount.restype = ctypes.c_ulonglong
    lib.fakeNvmlCallCount.argtypes = [ctypes.c_char_p]
    return int(lib.fakeNvmlCallCount(prefix.encode()))


def advance_clock(seconds: float) -> None:
    """Move the driver's clocks on by ``seconds`` in the fake loaded in this process: its counters,
    field timestamps, samples and scheduled events and losses, as if that much time had passed
    (its real sleeps, a PCIe sample or ``delay_ms``, are not shortened)."""
    lib = ctypes.CDLL(SONAME)
    lib.fakeNvmlAdvanceClock.restype = None
    lib.fakeNvmlAdvanceClock.argtypes = [ctypes.c_double]
    lib.fakeNvmlAdvanceClock(seconds)


def step_wall_clock(seconds: float) -> None:
    """Step the wall clock of the driver's timestamps by ``seconds`` (back where negative), as NTP or
    ``date -s`` steps the system's: its monotonic clock, and the work its counters accrue, go on."""
    lib = ctypes.CDLL(SONAME)
    lib.fakeNvmlStepWallClock.restype = None
    lib.fakeNvmlStepWallClock.argtypes = [ctypes.c_double]
    lib.fakeNvmlStepWallClock(seconds)


def driver_monotonic() -> float:
    """The monotonic clock of the fake loaded in this process, in seconds: time.monotonic() moved on
    by ``advance_clock``.  An exporter in the test's process is handed it, so that its spans follow
    the driver's time as they follow real time on a real machine."""
    return float(_clock("fakeNvmlMonotonic")())


def driver_wall_clock() -> float:
    """The wall clock of the fake's timestamps, in seconds: time.time() moved on by ``advance_clock``
    and stepped by ``step_wall_clock``."""
    return float(_clock("fakeNvmlWallClock")())


@functools.cache
def _clock(name: str) -> Any:
    """One of the fake's clocks, looked up once: a poll reads them several times per GPU."""
    fn = getattr(ctypes.CDLL(SONAME), name)
    fn.restype, fn.argtypes = ctypes.c_double, []
    return fn


def in_use_path(scenario: Path) -> Path:
    """fakenvml.c's hold_devices file for ``scenario``: $TMPDIR/fakenvml-inuse-<FNV-1a of the path>."""
    h = 1469598103934665603
    for byte in str(scenario).encode():
        h = ((h ^ byte) * 1099511628211) % 2**64
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"fakenvml-inuse-{h:016x}"


def gpu_reset(scenario: Path) -> str | None:
    """What ``nvidia-smi -r`` would say on the node of ``scenario``: None where the reset would go
    ahead, else its refusal, as when any process has NVML initialised on the fake (fakenvml.c's
    hold_devices: the driver's device files held open).  The reset itself changes nothing."""
    path = in_use_path(scenario)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # no client ever opened the devices
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return (
            "The GPU is currently in use by another client. "  # nvidia-smi's words, gpu-operator #118
            "Please first kill all processes using this device"
        )
    finally:
        os.close(fd)  # the exclusive lock, where it was had, goes with it
    return None
