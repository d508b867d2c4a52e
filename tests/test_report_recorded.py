"""The report's recorded path (alerts/gpu-report.rules.yml) against its raw path, on a real Prometheus:
two days of history backfilled with promtool, the recording rules' output made by promtool from the
same Prometheus (``create-blocks-from rules``, which evaluates each group at the phase of the hour a
running Prometheus would), and the report run both ways.  The money is the same to the float.

The history is sampled every 20 minutes, so that the raw path steps by an hour over two days (three
scrape intervals at least), as it does at any scrape interval over 30 days: both paths then evaluate
the same expressions at the same times.  It holds the edges the recorded path must keep:
- n1 GPU 0: an H100 whose price changes mid-hour (3.00 to 3.50 at 20 h 30 min), held by a pod, busy
  then idle;
- n1 GPU 1: seen by two scrapers (jobs gpu-exporter and replica), counted once;
- n2 GPU 0: its exporter restarts 10 h 40 min in, gone 40 minutes, its counters from 0 again;
- n2 GPU 1: an L4 first seen 5 h 20 min in (a partial first hour), idle, restarted with n2's exporter;
- n3 GPU 0: an H100 without a price.
- n4 GPU 0: an H100 whose pod changes every 8 hours, its price (2.00, then 2.40 from 30 h) written
  under its pod's labels as the exporter writes it: one price series per pod, none of which lasts
  the range (issue 53).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.report.model import iso
from gpu_exporter.report.queries import LAG
from tests.prometheus_helpers import Prometheus, prometheus, victoria_metrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alerts" / "gpu-report.rules.yml"
HOUR, STEP = 3600, 1200
END = math.floor(time.time() / HOUR) * HOUR - 3 * HOUR  # its hours recorded (1 to 2 h after each) before now
START = END - 48 * HOUR
T0 = START - 2 * HOUR
H100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA L4"
GIB = 1024**3


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def _state(node: str, gpu: str, rel: float) -> tuple[str, dict[str, str]]:
    """The state and holder of the scrape interval ending ``rel`` seconds after START."""
    if (node, gpu) == ("n1", "0"):
        return ("busy", {"namespace": "ml", "pod": "train-a", "container": "main"}) if rel <= 30 * HOUR else (
            "allocated_idle", {"namespace": "ml", "pod": "train-a", "container": "main"})  # fmt: skip
    if (node, gpu) == ("n1", "1"):
        return "busy", {"user": "alice"}
    if (node, gpu) == ("n2", "0"):
        return "busy", {"user": "bob"}
    if (node, gpu) == ("n4", "0"):
        return "busy", {"namespace": "batch", "pod": f"daily-{int(rel // CHURN)}", "container": "main"}
    return "idle", {}


GPUS = [("n1", "0", H100, [(-math.inf, 3.0), (20 * HOUR + 30 * 60, 3.5)], ("gpu-exporter",)),
        ("n1", "1", H100, [(-math.inf, 3.0)], ("gpu-exporter", "replica")),
        ("n2", "0", H100, [(-math.inf, 2.5)], ("gpu-exporter",)),
        ("n2", "1", L4, [(-math.inf, 0.8)], ("gpu-exporter",)),
        ("n3", "0", H100, None, ("gpu-exporter",)),
        ("n4", "0", H100, [(-math.inf, 2.0), (30 * HOUR, 2.4)], ("gpu-exporter",))]  # fmt: skip
CHURN = 8 * HOUR  # n4's pod changes this often
OUTAGE = (10 * HOUR + 40 * 60, 11 * HOUR + 20 * 60)  # n2's exporter is gone: no samples
FIRST_SEEN = {("n2", "1"): 5 * HOUR + 20 * 60}


def history(step: int = STEP) -> str:
    """The history, sampled every ``step`` seconds."""
    lines: list[str] = []
    for node, gpu, name, prices, jobs in GPUS:
        counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        rows: list[tuple[int, dict[tuple[str, tuple[tuple[str, str], ...]], float], str, dict[str, str]]] = []
        restarted = True
        for k in range((END - T0) // step + 1):
            t = T0 + k * step
            rel = t - START
            gone = node == "n2" and OUTAGE[0] <= rel < OUTAGE[1]
            if gone or rel < FIRST_SEEN.get((node, gpu), -math.inf):
                restarted = True
                continue
            state, holder = _state(node, gpu, rel)
            key = (state, tuple(sorted(holder.items())))
            if node == "n4":  # the interval ending now was the last pod's; the new pod's series starts at 0
                counters.setdefault(key, 0.0)
                was, before = _state(node, gpu, rel - step)
                key = (was, tuple(sorted(before.items())))
            if restarted:
                counters = dict.fromkeys(counters, 0.0)
                restarted = False
            else:
                counters[key] = counters.get(key, 0.0) + step
            counters.setdefault(("idle", ()), 0.0)
            counters.setdefault(("down", ()), 0.0)
            rows.append((t, dict(counters), state, holder))
        for job in jobs:
            base = {"job": job, "instance": f"{node}:9445", "node": node, "gpu": gpu, "uuid": f"GPU-{node}-{gpu}"}
            for t, values, state, _holder in rows:
                for (s, h), v in values.items():
                    labels = {**base, **(dict(h) if s in ("busy", "allocated_idle") else {}), "state": s}
                    lines.append(f"gpu_state_seconds_total{{{_labels(labels)}}} {v} {t}\n")
                if prices is not None:
                    price = [p for since, p in prices if t - START >= since][-1]
                    # n4's under its holder's labels, as the exporter writes a price (the others' without)
                    held = _holder if node == "n4" else {}
                    lines.append(f"gpu_price_per_hour{{{_labels({**base, **held, 'currency': 'USD'})}}} {price} {t}\n")
                lines.append(f"gpu_info{{{_labels({**base, 'name': name, 'mig_mode': 'disabled'})}}} 1 {t}\n")
                total = 80 * GIB if name == H100 else int(22.5 * GIB)
                lines.append(f"gpu_memory_total_bytes{{{_labels(base)}}} {total} {t}\n")
                used = 20 * GIB if state != "idle" else 0
                lines.append(f"gpu_memory_used_max_bytes{{{_labels(base)}}} {used} {t}\n")
                util = {"busy": 0.9, "allocated_idle": 0.01}.get(state, 0.0)
                lines.append(f"gpu_utilization_ratio{{{_labels(base)}}} {util} {t}\n")
                if name == H100:
                    lines.append(f"gpu_sm_active_ratio{{{_labels(base)}}} {util / 3} {t}\n")
    # OpenMetrics wants each series' samples together, in time order: they are, series by series.
    by_series: dict[str, list[str]] = {}
    for line in lines:
        series, rest = line.rsplit(" ", 2)[0], line
        by_series.setdefault(series, []).append(rest)
    return "".join(x for v in by_series.values() for x in v) + "# EOF\n"


def promtool(*args: str) -> None:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def _backfilled(tmp: Path, step: int) -> Iterator[Prometheus]:
    """The raw history, then the recording rules evaluated on it and backfilled next to it."""
    (tmp / "history.om").write_text(history(step))
    promtool("tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"), str(tmp / "prom" / "data"))
    with prometheus([], tmp / "prom") as prom:
        promtool("tsdb", "create-blocks-from", "rules", f"--url={prom.url}", f"--start={START}",
                 f"--end={END + LAG}", f"--output-dir={tmp / 'rules'}", str(RULES))  # fmt: skip
    for block in (tmp / "rules").iterdir():
        shutil.move(str(block), tmp / "prom" / "data" / block.name)
    with prometheus([], tmp / "prom") as prom:
        yield prom


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    yield from _backfilled(tmp_path_factory.mktemp("recorded"), STEP)


def report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--format", "json",
                           *args], capture_output=True, text=True, timeout=300)  # fmt: skip


def as_json(url: str, *args: str) -> tuple[dict[str, Any], str]:
    out = report(url, *args)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc, out.stderr


SPAN = ("--start", str(START), "--end", str(END))


@pytest.fixture(scope="module")
def both(store: Prometheus) -> dict[str, tuple[dict[str, Any], str]]:
    return {mode: as_json(store.url, *SPAN, "--prometheus.recorded", mode) for mode in ("no", "yes")}


def test_each_path_reads_what_it_says(both: dict[str, tuple[dict[str, Any], str]]) -> None:
    assert "reading the raw series" in both["no"][1]
    assert "reading the hourly recorded series" in both["yes"][1]
    assert both["no"][0]["range"]["step_seconds"] == both["yes"][0]["range"]["step_seconds"] == HOUR


def test_both_paths_give_the_same_money_hours_and_advice(both: dict[str, tuple[dict[str, Any], str]]) -> None:
    raw, rec = both["no"][0], both["yes"][0]
    assert rec["totals"] == raw["totals"]
    assert rec["gpus"] == raw["gpus"]
    assert rec["holders"] == raw["holders"]
    assert rec["recommendations"] == raw["recommendations"]
    assert rec["timeline"] == raw["timeline"]


def test_a_gpu_whose_pod_changes_is_priced_by_its_hours_not_step_by_step(
    both: dict[str, tuple[dict[str, Any], str]],
) -> None:
    """n4's price is written under each pod's labels: no one series is priced all range, yet the GPU is
    at every step. Each path counts its priced steps per GPU, so the GPU is priced by hours x price in
    two pieces, not step by step (the query a 10,000-GPU month with daily pods spent 100 s in), and
    its money is the hours' at each price, the same on both paths."""
    found = {}
    for mode in ("no", "yes"):
        doc, progress = both[mode]
        assert "cost of GPUs whose price changed" not in progress, (mode, progress)
        (found[mode],) = [g for g in doc["gpus"] if g["node"] == "n4"]
    raw, rec = found["no"], found["yes"]
    assert (rec["gpu_hours"], rec["cost"]) == (raw["gpu_hours"], raw["cost"])
    # Busy all 48 h; each hour at the price its last sample had, 2.40 from the sample at 30 h: 29 h at 2.00
    # and 19 h at 2.40.
    assert raw["busy_hours"] == raw["gpu_hours"] == pytest.approx(48, abs=1e-6), raw
    assert raw["cost"] == pytest.approx(29 * 2.0 + 19 * 2.4, abs=1e-6), raw


