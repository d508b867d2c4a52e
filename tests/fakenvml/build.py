"""Builds the fake ``libnvidia-ml.so.1`` with gcc, cached by a hash of everything that goes into it.

The header is NVIDIA's own ``nvml.h`` from the ``nvidia-nvml-dev`` wheel, so the compiler checks
our signatures and struct layouts against the real API.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fakenvml.c"
SONAME = "libnvidia-ml.so.1"
CFLAGS = [
    "-shared",
    "-fPIC",
    "-O2",
    "-g",
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pthread",
    # Lets us define the old unversioned entry points (nvmlInit, the v1 process-info calls)
    # next to the versioned ones, each checked against its own prototype.
    "-DNVML_NO_UNVERSIONED_FUNC_DEFS",
    f"-Wl,-soname,{SONAME}",
]


class BuildError(RuntimeError):
    pass


def nvml_header() -> Path:
    """The nvml.h shipped in the nvidia-nvml-dev wheel (``nvidia/cu*/include/nvml.h``)."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    found = sorted(h for root in roots for h in Path(root).glob("*/include/nvml.h"))
    if not found:
        raise BuildError(
            "nvml.h not found: install the test dependency 'nvidia-nvml-dev' "
            "(pip install -e '.[test]'), which ships NVIDIA's header"
        )
    return found[-1]


def build_dir() -> Path:
    return Path(os.environ.get("FAKE_NVML_BUILD_DIR", HERE / ".build"))


def build_library(compiler: str | None = None, hide: Sequence[str] = ()) -> Path:
    """Compile the fake library if this exact source, header and flag set has not been built yet.

    ``hide`` names entry points to leave out of the library's exported symbols, as an older driver
    lacks them: nvidia-ml-py then answers ``NVML_ERROR_FUNCTION_NOT_FOUND`` for them.

    Returns the path of ``.../<hash>/libnvidia-ml.so.1``.  Safe to call from parallel processes:
    each builds into a private temporary directory and renames it into place.
    """
    cc = compiler or os.environ.get("CC", "gcc")
    header = nvml_header()
    hidden = sorted(set(hide))
    script = f"{{ global: *; local: {'; '.join(hidden)}; }};\n" if hidden else ""
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), header.read_bytes(), " ".join([cc, *CFLAGS]).encode(), script.encode()):
        digest.update(hashlib.sha256(part).digest())
    target_dir = build_dir() / digest.hexdigest()[:16]
    target = target_dir / SONAME
    if target.exists():
        return target
    if shutil.which(cc) is None:
        raise BuildError(f"C compiler '{cc}' not found; the fake NVML library needs gcc")
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target_dir.parent))
    cmd = [cc, *CFLAGS, f"-I{header.parent}", "-o", str(tmp / SONAME), str(SOURCE)]
    if script:
        (tmp / "exports.map").write_text(script)
        cmd.append(f"-Wl,--version-script={tmp / 'exports.map'}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"building the fake NVML library failed:\n$ {' '.join(cmd)}\n{proc.stderr}")
    if proc.stderr.strip():  # -Werror makes this unreachable unless a linker warns
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"the fake NVML library built with warnings:\n{proc.stderr}")
    try:
        tmp.rename(target_dir)
    except OSError:
        # Another process won the race; its build is identical.
        shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(build_library())
