"""Cardinality control, as node_exporter does it: ``--[no-]collector.<name>``, the ``collectors:``
config key and GPU_EXPORTER_COLLECTORS__<NAME>.  A collector switched off has no series in
/metrics and costs no NVML query (counted by the fake library itself)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.cli import make_backend
from gpu_exporter.daemon import Daemon
from gpu_exporter.metric_defs import COLLECTOR_HELP, COLLECTOR_METRICS, METRICS
from gpu_exporter.settings.config import COLLECTORS, RULES_NEEDING, ConfigError, Settings, load_settings
from tests.exporter_helpers import parse_exposition, run_daemon, wait_for
from tests.fakenvml import Scenario, subprocess_env
from tests.fakenvml.presets import GIB, h100_sxm
from tests.fakenvml.runtime import call_count as calls

pytestmark = pytest.mark.integration

RUNNING = Path(__file__).resolve().parent.parent / "docs" / "running.md"

# The NVML entry points each collector needs (prefixes, as the fake counts them).
CALLS = {
    "nvlink": ("nvmlDeviceGetNvLinkState",),
    "processes": ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
                  "nvmlDeviceGetProcessUtilization"),
    "clocks": ("nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetPerformanceState",
               "nvmlDeviceGetCurrentClocksEventReasons"),
    "ecc": ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"),
    "profiling": ("nvmlGpm",),
}  # fmt: skip


def one_h100(scenario: Scenario) -> Scenario:
    """One H100 SXM with 8 processes: the node docs/running.md's series table describes."""
    g = h100_sxm(scenario.add_gpu(), "collectors", 0, util=80, mem_used=60 * GIB, power_mw=500_000)
    for p in range(8):
        g.add_process(20_000 + p, GIB * (1 + p), name="python3", sm=50, mem=20)
    scenario.write()
    return scenario


def scrape_once(settings: Settings, polls: int = 2) -> tuple[dict[str, int], str]:
    """NVML calls per collector during ``polls`` polls of a fresh daemon, and its /metrics body."""
    before = {name: sum(calls(p) for p in prefixes) for name, prefixes in CALLS.items()}
    daemon = Daemon(settings, lambda errors: make_backend(settings, errors))
    try:
        for i in range(polls):
            if i:
                time.sleep(0.15)  # GPM diffs two samples at least 0.1 s apart
            snap = daemon.poll_once()
            assert snap.nvml_up and all(g.up for g in snap.gpus)
        body = daemon.exposition.body().decode()
    finally:
        daemon.poller.close()
    made = {name: sum(calls(p) for p in prefixes) - before[name] for name, prefixes in CALLS.items()}
    return made, body


def per_gpu_series(body: str, gpu: str = "0") -> Counter[str]:
    """Series with this GPU's label, by metric name."""
    return Counter(name for name, labels in parse_exposition(body) if ("gpu", gpu) in labels)


def collector_of(metric: str) -> str:
    return next((c for c, names in COLLECTOR_METRICS.items() if metric in names), "always")


def test_every_collector_names_real_metrics_and_has_a_setting() -> None:
    assert set(COLLECTOR_METRICS) == set(COLLECTORS) == set(CALLS)
    for names in COLLECTOR_METRICS.values():
        assert names <= set(METRICS)


@pytest.mark.parametrize("name", COLLECTORS)
def test_a_collector_switched_off_has_no_series_and_makes_no_nvml_call(
    name: str, nvml: Any, scenario: Scenario
) -> None:
    one_h100(scenario)
    on_calls, on_body = scrape_once(load_settings({"profiling_interval": 0.1}))
    off_calls, off_body = scrape_once(load_settings({"profiling_interval": 0.1, "collectors": {name: False}}))
    on, off = per_gpu_series(on_body), per_gpu_series(off_body)
    mine = COLLECTOR_METRICS[name]
    assert {m for m in on if m in mine}, f"{name} on: none of its series in /metrics"
    assert not {m for m in off if m in mine}, f"{name} off: its series are still in /metrics"
    # Everything else is unchanged (but what the rules and books derive from processes).
    assert {m: n for m, n in on.items() if m not in mine} == {m: n for m, n in off.items() if m not in mine}
    assert on_calls[name] > 0, f"{name} on made none of {CALLS[name]}"
    assert off_calls[name] == 0, f"{name} off still called {CALLS[name]}: {off_calls[name]} times"
    others = {c: n for c, n in off_calls.items() if c != name}
    assert all(n > 0 for n in others.values()), f"switching {name} off stopped other collectors: {others}"


