"""The daemon and Prometheus agree at the threshold.

A property test feeds random traces, rich in values exactly at the thresholds, both to the daemon's
rule engine and to Prometheus's own rule evaluation (promtool's unit-test runner: the rules package
and PromQL engine of the installed Prometheus, evaluating the shipped ``alerts/`` file, with the
windows and ``for`` durations shortened alike on both sides).  After every sample, both must hold
the same pending and firing alerts.  A real Prometheus server scraping the real daemon then checks
the case from the issue: a GPU steady at exactly 10% fires on neither side; one at 9% fires on both.

Sample times: the daemon judges at each poll; Prometheus 2.x ranges are closed at both ends and
3.x ranges are left-open like the daemon's, so samples lie half an evaluation interval off the
evaluation times, where both versions see the same samples as the daemon.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.alerting.engine import RuleEngine
from gpu_exporter.settings.config import load_settings
from gpu_exporter.snapshot import GpuReading, GpuStatic, NodeSnapshot, ProcessReading, pcie_link_bytes_per_second
from tests.exporter_helpers import http_get, run_daemon, value, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm
from tests.prometheus_helpers import prometheus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alerts" / "gpu-exporter.rules.yml"
GIB = 1024**3
TOTAL = 100 * GIB  # so that k GiB used is exactly the ratio k/100 on both sides

# The rules under test, and their durations shortened alike on both sides (the comparisons and
# thresholds are the shipped ones).
COMPARED = ("GpuUnderutilized", "GpuMemoryHigh", "GpuPcieBottleneck", "GpuPcieLinkDegraded")
FOR = {"GpuUnderutilized": "3m", "GpuMemoryHigh": "2m", "GpuPcieBottleneck": "2m", "GpuPcieLinkDegraded": "2m"}
WINDOW = "6m"
SERIES = 'job="gpu-exporter",instance="n1:9445",gpu="0",uuid="GPU-0"'


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)


def shortened_rules(dst: Path, avg_over_time: bool = False) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    (gpu_group,) = [g for g in doc["groups"] if g["name"] == "gpu-exporter.gpu"]
    rules = [r for r in gpu_group["rules"] if r.get("alert") in COMPARED]
    for r in rules:
        r["for"] = FOR[r["alert"]]
        r["expr"] = r["expr"].replace("[30m]", f"[{WINDOW}]")
        if avg_over_time:  # what the rule said before: Prometheus 2.x's incremental mean
            r["expr"] = re.sub(r"sum_over_time\((.*?)\) / count_over_time\(\1\)", r"avg_over_time(\1)", r["expr"])
        r["annotations"] = {}
    dst.write_text(yaml.safe_dump({"groups": [{"name": "parity", "rules": rules}]}))
    return dst


DAEMON_RULES = load_settings({"rules": {
    "GpuUnderutilized": {"for": FOR["GpuUnderutilized"], "window": WINDOW},
    "GpuMemoryHigh": {"for": FOR["GpuMemoryHigh"]},
    "GpuPcieBottleneck": {"for": FOR["GpuPcieBottleneck"]},
    "GpuPcieLinkDegraded": {"for": FOR["GpuPcieLinkDegraded"]},
}}).rules  # fmt: skip


@dataclass(frozen=True)
class Step:
    """One poll of one GPU."""

    util: float | None  # None: no reading (a stale series in Prometheus)
    holds_memory: bool
    memory_gib: int  # of TOTAL = 100 GiB, so the ratio is memory_gib / 100
    gen: int
    width: int
    rx_share: float  # of the link's capacity
    tx_share: float

    @property
    def cap(self) -> float:
        cap = pcie_link_bytes_per_second(self.gen, self.width)
        assert cap is not None
        return cap

    @property
    def rx(self) -> float:
        return self.rx_share * self.cap

    @property
    def tx(self) -> float:
        return self.tx_share * self.cap


# Values at, just around and away from every threshold of the compared rules.
UTIL = st.one_of(
    st.sampled_from([0.0, 0.05, 0.09, 0.1, 0.11, 0.14, 0.15, 0.16, 0.19, 0.2, 0.21, 0.49, 0.5, 0.51, 0.95]),
    st.integers(0, 100).map(lambda k: k / 100),
    st.none(),
)
STEP = st.builds(
    Step,
    util=UTIL,
    holds_memory=st.sampled_from([True, True, True, False]),
    memory_gib=st.one_of(
        st.sampled_from([50, 84, 85, 86, 89, 90, 91, 94, 95, 96, 97, 98, 99, 100]), st.integers(0, 100)
    ),
    gen=st.sampled_from([5, 5, 4, 1]),
    width=st.sampled_from([16, 16, 8]),
    rx_share=st.sampled_from([0.1, 0.69, 0.7, 0.71, 0.79, 0.8, 0.81, 0.95]),
    tx_share=st.sampled_from([0.1, 0.5, 0.7, 0.8]),
)


def runs(first: Step) -> st.SearchStrategy[list[Step]]:
    """Mostly one value, held long enough to fill the window and reach ``for``, with changes."""
    return st.lists(st.one_of(st.just(first), st.just(first), STEP), min_size=6, max_size=30)


def balanced(step: Step) -> st.SearchStrategy[list[Step]]:
    """Pairs of utilizations averaging exactly a threshold (10% or 15%): the window's mean is
    then exactly at the threshold whenever the window holds whole pairs."""
    pair = st.tuples(st.sampled_from([10, 15]), st.integers(1, 10)).map(
        lambda cd: [replace(step, util=(cd[0] - cd[1]) / 100), replace(step, util=(cd[0] + cd[1]) / 100)]
    )
    return st.lists(pair, min_size=3, max_size=12).map(lambda pairs: [s for p in pairs for s in p])


TRACES = st.one_of(STEP.flatmap(runs), STEP.flatmap(balanced))
STATIC = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA H100", pci_bus_id="00000000:18:00.0", pcie_max_generation=5,
                   pcie_max_width=16)  # fmt: skip


def reading(s: Step) -> GpuReading:
    return GpuReading(
        index=0, uuid="GPU-0", up=True, static=STATIC, utilization_ratio=s.util, memory_total_bytes=TOTAL,
        memory_used_bytes=s.memory_gib * GIB, pcie_link_generation=s.gen, pcie_link_width=s.width,
        pcie_rx_bytes_per_second=s.rx, pcie_tx_bytes_per_second=s.tx,
        processes=(ProcessReading(7, "python3", GIB if s.holds_memory else 0),),
        clock_event_active=MappingProxyType({}),
    )  # fmt: skip


Alerts = set[tuple[str, str, str]]  # (alertname, severity, state)


def daemon_alerts(trace: list[Step]) -> list[Alerts]:
    """The daemon's pending and firing alerts after each poll, at 30 s + 60 s * k."""
    engine = RuleEngine(DAEMON_RULES, "n1", resend_interval=3600)
    out = []
    for k, step in enumerate(trace):
        engine.evaluate(NodeSnapshot(taken_at=30.0 + 60 * k, duration_seconds=0.01, nvml_up=True,
                                     gpus=(reading(step),)))  # fmt: skip
        out.append({(a.label_dict["alertname"], a.label_dict["severity"], a.state) for a in engine.active()
                    if a.label_dict["alertname"] in COMPARED})  # fmt: skip
    return out


