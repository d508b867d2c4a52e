"""The rules that use profiling-grade activity: GpuUnderutilized on SM activity where a GPU has GPM,
and GpuLowSmActivity; on scripted traces, and in the daemon and a real Prometheus side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.alerting.engine import FIRING, PENDING
from gpu_exporter.snapshot import Activity, GpuReading
from tests import assert_mentions
from tests.exporter_helpers import http_get, run_daemon, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_activity, h100_sxm
from tests.prometheus_helpers import prometheus
from tests.test_alert_rules import firing, short_daemon_config, short_rules_file
from tests.test_rules import GIB, STATIC, fast_rules, fired, gpu, minutes, run

pytestmark = pytest.mark.integration

GPM_STATIC = STATIC.__class__(**{**{s: getattr(STATIC, s) for s in STATIC.__slots__}, "gpm_supported": True})


def hopper(util: float, sm: float | None, **kw: Any) -> GpuReading:
    return gpu(static=GPM_STATIC, utilization_ratio=util, activity=None if sm is None else Activity(sm=sm), **kw)


# -- GpuUnderutilized: the activity signal -------------------------------------------------------------
def test_underutilized_uses_sm_activity_where_the_gpu_has_it() -> None:
    """GPU-Util reads 100% from one tiny kernel; SM activity says the card idles."""
    engine, sent = run([hopper(1.0, 0.03)] * minutes(70))
    assert "GpuUnderutilized/warning" in fired(sent)
    (alert,) = [a for a in engine.active() if a.label_dict["alertname"] == "GpuUnderutilized"]
    assert "SM activity averaged 3%" in dict(alert.annotations)["description"]


def test_underutilized_falls_back_to_gpu_util_without_gpm() -> None:
    engine, _ = run([gpu(utilization_ratio=0.02)] * minutes(70))
    (alert,) = [a for a in engine.active() if a.label_dict["alertname"] == "GpuUnderutilized"]
    assert "GPU utilization averaged 2%" in dict(alert.annotations)["description"]
    assert "GpuUnderutilized/warning" not in fired(run([hopper(0.02, 0.5)] * minutes(70))[1]), "SM activity wins"


@pytest.mark.parametrize(
    ("signal", "util", "sm", "fires"),
    [
        ("gpu_utilization", 1.0, 0.03, False),  # told to use GPU-Util: the card looks busy
        ("gpu_utilization", 0.02, 0.5, True),
        ("sm_active", 1.0, 0.03, True),
        ("sm_active", 0.02, None, False),  # told to use SM activity, and there is none: nothing to say
        ("auto", 0.02, None, True),
    ],
)
def test_the_signal_setting_picks_the_signal(signal: str, util: float, sm: float | None, fires: bool) -> None:
    rules = fast_rules(GpuUnderutilized={"signal": signal})
    _, sent = run([hopper(util, sm)] * minutes(70), rules)
    assert ("GpuUnderutilized/warning" in fired(sent)) is fires


def test_an_unknown_signal_is_refused_naming_the_choices() -> None:
    from gpu_exporter.settings.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match="sm_active"):
        load_settings({"rules": {"GpuUnderutilized": {"signal": "tensor"}}})


# -- GpuLowSmActivity ------------------------------------------------------------------------------------
def low_sm_alerts(trace: list[GpuReading], **rule: Any) -> list[tuple[int, str]]:
    """(poll, state) of GpuLowSmActivity after each poll."""
    from gpu_exporter.alerting.engine import RuleEngine
    from tests.test_rules import STEP, T0, snap

    engine = RuleEngine(fast_rules(GpuLowSmActivity=rule) if rule else fast_rules(), "node-a", resend_interval=3600)
    out = []
    for i, g in enumerate(trace):
        engine.evaluate(snap(T0 + i * STEP, g))
        states = [a.state for a in engine.active() if a.label_dict["alertname"] == "GpuLowSmActivity"]
        out.append((i, states[0] if states else "inactive"))
    return out


def test_low_sm_activity_stays_pending_for_its_for_then_fires() -> None:
    states = dict(low_sm_alerts([hopper(0.95, 0.10)] * minutes(45)))
    assert states[0] == PENDING
    assert states[minutes(30) - 1] == PENDING, "the 30 min `for` is enforced"
    assert states[minutes(30) + 1] == FIRING


def test_low_sm_activity_fires_with_its_numbers_and_resolves_when_the_sms_work() -> None:
    busy_sms = [hopper(0.95, 0.85)] * minutes(40)
    engine, sent = run([hopper(0.95, 0.10)] * minutes(40) + busy_sms)
    first = [a for batch in sent for a in batch if a.label_dict["alertname"] == "GpuLowSmActivity"]
    assert first and first[0].state == FIRING
    assert_mentions(dict(first[0].annotations)["description"], "GPU utilization averaged 95%", "SM activity only 10%")
    assert first[0].value == pytest.approx(0.10)
    assert not [a for a in engine.active() if a.label_dict["alertname"] == "GpuLowSmActivity"], "resolved"


def test_low_sm_activity_hysteresis_keeps_it_firing_between_the_thresholds() -> None:
    trace = [hopper(0.95, 0.10)] * minutes(70) + [hopper(0.78, 0.28)] * minutes(40)
    assert low_sm_alerts(trace)[-1][1] == FIRING, "78% util and 28% SM are inside the clear band"
    cleared = [hopper(0.95, 0.10)] * minutes(70) + [hopper(0.70, 0.10)] * minutes(40)
    assert low_sm_alerts(cleared)[-1][1] == "inactive", "utilization under 75% clears it"
    cleared = [hopper(0.95, 0.10)] * minutes(70) + [hopper(0.95, 0.35)] * minutes(40)
    assert low_sm_alerts(cleared)[-1][1] == "inactive", "SM activity over 30% clears it"


@pytest.mark.parametrize(
    ("util", "sm"),
    [(0.95, 0.25), (0.79, 0.05), (0.95, None)],  # at the threshold; utilization not high; no GPM
)
def test_low_sm_activity_does_not_fire(util: float, sm: float | None) -> None:
    assert "GpuLowSmActivity/warning" not in fired(run([hopper(util, sm)] * minutes(70))[1])


def test_low_sm_activity_can_be_switched_off() -> None:
    rules = fast_rules(GpuLowSmActivity={"enabled": False})
    assert "GpuLowSmActivity/warning" not in fired(run([hopper(0.95, 0.10)] * minutes(70), rules)[1])


# -- the daemon and a real Prometheus on the same fake Hopper GPUs -------------------------------------------
def gpm_node(path: Path) -> Scenario:
    s = Scenario(path)
    for i in range(4):
        g = h100_sxm(s.add_gpu(), "gpm-parity", i, util=95, mem_used=40 * GIB, power_mw=500_000)
        g.add_process(61_000 + i, 39 * GIB, name="python3", sm=95)
    s.gpu(0).gpm(sm_util=10)  # launch-bound: GPU-Util 95%, SMs mostly idle
    s.gpu(1).gpm(sm_util=3)  # and idle enough to be underutilized too
    s.gpu(2).gpm(**h100_activity(95))  # a healthy training step
    s.gpu(3).identity("NVIDIA A100-SXM4-80GB", str(s.gpu(3).values["uuid"])).gpm_supported(False)  # no GPM
    s.write()
    return s


EXPECTED = {("GpuLowSmActivity", "0"), ("GpuLowSmActivity", "1"), ("GpuUnderutilized", "1")}


def test_daemon_and_prometheus_agree_on_the_activity_rules(tmp_path: Path) -> None:
    s = gpm_node(tmp_path / "node.scn")
    cfg = short_daemon_config(tmp_path / "daemon.yml")
    doc = yaml.safe_load(cfg.read_text())
    doc["rules"]["GpuLowSmActivity"] = {"for": "3s", "window": "20s"}
    cfg.write_text(yaml.safe_dump(doc))
    with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "1s") as d:
        rules = short_rules_file(tmp_path / "rules.yml")
        with prometheus([f"127.0.0.1:{d.port}"], tmp_path / "prom", rule_files=[rules],
                        labels={"node": "node-a"}) as prom:  # fmt: skip

            def daemon_alerts() -> set[tuple[str, str]]:
                return firing(json.loads(http_get(d.url + "/api/v1/alerts")[2])["data"]["alerts"])

            wait_for(lambda: daemon_alerts() == EXPECTED, timeout=60, what=f"the daemon's alerts {EXPECTED}")
            wait_for(lambda: firing(prom.alerts()) == EXPECTED, timeout=60, what=f"Prometheus's alerts {EXPECTED}")
            assert daemon_alerts() == firing(prom.alerts()) == EXPECTED
