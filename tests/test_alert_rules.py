"""The Prometheus rule files in alerts/: valid, unit-tested, in sync with the PrometheusRule, and
giving the same alerts as the daemon's own rules on the same GPUs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.settings.durations import parse_duration
from tests.exporter_helpers import http_get, run_daemon, wait_for
from tests.fakenvml import Counter, Scenario
from tests.fakenvml.presets import h100_activity, h100_sxm
from tests.prometheus_helpers import prometheus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alerts" / "gpu-exporter.rules.yml"
COST_RULES = ROOT / "alerts" / "gpu-cost.rules.yml"
REPORT_RULES = ROOT / "alerts" / "gpu-report.rules.yml"
UNIT_TESTS = ROOT / "alerts" / "tests" / "gpu-exporter.rules.test.yml"
CRD = ROOT / "deploy" / "k8s" / "base" / "prometheusrule.yaml"
GIB = 1024**3


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)


def rules_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"]]


def test_promtool_check_rules() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("unit_tests", sorted((ROOT / "alerts" / "tests").glob("*.test.yml")), ids=lambda p: p.name)
def test_promtool_unit_tests(unit_tests: Path) -> None:
    """Every unit-test file under alerts/tests runs, the cost recording rules' included."""
    out = promtool("test", "rules", str(unit_tests))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_rule_has_unit_tests_that_fire_and_resolve() -> None:
    tested = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {a["alertname"] for t in tested for a in t.get("alert_rule_test", []) if a["exp_alerts"]}
    quiet = {a["alertname"] for t in tested for a in t.get("alert_rule_test", []) if not a["exp_alerts"]}
    names = {r["alert"] for r in rules_of(yaml.safe_load(RULES.read_text())) if "alert" in r}
    assert fired == names and quiet >= names - {"GpuExporterNvmlDown", "GpuExporterPollStale", "GpuExporterNvmlErrors"}