def series(name: str, values: list[float | None], extra: str = "") -> dict[str, str]:
    """Samples at 30 s + 60 s * k (half a step off the evaluations); None is a stale marker."""
    slots = []
    for v in values:
        slots += ["_", "stale" if v is None else repr(float(v))]
    return {"series": f"{name}{{{SERIES}{extra}}}", "values": " ".join(slots)}


def promtool_agrees(trace: list[Step], expected: list[Alerts], workdir: Path,
                    avg_over_time: bool = False) -> tuple[bool, str]:  # fmt: skip
    """Whether Prometheus's rule evaluation of the shortened rules has exactly ``expected`` in
    ALERTS after each sample (at 60 s * (k + 1))."""
    rules = shortened_rules(workdir / "rules.yml", avg_over_time)
    inputs = [
        series("gpu_utilization_ratio", [s.util for s in trace]),
        series("gpu_process_memory_used_bytes", [GIB if s.holds_memory else 0 for s in trace],
               ',pid="7",process="python3"'),
        series("gpu_memory_used_bytes", [s.memory_gib * GIB for s in trace]),
        series("gpu_memory_total_bytes", [TOTAL for _ in trace]),
        series("gpu_pcie_link_generation", [s.gen for s in trace]),
        series("gpu_pcie_link_max_generation", [5 for _ in trace]),
        series("gpu_pcie_link_width", [s.width for s in trace]),
        series("gpu_pcie_link_max_width", [16 for _ in trace]),
        series("gpu_pcie_link_max_bytes_per_second", [s.cap for s in trace]),
        series("gpu_pcie_rx_bytes_per_second", [s.rx for s in trace]),
        series("gpu_pcie_tx_bytes_per_second", [s.tx for s in trace]),
    ]  # fmt: skip
    checks = []
    for k, alerts in enumerate(expected):
        samples = [{"labels": f'ALERTS{{alertname="{n}",alertstate="{state}",severity="{sev}",{SERIES}}}', "value": 1}
                   for n, sev, state in sorted(alerts)]  # fmt: skip
        checks.append({"expr": "ALERTS", "eval_time": f"{60 * (k + 1)}s", "exp_samples": samples})
    test = {"rule_files": [str(rules)], "evaluation_interval": "1m",
            "tests": [{"interval": "30s", "input_series": inputs, "promql_expr_test": checks}]}  # fmt: skip
    path = workdir / "parity.test.yml"
    path.write_text(yaml.safe_dump(test))
    out = promtool("test", "rules", str(path))
    return out.returncode == 0, out.stdout + out.stderr


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=TRACES)
def test_daemon_and_prometheus_hold_the_same_alerts_on_random_traces(trace: list[Step], tmp_path: Path) -> None:
    expected = daemon_alerts(trace)
    agrees, report = promtool_agrees(trace, expected, tmp_path)
    assert agrees, f"the daemon said {expected}\nPrometheus:\n{report}"


