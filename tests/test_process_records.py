"""Process lists read right on every driver, whatever the bindings: R535 (535.104 on) writes 32-byte
records from the ``_v3`` calls, R550 and later 24, and nvidia-ml-py reads the size of its own release
(12.535.77, our floor, 32; 12.550 and 13.x, 24).  A mismatch reads every record after the first at
the wrong offset: a phantom pid 0 and the real second process lost (issue 49)."""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import spawn_sleeper
from tests.exporter_helpers import make_poller
from tests.fakenvml import Scenario, build_library, subprocess_env
from tests.fakenvml.presets import GIB, MIB, a100_sxm, h100_sxm
from tests.test_gpm import oldest_bindings

ROOT = Path(__file__).resolve().parent.parent
FILL = 0xA5
SERVER, CLIENT, XORG = 999_990_101, 999_990_102, 999_990_103


@pytest.fixture
def two_live() -> Iterator[tuple[int, int]]:
    """Two real processes, so that /proc names them and their user (the holder)."""
    procs = [spawn_sleeper(), spawn_sleeper()]
    try:
        yield procs[0].pid, procs[1].pid
    finally:
        for p in procs:
            p.kill()
            p.wait()


def shared_gpu(s: Scenario, branch: int, first: int, second: int) -> None:
    """An H100 on driver ``branch`` shared by two compute processes, an MPS server with a client
    besides, and Xorg: two or more records in each list."""
    s.driver(branch)
    g = h100_sxm(s.add_gpu(), "rec", 0, util=90, mem_used=40 * GIB, power_mw=500_000).process_utilization(100)
    g.add_process(first, 3 * GIB, sm=20).add_process(second, 5 * GIB, sm=70)
    g.add_process(SERVER, 30 * MIB, name="nvidia-cuda-mps-server").add_process(CLIENT, 7 * GIB, kind="mps", name="mps1")
    g.add_process(XORG, 64 * MIB, kind="graphics", name="Xorg").add_process(XORG + 1, 32 * MIB, kind="graphics")
    s.write()


def me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


# -- the fake writes what each driver writes ------------------------------------------------------------
def written(N: Any, name: str, h: Any, room: int = 8) -> tuple[int, int]:
    """(count, bytes written) of one call into a buffer filled with 0xA5, measured from the buffer."""
    fn = N._nvmlGetFunctionPointer(name)
    buf = (ctypes.c_ubyte * (room * 32))()
    ctypes.memset(buf, FILL, ctypes.sizeof(buf))
    count = ctypes.c_uint(room)
    assert fn(h, ctypes.byref(count), buf) == N.NVML_SUCCESS
    return count.value, len(bytes(buf).rstrip(bytes([FILL])))


@pytest.mark.parametrize("branch,v3", [(535, 32), (550, 24), (570, 24), (580, 24)])
def test_the_fake_writes_the_record_of_its_driver(scenario: Scenario, nvml: Any, two_live: Any, branch: int,
                                                  v3: int) -> None:  # fmt: skip
    """R535's _v3 writes nvmlProcessInfo_t with usedGpuCcProtectedMemory (32 bytes), R550 and later the
    24-byte v2 record; _v2 and the unversioned call never changed.  The functions that tell them apart:
    nvmlDeviceGetConfComputeMemSizeInfo (R535 on), nvmlDeviceGetRunningProcessDetailList (R550 on)."""
    N = nvml
    shared_gpu(scenario, branch, *two_live)
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    for kind, n in (("Compute", 3), ("MPSCompute", 1), ("Graphics", 2)):
        base = f"nvmlDeviceGet{kind}RunningProcesses"
        assert written(N, base + "_v3", h) == (n, n * v3)
        assert written(N, base + "_v2", h) == (n, n * 24)
        assert written(N, base, h) == (n, n * 16)
    conf = N._nvmlGetFunctionPointer("nvmlDeviceGetConfComputeMemSizeInfo")(h, ctypes.byref((ctypes.c_ulonglong * 2)()))
    assert conf == N.NVML_ERROR_NOT_SUPPORTED  # present, and no confidential computing here
    plist = N.c_nvmlProcessDetailList_v1_t(version=N.nvmlProcessDetailList_v1, mode=N.NVML_PROCESS_MODE_COMPUTE)
    ret = N._nvmlGetFunctionPointer("nvmlDeviceGetRunningProcessDetailList")(h, ctypes.byref(plist))
    if branch == 535:
        assert ret == N.NVML_ERROR_FUNCTION_NOT_FOUND
    else:
        assert (ret, plist.numProcArrayEntries) == (N.NVML_ERROR_INSUFFICIENT_SIZE, 3)
        procs = N.nvmlDeviceGetRunningProcessDetailList(h, N.nvmlProcessDetailList_v1, N.NVML_PROCESS_MODE_ALL)
        assert sorted(p.pid for p in procs) == sorted([*two_live, SERVER, CLIENT, XORG, XORG + 1])