def test_one_scraper_alone_gives_the_same_money_on_both_paths(store: Prometheus) -> None:
    """Without a GPU seen twice, the recorded path sums each hour's samples as they are (no step by step
    comparison of copies): the same figures still."""
    one = ("--selector", '{job="gpu-exporter"}')
    raw, _ = as_json(store.url, *SPAN, *one, "--prometheus.recorded", "no")
    rec, err = as_json(store.url, *SPAN, *one, "--prometheus.recorded", "yes")
    assert "reading the hourly recorded series" in err and rec["totals"]["merged_gpus"] == 0
    assert rec["totals"]["gpus"] == 6
    assert (rec["totals"], rec["gpus"], rec["holders"]) == (raw["totals"], raw["gpus"], raw["holders"])


def test_a_fleet_read_in_shards_gives_what_it_gives_read_whole(
    store: Prometheus, both: dict[str, tuple[dict[str, Any], str]]
) -> None:
    """A GPU a shard (``--prometheus.shard-gpus 1``): the merged GPU's copies fall in its shard, n1 GPU 0's
    and n4's price changes cut their own shard's hours into pieces, the timeline is the shards' added up,
    and the report is the one read whole, to the float."""
    doc, err = as_json(store.url, *SPAN, "--prometheus.recorded", "yes", "--prometheus.shard-gpus", "1")
    assert "the GPUs in 6 shards" in err and "hours over time, GPUs 6/6" in err, err
    whole = both["yes"][0]
    for key in ("totals", "gpus", "holders", "recommendations", "timeline"):
        assert doc[key] == whole[key], key
    assert doc["totals"]["merged_gpus"] == 1


