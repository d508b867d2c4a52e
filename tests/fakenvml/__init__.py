"""A fake NVIDIA driver for tests: a C ``libnvidia-ml.so.1`` driven by scenario files.

See README.md beside this file for the scenario format.
"""

from .build import BuildError, build_library, nvml_header
from .runtime import SCENARIO_ENV, install_library, load_in_process, run_python, start, subprocess_env
from .scenario import (
    CLOCK_EVENT_REASONS,
    EVENT_XID_CRITICAL,
    GPU_IS_LOST,
    NOT_SUPPORTED,
    Counter,
    Err,
    Gpu,
    MigDevice,
    Process,
    Scenario,
    Xid,
)

__all__ = [
    "CLOCK_EVENT_REASONS",
    "EVENT_XID_CRITICAL",
    "GPU_IS_LOST",
    "NOT_SUPPORTED",
    "SCENARIO_ENV",
    "BuildError",
    "Counter",
    "Err",
    "Gpu",
    "MigDevice",
    "Process",
    "Scenario",
    "Xid",
    "build_library",
    "install_library",
    "load_in_process",
    "nvml_header",
    "run_python",
    "start",
    "subprocess_env",
]
