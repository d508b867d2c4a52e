"""Rules are tuned the way users try (issue 34, item 3): every threshold with a clear threshold is
one pair, checked by one rule; a clear past its threshold is refused, saying what to set; a
threshold set alone takes its clear along; and docs/alerts.md's table of rules, which names every key
with its default, is written from the settings, so it cannot drift from them.

The pairs and their directions are listed here by hand, read off ``alerting/rules.py`` (``high``:
the alert fires above the threshold and clears below the clear), so a pair the settings forget to
declare, or declare the wrong way round, fails here.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gpu_exporter.alerting.engine import FIRING, RESOLVED, RuleEngine
from gpu_exporter.alerting.settings import RULE_DOCS, RulesSettings, rules_table
from gpu_exporter.cli import main
from gpu_exporter.once import UNKNOWN
from gpu_exporter.settings.config import ConfigError, load_settings
from gpu_exporter.settings.durations import parse_duration
from tests import assert_mentions
from tests.test_rule_properties import CASES
from tests.test_rules import GEN5_X16, T0, gpu, snap

ROOT = Path(__file__).resolve().parent.parent

# (alert, threshold key, clear key, high), from the comparisons in alerting/rules.py.
PAIRS = [
    ("GpuUnderutilized", "threshold", "clear_threshold", False),  # fires mean < threshold, clears mean > clear
    ("GpuLowSmActivity", "utilization_at_least", "clear_utilization_below", True),  # util >= t; util < clear
    ("GpuLowSmActivity", "sm_active_below", "clear_sm_active_above", False),  # sm < t; sm > clear
    ("GpuMemoryHigh", "warning", "warning_clear", True),  # ratio > t; ratio < clear
    ("GpuMemoryHigh", "critical", "critical_clear", True),
    ("GpuPcieBottleneck", "threshold", "clear_threshold", True),  # load >= t; load < clear
]
IDS = [f"{a}.{c}" for a, _, c, _ in PAIRS]
DEFAULTS = RulesSettings()


def default(alert: str, key: str) -> float:
    return float(getattr(getattr(DEFAULTS, alert), key))


def refused(rules: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        load_settings({"rules": rules})
    return str(e.value)


# -- one pair, one rule ------------------------------------------------------------------------------------
def test_every_clear_key_of_every_rule_is_a_declared_pair_the_right_way_round() -> None:
    declared = [(alert, h.threshold, h.clear, h.high) for alert in RulesSettings.model_fields
                for h in type(getattr(DEFAULTS, alert)).hysteresis]  # fmt: skip
    assert declared == PAIRS
    clears = [(alert, key) for alert in RulesSettings.model_fields
              for key in type(getattr(DEFAULTS, alert)).model_fields if "clear" in key]  # fmt: skip
    assert clears == [(a, c) for a, _, c, _ in PAIRS]
    for alert, threshold, clear, high in PAIRS:  # the defaults themselves keep the rule
        assert (default(alert, clear) < default(alert, threshold)) == high, (alert, clear)


@pytest.mark.parametrize(("alert", "threshold", "clear", "high"), PAIRS, ids=IDS)
def test_a_clear_past_its_threshold_is_refused_naming_both_keys_their_values_and_the_fix(
    alert: str, threshold: str, clear: str, high: bool
) -> None:
    t = default(alert, threshold)
    bad = round(t + 0.01 if high else t - 0.01, 2)
    msg = refused({alert: {threshold: t, clear: bad}})
    assert f"invalid rules.{alert} " in msg
    assert f"{clear} {bad:g} is {'above' if high else 'below'} {threshold} {t:g}" in msg
    assert "flap" in msg
    # The fix: either key, each with the value that works.
    assert f"set {clear} to {t:g} or {'less' if high else 'more'}" in msg
    assert f"or {threshold} to {bad:g} or {'more' if high else 'less'}" in msg


@pytest.mark.parametrize(("alert", "threshold", "clear", "high"), PAIRS, ids=IDS)
def test_a_clear_equal_to_its_threshold_is_taken(alert: str, threshold: str, clear: str, high: bool) -> None:
    t = default(alert, threshold)
    rule = getattr(load_settings({"rules": {alert: {threshold: t, clear: t}}}).rules, alert)
    assert getattr(rule, clear) == getattr(rule, threshold) == t


def test_every_problem_of_a_rule_is_said_at_once() -> None:
    msg = refused({"GpuMemoryHigh": {"warning_clear": 0.92, "critical_clear": 0.99}})
    assert_mentions(msg, "warning_clear 0.92", "above warning 0.9", "set warning_clear to 0.9 or less",
                    "critical_clear 0.99", "above critical 0.98", "set critical_clear to 0.98 or less")  # fmt: skip


def test_the_pcie_clear_past_its_threshold_exits_as_a_bad_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report: ``clear_threshold: 0.9`` with ``threshold: 0.8`` was taken, and the alert flapped."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"rules": {"GpuPcieBottleneck": {"threshold": 0.8, "clear_threshold": 0.9}}}))
    assert main(["--config", str(cfg), "--once", "--simulate"]) == UNKNOWN  # --once is a check
    err = capsys.readouterr().err
    assert err.startswith("gpu-exporter: ")
    assert_mentions(err, "invalid rules.GpuPcieBottleneck", "clear_threshold 0.9", "above threshold 0.8",
                    "set clear_threshold to 0.8 or less")  # fmt: skip


# -- a threshold set alone ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("alert", "threshold", "clear", "high"), PAIRS, ids=IDS)
def test_a_threshold_set_alone_past_the_default_clear_takes_its_clear_along(
    alert: str, threshold: str, clear: str, high: bool
) -> None:
    """The default clear would be past the new threshold: it follows, the defaults' gap away."""
    t0, c0 = default(alert, threshold), default(alert, clear)
    gap = abs(t0 - c0)
    t = round(c0 - 0.1 if high else c0 + 0.1, 2)
    below = {"warning": 0.8} if threshold == "critical" else {}  # critical may not be below warning
    rule = getattr(load_settings({"rules": {alert: {threshold: t, **below}}}).rules, alert)
    assert getattr(rule, threshold) == t
    assert getattr(rule, clear) == pytest.approx(t - gap if high else t + gap, abs=1e-9)