def test_the_history_holds_the_edges_the_recorded_path_keeps(both: dict[str, tuple[dict[str, Any], str]]) -> None:
    """Not a trivial history: a price changed mid-hour, one GPU merged from two scrapers, a restart."""
    doc = both["yes"][0]
    gpus = {(g["node"], g["gpu"]): g for g in doc["gpus"]}
    assert doc["totals"]["merged_gpus"] == 1 and len(gpus[("n1", "1")]["targets"]) == 2
    assert gpus[("n1", "1")]["busy_hours"] == pytest.approx(48, abs=0.5)  # once, not twice
    n1 = gpus[("n1", "0")]
    assert 48 * 3.0 < n1["cost"] < 48 * 3.5  # both prices, each for its hours
    assert n1["price_now_per_hour"] == 3.5
    assert gpus[("n2", "0")]["busy_hours"] == pytest.approx(48 - 2 / 3, abs=0.4)  # gone 40 minutes
    # First seen 5 h 20 min in (its first scrape counts nothing), and on n2, whose exporter was gone.
    assert gpus[("n2", "1")]["idle_hours"] == pytest.approx(48 - 5 - 2 / 3 - 2 / 3, abs=0.4)
    assert gpus[("n3", "0")]["cost"] is None


def test_the_hours_before_the_rules_ran_are_read_raw(store: Prometheus) -> None:
    """Before the rules ran, the hours are read from the raw series, the others recorded (issue 48).  Their
    backfill starts at START, whose evaluation records the hour ending an hour before it: the hours
    before START - 2 h are not."""
    early = ("--start", str(START - 4 * HOUR), "--end", str(END))
    doc, err = as_json(store.url, *early)
    assert f"raw from {iso(START - 4 * HOUR)} to {iso(START - 2 * HOUR)}; recorded from" in err, err
    assert "lack 2 of its hours" in err and doc["recorded"]["missing_hours"][0]["hours"] == 2
    raw, _ = as_json(store.url, *early, "--prometheus.recorded", "no")
    assert doc["totals"]["cost"] == pytest.approx(raw["totals"]["cost"], rel=1e-9)
    # --prometheus.recorded yes reads it so too: a part of it is recorded (tests/test_report_paths.py has
    # the range with none, which fails).
    doc_yes, _ = as_json(store.url, *early, "--prometheus.recorded", "yes")
    assert doc_yes["totals"] == doc["totals"]


