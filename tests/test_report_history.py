"""``gpu-exporter report`` on a week of history with every case issue 25 found (tests/report_week.py),
the same samples in a real Prometheus and a real VictoriaMetrics: each engine's JSON equals figures
computed by hand, and the two equal each other (money to 0.1%, advice exactly).

Every minute the exporter counts is in the hand figures; each engine may differ from them by less
than a scrape interval per GPU (Prometheus extrapolates a counter's increase across the 20 minutes
node n2's exporter was gone, by half a scrape)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import assert_mentions
from tests.report_week import END, GIB, START, Stores, stores

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("prometheus", "victoriametrics")
MINUTE_H = 1 / 60
OUT = 21 / 60  # node n2's exporter was gone 20 minutes and counted nothing in the minute it came back


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with stores(tmp_path_factory.mktemp("week")) as s:
        yield s


def report(url: str, *args: str, span: tuple[float, float] | None = (START, END)) -> subprocess.CompletedProcess[str]:
    when = ("--start", str(span[0]), "--end", str(span[1])) if span else ()
    return subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, *when, *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def as_json(url: str, *args: str) -> dict[str, Any]:
    out = report(url, "--format", "json", *args)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.fixture(scope="module")
def docs(week: Stores) -> dict[str, dict[str, Any]]:
    return {engine: as_json(url) for engine, url in week.urls().items()}


HOURS = ("gpu_hours", "busy_hours", "allocated_idle_hours", "idle_hours", "down_hours")
# (node, gpu): busy, allocated idle, idle h; cost, wasted; price now; highest memory GiB; activity, signal; holder
EXPECTED = {
    ("n1", "0"): (68, 100, 0, 504.0, 300.0, 3.0, 11.2, 0.18, "SM activity", "pod ml/train-a"),
    ("n1", "1"): (168, 0, 0, 504.0, 0.0, 3.0, 60, 0.82, "SM activity", "pod ml/serve-b"),
    ("n1", "2"): (168, 0, 0, 336.0, 0.0, 2.0, 30, 0.20, "SM activity", "pod ml/light-c"),
    ("n1", "3"): (168, 0, 0, 504.0, 0.0, 3.0, 60, 0.30, "SM activity", "pod ml/big-d"),
    ("n2", "0"): (168 - OUT, 0, 0, (168 - OUT) * 3.0, 0.0, 3.0, 70, 0.10, "SM activity", "user alice"),
    # 0.80 until the step in which the price changed (84 h to 84 h 14 min), 1.00 from that step on.
    ("n2", "1"): (168 - OUT, 0, 0, (84 - OUT) * 0.8 + 84 * 1.0, 0.0, 1.0, 8, 0.75, "GPU utilization", "user carol"),
    ("n2", "2"): (0, 0, 159 - OUT, (159 - OUT) * 0.8, (159 - OUT) * 0.8, 0.8, 0, None, "GPU utilization", ""),
    ("n2", "3"): (0, 168 - OUT, 0, (168 - OUT) * 3.0, (168 - OUT) * 3.0, 3.0, 2, 0.0, "SM activity", "user dave"),
    ("n3", "0"): (0, 0, 168, None, None, None, 0, None, "GPU utilization", ""),
    ("n3", "1"): (168, 0, 0, None, None, None, 6, 0.05, "SM activity", "pod ml/unpriced-e"),
    ("n4", "0"): (168, 0, 0, 504.0, 0.0, 3.0, 9, 0.15, "SM activity", "pod ml/gpm-f"),
}  # fmt: skip


def close(got: float | None, want: float | None, rel: float = 1e-3, abs_: float = 0.01) -> bool:
    if got is None or want is None:
        return got is want
    return math.isclose(got, want, rel_tol=rel, abs_tol=abs_)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_gpu_equals_the_figures_computed_by_hand(docs: dict[str, dict[str, Any]], engine: str) -> None:
    doc = docs[engine]
    assert (doc["schema"], doc["currency"], doc["status"]) == ("gpu-exporter.report/v1", "USD", "ok")
    assert doc["range"] == {"start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(START)),
                            "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(END)), "hours": 168.0,
                            "step_seconds": 840, "requested_start": None, "requested_end": None}  # fmt: skip
    gpus = {(g["node"], g["gpu"]): g for g in doc["gpus"]}
    assert set(gpus) == set(EXPECTED)
    for key, (busy, alloc, idle, cost, wasted, price, peak, act, signal, holder) in EXPECTED.items():
        g = gpus[key]
        for field, want in zip(HOURS[1:], (busy, alloc, idle, 0), strict=True):
            assert close(g[field], want, 0, MINUTE_H), (key, field, g[field], want)
        assert close(g["cost"], cost) and close(g["wasted_cost"], wasted), (key, g["cost"], cost)
        assert g["price_now_per_hour"] == price, key
        assert g["memory_peak_bytes"] == peak * GIB or math.isclose(g["memory_peak_bytes"], peak * GIB), key
        assert close(g["activity_p95"], act, 0, 1e-4) and g["activity_signal"] == signal, (key, g["activity_p95"])
        assert g["holder"] == holder, key
    t = doc["totals"]
    assert close(t["gpu_hours"], 1837.6, 0, 6 * MINUTE_H) and close(t["cost"], 3635.74) \
        and close(t["wasted_cost"], 929.87)  # fmt: skip
    assert (t["gpus"], t["unpriced_gpus"], t["unpriced_hours"]) == (11, 2, 336.0)
    # The timeline tiles the week: its steps add up to the totals.
    assert len(doc["timeline"]) == 720
    for h in HOURS[1:]:
        assert close(sum(p[h] for p in doc["timeline"]), t[h], 0, 6 * MINUTE_H), h


@pytest.mark.parametrize("engine", ENGINES)
def test_the_advice_is_what_a_platform_engineer_would_sign(docs: dict[str, dict[str, Any]], engine: str) -> None:
    """Issue 25, each case:
    - n1 GPU 1, busy at 82% SM activity: no card is as fast (811 TFLOPS needed), so no advice.
    - n1 GPU 3, an on-demand H100 whose 60 GiB job fits only a whole H100 (the fleet also has one at
      2.00): never its own card, its 7g.80gb slice, or the cheaper H100.
    - n2 GPU 0, 12 GiB but 70 GiB for 3 hours: nothing holds 84 GiB.
    - n2 GPU 2, idle all the 158.65 h the exporter saw it (94.4% of the week): released.
    - n1 GPU 0 and n2 GPU 3, held but idle: reclaimed from whoever holds them.
    - n3 GPU 0, unpriced and idle: released, with no money figure.
    - n4 GPU 0: judged by its SM activity (15%) though GPU-Util (95%) fills its first 12 hours.
    Issue 37: n2 GPU 1, an L4 at 75% GPU-Util without GPM, was told an H100's 1g.10gb slice: its FP32
    and FP16 pipes, unknown, may be as busy as 75% of the L4's 30.3 TFLOPS (22.7), and the slice has
    67 / 7 = 9.6 of FP32: no advice now."""
    recs = {(r["node"], r["gpu"]): r for r in docs[engine]["recommendations"]}
    assert set(recs) == {("n1", "0"), ("n1", "2"), ("n2", "2"), ("n2", "3"), ("n3", "0"), ("n4", "0")}
    expected = {
        # (kind, suggested, saving a month, suggested price)
        ("n1", "0"): ("reclaim", "reclaim from pod ml/train-a", 3.0 * 100 / 168 * 730, 0.0),
        ("n1", "2"): ("mig", "H100 80GB MIG 3g.40gb", (2.0 - 2.0 * 3 / 7) * 730, 2.0 * 3 / 7),
        ("n2", "2"): ("release", "release", 0.8 * 730, 0.0),
        ("n2", "3"): ("reclaim", "reclaim from user dave", 3.0 * 730, 0.0),
        ("n3", "0"): ("release", "release", None, 0.0),
        ("n4", "0"): ("mig", "H100 80GB MIG 2g.20gb", (3.0 - 3.0 * 2 / 7) * 730, 3.0 * 2 / 7),
    }
    for key, (kind, suggested, saving, price) in expected.items():
        r = recs[key]
        assert (r["kind"], r["suggested"]) == (kind, suggested), (key, r["reason"])
        assert close(r["saving_per_month"], saving, 1e-4) and close(r["suggested_price_per_hour"], price, 1e-3), key
    assert_mentions(recs[("n1", "2")]["reason"], "pod ml/light-c", "30.0 GiB", "20% SM activity",
                    "10% DRAM bandwidth", "p95", "NVIDIA H100 80GB HBM3", "GPU 2 on n1", "168 h",
                    "H100 80GB MIG 3g.40gb", "32% headroom", "at least as fast", "$0.86/h", "this GPU's price",
                    "$2.00/h", "$834/month")  # fmt: skip
    assert_mentions(recs[("n2", "2")]["reason"], "GPU 2 on n2", "NVIDIA L4", "held by nobody", "159 h",
                    "the exporter saw it", "100%", "$127", "releasing it", "$584/month")  # fmt: skip
    assert_mentions(recs[("n2", "3")]["reason"], "GPU 3 on n2", "NVIDIA H100 80GB HBM3", "held but left idle", "168 h",
                    "100%", "$503", "reclaiming it from user dave", "$2,190/month")  # fmt: skip
    assert_mentions(recs[("n3", "0")]["reason"], "GPU 0 on n3", "100%", "releasing it", "no price")
    assert "$" not in recs[("n3", "0")]["reason"]
    assert close(docs[engine]["totals"]["advised_saving_per_month"], 6893.29 - (1.0 - 3.0 / 7) * 730, 1e-4)


def test_both_engines_give_the_same_report(docs: dict[str, dict[str, Any]]) -> None:
    """Issue 25: an ``or on (...)`` read 93.7% activity on VictoriaMetrics and 82% on Prometheus, and the
    advice changed. The same samples, two engines: the same advice word for word, the same money to
    0.1%, the same hours to a minute per GPU."""
    p, v = docs["prometheus"], docs["victoriametrics"]
    assert p["recommendations"] == v["recommendations"] or [
        {k: x for k, x in r.items() if k not in ("saving_per_month", "seen_hours")} for r in p["recommendations"]
    ] == [{k: x for k, x in r.items() if k not in ("saving_per_month", "seen_hours")} for r in v["recommendations"]]
    for a, b in zip(p["recommendations"], v["recommendations"], strict=True):
        assert close(a["saving_per_month"], b["saving_per_month"], 1e-3)
    for a, b in zip(p["gpus"], v["gpus"], strict=True):
        assert {k: x for k, x in a.items() if k not in (*HOURS, "cost", "wasted_cost", "price_per_hour")} == \
            {k: x for k, x in b.items() if k not in (*HOURS, "cost", "wasted_cost", "price_per_hour")}  # fmt: skip
        for k in HOURS:
            assert close(a[k], b[k], 0, MINUTE_H), (a["node"], a["gpu"], k)
        for k in ("cost", "wasted_cost", "price_per_hour"):
            assert close(a[k], b[k]), (a["node"], a["gpu"], k)
    assert close(p["totals"]["cost"], v["totals"]["cost"]) and [h["holder"] for h in p["holders"]] == \
        [h["holder"] for h in v["holders"]]  # fmt: skip


def test_the_holders_pay_for_what_they_held_and_unpriced_hours_are_shown(docs: dict[str, dict[str, Any]]) -> None:
    """Issue 25: a holder's cost silently left out its unpriced GPUs."""
    holders = {h["holder"]: h for h in docs["victoriametrics"]["holders"]}
    assert [h["holder"] for h in docs["victoriametrics"]["holders"]] == [
        "user dave", "pod ml/train-a", "pod ml/big-d", "pod ml/gpm-f", "pod ml/light-c", "pod ml/serve-b",
        "pod ml/unpriced-e", "user alice", "user bob", "user carol"]  # fmt: skip
    assert (holders["pod ml/unpriced-e"]["cost"], holders["pod ml/unpriced-e"]["unpriced_hours"]) == (None, 168.0)
    assert close(holders["user bob"]["cost"], (84 - OUT) * 0.8 + 16 * 1.0) and close(
        holders["user carol"]["cost"], 68.0
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_a_selector_narrows_the_week_to_one_node(week: Stores, engine: str) -> None:
    doc = as_json(week.urls()[engine], "--selector", '{node="n2"}')
    assert {g["node"] for g in doc["gpus"]} == {"n2"}
    assert close(doc["totals"]["cost"], 1283.74)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_range_is_exactly_the_one_asked_for(week: Stores, engine: str) -> None:
    """Issue 25: --start 2026-01-01 --end 2026-07-01 covered 2025-12-31T17:00 to 2026-06-30T20:00, and a
    721-hour range lost its first hour. A range that starts and ends off any step boundary (13 minutes
    after the week began, 29 hours and 7 minutes long) is covered exactly: n1 GPU 1, busy throughout, is
    busy all of it."""
    start = START + 13 * 60
    end = start + 29 * 3600 + 7 * 60
    doc = as_json(week.urls()[engine], "--start", str(start), "--end", str(end))
    assert (doc["range"]["start"], doc["range"]["end"]) == (
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)),
    )
    (g,) = [g for g in doc["gpus"] if (g["node"], g["gpu"]) == ("n1", "1")]
    assert close(g["busy_hours"], 29 + 7 / 60, 0, MINUTE_H) and close(g["cost"], (29 + 7 / 60) * 3.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_range_ending_in_the_future_is_cut_to_now_and_keeps_its_cost(week: Stores, engine: str) -> None:
    """Issue 25: a month-to-date report (--end next month) printed its hours but "No prices in Prometheus"
    and cost: null for every GPU. The end is cut to now, the report says so, and the week is priced."""
    out = report(week.urls()[engine], "--format", "json", span=(START, END + 40 * 86400))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["range"]["requested_end"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(END + 40 * 86400))
    assert "the range ended in the future" in out.stderr and "cut to now" in out.stderr
    assert close(doc["totals"]["cost"], 3635.74) and doc["status"] == "ok"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_century_long_range_still_ends_now_and_finds_the_week(week: Stores, engine: str) -> None:
    """Issue 25: --since 36500d ended 7 weeks ago and showed 0 GPUs."""
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", week.urls()[engine],
                          "--since", "36500d", "--format", "json", "--quiet"], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["range"]["requested_start"] is not None and doc["range"]["start"] < "1971"
    # The week, and the hour of history before it (20.80 an hour for the GPUs priced and seen then).
    assert doc["totals"]["gpus"] == 11 and close(doc["totals"]["cost"], 3635.74 + 20.80 * 59 / 60, 5e-3)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("args", "span", "status", "reason"),
    [
        (("--selector", '{node="elsewhere"}'), (START, END), 3,
         'the selector {node="elsewhere"} matched none of the 11 GPUs in the store from'),
        ((), (START - 30 * 86400, START - 20 * 86400), 3, "no gpu-exporter data from"),
        (("--currency", "EUR"), (START, END), 4, "no prices in EUR: the GPUs are priced in USD"),
        (("--selector", '{node="n3"}'), (START, END), 4, "no prices: the store has no gpu_price_per_hour"),
    ],
    ids=["selector-matched-nothing", "no-data-in-range", "no-prices-in-currency", "no-prices"],
)  # fmt: skip
def test_an_empty_or_unpriced_report_says_why_with_its_exit_status(week: Stores, engine: str, args: tuple[str, ...],
                                                                   span: tuple[float, float], status: int,
                                                                   reason: str) -> None:  # fmt: skip
    """Issue 25: an empty report said "No prices in Prometheus", and with --quiet nothing at all. Each
    reason is on stderr, --quiet or not, in the report itself, and in the exit status (docs/cost.md)."""
    for quiet in ((), ("--quiet",)):
        out = report(week.urls()[engine], *args, *quiet, span=span)
        assert out.returncode == status, out.stderr
        assert reason in out.stderr, out.stderr
        assert reason in out.stdout, out.stdout
        if quiet:
            assert out.stderr.count("\n") == 1, out.stderr