def test_readme_series_table_matches_an_h100(nvml: Any, scenario: Scenario) -> None:
    """docs/running.md's "series per GPU by collector" table, from real output of one H100 with 8 processes."""
    one_h100(scenario)
    _, body = scrape_once(load_settings({"profiling_interval": 0.1}))
    by_collector: Counter[str] = Counter()
    for metric, n in per_gpu_series(body).items():
        by_collector[collector_of(metric)] += n
    text = RUNNING.read_text()
    table = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| `?([a-z]+)`? \| (\d+) \|", text, re.M)}
    want = {c: by_collector[c] for c in (*COLLECTORS, "always")}
    assert {c: table.get(c) for c in want} == want, f"docs/running.md's series table is out of date: {want}"
    total = re.search(r"^\| total \| (\d+) \|", text, re.M)
    assert total is not None and int(total.group(1)) == sum(by_collector.values())
    # --help's figure (the collector's description) is held to the same count: it said 54 for nvlink
    # when the README and a measurement said 108.
    stated = {c: int(m.group(1)) for c, text in COLLECTOR_HELP.items() if (m := re.search(r"(\d+) series", text))}
    assert stated and stated == {c: by_collector[c] for c in stated}, (stated, want)


def test_flags_env_and_config_file_set_collectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("collectors:\n  clocks: false\n  nvlink: false\n")
    monkeypatch.setenv("GPU_EXPORTER_COLLECTORS__ECC", "false")
    s = load_settings({"collectors": {"nvlink": True}}, cfg)  # the flag wins over the file
    assert s.collectors.disabled() == {"clocks", "ecc"}
    cfg.write_text("collectors:\n  sensors: false\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'collectors.sensors'.*nvlink"):
        load_settings({}, cfg)
    cfg.write_text("collectors:\n  ecc: maybe\n")
    monkeypatch.delenv("GPU_EXPORTER_COLLECTORS__ECC")
    with pytest.raises(ConfigError, match=r"collectors.ecc"):
        load_settings({}, cfg)


def test_rules_that_need_processes_are_off_with_them() -> None:
    wanted = {"rules": {"GpuIdle": {"enabled": True}, "GpuUnderutilized": {"enabled": True}}}
    on = load_settings(wanted)
    off = load_settings({**wanted, "collectors": {"processes": False}})
    assert set(RULES_NEEDING) == {"GpuIdle", "GpuUnderutilized"}
    for rule in RULES_NEEDING:
        assert getattr(on.rules, rule).enabled is True
        assert getattr(off.rules, rule).enabled is False, f"{rule} would misjudge without the process list"
    assert off.rules.GpuMemoryHigh.enabled is True  # the others stay as configured


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--collector.sensors", "unknown collector 'sensors'"),
        ("--no-collector.nvlnk", "unknown collector 'nvlnk'"),
        ("--no-collector.nvlink=1", "take no value"),
    ],
)
@pytest.mark.parametrize(("mode", "status"), [("--once", 3), ("--version", 2)])
def test_a_bad_collector_flag_exits_and_says_why(
    flag: str, message: str, mode: str, status: int, tmp_path: Path
) -> None:
    """Exit 2 like any bad flag; under --once 3, a monitoring plugin's UNKNOWN ("cannot check")."""
    s = Scenario(tmp_path / "n.scn")
    s.add_gpu()
    s.write()
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", flag, mode], env=subprocess_env(s.path),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == status, out
    assert message in out.stderr and "nvlink" in out.stderr, out.stderr


def test_the_daemon_honours_no_collector_flags(scenario: Scenario) -> None:
    one_h100(scenario)
    with run_daemon(scenario.path, "--no-collector.nvlink", "--no-collector.processes", "--collector.ecc") as d:
        wait_for(lambda: any(name == "gpu_up" for name, _ in d.metrics()), what="the first poll in /metrics")
        names = {name for name, _ in d.metrics()}
    assert "gpu_up" in names and "gpu_ecc_errors_total" in names and "gpu_clock_hertz" in names
    assert not names & (COLLECTOR_METRICS["nvlink"] | COLLECTOR_METRICS["processes"])