def test_warning_alone_moves_only_its_own_clear() -> None:
    rules = load_settings({"rules": {"GpuMemoryHigh": {"warning": 0.6}}}).rules.GpuMemoryHigh
    assert (rules.warning, rules.warning_clear, rules.critical, rules.critical_clear) == (0.6, 0.55, 0.98, 0.95)
    raised = load_settings({"rules": {"GpuMemoryHigh": {"warning": 0.95}}}).rules.GpuMemoryHigh
    assert (raised.warning, raised.warning_clear) == (0.95, 0.9)  # the same 0.05 of hysteresis, not 0.10


def test_a_threshold_without_room_for_the_gap_clears_at_the_end_of_the_range() -> None:
    assert (
        load_settings({"rules": {"GpuUnderutilized": {"threshold": 0.97}}}).rules.GpuUnderutilized.clear_threshold == 1
    )
    assert load_settings({"rules": {"GpuMemoryHigh": {"warning": 0.03}}}).rules.GpuMemoryHigh.warning_clear == 0


def test_a_clear_that_is_set_is_taken_as_given() -> None:
    wide = load_settings({"rules": {"GpuMemoryHigh": {"warning": 0.95, "warning_clear": 0.5}}}).rules.GpuMemoryHigh
    assert (wide.warning, wide.warning_clear) == (0.95, 0.5)
    alone = load_settings({"rules": {"GpuMemoryHigh": {"warning_clear": 0.8}}}).rules.GpuMemoryHigh
    assert (alone.warning, alone.warning_clear) == (0.9, 0.8)


def test_warning_above_the_default_critical_names_critical_as_the_key_to_set() -> None:
    msg = refused({"GpuMemoryHigh": {"warning": 0.99}})
    assert "warning 0.99 is above critical 0.98" in msg and "set critical to 0.99 or more" in msg
    assert "or warning to 0.98 or less" in msg
    ok = load_settings({"rules": {"GpuMemoryHigh": {"warning": 0.99, "critical": 0.995}}}).rules.GpuMemoryHigh
    assert (ok.warning_clear, ok.critical_clear) == (0.94, 0.965)


