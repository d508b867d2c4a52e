"""Issue 48, item 3: the recorded path knows when it is incomplete. The recording rules ran every hour
of a day, but the hours rule (gpu:report_state_seconds:hour) failed for 6 of its 24 hours (a ruler's
limit, a timeout) while the marker and the other rules ran: ``auto`` reads those 6 hours from the raw
series and the 18 others recorded, bills what the raw series give, and says so.  Two days of history
backfilled into a real Prometheus, the rules evaluated on it by promtool (tests/test_report_recorded.py),
the hours rule left out of the evaluations of the 6 hours; the same samples in a real VictoriaMetrics."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.report.queries import LAG, REC_STATE
from tests.prometheus_helpers import Prometheus, prometheus, victoria_metrics
from tests.test_report_recorded import END, HOUR, RULES, START, STEP, as_json, history, promtool, recorded_samples

pytestmark = pytest.mark.integration

DAY = ("--start", str(END - 24 * HOUR), "--end", str(END))
FAILED = (END - 14 * HOUR, END - 8 * HOUR)  # the hours rule wrote nothing for the hours from a to b


def _without_hours_rule(tmp: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        group["rules"] = [r for r in group["rules"] if r.get("record") != REC_STATE]
    out = tmp / "without-hours.rules.yml"
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("recorded-missing")
    (tmp / "history.om").write_text(history(STEP))
    promtool("tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"), str(tmp / "prom" / "data"))
    # The evaluation in [H + 1 h, H + 2 h) records the hour ending at H: those of the failed hours run
    # without the hours rule, the others with every rule.
    a, b = FAILED[0] + 2 * HOUR, FAILED[1] + 2 * HOUR
    with prometheus([], tmp / "prom") as prom:
        for n, (start, end, rules) in enumerate([(START, a, RULES), (a, b, _without_hours_rule(tmp)),
                                                  (b, END + LAG, RULES)]):  # fmt: skip
            promtool("tsdb", "create-blocks-from", "rules", f"--url={prom.url}", f"--start={start}", f"--end={end - 1}",
                     f"--output-dir={tmp / f'rules{n}'}", str(rules))  # fmt: skip
    for n in range(3):
        for block in (tmp / f"rules{n}").iterdir():
            shutil.move(str(block), tmp / "prom" / "data" / block.name)
    with prometheus([], tmp / "prom") as prom:
        yield prom


def _check(doc: dict[str, Any], err: str, raw: dict[str, Any]) -> None:
    assert "reading the range in parts" in err and "lack 6 of its hours" in err, err
    assert doc["recorded"]["missing_hours"] == [{"from": _iso(FAILED[0]), "to": _iso(FAILED[1]), "hours": 6}], doc[
        "recorded"
    ]
    # What the raw series give, to the float: the 6 hours are billed, read raw.
    assert doc["totals"]["gpu_hours"] == pytest.approx(raw["totals"]["gpu_hours"], rel=1e-9)
    assert doc["totals"]["cost"] == pytest.approx(raw["totals"]["cost"], rel=1e-9)
    assert {(g["node"], g["gpu"]): g["gpu_hours"] for g in doc["gpus"]} == pytest.approx(
        {(g["node"], g["gpu"]): g["gpu_hours"] for g in raw["gpus"]}, rel=1e-9
    )


def test_hours_the_hours_rule_missed_are_read_raw_and_the_report_says_so(store: Prometheus) -> None:
    raw, _ = as_json(store.url, *DAY, "--prometheus.recorded", "no")
    doc, err = as_json(store.url, *DAY)
    _check(doc, err, raw)
    table = as_table_text(store.url)
    assert "Recorded series" in table and "6 hours of the range without hours" in table, table


def test_victoriametrics_reads_the_same_hours_raw(store: Prometheus, tmp_path: Path) -> None:
    raw, _ = as_json(store.url, *DAY, "--prometheus.recorded", "no")
    with victoria_metrics(tmp_path / "vm") as vm:
        vm.load(history(STEP) + recorded_samples(store))
        doc, err = as_json(vm.url, *DAY)
    _check(doc, err, raw)


def as_table_text(url: str) -> str:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, *DAY, "--quiet"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def _iso(t: float) -> str:
    from gpu_exporter.report.model import iso

    return iso(t)