def test_a_users_catalogue_with_prices_is_what_the_report_suggests_from(week: Stores, tmp_path: Path) -> None:
    """--catalogue FILE with a price: a card the user can buy, cheaper than the slices the store prices."""
    cards = yaml.safe_load((ROOT / "gpu_exporter" / "report" / "catalogue.yaml").read_text())
    cards["currency"] = "USD"
    # Its FP32 rate too: the job uses its FP32 pipe (2%), and a card whose rate for it is unknown is not
    # claimed to be as fast (issue 37).
    cards["cards"].append({"name": "Budget 40GB", "match": ["Budget 40GB"], "memory_gib": 40, "fp16_tflops": 300,
                           "fp32_tflops": 40, "memory_bandwidth_gbps": 1000, "price_per_hour": 0.50})  # fmt: skip
    path = tmp_path / "cards.yaml"
    path.write_text(yaml.safe_dump(cards))
    doc = as_json(week.urls()["victoriametrics"], "--catalogue", str(path))
    recs = {(r["node"], r["gpu"]): r for r in doc["recommendations"]}
    # n1 GPU 2 needs 36 GiB, 198 TFLOPS and 335 GB/s: the Budget 40GB at 0.50 beats its own 3g.40gb (0.86).
    light = recs[("n1", "2")]
    assert (light["suggested"], light["price_source"]) == ("Budget 40GB", "your catalogue")
    assert close(light["saving_per_month"], (2.0 - 0.5) * 730)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--selector", "cluster=eu"), "is not a label selector"),
        (("--selector", '{__name__="x"}'), "may not name metrics"),
        (("--since", "7d"), "give --since or --start, not both"),
        (("--format", "json", "--prometheus.bearer-token-file", "/nonexistent/token"), "cannot read the bearer token"),
        (("--catalogue", "/nonexistent/cards.yaml"), "cannot read the catalogue"),
        (("--config", "/nonexistent/config.yaml"), "cannot read config file /nonexistent/config.yaml"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(week: Stores, args: tuple[str, ...], needle: str) -> None:
    out = report(week.prometheus.url, *args)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert out.stdout == ""


def code_blocks(path: Path, after: str) -> list[str]:
    """The fenced blocks of a document from the line holding ``after`` on."""
    text = path.read_text().split(after, 1)[1]
    return [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith("\n") or b.startswith("text\n")]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_readme_and_docs_show_real_output(week: Stores, engine: str, tmp_path: Path) -> None:
    """The README's excerpt and docs/cost.md's worked examples are what the report prints for this week
    (the dates aside): each line of them is a line of the output. The README's is Prometheus's, as it
    says (the engines count every step alike since issue 48, but for a new series' first step); the
    examples are both engines'."""
    url = week.urls()[engine]
    cheap_l40s, slower = tmp_path / "l40s.yaml", tmp_path / "slower.yaml"
    cheap_l40s.write_text(yaml.safe_dump({"pricing": {"currency": "USD", "models": {"L40S": 0.80}}}))
    slower.write_text(yaml.safe_dump({"pricing": {"currency": "USD", "models": {"L40S": 0.80, "A100": 1.00}},
                                      "report": {"allow_slower": True}}))  # fmt: skip
    outputs = [report(url, "--quiet").stdout, report(url, "--quiet", "--config", str(cheap_l40s)).stdout,
               report(url, "--quiet", "--config", str(slower)).stdout,
               report(url, "--quiet", span=(END - 12 * 3600, END)).stdout]  # fmt: skip
    printed = {line for out in outputs for line in out.splitlines()}
    (excerpt,) = code_blocks(ROOT / "README.md", "An excerpt of the table")[:1]
    examples = code_blocks(ROOT / "docs" / "cost.md", "**Worked examples**")[:6]
    for block in (*([excerpt] if engine == "prometheus" else []), *examples):
        for line in block.splitlines():
            if line and "GPU cost and waste from" not in line:
                assert line in printed, f"not printed by the report: {line!r}"
