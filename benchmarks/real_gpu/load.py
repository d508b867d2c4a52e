"""A GPU load in phases, for checking the exporter against a real driver.

``python3 load.py tensor SECONDS``: back-to-back bf16 matrix products (tensor pipes and SMs busy).
``python3 load.py tiny SECONDS``: one tiny kernel at a time, synchronised after each: GPU-Util
reads high while almost every SM idles (what GpuLowSmActivity is for).
"""

from __future__ import annotations

import sys
import time

import torch


def main() -> None:
    mode, seconds = sys.argv[1], float(sys.argv[2])
    end = time.monotonic() + seconds
    dev = torch.device("cuda")
    if mode == "tensor":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        while time.monotonic() < end:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
    else:
        x = torch.zeros(1, device=dev)
        while time.monotonic() < end:
            x.add_(1)
            torch.cuda.synchronize()
    print(f"load {mode} done", flush=True)


if __name__ == "__main__":
    main()