def test_a_threshold_set_alone_no_longer_flaps() -> None:
    """``GpuPcieBottleneck: {threshold: 0.6}`` kept the default clear 0.7: a link at 65% both fired and
    cleared the alert, which resolved and fired again on every poll.  Its clear now follows (0.5)."""
    rules = load_settings({"rules": {"GpuPcieBottleneck": {"threshold": 0.6, "for": "0s"}}}).rules
    engine = RuleEngine(rules, "n", resend_interval=3600)
    states = []
    for i in range(10):
        reading = gpu(utilization_ratio=0.3, pcie_rx_bytes_per_second=0.65 * GEN5_X16)
        sent = engine.evaluate(snap(T0 + i, reading)).to_send
        states += [a.state for a in sent if a.label_dict["alertname"] == "GpuPcieBottleneck"]
    assert states == [FIRING] and RESOLVED not in states


# -- docs/alerts.md's table --------------------------------------------------------------------------------
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def readme_rows() -> dict[str, list[str]]:
    gen = generator()
    text = (ROOT / "docs" / "alerts.md").read_text()
    block = text.split(gen.RULES_BEGIN, 1)[1].split(gen.END, 1)[0]
    assert block == rules_table(), "docs/alerts.md's table of rules is stale: run .venv/bin/python docs/generate.py"
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in block.splitlines()[2:]]
    return {row[0].split("`")[1]: row for row in rows}


def test_the_readme_table_is_generated_and_names_every_key_of_every_rule_with_its_default() -> None:
    rows = readme_rows()
    assert list(rows) == list(RulesSettings.model_fields) == list(RULE_DOCS)
    for alert, (name, _, fires, for_, clears) in rows.items():
        rule = getattr(DEFAULTS, alert)
        text = f"{fires} {clears}"
        for key in type(rule).model_fields:
            if key in ("enabled", "for_"):
                continue
            value = getattr(rule, key)
            written = re.search(rf"(\S+) \(`{key}`\)", text)
            assert written is not None, f"{alert}.{key} is not in docs/alerts.md's table"
            if isinstance(value, list):
                assert f"{', '.join(map(str, value))} (`{key}`)" in text
            elif isinstance(value, str):
                assert written.group(1) == value
            elif key == "window":
                assert parse_duration(written.group(1)) == value
            else:
                assert float(written.group(1)) == value, (alert, key)
        assert parse_duration(for_) == rule.for_
        assert ("(off by default)" in name) == (not rule.enabled)
    assert rows["GpuMemoryHigh"][4] == "below 0.85 (`warning_clear`) / 0.95 (`critical_clear`)"
    assert rows["GpuUnderutilized"][3] == "30m" and "30m (`window`)" in rows["GpuUnderutilized"][2]
    assert rows["GpuLost"][3] == "30s" and rows["GpuIdle"][3] == "1h"


def test_the_readme_table_severities_are_the_rules_own() -> None:
    severities: dict[str, set[str]] = {}
    for case in CASES:
        severities.setdefault(case.alertname, set()).add(case.severity)
    rows = readme_rows()
    assert {alert: set(row[1].split(" / ")) for alert, row in rows.items()} == severities


def test_the_readme_example_of_a_warning_set_alone_is_what_the_settings_do() -> None:
    rules = load_settings({"rules": {"GpuMemoryHigh": {"warning": 0.6}}}).rules.GpuMemoryHigh
    assert f"(`warning: 0.6` alone clears\nbelow {rules.warning_clear:g};" in (ROOT / "docs" / "alerts.md").read_text()


def test_the_generator_checks_and_rewrites_the_readme_table(tmp_path: Path) -> None:
    gen = generator()
    assert gen.main(["--check"]) == 0  # docs/alerts.md and docs/metrics.md are fresh
    stale = f"intro\n{gen.RULES_BEGIN}| `GpuLost` | critical | old words |\n{gen.END}after\n"
    fresh = gen.generated(stale, rules_table(), gen.RULES_BEGIN, tmp_path / "README.md")
    assert fresh != stale and fresh.startswith("intro\n") and fresh.endswith(f"{gen.END}after\n")
    assert gen.generated(fresh, rules_table(), gen.RULES_BEGIN) == fresh
    with pytest.raises(SystemExit, match="markers"):
        gen.generated("no markers\n", rules_table(), gen.RULES_BEGIN, tmp_path / "README.md")