def test_prometheusrule_is_generated_from_the_rule_files(tmp_path: Path) -> None:
    """The PrometheusRule ships every group of both rule files, the cost recording rules included,
    as they are there: a cluster gets the alerts and the cost and waste figures from one apply."""
    out = subprocess.run([sys.executable, str(ROOT / "alerts" / "render_prometheusrule.py"), "--check"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    crd = yaml.safe_load(CRD.read_text())
    assert crd["apiVersion"] == "monitoring.coreos.com/v1" and crd["kind"] == "PrometheusRule"
    alerts, cost, report = (yaml.safe_load(f.read_text())["groups"] for f in (RULES, COST_RULES, REPORT_RULES))
    assert crd["spec"]["groups"] == alerts + cost + report
    shipped = {r.get("record") for g in crd["spec"]["groups"] for r in g["rules"]}
    assert {"node:gpu_wasted_cost:increase1h", "namespace:gpu_wasted_hours:increase1d",
            "gpu:report_state_seconds:hour"} <= shipped  # fmt: skip
    spec = tmp_path / "spec.yml"
    spec.write_text(yaml.safe_dump(crd["spec"]))
    checked = promtool("check", "rules", str(spec))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_same_names_severities_thresholds_and_durations_as_the_daemon() -> None:
    d = RulesSettings()
    rules = {
        (r["alert"], r["labels"]["severity"]): r for r in rules_of(yaml.safe_load(RULES.read_text())) if "alert" in r
    }
    gpu_rules = {k for k in rules if not k[0].startswith("GpuExporter")}
    assert gpu_rules == {
        ("GpuUnderutilized", "warning"), ("GpuLowSmActivity", "warning"), ("GpuMemoryHigh", "warning"),
        ("GpuMemoryHigh", "critical"),
        ("GpuPcieBottleneck", "warning"), ("GpuPcieLinkDegraded", "warning"), ("GpuLost", "critical"),
        ("GpuXidError", "critical"), ("GpuThermalThrottling", "warning"), ("GpuEccUncorrectable", "critical"),
        ("GpuRowRemapFailure", "critical"), ("GpuRowRemapPending", "warning"), ("GpuRecoveryRequired", "critical"),
        ("GpuResetRequired", "critical"), ("GpuFabricUnhealthy", "critical"), ("GpuFabricNotReady", "critical"),
    }  # fmt: skip
    expected: dict[tuple[str, str], tuple[float, list[str]]] = {
        ("GpuUnderutilized", "warning"): (d.GpuUnderutilized.for_, [
            f"< {d.GpuUnderutilized.threshold:.2f}", f"<= {d.GpuUnderutilized.clear_threshold:.2f}",
            f"[{d.GpuUnderutilized.window / 60:g}m]"]),
        ("GpuLowSmActivity", "warning"): (d.GpuLowSmActivity.for_, [
            f"< {d.GpuLowSmActivity.sm_active_below:.2f}", f">= {d.GpuLowSmActivity.utilization_at_least:.2f}",
            f"<= {d.GpuLowSmActivity.clear_sm_active_above:.2f}",
            f">= {d.GpuLowSmActivity.clear_utilization_below:.2f}", f"[{d.GpuLowSmActivity.window / 60:g}m]"]),
        ("GpuMemoryHigh", "warning"): (d.GpuMemoryHigh.for_, [
            f"> {d.GpuMemoryHigh.warning:.2f}", f">= {d.GpuMemoryHigh.warning_clear:.2f}"]),
        ("GpuMemoryHigh", "critical"): (d.GpuMemoryHigh.for_, [
            f"> {d.GpuMemoryHigh.critical:.2f}", f">= {d.GpuMemoryHigh.critical_clear:.2f}"]),
        ("GpuPcieBottleneck", "warning"): (d.GpuPcieBottleneck.for_, [
            f">= {d.GpuPcieBottleneck.threshold:.2f}", f">= {d.GpuPcieBottleneck.clear_threshold:.2f}",
            f"< {d.GpuPcieBottleneck.utilization_below:.2f}"]),
        ("GpuPcieLinkDegraded", "warning"): (d.GpuPcieLinkDegraded.for_, [
            f">= {d.GpuPcieLinkDegraded.min_utilization:.2f}"]),
        ("GpuLost", "critical"): (d.GpuLost.for_, ["gpu_up == 0"]),
        ("GpuXidError", "critical"): (d.GpuXidError.for_, [
            "|".join(map(str, d.GpuXidError.codes)), f"[{d.GpuXidError.window / 60:g}m]"]),
        ("GpuThermalThrottling", "warning"): (d.GpuThermalThrottling.for_, ["hw_thermal|sw_thermal"]),
        ("GpuEccUncorrectable", "critical"): (d.GpuEccUncorrectable.for_, [
            f"[{d.GpuEccUncorrectable.window / 3600:g}h]"]),
        ("GpuRowRemapFailure", "critical"): (d.GpuRowRemapFailure.for_, ["gpu_row_remap_failure == 1"]),
        ("GpuRowRemapPending", "warning"): (d.GpuRowRemapPending.for_, ["gpu_row_remap_pending == 1"]),
        ("GpuRecoveryRequired", "critical"): (d.GpuRecoveryRequired.for_, ["gpu_recovery_action > 0"]),
        ("GpuResetRequired", "critical"): (d.GpuResetRequired.for_, ["gpu_reset_required == 1"]),
        ("GpuFabricUnhealthy", "critical"): (d.GpuFabricUnhealthy.for_, ["gpu_fabric_issue == 1"]),
        ("GpuFabricNotReady", "critical"): (d.GpuFabricNotReady.for_, ["gpu_fabric_state < 3"]),
    }  # fmt: skip
    for key, (for_seconds, needles) in expected.items():
        rule = rules[key]
        assert parse_duration(rule["for"]) == for_seconds, key
        for needle in needles:
            assert needle in rule["expr"], (key, needle)
        assert {"summary", "description"} <= rule["annotations"].keys()


# -- parity: the daemon and a real Prometheus evaluating alerts/ on the same fake GPUs ----------------
SHORT = "3s"
LONG_WINDOW = "5m"  # windows that must not age out while the test runs


def short_rules_file(dst: Path, src: Path = RULES) -> Path:
    doc = yaml.safe_load(src.read_text())
    for r in rules_of(doc):
        if parse_duration(r.get("for", "0s")) > 0:
            r["for"] = SHORT
        expr = r["expr"]
        expr = expr.replace("[30m]", "[20s]")  # the utilization window
        expr = re.sub(r"\[15m\]|offset 15m", lambda m: m.group(0).replace("15m", LONG_WINDOW), expr)
        expr = expr.replace("[1h]", "[20s]")
        r["expr"] = expr
    dst.write_text(yaml.safe_dump(doc))
    return dst


def short_daemon_config(dst: Path) -> Path:
    d = RulesSettings()
    rules: dict[str, dict[str, Any]] = {}
    for name in type(d).model_fields:
        if getattr(d, name).for_ > 0:
            rules[name] = {"for": SHORT}
    rules["GpuUnderutilized"]["window"] = "20s"
    rules["GpuXidError"] = {"window": LONG_WINDOW}
    rules["GpuEccUncorrectable"] = {"window": "20s"}
    # The slow reads (ECC, rows, link states) as often as the shortened windows need them.
    dst.write_text(yaml.safe_dump({"node_name": "node-a", "rules": rules, "poll_slow_interval": "1s"}))
    return dst


def parity_node(path: Path) -> Scenario:
    s = Scenario(path)
    for i in range(6):
        g = h100_sxm(s.add_gpu(), "parity", i, util=95, mem_used=40 * GIB, power_mw=500_000)
        g.add_process(60_000 + i, 39 * GIB, name="python3")
    s.gpu(0).utilization(38, 10).pcie(gen=1, width=8, rx_kbps=1_900_000)  # starved on a degraded link
    s.gpu(1).memory(81559 * 1024**2, int(0.95 * 81559 * 1024**2), reserved=0).remapped_rows(pending=True)
    s.gpu(2).clocks_event_reasons("hw_thermal").add_xid(79)
    s.gpu(3).lost()
    s.gpu(4).utilization(2, 1).gpm(**h100_activity(2)).pcie(tx_kbps=1000, rx_kbps=1000)
    s.gpu(4).ecc(corrected=0, uncorrected=Counter(1, 0.5))
    s.write()
    return s


EXPECTED = {
    ("GpuPcieBottleneck", "0"), ("GpuPcieLinkDegraded", "0"), ("GpuMemoryHigh", "1"), ("GpuRowRemapPending", "1"),
    ("GpuThermalThrottling", "2"), ("GpuXidError", "2"), ("GpuLost", "3"), ("GpuUnderutilized", "4"),
    ("GpuEccUncorrectable", "4"),
}  # fmt: skip


def firing(alerts: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(a["labels"]["alertname"], a["labels"]["gpu"]) for a in alerts
            if a["state"] == "firing" and "gpu" in a["labels"]}  # fmt: skip


def test_daemon_and_prometheus_agree_on_a_scenario(tmp_path: Path) -> None:
    s = parity_node(tmp_path / "node.scn")
    cfg = short_daemon_config(tmp_path / "daemon.yml")
    with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "1s") as d:
        rules = short_rules_file(tmp_path / "rules.yml")
        with prometheus([f"127.0.0.1:{d.port}"], tmp_path / "prom", rule_files=[rules],
                        labels={"node": "node-a"}) as prom:  # fmt: skip

            def daemon_alerts() -> set[tuple[str, str]]:
                return firing(json.loads(http_get(d.url + "/api/v1/alerts")[2])["data"]["alerts"])

            wait_for(lambda: daemon_alerts() == EXPECTED, timeout=60, what="the daemon's alerts")
            wait_for(lambda: firing(prom.alerts()) == EXPECTED, timeout=60, what="Prometheus's alerts")
            # Both stay in agreement: nothing flaps or ages out in either.
            assert daemon_alerts() == firing(prom.alerts()) == EXPECTED
            prom_labels = {a["labels"]["alertname"]: a["labels"] for a in prom.alerts()}
            assert prom_labels["GpuLost"]["severity"] == "critical" and prom_labels["GpuLost"]["node"] == "node-a"
