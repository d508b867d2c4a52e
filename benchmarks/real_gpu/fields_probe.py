"""What a real driver answers to the questions of issue 26 that the fake NVML cannot settle, as one
JSON object.

``python3 benchmarks/real_gpu/fields_probe.py [--copy]`` on a machine with an NVIDIA GPU:

- ``accumulate``: fields 82, 197, 198 and 138 read 50 times through one array reused as is (never
  zeroed) and through a fresh array each time (as nvidia-ml-py does).  A driver that adds into the
  caller's ``value`` (go-nvml #46) shows the reused series running away from the fresh one.
- ``pcie``: the counters' value types and values, whether they ever read 2^32 or more, the rate they
  give over 2 s against ``nvmlDeviceGetPcieThroughput`` sampled meanwhile, and with ``--copy`` (torch
  with CUDA) the bytes of a host-to-device copy of more than 5 GB/s for 2 s against the counters' RX.
- ``nvlink``: what field 91 answers, and what ``nvmlDeviceGetNvLinkState`` and field 138 answer for
  the last link, the links past it, and link 17, 18 and 35.
- ``unknown_field``: what a field id no driver knows answers, per entry and for the call.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import sys
import time
from typing import Any

import pynvml as N

from gpu_exporter.sources.nvml import bindings

FIELDS = {"memory_temp": (82, 0), "pcie_tx": (197, 0), "pcie_rx": (198, 0), "nvlink_tx_link0": (138, 0)}
READERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def value(fv: Any) -> Any:
    if fv.nvmlReturn != N.NVML_SUCCESS:
        return f"error {fv.nvmlReturn} ({N.nvmlErrorString(fv.nvmlReturn)})"
    member = READERS.get(fv.valueType)
    return getattr(fv.value, member) if member and hasattr(fv.value, member) else f"type {fv.valueType}"


def fresh(h: Any, ids: list[tuple[int, int]]) -> list[Any]:
    return list(N.nvmlDeviceGetFieldValues(h, ids))


def accumulate(h: Any) -> dict[str, Any]:
    ids = list(FIELDS.values())
    reused = (N.c_nvmlFieldValue_t * len(ids))()
    for entry, (fid, scope) in zip(reused, ids, strict=True):
        entry.fieldId, entry.scopeId = fid, scope
    fn = bindings.c_function("nvmlDeviceGetFieldValues")
    series: dict[str, dict[str, list[Any]]] = {name: {"reused": [], "fresh": []} for name in FIELDS}
    for _ in range(50):
        ret = fn(h, ctypes.c_int(len(ids)), reused)
        new = fresh(h, ids)
        for i, name in enumerate(FIELDS):
            series[name]["reused"].append(value(reused[i]) if ret == N.NVML_SUCCESS else f"call error {ret}")
            series[name]["fresh"].append(value(new[i]))
        time.sleep(0.02)
    out = {}
    for name, s in series.items():
        r, f = s["reused"], s["fresh"]
        numbers = all(isinstance(x, int | float) for x in r + f)
        out[name] = {
            "first": (r[0], f[0]),
            "last": (r[-1], f[-1]),
            # A driver that adds into the array: the reused value runs ahead of the fresh one read
            # right after it, by about the sum of the earlier reads.
            "accumulates": bool(numbers and r[-1] > 1.5 * f[-1] + 1000) if numbers else None,
        }
    return out


def pcie(h: Any, copy: bool) -> dict[str, Any]:
    ids = [FIELDS["pcie_tx"], FIELDS["pcie_rx"]]
    a = fresh(h, ids)
    out: dict[str, Any] = {"value_types": [fv.valueType for fv in a], "first": [value(fv) for fv in a]}
    if any(fv.nvmlReturn != N.NVML_SUCCESS for fv in a):
        return out
    t0 = time.monotonic()
    samples, readings = [], []
    while time.monotonic() - t0 < 2.0:
        samples.append((N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES) * 1024,
                        N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES) * 1024))  # fmt: skip
        readings.append([value(fv) for fv in fresh(h, ids)])
    b = fresh(h, ids)
    span = (max(fv.timestamp for fv in b) - max(fv.timestamp for fv in a)) / 1e6
    everything = [value(fv) for fv in a] + [x for r in readings for x in r] + [value(fv) for fv in b]
    out.update(
        seen_at_or_above_2_32=any(isinstance(x, int) and x >= 2**32 for x in everything),
        went_back=[d for d in (0, 1) if any(r2[d] < r1[d] for r1, r2 in itertools.pairwise(readings))],
        counter_rate=[(value(b[d]) - value(a[d])) / span for d in (0, 1)],
        sample_rate_mean=[sum(s[d] for s in samples) / len(samples) for d in (0, 1)],
    )
    if copy:
        out["copy"] = host_to_device(h, ids)
    return out


def host_to_device(h: Any, ids: list[tuple[int, int]]) -> dict[str, Any]:
    """Copy pinned host memory to the GPU for 2 s; the bytes moved against the counters' RX."""
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)  # 1 GiB
    dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    before, moved, t0 = fresh(h, ids), 0, time.perf_counter()
    while time.perf_counter() - t0 < 2.0:
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        moved += src.numel()
    took = time.perf_counter() - t0
    after = fresh(h, ids)
    rx = value(after[1]) - value(before[1])
    return {"bytes_copied": moved, "seconds": took, "copy_rate": moved / took, "counter_rx_delta": rx,
            "counter_rx_delta_mod_2_32": rx % 2**32, "ratio_rx_to_copied": rx / moved,
            "wrapped_during": value(after[1]) < value(before[1])}  # fmt: skip


def nvlink(h: Any) -> dict[str, Any]:
    (count,) = fresh(h, [(91, 0)])
    out: dict[str, Any] = {"field_91": value(count), "field_91_type": count.valueType}
    n = value(count) if isinstance(value(count), int) else 0
    for link in sorted({max(n - 1, 0), n, n + 1, 12, 17, 18, 35}):
        try:
            state: Any = N.nvmlDeviceGetNvLinkState(h, link)
        except N.NVMLError as e:
            state = f"error {e.value} ({e})"
        (tx,) = fresh(h, [(138, link)])
        out[f"link_{link}"] = {"state": state, "field_138": value(tx)}
    return out


def unknown_field(h: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fid in (N.NVML_FI_MAX, 400, 65535):
        try:
            out[str(fid)] = value(fresh(h, [(fid, 0)])[0])
        except N.NVMLError as e:
            out[str(fid)] = f"call error {e.value} ({e})"
    return out


def main() -> None:
    N.nvmlInit()
    result: dict[str, Any] = {"driver": N.nvmlSystemGetDriverVersion(), "gpus": []}
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        gpu: dict[str, Any] = {"index": i, "name": N.nvmlDeviceGetName(h)}
        for name, probe in (("accumulate", accumulate), ("nvlink", nvlink), ("unknown_field", unknown_field)):
            try:
                gpu[name] = probe(h)
            except Exception as e:  # one question's failure leaves the others' answers
                gpu[name] = f"failed: {type(e).__name__}: {e}"
        try:
            gpu["pcie"] = pcie(h, copy="--copy" in sys.argv and i == 0)
        except Exception as e:
            gpu["pcie"] = f"failed: {type(e).__name__}: {e}"
        result["gpus"].append(gpu)
    N.nvmlShutdown()
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