def test_a_range_off_whole_hours_is_read_raw(store: Prometheus) -> None:
    doc, err = as_json(store.url, "--start", str(START + 600), "--end", str(END))
    assert "reading the raw series: the range is not 1 to 30 days on whole hours" in err
    assert doc["status"] == "ok"


def recorded_samples(prom: Prometheus) -> str:
    """The recorded series Prometheus holds, as ``name{labels} value unix_seconds`` lines."""
    span = END + LAG - START + 2 * HOUR
    data = prom.api("query", query=f'{{__name__=~"gpu:report_.+"}}[{span}s]', time=str(END + LAG + HOUR))
    lines = []
    for r in data["result"]:
        labels = dict(r["metric"])
        name = labels.pop("__name__")
        lines += [f"{name}{{{_labels(labels)}}} {v} {t}" for t, v in r["values"]]
    return "\n".join(lines) + "\n"


def test_victoriametrics_reads_the_same_recorded_hours(
    store: Prometheus, tmp_path: Path, both: dict[str, tuple[dict[str, Any], str]]
) -> None:
    """The recorded path's ranges and subqueries read the same samples on VictoriaMetrics (whose ranges
    leave their start out) as on Prometheus: the same samples recorded by Prometheus give the same report."""
    with victoria_metrics(tmp_path / "vm") as vm:
        vm.load(history() + recorded_samples(store))
        doc, err = as_json(vm.url, *SPAN, "--prometheus.recorded", "yes")
    assert "reading the hourly recorded series" in err
    rec = both["yes"][0]
    assert (doc["totals"], doc["gpus"], doc["holders"]) == (rec["totals"], rec["gpus"], rec["holders"])