def test_the_versioned_list_is_for_hopper_and_newer(scenario: Scenario, nvml: Any) -> None:
    """nvml.h on nvmlDeviceGetRunningProcessDetailList: "For Hopper or newer fully supported devices"."""
    N = nvml
    scenario.driver(580)
    a100_sxm(scenario.add_gpu(), "old", 0).add_process(4242, GIB)
    scenario.write()
    N.nvmlInit()
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetRunningProcessDetailList(N.nvmlDeviceGetHandleByIndex(0), N.nvmlProcessDetailList_v1,
                                                N.NVML_PROCESS_MODE_COMPUTE)  # fmt: skip


# -- the exporter, in this process (the newest bindings) -------------------------------------------------
@pytest.mark.parametrize("branch", [535, 550, 580])
def test_the_second_process_on_a_shared_gpu_is_read_on_every_driver(scenario: Scenario, nvml: Any, two_live: Any,
                                                                    branch: int) -> None:  # fmt: skip
    """On R535 the newest bindings alone read a phantom pid 0 in place of the second process."""
    first, second = two_live
    shared_gpu(scenario, branch, first, second)
    poller, errors = make_poller()
    procs = {p.pid: p for p in poller.poll().gpus[0].processes}
    poller.close()
    assert 0 not in procs
    assert sorted(procs) == sorted([first, second, SERVER, CLIENT, XORG, XORG + 1])
    one, two = procs[first], procs[second]
    assert (two.used_memory_bytes, two.kind, two.user) == (5 * GIB, "compute", me())
    assert two.sm_utilization_ratio == pytest.approx(0.70)
    assert two.holder == one.holder and two.holder.values != ("unknown",)
    assert (procs[CLIENT].used_memory_bytes, procs[XORG + 1].used_memory_bytes) == (7 * GIB, 32 * MIB)
    assert not [k for k in errors.counts if "RunningProcesses" in k[0]], errors.counts


# -- every allowed bindings version on both record sizes, in a child process each ------------------------
POLL = """
import json, pynvml
from tests.exporter_helpers import make_poller
poller, errors = make_poller()
seen = [[(p.pid, p.used_memory_bytes, p.user, list(p.holder.values), p.sm_utilization_ratio)
         for p in poller.poll().gpus[0].processes] for _ in range(2)]
poller.close()
pynvml.nvmlInit()
try:  # the bindings' own read, for comparison; 13.x refuses a driver without _v3 outright
    theirs = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))]
except Exception as e:
    theirs = type(e).__name__
pynvml.nvmlShutdown()
print(json.dumps({"bindings": pynvml.__file__, "seen": seen, "theirs": theirs,
                  "errors": {f"{f}/{e}": n for (f, e), n in errors.counts.items() if "Processes" in f}}))
"""


def poll_child(scenario: Path, *, bindings: str = "newest", hide: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    lib_dir = build_library(hide=hide).parent if hide else None
    env = subprocess_env(scenario, library_dir=lib_dir)
    if bindings == "oldest":
        env["PYTHONPATH"] = str(oldest_bindings())
    out = subprocess.run([sys.executable, "-c", POLL], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1]), out.stdout + out.stderr


@pytest.mark.integration
@pytest.mark.parametrize("branch", [535, 550])
@pytest.mark.parametrize("bindings", ["oldest", "newest"])
def test_every_bindings_version_reads_both_record_sizes(tmp_path: Path, two_live: Any, bindings: str,
                                                        branch: int) -> None:  # fmt: skip
    """The bindings' own read is wrong where its record is not the driver's (12.535.77 on R550, 13.x on
    R535): the exporter's is right on all four."""
    first, second = two_live
    s = Scenario(tmp_path / "node.scn")
    shared_gpu(s, branch, first, second)
    result, log = poll_child(s.path, bindings=bindings)
    assert ("nvidia-ml-py-oldest" in result["bindings"]) == (bindings == "oldest")
    theirs_right = (bindings == "oldest") == (branch == 535)
    assert (result["theirs"] == [first, second, SERVER]) == theirs_right, result["theirs"]  # the matrix bites
    for poll in result["seen"]:
        procs = {pid: (used, user, holder, sm) for pid, used, user, holder, sm in poll}
        assert sorted(procs) == sorted([first, second, SERVER, CLIENT, XORG, XORG + 1])
        used, user, holder, sm = procs[second]
        assert (used, user, holder) == (5 * GIB, me(), procs[first][2])
        assert sm == pytest.approx(0.70)
        assert procs[CLIENT][0] == 7 * GIB and procs[XORG + 1][0] == 32 * MIB
    assert result["errors"] == {}
    assert "nvml_process_record_size" not in log  # the functions said the size the driver wrote


