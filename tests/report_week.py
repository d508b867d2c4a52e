"""A week of gpu-exporter history with every case issue 25 found, as gpu-exporter would have exported
it, sampled every minute: backfilled into a real Prometheus (``promtool tsdb create-blocks-from
openmetrics``) and imported into a real VictoriaMetrics, the same samples in both.

Node n1 (pods, USD):
- GPU 0, H100 at 3.00, pod ml/train-a: busy 68 h at 18% SM activity, then held but idle 100 h (2%).
- GPU 1, H100 at 3.00, pod ml/serve-b: busy all week at 82% SM activity, 50% DRAM, 60 GiB.
- GPU 2, H100 reserved at 2.00, pod ml/light-c: busy all week at 20% SM activity, 10% DRAM, 30 GiB.
- GPU 3, H100 on demand at 3.00, pod ml/big-d: busy all week at 30% SM activity, 60 GiB.
Node n2 (Unix users, USD), whose exporter restarted 50 h into the week, gone for 20 minutes:
- GPU 0, H100 at 3.00, user alice: busy all week at 10% SM activity and 12 GiB, but 70 GiB for 3 h.
- GPU 1, L4 at 0.80 then 1.00 from 84 h 7 min, busy 100 h for user bob then 68 h for user carol, 75%
  GPU-Util, 8 GiB.
- GPU 2, L4 at 0.80, first seen 9 h into the week (its exporter came later), idle ever since.
- GPU 3, H100 at 3.00, user dave: held all week at 0%.
Node n3 (no prices): GPU 0, an L4 idle all week; GPU 1, an H100 that pod ml/unpriced-e keeps busy
at 5%, 6 GiB.
Node n4 (USD): GPU 0, H100 at 3.00, pod ml/gpm-f: busy all week at 15% SM activity (95% GPU-Util),
9 GiB; its SM activity is missing for the first 12 h (GPM not ready).

Where a GPU has SM activity (GPM) it has its pipes' too, as the exporter gives them: the tensor pipe
half as busy as the SMs, FP32 2%, FP64 and FP16 idle; and each H100 sends 40 MB/s over NVLink (two
links), the chatter of a job that does not use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.prometheus_helpers import Prometheus, VictoriaMetrics, prometheus, victoria_metrics

GIB = 1024**3
STEP = 60
HOUR = 3600
END = math.floor(time.time() / HOUR) * HOUR - 2 * HOUR
START = END - 168 * HOUR
T0 = START - HOUR  # an hour of history before the week
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
HELD = ("busy", "allocated_idle")
NVLINK_CHATTER = 20e6  # bytes/s each H100 link sends: far below the 1 GB/s that counts as using NVLink


@dataclass
class Seg:
    """A run of hours in one state: by whom, at what activity and memory."""

    hours: float
    state: str
    holder: dict[str, str] = field(default_factory=dict)  # namespace/pod/container, or user
    sm: float | None = None
    util: float = 0.0
    dram: float | None = None
    peak: float = 0.0


@dataclass
class Gpu:
    node: str
    gpu: str
    name: str
    total: int
    segs: list[Seg]  # from START; the hour before it is in the first segment's state
    prices: list[tuple[float, float]] | None  # (from seconds after START, price), or no price at all
    first_seen: float = 0.0  # seconds after START the exporter first saw it (before that, nothing)
    sm_missing_h: tuple[float, float] | None = None  # hours after START with no SM activity samples
    spikes: list[tuple[float, float, float]] = field(default_factory=list)  # (from h, to h, peak bytes)

    @property
    def uuid(self) -> str:
        return f"GPU-{self.node}-{self.gpu}"


def pod(name: str) -> dict[str, str]:
    return {"namespace": "ml", "pod": name, "container": "main"}


def user(name: str) -> dict[str, str]:
    return {"user": name}


OUTAGES = {"n2": [(50 * HOUR, 50 * HOUR + 20 * 60)]}  # seconds after START: no samples, counters from 0 after
PRICE_CHANGE = 84 * HOUR + 7 * 60  # n2 GPU 1, not on a step boundary (steps of 14 minutes)
GPUS: list[Gpu] = [
    Gpu("n1", "0", H100, 80 * GIB, [Seg(68, "busy", pod("train-a"), 0.18, 0.9, 0.05, 11.2 * GIB),
                                    Seg(100, "allocated_idle", pod("train-a"), 0.02, 0.9, 0.0, 11.2 * GIB)],
        [(0, 3.0)]),
    Gpu("n1", "1", H100, 80 * GIB, [Seg(168, "busy", pod("serve-b"), 0.82, 1.0, 0.5, 60 * GIB)], [(0, 3.0)]),
    Gpu("n1", "2", H100, 80 * GIB, [Seg(168, "busy", pod("light-c"), 0.20, 0.8, 0.1, 30 * GIB)], [(0, 2.0)]),
    Gpu("n1", "3", H100, 80 * GIB, [Seg(168, "busy", pod("big-d"), 0.30, 0.9, 0.2, 60 * GIB)], [(0, 3.0)]),
    Gpu("n2", "0", H100, 80 * GIB, [Seg(168, "busy", user("alice"), 0.10, 0.6, 0.05, 12 * GIB)], [(0, 3.0)],
        spikes=[(100, 103, 70 * GIB)]),
    Gpu("n2", "1", L4, int(22.5 * GIB), [Seg(100, "busy", user("bob"), None, 0.75, None, 8 * GIB),
                                         Seg(68, "busy", user("carol"), None, 0.75, None, 8 * GIB)],
        [(0, 0.8), (PRICE_CHANGE, 1.0)]),
    Gpu("n2", "2", L4, int(22.5 * GIB), [Seg(168, "idle")], [(0, 0.8)], first_seen=9 * HOUR),
    Gpu("n2", "3", H100, 80 * GIB, [Seg(168, "allocated_idle", user("dave"), 0.0, 0.0, 0.0, 2 * GIB)], [(0, 3.0)]),
    Gpu("n3", "0", L4, int(22.5 * GIB), [Seg(168, "idle")], None),
    Gpu("n3", "1", H100, 80 * GIB, [Seg(168, "busy", pod("unpriced-e"), 0.05, 0.5, 0.02, 6 * GIB)], None),
    Gpu("n4", "0", H100, 80 * GIB, [Seg(168, "busy", pod("gpm-f"), 0.15, 0.95, 0.05, 9 * GIB)], [(0, 3.0)],
        sm_missing_h=(0, 12)),
]  # fmt: skip


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def _at(g: Gpu, t: float) -> Seg:
    """The segment of the minute that ends at ``t`` (seconds since the epoch)."""
    h = (t - 1 - START) / HOUR
    at = 0.0
    for s in g.segs:
        at += s.hours
        if h < at:
            return s
    return g.segs[-1]


def history() -> str:
    """OpenMetrics text of the week, as a scrape every minute would have stored it."""
    lines: list[str] = []
    for g in GPUS:
        base = {"job": "gpu-exporter", "instance": f"{g.node}:9445", "node": g.node, "gpu": g.gpu, "uuid": g.uuid}
        counters: dict[tuple[str, ...], float] = {}
        series: dict[str, list[str]] = {}
        restarted = True  # the first sample the exporter takes has counted nothing yet
        for k in range(169 * 60 + 1):
            t = T0 + k * STEP
            rel = t - START
            if rel < g.first_seen or any(a <= rel < b for a, b in OUTAGES.get(g.node, [])):
                restarted = True
                continue
            seg = _at(g, t)
            key = (seg.state, *(f"{k}={v}" for k, v in seg.holder.items()))
            if restarted:
                counters = dict.fromkeys(counters, 0.0)
                restarted = False
            else:
                counters[key] = counters.get(key, 0.0) + STEP
            counters.setdefault(("idle",), 0.0)
            counters.setdefault(("down",), 0.0)
            for ck, v in counters.items():
                holder = dict(x.split("=", 1) for x in ck[1:])
                labels = {**base, **(holder if ck[0] in HELD else {}), "state": ck[0]}
                if "user" not in labels:
                    labels["user"] = ""
                series.setdefault(f"gpu_state_seconds_total{{{_labels(labels)}}}", []).append(f"{v} {t}")
            pods = {k: v for k, v in seg.holder.items() if k != "user"} if seg.state in HELD else {}
            if g.prices is not None:
                price = [p for since, p in g.prices if rel >= since][-1]
                series.setdefault(f"gpu_price_per_hour{{{_labels({**base, **pods, 'currency': 'USD'})}}}", []).append(
                    f"{price} {t}"
                )
            info = {**base, **pods, "name": g.name, "mig_mode": "disabled"}
            series.setdefault(f"gpu_info{{{_labels(info)}}}", []).append(f"1 {t}")
            series.setdefault(f"gpu_memory_total_bytes{{{_labels({**base, **pods})}}}", []).append(f"{g.total} {t}")
            peak = seg.peak if seg.state in HELD else 0.0
            for a, b, p in g.spikes:
                if a * HOUR <= rel < b * HOUR:
                    peak = p
            series.setdefault(f"gpu_memory_used_max_bytes{{{_labels({**base, **pods})}}}", []).append(f"{peak} {t}")
            series.setdefault(f"gpu_utilization_ratio{{{_labels({**base, **pods})}}}", []).append(f"{seg.util} {t}")
            missing = g.sm_missing_h is not None and g.sm_missing_h[0] * HOUR <= rel < g.sm_missing_h[1] * HOUR
            if seg.sm is not None and not missing:
                series.setdefault(f"gpu_sm_active_ratio{{{_labels({**base, **pods})}}}", []).append(f"{seg.sm} {t}")
            if seg.dram is not None and not missing:
                series.setdefault(f"gpu_dram_active_ratio{{{_labels({**base, **pods})}}}", []).append(f"{seg.dram} {t}")
            if seg.sm is not None and not missing:
                for pipe, busy in (("tensor", seg.sm / 2), ("fp64", 0.0), ("fp32", 0.02), ("fp16", 0.0)):
                    series.setdefault(f"gpu_{pipe}_active_ratio{{{_labels({**base, **pods})}}}", []).append(
                        f"{busy} {t}"
                    )
            if g.name == H100:
                for link in ("0", "1"):
                    sent = NVLINK_CHATTER * (t - T0)  # counted since the driver loaded, an hour before the week
                    series.setdefault(f"gpu_nvlink_tx_bytes_total{{{_labels({**base, 'link': link})}}}", []).append(
                        f"{sent:.0f} {t}"
                    )
        for name, samples in series.items():
            lines += [f"{name} {s}\n" for s in samples]
    return "".join(lines) + "# EOF\n"


def _blocks(text: str) -> Path:
    """The week as TSDB blocks.  promtool takes about a minute to make them, so they are kept in the
    temp folder under a name that changes with the data, and made once for every run of the hour: the
    mutation runs of the report (quality/) run the history tests once per mutant."""
    key = hashlib.sha256(text.encode()).hexdigest()
    cache = Path(tempfile.gettempdir()) / f"gpu-exporter-week2-{key[:16]}"
    if (cache / "data").is_dir():
        return cache / "data"
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    building = Path(tempfile.mkdtemp(prefix="gpu-exporter-week2-building-"))
    try:
        (building / "week.om").write_text(text)
        out = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(building / "week.om"),
                              str(building / "data")], capture_output=True, text=True, timeout=600)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        (building / "week.om").unlink()
        for old in Path(tempfile.gettempdir()).glob("gpu-exporter-week2-????????????????"):
            if time.time() - old.stat().st_mtime > 6 * HOUR:  # the weeks of hours long gone (not one in use)
                shutil.rmtree(old, ignore_errors=True)
        with contextlib.suppress(OSError):  # another run made the same blocks meanwhile: use those
            building.rename(cache)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return cache / "data"


@dataclass
class Stores:
    prometheus: Prometheus
    victoriametrics: VictoriaMetrics

    def urls(self) -> dict[str, str]:
        return {"prometheus": self.prometheus.url, "victoriametrics": self.victoriametrics.url}


@contextmanager
def stores(tmp: Path) -> Iterator[Stores]:
    """The week in a Prometheus and a VictoriaMetrics, both on 127.0.0.1."""
    text = history()
    shutil.copytree(_blocks(text), tmp / "prom" / "data")  # Prometheus writes to its data: a copy of its own
    with prometheus([], tmp / "prom") as prom, victoria_metrics(tmp / "vm") as vm:
        vm.load(text)
        yield Stores(prom, vm)