# -- a range read in parts ---------------------------------------------------------------------------
# The same history sampled every 5 minutes (a step of three scrapes is 15 minutes), and a range whose
# ends are no whole hours: 25 minutes after START to 1,000 s before END.  Its ends are read raw, the
# 46 whole hours between them recorded.
FINE = 300
HEAD, TAIL = (START + 1500, START + HOUR), (END - HOUR, END - 1000)
OFF_HOURS = ("--start", str(HEAD[0]), "--end", str(TAIL[1]))


@pytest.fixture(scope="module")
def fine_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    yield from _backfilled(tmp_path_factory.mktemp("recorded-fine"), FINE)


@pytest.fixture(scope="module")
def in_parts(fine_store: Prometheus) -> dict[str, tuple[dict[str, Any], str]]:
    """The range read in parts, raw whole, and each of its parts read on its own."""
    return {
        "parts": as_json(fine_store.url, *OFF_HOURS),
        "raw": as_json(fine_store.url, *OFF_HOURS, "--prometheus.recorded", "no"),
        "head": as_json(fine_store.url, "--start", str(HEAD[0]), "--end", str(HEAD[1])),
        "middle": as_json(fine_store.url, "--start", str(HEAD[1]), "--end", str(TAIL[0]), "--prometheus.recorded",
                          "yes"),
        "tail": as_json(fine_store.url, "--start", str(TAIL[0]), "--end", str(TAIL[1])),
    }  # fmt: skip


def test_a_range_off_whole_hours_reads_its_ends_raw_and_the_hours_between_recorded(
    in_parts: dict[str, tuple[dict[str, Any], str]],
) -> None:
    from gpu_exporter.report.model import iso

    doc, err = in_parts["parts"]
    assert "reading the range in parts" in err
    assert f"raw from {iso(HEAD[0])} to {iso(HEAD[1])}" in err
    assert f"recorded from {iso(HEAD[1])} to {iso(TAIL[0])}" in err and f"raw from {iso(TAIL[0])} to" in err
    assert doc["range"]["start"] == iso(HEAD[0]) and doc["range"]["end"] == iso(TAIL[1])
    assert "reading the raw series" in in_parts["raw"][1] and "reading the hourly" in in_parts["middle"][1]


def test_a_range_read_in_parts_costs_what_its_parts_cost_on_their_own(
    in_parts: dict[str, tuple[dict[str, Any], str]],
) -> None:
    """Each GPU's hours and cost, and each holder's, are the sum of the three reports of its parts (each
    rounded to the fourth digit: so to 3 units of it)."""
    doc = in_parts["parts"][0]
    parts = [in_parts[k][0] for k in ("head", "middle", "tail")]
    for g in doc["gpus"]:
        each = [x for p in parts for x in p["gpus"] if (x["node"], x["gpu"]) == (g["node"], g["gpu"])]
        assert len(each) == (2 if (g["node"], g["gpu"]) == ("n2", "1") else 3), g  # n2 GPU 1: first seen later
        for field in ("gpu_hours", "busy_hours", "allocated_idle_hours", "idle_hours", "down_hours"):
            assert g[field] == pytest.approx(sum(x[field] for x in each), abs=3e-6), (g["node"], g["gpu"], field)
        if g["cost"] is None:
            assert all(x["cost"] is None for x in each)
        else:
            assert g["cost"] == pytest.approx(sum(x["cost"] for x in each), abs=3e-4), (g["node"], g["gpu"])
    for h in doc["holders"]:
        each = [x for p in parts for x in p["holders"] if x["holder"] == h["holder"]]
        assert h["busy_hours"] == pytest.approx(sum(x["busy_hours"] for x in each), abs=3e-6)
        assert h["cost"] == pytest.approx(sum(x["cost"] or 0.0 for x in each), abs=3e-4)
    assert doc["totals"]["cost"] == pytest.approx(sum(p["totals"]["cost"] for p in parts), abs=3e-4)
    # n1 GPU 0's price changed from 3.00 to 3.50 within the middle: the price now is the tail's.
    n1 = next(g for g in doc["gpus"] if (g["node"], g["gpu"]) == ("n1", "0"))
    assert n1["price_now_per_hour"] == 3.5 and doc["totals"]["merged_gpus"] == 1