@pytest.mark.integration
def test_535_98_without_the_v3_calls_is_read_through_v2(tmp_path: Path, two_live: Any) -> None:
    """535.98 dropped the _v3 calls (nvidia-settings 0cb3bef): _v2, whose record never changed."""
    s = Scenario(tmp_path / "node.scn")
    shared_gpu(s, 535, *two_live)
    hidden = tuple(f"nvmlDeviceGet{k}RunningProcesses_v3" for k in ("Compute", "MPSCompute", "Graphics"))
    result, log = poll_child(s.path, hide=hidden)
    procs = {pid: used for pid, used, *_ in result["seen"][0]}
    assert procs == {two_live[0]: 3 * GIB, two_live[1]: 5 * GIB, SERVER: 30 * MIB, CLIENT: 7 * GIB,
                     XORG: 64 * MIB, XORG + 1: 32 * MIB}  # fmt: skip
    assert result["errors"] == {} and "nvml_process_record_size" not in log
    assert result["theirs"] == "NVMLLibraryMismatchError"  # what the bindings alone make of it


@pytest.mark.integration
def test_a_driver_whose_functions_mislead_is_read_as_it_writes(tmp_path: Path, two_live: Any) -> None:
    """An R550 driver without the versioned list looks like R535 by its functions, and writes 24 bytes:
    what it wrote is believed, and the disagreement said once, not every poll."""
    s = Scenario(tmp_path / "node.scn")
    shared_gpu(s, 550, *two_live)
    result, log = poll_child(s.path, hide=("nvmlDeviceGetRunningProcessDetailList",))
    for poll in result["seen"]:
        procs = {pid: used for pid, used, *_ in poll}
        assert procs[two_live[1]] == 5 * GIB and 0 not in procs and len(procs) == 6
    # Once for each of the three lists, not again at the second poll.
    assert log.count("nvml_process_record_size") == 3, log


def test_the_real_gpu_probe_is_ready_to_run() -> None:
    """benchmarks/real_gpu/process_records_probe.py runs only where there is a GPU: here it must at
    least import, and its CUDA child compile."""
    import importlib.util

    path = ROOT / "benchmarks" / "real_gpu" / "process_records_probe.py"
    spec = importlib.util.spec_from_file_location("process_records_probe", path)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    compile(probe.HOLDER, "holder", "exec")
    assert callable(probe.main) and "process_records_probe.py" in (ROOT / "benchmarks/real_gpu/check.sh").read_text()


@pytest.mark.parametrize(
    "wrote,expected,count,cleared",
    [
        (32, 24, 2, False),  # R535 behind R550's functions: read as written
        (24, 32, 2, False),  # and the other way
        (24, 32, 1, False),  # one record says its size too
        (24, 24, 2, True),  # a driver that clears the whole buffer: its functions decide
        (32, 32, 3, True),
    ],
)
def test_the_size_is_where_the_written_bytes_end(wrote: int, expected: int, count: int, cleared: bool) -> None:
    """A record's last byte is the top byte of a count or an instance id, 0x00 or 0xFF, never 0xA5."""
    from gpu_exporter.sources.nvml.process_records import Layout, _records

    room = 2 * count + 8
    buf = bytearray([FILL] * room * 32)
    if cleared:
        buf[: room * wrote] = bytes(room * wrote)
    shape = struct.Struct({24: "@IQII", 32: "@IQIIQ"}[wrote])
    for i in range(count):
        fields = (4242 + i, (i + 1) * GIB, 0xFFFFFFFF, 0xFFFFFFFF, 0)[: len(shape.format) - 1]
        shape.pack_into(buf, i * wrote, *fields)
    records = _records(bytes(buf), count, "nvmlDeviceGetComputeRunningProcesses_v3", Layout("_v3", expected))
    assert [(r.pid, r.used_memory) for r in records] == [(4242 + i, (i + 1) * GIB) for i in range(count)]
