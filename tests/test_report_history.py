"""``gpu-exporter report`` on a week of history with known waste, backfilled into a real Prometheus
with ``promtool tsdb create-blocks-from openmetrics``: the JSON equals figures computed by hand.

Two nodes, sampled every minute, as gpu-exporter would have exported them:
- n1 GPU 0, an H100 at 3.00 USD/h, held by pod ml/train-a: busy for 68 h (18% SM activity), then
  allocated but idle for 100 h (2%); its memory peaks at 11.2 GiB all week.
- n1 GPU 1, an H100 at 3.00 USD/h, held by pod ml/serve-b: busy all week at 85%, peaks at 70 GiB.
- n2 GPU 0, an L4 at 0.80 USD/h, nobody's: idle all week.
- n2 GPU 1, an L4, user alice (no Kubernetes): allocated but idle 20 h at 1% GPU-Util, busy 130 h
  at 70%, then down for 18 h; its memory peaks at 22 of 22.5 GiB. Its price goes from 0.80 USD/h to
  1.00 after the first 84 h, so the report prices its hours step by step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus_helpers import Prometheus, prometheus

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024**3
STEP = 60
HOUR = 3600
END = math.floor(time.time() / HOUR) * HOUR - 2 * HOUR
START = END - 168 * HOUR
T0 = START - HOUR  # an hour of history before the week, in each GPU's first state
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
PEAK_TRAIN = int(11.2 * GIB)

GPUS: list[dict[str, Any]] = [
    dict(node="n1", gpu="0", name=H100, total=80 * GIB, price=3.0, pod=("ml", "train-a", "main"), user="",
         segments=[("busy", 68), ("allocated_idle", 100)], peak=PEAK_TRAIN, sm={"busy": 0.18, "allocated_idle": 0.02},
         util={"busy": 0.9, "allocated_idle": 0.9}),
    dict(node="n1", gpu="1", name=H100, total=80 * GIB, price=3.0, pod=("ml", "serve-b", "main"), user="",
         segments=[("busy", 168)], peak=70 * GIB, sm={"busy": 0.85}, util={"busy": 1.0}),
    dict(node="n2", gpu="0", name=L4, total=int(22.5 * GIB), price=0.8, pod=None, user="",
         segments=[("idle", 168)], peak=0, sm=None, util={"idle": 0.0}),
    dict(node="n2", gpu="1", name=L4, total=int(22.5 * GIB), price=0.8, price_later=1.0, pod=None, user="alice",
         segments=[("allocated_idle", 20), ("busy", 130), ("down", 18)], peak=22 * GIB, sm=None,
         util={"allocated_idle": 0.01, "busy": 0.7}),
]  # fmt: skip


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def history(path: Path) -> None:
    """OpenMetrics text of the week, as Prometheus would have scraped it every minute."""
    lines: list[str] = []
    times = range(T0, END + 1, STEP)
    for g in GPUS:
        base = {"job": "gpu-exporter", "instance": f"{g['node']}:9445", "node": g["node"], "gpu": g["gpu"],
                "uuid": f"GPU-{g['node']}-{g['gpu']}"}  # fmt: skip
        pods = dict(zip(("namespace", "pod", "container"), g["pod"], strict=True)) if g["pod"] else {}
        holder = {**pods, "user": g["user"]}
        bounds, at = [], T0
        for i, (state, hours) in enumerate(g["segments"]):
            at += (hours + (1 if i == 0 else 0)) * HOUR
            bounds.append((at, state))

        def state_at(t: int, bounds: list[tuple[int, str]] = bounds) -> str:
            return next((s for end, s in bounds if t < end), bounds[-1][1])

        counters: dict[tuple[str, str], float] = {}
        series: dict[str, list[str]] = {}
        for t in times:
            state = state_at(t - 1)  # the state of the minute that ends at t
            held = state in ("busy", "allocated_idle")
            if t > T0:
                key = ("holder" if held else "nobody", state)
                counters[key] = counters.get(key, 0.0) + STEP
            for who in ("nobody", "holder"):
                for s in ("busy", "allocated_idle") if who == "holder" else ("busy", "allocated_idle", "idle", "down"):
                    labels = {**base, **(holder if who == "holder" else {"user": ""}), "state": s}
                    series.setdefault(f"gpu_state_seconds_total{{{_labels(labels)}}}", []).append(
                        f"{counters.get((who, s), 0.0)} {t}"
                    )
            price = g["price"] if t <= START + 84 * HOUR else g.get("price_later", g["price"])
            series.setdefault(f"gpu_price_per_hour{{{_labels({**base, **pods, 'currency': 'USD'})}}}", []).append(
                f"{price} {t}"
            )
            if state == "down":
                continue  # a lost GPU exports gpu_up 0 and nothing else
            info = {**base, **pods, "name": g["name"], "mig_mode": "disabled"}
            series.setdefault(f"gpu_info{{{_labels(info)}}}", []).append(f"1 {t}")
            series.setdefault(f"gpu_memory_total_bytes{{{_labels({**base, **pods})}}}", []).append(f"{g['total']} {t}")
            peak = g["peak"] if held else 0
            series.setdefault(f"gpu_memory_used_max_bytes{{{_labels({**base, **pods})}}}", []).append(f"{peak} {t}")
            series.setdefault(f"gpu_utilization_ratio{{{_labels({**base, **pods})}}}", []).append(
                f"{g['util'].get(state, 0.0)} {t}"
            )
            if g["sm"] is not None:
                series.setdefault(f"gpu_sm_active_ratio{{{_labels({**base, **pods})}}}", []).append(
                    f"{g['sm'].get(state, 0.0)} {t}"
                )
        for name, samples in series.items():
            lines += [f"{name} {s}\n" for s in samples]
    path.write_text("".join(lines) + "# EOF\n")


def week_blocks() -> Path:
    """The week as TSDB blocks.  promtool takes about a minute to make them, so they are kept in the
    temp folder under a name that changes with the data (and with this file), and made once for
    every run of the hour: the mutation runs of the report (quality/) run this file once per mutant."""
    key = hashlib.sha256(f"{GPUS!r} {T0} {START} {END} {STEP}".encode() + Path(__file__).read_bytes()).hexdigest()
    cache = Path(tempfile.gettempdir()) / f"gpu-exporter-week-{key[:16]}"
    if (cache / "data").is_dir():
        return cache / "data"
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    building = Path(tempfile.mkdtemp(prefix="gpu-exporter-week-building-"))
    try:
        history(building / "week.om")
        out = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(building / "week.om"),
                              str(building / "data")], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        (building / "week.om").unlink()
        for old in Path(tempfile.gettempdir()).glob("gpu-exporter-week-????????????????"):
            if time.time() - old.stat().st_mtime > 6 * HOUR:  # the weeks of hours long gone (not one in use)
                shutil.rmtree(old, ignore_errors=True)
        with contextlib.suppress(OSError):  # another run made the same blocks meanwhile: use those
            building.rename(cache)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return cache / "data"


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("week")
    shutil.copytree(week_blocks(), tmp / "prom" / "data")  # Prometheus writes to its data: a copy of its own
    with prometheus([], tmp / "prom") as prom:
        yield prom


def report(prom: Prometheus, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", prom.url,
                           "--start", str(START), "--end", str(END), *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 3)
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [rounded(x) for x in v]
    return v


HOURS = ("gpu_hours", "busy_hours", "allocated_idle_hours", "idle_hours", "down_hours")


def test_the_week_equals_the_figures_computed_by_hand(week: Prometheus) -> None:
    out = report(week, "--format", "json")
    assert out.returncode == 0, out.stderr
    # One GPU's price changed: it alone is priced step by step, by an eighth query.
    assert "/8] cost of GPUs whose price changed" in out.stderr, out.stderr
    doc = rounded(json.loads(out.stdout))
    assert doc["schema"] == "gpu-exporter.report/v1" and doc["currency"] == "USD"
    assert doc["range"] == {"start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(START)),
                            "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(END)), "hours": 168.0,
                            "step_seconds": 900}  # fmt: skip
    # 4 GPUs x 168 h. Busy 68 + 168 + 130; allocated but idle 100 + 20; idle 168; down 18.
    # Cost 168 x 3.00 x 2 + 168 x 0.80 + (84 x 0.80 + 84 x 1.00); wasted 100 x 3.00 + 168 x 0.80 + 20 x 0.80.
    assert doc["totals"] == {"gpu_hours": 672.0, "busy_hours": 366.0, "allocated_idle_hours": 120.0,
                             "idle_hours": 168.0, "down_hours": 18.0, "cost": 1293.6, "wasted_cost": 450.4,
                             "gpus": 4, "unpriced_gpus": 0}  # fmt: skip
    gpus = {(g["node"], g["gpu"]): g for g in doc["gpus"]}
    expected = {
        ("n1", "0"): (168, 68, 100, 0, 0, 504.0, 300.0, 3.0, PEAK_TRAIN, 0.18, "SM activity", "pod ml/train-a"),
        ("n1", "1"): (168, 168, 0, 0, 0, 504.0, 0.0, 3.0, 70 * GIB, 0.85, "SM activity", "pod ml/serve-b"),
        ("n2", "0"): (168, 0, 0, 168, 0, 134.4, 134.4, 0.8, 0, None, "GPU utilization", ""),
        ("n2", "1"): (168, 130, 20, 0, 18, 151.2, 16.0, 0.9, 22 * GIB, 0.7, "GPU utilization", "user alice"),
    }
    for key, (total, busy, alloc, idle, down, cost, wasted, price, peak, act, signal, holder) in expected.items():
        g = gpus[key]
        assert [g[h] for h in HOURS] == [total, busy, alloc, idle, down], key
        assert (g["cost"], g["wasted_cost"], g["price_per_hour"]) == (cost, wasted, price), key
        assert (g["memory_peak_bytes"], g["activity_p95"], g["activity_signal"], g["holder"]) == \
            (peak, act, signal, holder), key  # fmt: skip
    assert gpus[("n2", "1")]["notes"] and "whole card (22.0 of 22.5 GiB)" in gpus[("n2", "1")]["notes"][0]
    assert all(not g["notes"] for k, g in gpus.items() if k != ("n2", "1"))

    assert doc["holders"] == [
        {"kind": "pod", "holder": "pod ml/train-a", "namespace": "ml", "pod": "train-a", "user": "", "gpus": 1,
         "gpu_hours": 168.0, "busy_hours": 68.0, "allocated_idle_hours": 100.0, "cost": 504.0, "wasted_cost": 300.0},
        {"kind": "user", "holder": "user alice", "namespace": "", "pod": "", "user": "alice", "gpus": 1,
         "gpu_hours": 150.0, "busy_hours": 130.0, "allocated_idle_hours": 20.0, "cost": 133.2, "wasted_cost": 16.0},
        {"kind": "pod", "holder": "pod ml/serve-b", "namespace": "ml", "pod": "serve-b", "user": "", "gpus": 1,
         "gpu_hours": 168.0, "busy_hours": 168.0, "allocated_idle_hours": 0.0, "cost": 504.0, "wasted_cost": 0.0},
    ]  # fmt: skip

    # n1 GPU 0 needs 11.2 GiB x 1.2 = 13.44 GiB and 18% of 960 = 172.8 FP16 TFLOPS. The cheapest card that
    # holds it is the RTX 3090 (24 GiB, 142 TFLOPS, 0.30 USD/h in the catalogue): 172.8 / 142 = 1.217x as long,
    # 0.30 x 1.217 = 0.3651 USD/h. Saving (3.00 - 0.3651) x 168 h x 730/168 = 1923.50 USD/month.
    # The busy H100 needs 84 GiB: no card holds it. The L4 with the full card's memory gets a note, not a card.
    # n2 GPU 0 sat idle all week: releasing it saves 0.80 x 730 = 584 USD/month.
    slowdown = 172.8 / 142
    assert doc["recommendations"] == [
        {"node": "n1", "gpu": "0", "uuid": "GPU-n1-0", "holder": "pod ml/train-a", "current_model": H100,
         "suggested": "RTX 3090",
         "reason": "pod ml/train-a peaked at 11.2 GiB and 18% SM activity on NVIDIA H100 80GB HBM3 (GPU 0 on n1) "
                   "for 168 h; an RTX 3090 would hold it with 114% headroom, taking about 1.2x as long; estimated "
                   "saving $1,923/month",
         "saving_per_month": round((3.0 - 0.30 * slowdown) * 730, 3), "suggested_price_per_hour": 0.3,
         "slowdown": round(slowdown, 2)},
        {"node": "n2", "gpu": "0", "uuid": "GPU-n2-0", "holder": "", "current_model": L4, "suggested": "release",
         "reason": "GPU 0 on n2 (NVIDIA L4) sat idle, held by nobody, for 168 h of 168 h; releasing it would save an "
                   "estimated $584/month",
         "saving_per_month": 584.0, "suggested_price_per_hour": 0.0, "slowdown": 1.0},
    ]  # fmt: skip
    # The timeline tiles the week: its steps add up to the totals.
    assert len(doc["timeline"]) == 672
    for h in HOURS[1:]:
        assert round(sum(p[h] for p in doc["timeline"]), 2) == doc["totals"][h], h


def test_an_hour_of_minute_scrapes_is_counted_in_steps_of_several_scrapes(week: Prometheus) -> None:
    """The report reads the scrape interval from the samples: on the week's 1-minute scrapes, the last
    hour is summed in steps of 5 minutes (at least three scrapes each), not the 5 s an hour would
    otherwise get, whose increase() would see no two samples and count no hours at all."""
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", week.url,
                          "--start", str(END - HOUR), "--end", str(END), "--format", "json"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "over 1 h (12 steps of 300 s)" in out.stderr, out.stderr
    doc = rounded(json.loads(out.stdout))
    assert doc["range"]["step_seconds"] == 300 and doc["range"]["hours"] == 1.0
    # The week's last hour: n1 GPU 0 allocated but idle, n1 GPU 1 busy, n2 GPU 0 idle, n2 GPU 1 down.
    assert {k: doc["totals"][k] for k in HOURS} == {"gpu_hours": 4.0, "busy_hours": 1.0, "allocated_idle_hours": 1.0,
                                                   "idle_hours": 1.0, "down_hours": 1.0}  # fmt: skip


def test_a_selector_narrows_the_week_to_one_node(week: Prometheus) -> None:
    out = report(week, "--format", "json", "--selector", '{node="n2"}')
    doc = json.loads(out.stdout)
    assert {g["node"] for g in doc["gpus"]} == {"n2"}
    assert rounded(doc["totals"]["cost"]) == 285.6 and rounded(doc["totals"]["wasted_cost"]) == 150.4


def test_a_users_catalogue_is_what_the_report_suggests_from(week: Prometheus, tmp_path: Path) -> None:
    """--catalogue FILE: the shipped cards, and a cheaper one the user buys, which is suggested."""
    cards = yaml.safe_load((ROOT / "gpu_exporter" / "report" / "catalogue.yaml").read_text())
    cards["cards"].append({"name": "Budget 16GB", "match": ["Budget 16GB"], "memory_gib": 16, "fp16_tflops": 200,
                           "fp32_tflops": 25, "memory_bandwidth_gbps": 600, "price_per_hour": 0.20})  # fmt: skip
    path = tmp_path / "cards.yaml"
    path.write_text(yaml.safe_dump(cards))
    out = report(week, "--format", "json", "--catalogue", str(path))
    assert out.returncode == 0, out.stderr
    recs = {(r["node"], r["gpu"]): r for r in json.loads(out.stdout)["recommendations"]}
    # n1 GPU 0 needs 13.44 GiB and 172.8 TFLOPS: the Budget 16GB holds both at 0.20 USD/h, below the RTX
    # 3090's 0.30 x 1.217. (3.00 - 0.20) x 168 h x 730 / 168 h = 2,044 USD/month; 16 / 11.2 = 43% headroom.
    train = recs[("n1", "0")]
    assert (train["suggested"], train["saving_per_month"], train["slowdown"]) == ("Budget 16GB", 2044.0, 1.0)
    assert "a Budget 16GB would hold it with 43% headroom; estimated saving $2,044/month" in train["reason"]
    assert recs[("n2", "0")]["suggested"] == "release"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--selector", "cluster=eu"), "is not a label selector"),
        (("--selector", '{__name__="x"}'), "may not name metrics"),
        (("--since", "7d"), "give --since or --start, not both"),
        (("--format", "json", "--prometheus.bearer-token-file", "/nonexistent/token"), "cannot read the bearer token"),
        (("--catalogue", "/nonexistent/cards.yaml"), "cannot read the catalogue"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(week: Prometheus, args: tuple[str, ...], needle: str) -> None:
    out = report(week, *args)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert out.stdout == ""