def test_a_range_read_in_parts_costs_what_it_costs_read_raw(
    in_parts: dict[str, tuple[dict[str, Any], str]],
) -> None:
    """The raw path steps by 1,300 s where the parts step by the hour and by 15 minutes or so: the same
    hours but at a restart (n2's, whose hours each path counts to within a step of the 46.56 h it was
    busy), the same money to 0.2%."""
    doc, raw = in_parts["parts"][0], in_parts["raw"][0]
    assert doc["totals"]["gpus"] == raw["totals"]["gpus"] == 6 and raw["range"]["step_seconds"] == 1300
    step = 1300 / HOUR
    for g, r in zip(doc["gpus"], raw["gpus"], strict=True):
        assert (g["node"], g["gpu"]) == (r["node"], r["gpu"])
        for field in ("busy_hours", "allocated_idle_hours", "idle_hours"):
            assert g[field] == pytest.approx(r[field], abs=step), (g["node"], g["gpu"], field)
    assert doc["totals"]["cost"] == pytest.approx(raw["totals"]["cost"], rel=0.002)
    assert [r["kind"] for r in doc["recommendations"]] == [r["kind"] for r in raw["recommendations"]]


def test_a_range_read_in_parts_and_shards_gives_what_it_gives_read_whole(
    fine_store: Prometheus, in_parts: dict[str, tuple[dict[str, Any], str]]
) -> None:
    """The raw ends and the recorded hours, each asked three GPUs at a time: the same report."""
    doc, err = as_json(fine_store.url, *OFF_HOURS, "--prometheus.shard-gpus", "3")
    assert "in 3 parts, the GPUs in 3 shards" in err, err
    whole = in_parts["parts"][0]
    for key in ("totals", "gpus", "holders", "recommendations", "timeline"):
        assert doc[key] == whole[key], key


def test_csv_of_a_range_read_in_parts_adds_up_to_its_total(fine_store: Prometheus, tmp_path: Path) -> None:
    """The charges of a range read in parts: each GPU's price periods go on across the parts (n1 GPU 0's
    two, the others' one), and add up to the report's total to the last digit."""
    import csv
    import io
    from decimal import Decimal

    from gpu_exporter.report.model import iso

    out = report(fine_store.url, *OFF_HOURS)
    doc = json.loads(out.stdout)
    text = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", fine_store.url,
                           *OFF_HOURS, "--format", "csv"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert text.returncode == 0, text.stderr
    rows = list(csv.DictReader(io.StringIO(text.stdout)))
    assert sum(Decimal(r["cost"]) for r in rows if r["cost"]) == Decimal(str(doc["totals"]["cost"]))
    periods: dict[tuple[str, str], set[tuple[str, str, str]]] = {(r["node"], r["gpu"]): set() for r in rows}
    for r in rows:
        if r["cost"]:
            periods[(r["node"], r["gpu"])].add((r["period_start"], r["period_end"], r["price_per_hour"]))
    assert len(periods[("n1", "0")]) == 2
    assert periods[("n1", "1")] == {(doc["range"]["start"], doc["range"]["end"], "3.0")}
    assert periods[("n2", "1")] == {(iso(HEAD[1]), doc["range"]["end"], "0.8")}  # first seen in the middle


def test_victoriametrics_reads_a_range_in_parts_as_prometheus_does(
    fine_store: Prometheus, tmp_path: Path, in_parts: dict[str, tuple[dict[str, Any], str]]
) -> None:
    with victoria_metrics(tmp_path / "vm") as vm:
        vm.load(history(FINE) + recorded_samples(fine_store))
        doc, err = as_json(vm.url, *OFF_HOURS)
    assert "reading the range in parts" in err
    prom = in_parts["parts"][0]
    assert doc["totals"]["gpus"] == prom["totals"]["gpus"]
    assert doc["totals"]["cost"] == pytest.approx(prom["totals"]["cost"], rel=0.002)
    for g, p in zip(doc["gpus"], prom["gpus"], strict=True):
        assert g["busy_hours"] == pytest.approx(p["busy_hours"], abs=FINE / HOUR)