def test_the_property_can_fail() -> None:
    """The comparison is not vacuous: a daemon one ``for`` step late disagrees with Prometheus."""
    trace = [Step(0.02, True, 95, 5, 16, 0.1, 0.1)] * 8
    expected = daemon_alerts(trace)
    assert ("GpuUnderutilized", "warning", "firing") in expected[-1]
    assert ("GpuMemoryHigh", "warning", "firing") in expected[-1]
    late = [expected[0], *expected[:-1]]
    workdir = Path(tempfile.mkdtemp(prefix="parity-"))
    try:
        assert promtool_agrees(trace, expected, workdir)[0]
        agrees, report = promtool_agrees(trace, late, workdir)
        assert not agrees and "FAILED" in report
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_where_avg_over_time_is_one_ulp_below_the_threshold_the_shipped_rule_still_agrees() -> None:
    """Averaging exactly 10%, 0.18, 0.02, 0.19, 0.0 and 0.11 give 0.09999999999999999 with
    Prometheus 2.x's avg_over_time, 0.1 with sum_over_time / count_over_time and with the daemon."""
    trace = [Step(v, True, 50, 5, 16, 0.1, 0.1) for v in (0.18, 0.02, 0.19, 0.0, 0.11)]
    expected = daemon_alerts(trace)
    assert ("GpuUnderutilized", "warning", "pending") in expected[3]  # 0.0975 over four samples
    assert not any(a[0] == "GpuUnderutilized" for a in expected[4]), "exactly 10% is not below 10%"
    workdir = Path(tempfile.mkdtemp(prefix="parity-"))
    try:
        agrees, report = promtool_agrees(trace, expected, workdir)
        assert agrees, report
        agrees, report = promtool_agrees(trace, expected, workdir, avg_over_time=True)
        assert not agrees and "GpuUnderutilized" in report, "avg_over_time would have disagreed"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- a real Prometheus scraping the real daemon ---------------------------------------------------------
def test_a_gpu_steady_at_exactly_10_percent_fires_on_neither_side(tmp_path: Path) -> None:
    s = Scenario(tmp_path / "node.scn")
    for i, util in enumerate((10, 9)):
        g = h100_sxm(s.add_gpu(), "threshold", i, util=util, mem_used=40 * GIB, power_mw=300_000)
        g.gpm_supported(None)  # GPU-Util is the signal here (with GPM, SM activity would be)
        g.add_process(60_000 + i, 39 * GIB, name="python3")
    s.write()
    # 12 s windows: 60 polls at 200 ms, where a plain sum / len gives 0.09999999999999999.
    cfg = tmp_path / "daemon.yml"
    cfg.write_text(yaml.safe_dump({"node_name": "n1", "rules": {"GpuUnderutilized": {"window": "12s", "for": "2s"}}}))
    doc = yaml.safe_load(RULES.read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "GpuUnderutilized"]
    rule["expr"] = rule["expr"].replace("[30m]", "[12s]")
    rule["for"] = "2s"
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "threshold", "rules": [rule]}]}))
    with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d, \
            prometheus([f"127.0.0.1:{d.port}"], tmp_path / "prom", rule_files=[rules]) as prom:  # fmt: skip

        def daemon() -> dict[str, str]:
            alerts = json.loads(http_get(d.url + "/api/v1/alerts")[2])["data"]["alerts"]
            return {a["labels"]["gpu"]: a["state"] for a in alerts if a["labels"]["alertname"] == "GpuUnderutilized"}

        def prometheus_side() -> dict[str, str]:
            return {a["labels"]["gpu"]: a["state"] for a in prom.alerts()}

        wait_for(lambda: daemon() == {"1": "firing"}, timeout=60, what="the daemon firing for the GPU at 9%")
        wait_for(lambda: prometheus_side() == {"1": "firing"}, timeout=60, what="Prometheus firing for the GPU at 9%")
        # A plain sum / len dips below 10% only once the window holds 46 samples or more: give the
        # GPU at 10% a full window (60 polls) and ``for`` (10 polls), and some more.
        start = value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0
        wait_for(lambda: (value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0) >= start + 80,
                 timeout=60, what="80 more polls")  # fmt: skip
        assert daemon() == prometheus_side() == {"1": "firing"}, "the GPU at 10% is neither pending nor firing"
        window = 'gpu_utilization_ratio{gpu="0"}[12s]'
        mean = prom.query(f"sum_over_time({window}) / count_over_time({window})")
        assert float(mean[0]["value"][1]) >= 0.1  # 0.1, or 0.10000000000000002 for some sample counts
