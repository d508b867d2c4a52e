"""The process records as the driver writes them, with two processes on GPU 0 (issue 49).

Run on a machine with an NVIDIA GPU: ``python3 benchmarks/real_gpu/process_records_probe.py``.
It starts two processes that each hold a CUDA context and 64 MiB on GPU 0 (through libcuda.so.1
itself, no torch needed), then calls each process list (unversioned, ``_v2``, ``_v3``) into a
buffer filled with 0xA5 and prints, as one JSON object: the count, how many bytes the driver wrote
(so the record size), the records' raw bytes, and the pids read at 24 and at 32 bytes a record;
whether the driver has ``nvmlDeviceGetConfComputeMemSizeInfo`` and
``nvmlDeviceGetRunningProcessDetailList`` (what the exporter's choice rests on) and what the latter
lists; what nvidia-ml-py's own call and the exporter's reader (``process_records``) make of it.
R535 (535.104 on) should write 32 bytes a record from ``_v3``, R550 and later 24.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FILL = 0xA5
LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
         "nvmlDeviceGetMPSComputeRunningProcesses")  # fmt: skip

# A child that holds a CUDA context and an allocation on GPU 0 until its stdin closes.
HOLDER = """
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx, mem = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_ulonglong()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cu.cuMemAlloc_v2(ctypes.byref(mem), ctypes.c_size_t(64 << 20)) == 0
print("ready", flush=True)
sys.stdin.read()
"""


def holders(n: int) -> list[subprocess.Popen[str]]:
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(n)]  # fmt: skip
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", "a CUDA context could not be made"
    return procs


def raw_list(N: Any, name: str, h: Any, room: int = 16) -> dict[str, Any]:
    try:
        fn = N._nvmlGetFunctionPointer(name)
    except N.NVMLError as e:
        return {"error": str(e)}
    buf = (ctypes.c_ubyte * (room * 32))()
    ctypes.memset(buf, FILL, ctypes.sizeof(buf))
    count = ctypes.c_uint(room)
    ret = fn(h, ctypes.byref(count), buf)
    raw = bytes(buf)
    written = len(raw.rstrip(bytes([FILL])))
    n = count.value
    out: dict[str, Any] = {"ret": ret, "count": n, "bytes_written": written,
                           "record_size": written / n if n else None,
                           "raw_hex": raw[:written].hex()}  # fmt: skip
    for size in (16, 24, 32):
        out[f"pids_at_{size}"] = [struct.unpack_from("@I", raw, i * size)[0] for i in range(n)]
    return out


def main() -> None:
    import pynvml as N

    procs = holders(2)
    try:
        time.sleep(1)
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        out: dict[str, Any] = {"driver": N.nvmlSystemGetDriverVersion(), "name": N.nvmlDeviceGetName(h),
                               "nvidia_ml_py": N.__file__, "holders": [p.pid for p in procs]}  # fmt: skip
        for base in LISTS:
            for suffix in ("", "_v2", "_v3"):
                out[base + suffix] = raw_list(N, base + suffix, h)
        for fn in ("nvmlDeviceGetConfComputeMemSizeInfo", "nvmlDeviceGetRunningProcessDetailList"):
            try:
                N._nvmlGetFunctionPointer(fn)
                out[f"has {fn}"] = True
            except N.NVMLError:
                out[f"has {fn}"] = False
        try:
            mode = N.NVML_PROCESS_MODE_COMPUTE
            detail = N.nvmlDeviceGetRunningProcessDetailList(h, N.nvmlProcessDetailList_v1, mode)
            out["detail list (compute)"] = [(p.pid, p.usedGpuMemory) for p in detail]
        except (AttributeError, N.NVMLError) as e:
            out["detail list (compute)"] = repr(e)
        try:
            out["bindings' own compute list"] = [(p.pid, p.usedGpuMemory) for p in
                                                 N.nvmlDeviceGetComputeRunningProcesses(h)]  # fmt: skip
        except Exception as e:  # what the bindings alone make of this driver, whatever it raises
            out["bindings' own compute list"] = repr(e)
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from gpu_exporter.sources.nvml import process_records

        layout = process_records.choose(h)
        out["exporter layout"] = [layout.suffix, layout.size]
        out["exporter compute list"] = [list(r) for r in process_records.running(h, LISTS[0], layout)]
        mine = {p.pid for p in procs}
        out["exporter sees both holders"] = mine <= {r[0] for r in out["exporter compute list"]}
        N.nvmlShutdown()
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
            p.wait(timeout=30)
    print(json.dumps(out, indent=1, default=str))
    sys.exit(0 if out["exporter sees both holders"] else 1)


if __name__ == "__main__":
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
    main()
