"""Issue 48, item 2: hours survive a scrape gap on every engine, and the report says where the store
has gaps. Four hours of six GPUs scraped every 15 s (tests/report_gaps.py), with a minute and ten
minutes of failed scrapes while the exporter kept counting, ten minutes in which it restarted, and
ten minutes of the exporter's own job's failed scrapes while a federation's copy of its series kept
coming (items 2 and 4 together), in a real Prometheus and a real VictoriaMetrics."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.report_gaps import END, GAPS, PRICE, SCRAPE, START, Stores, stores, truth

pytestmark = pytest.mark.integration

ENGINES = ("prometheus", "victoriametrics")


@pytest.fixture(scope="module")
def gaps(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with stores(tmp_path_factory.mktemp("gaps")) as s:
        yield s


def report(url: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--start",
                          str(START), "--end", str(END), "--format", "json", "--quiet", *args],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.fixture(scope="module")
def docs(gaps: Stores) -> dict[str, dict[str, Any]]:
    return {engine: report(url) for engine, url in gaps.urls().items()}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("node", ["n-whole", "n-minute", "n-ten", "n-copied", "n-both"])
def test_hours_and_money_are_exact_across_a_gap_the_counters_covered(docs: dict[str, dict[str, Any]], engine: str,
                                                                     node: str) -> None:  # fmt: skip
    (g,) = [g for g in docs[engine]["gpus"] if g["node"] == node]
    # Every second the exporter counted, to 0.1% (14 s of 4 h); each state's to a scrape, where the state
    # changed within the gap (whose edges fall at another phase of the scrapes than the steps').
    assert g["gpu_hours"] == pytest.approx(4.0, rel=1e-3), (engine, node, g)
    assert g["cost"] == pytest.approx(4.0 * PRICE, rel=1e-3), (engine, node, g)
    for state, seconds in truth(node).items():
        assert abs(g[f"{state}_hours"] * 3600 - seconds) <= SCRAPE, (engine, node, state, g)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_gap_a_copy_counted_is_not_counted_again_by_the_own_job(docs: dict[str, dict[str, Any]],
                                                                 engine: str) -> None:  # fmt: skip
    # The own job's counters carry the gap's ten minutes into its first step after it, and the
    # federation's copy counted them as they passed: the GPU's hours are the range's, and no GPU's series
    # add up to more than the range (which the report would scale down, and say so).
    (g,) = [g for g in docs[engine]["gpus"] if g["node"] == "n-copied"]
    assert g["gpu_hours"] * 3600 == pytest.approx(END - START, abs=2), g
    for node in docs[engine]["gpus"]:
        assert not [n for n in node.get("notes", []) if "add up to" in n], node
    # The timeline counts each step once too: its hours are the fleet's.
    tl = docs[engine]["timeline"]
    assert sum(v for p in tl for k, v in p.items() if k.endswith("_hours")) == pytest.approx(
        docs[engine]["totals"]["gpu_hours"], abs=2 / 3600
    )


def test_the_engines_agree_on_the_fleet(docs: dict[str, dict[str, Any]]) -> None:
    prom, vm = (docs[e]["totals"] for e in ENGINES)
    assert vm["gpu_hours"] == pytest.approx(prom["gpu_hours"], rel=1e-3)
    assert vm["cost"] == pytest.approx(prom["cost"], rel=1e-3)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_restart_in_the_gap_never_bills_the_time_nobody_counted(docs: dict[str, dict[str, Any]], engine: str) -> None:
    (g,) = [g for g in docs[engine]["gpus"] if g["node"] == "n-restart"]
    assert g["gpu_hours"] <= truth("n-restart")["busy"] / 3600 + 1e-9


@pytest.mark.parametrize("engine", ENGINES)
def test_the_report_names_each_gap_and_whether_the_counters_covered_it(docs: dict[str, dict[str, Any]],
                                                                       engine: str) -> None:  # fmt: skip
    found = {g["node"]: g for g in docs[engine]["store_gaps"]}
    assert set(found) == {n for n, gap in GAPS.items() if gap is not None}, docs[engine]["store_gaps"]
    for node, g in found.items():
        gap = GAPS[node]
        assert gap is not None
        # When: the gap lies within the steps named, and its length to a scrape.
        assert g["from"] <= _iso(gap.at) and _iso(gap.at + gap.seconds) <= g["to"], g
        assert abs(g["missing_seconds"] - gap.seconds) <= 15, g
        assert g["covered"] is (gap.down is None), g


def test_the_table_says_where_the_store_has_gaps(gaps: Stores) -> None:
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", gaps.prometheus.url,
                          "--start", str(START), "--end", str(END), "--quiet"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Scrape gaps" in text, text
    for node in ("n-minute", "n-ten", "n-restart"):
        assert node in text.split("Scrape gaps", 1)[1]
    assert "counter reset" in text
    # n-both's two targets (the own job's and the federation's) lost the same ten minutes: each named.
    listed = text.split("Scrape gaps", 1)[1]
    assert "n-both (n-both:9445)" in listed and "n-both (central:9090)" in listed, listed


def _iso(t: float) -> str:
    from gpu_exporter.report.model import iso

    return iso(t)
