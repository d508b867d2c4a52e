"""SIGHUP re-reads the config file, as Prometheus does: rules, receivers and the web config change
without a restart; a bad file keeps the running configuration; what cannot change says so.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import yaml

from tests.alerting_helpers import EVERY_ALERT_ALONE, webhook_receiver
from tests.exporter_helpers import RunningDaemon, http_get, run_daemon, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import preset
from tests.web_helpers import basic, hashed


def events(d: RunningDaemon, name: str) -> list[dict[str, object]]:
    return [e for e in list(d.log) if e.get("event") == name]


def write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(doc))


def test_sighup_reloads_rules_receivers_and_web_config(scenario: Scenario, tmp_path: Path) -> None:
    preset("pcie-degraded", scenario.path).write()  # memory 75% used: no GpuMemoryHigh at the defaults
    cfg = tmp_path / "c.yaml"
    web = tmp_path / "web.yml"
    write(web, {"basic_auth_users": {"prom": hashed("pw")}})
    with webhook_receiver() as first, webhook_receiver() as second:
        write(cfg, {"poll_interval": "200ms", "alerting": {"webhooks": [{"url": first.url, **EVERY_ALERT_ALONE}]}})
        with run_daemon(scenario.path, "--config", str(cfg)) as d:
            wait_for(lambda: http_get(d.url + "/readyz")[0] == 200, what="ready")
            assert http_get(d.url + "/metrics")[0] == 200

            write(cfg, {
                "poll_interval": "200ms",
                "web_config_file": str(web),
                "rules": {"GpuMemoryHigh": {"warning_clear": 0.5, "warning": 0.6, "for": "0s"}},
                "alerting": {"webhooks": [{"url": second.url, **EVERY_ALERT_ALONE}]},
            })  # fmt: skip
            d.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: bool(events(d, "config_reloaded")), what="the reload")
            assert d.proc.poll() is None
            # The new rule fires, and goes to the new receiver only.
            wait_for(lambda: any(a["labels"]["alertname"] == "GpuMemoryHigh" for a in second.alerts()),
                     what="the alert at the new receiver")  # fmt: skip
            assert not any(a["labels"]["alertname"] == "GpuMemoryHigh" for a in first.alerts())
            # The web config named by the new file is in force.
            assert http_get(d.url + "/metrics")[0] == 401
            assert http_get(d.url + "/metrics", headers=basic("prom", "pw"))[0] == 200
            assert http_get(d.url + "/healthz")[0] == 200

            # A broken file: logged with the reason, and the running configuration stays.
            cfg.write_text("poll_interval: 200ms\nrules: [broken\n")
            d.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: bool(events(d, "config_reload_failed")), what="the failed reload")
            failed = events(d, "config_reload_failed")[0]
            assert str(cfg) in str(failed.get("error")) and "YAML" in str(failed.get("error"))
            assert d.proc.poll() is None
            assert http_get(d.url + "/metrics")[0] == 401
            assert http_get(d.url + "/metrics", headers=basic("prom", "pw"))[0] == 200

            # A setting that needs a restart is named in the log, and the rest is applied.
            write(cfg, {"poll_interval": "200ms", "process_top_n": 5})
            d.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: len(events(d, "config_reloaded")) == 2, what="the second reload")
            needs_restart = events(d, "setting_needs_restart")
            assert [e.get("setting") for e in needs_restart] == ["process_top_n"]
            assert http_get(d.url + "/metrics")[0] == 200  # web_config_file was removed: auth is off again


def test_a_failed_web_config_on_reload_keeps_everything(scenario: Scenario, tmp_path: Path) -> None:
    preset("pcie-degraded", scenario.path).write()
    cfg = tmp_path / "c.yaml"
    write(cfg, {"poll_interval": "200ms"})
    with run_daemon(scenario.path, "--config", str(cfg)) as d:
        wait_for(lambda: http_get(d.url + "/readyz")[0] == 200, what="ready")
        write(cfg, {"poll_interval": "200ms", "web_config_file": str(tmp_path / "missing.yml"),
                    "rules": {"GpuLost": {"for": "1s"}}})  # fmt: skip
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: bool(events(d, "config_reload_failed")), what="the failed reload")
        assert "missing.yml" in str(events(d, "config_reload_failed")[0].get("error"))
        assert not events(d, "config_reloaded")
        assert http_get(d.url + "/metrics")[0] == 200


def test_a_new_listen_address_needs_a_restart_and_says_so(scenario: Scenario, tmp_path: Path) -> None:
    preset("pcie-degraded", scenario.path).write()
    cfg = tmp_path / "c.yaml"
    write(cfg, {"poll_interval": "200ms", "listen_address": "127.0.0.1:0"})
    with run_daemon(scenario.path, "--config", str(cfg), listen_flag=False) as d:
        wait_for(lambda: http_get(d.url + "/readyz")[0] == 200, what="ready")
        write(cfg, {"poll_interval": "200ms", "listen_address": "127.0.0.1:1"})
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: bool(events(d, "config_reloaded")), what="the reload")
        assert [e.get("setting") for e in events(d, "setting_needs_restart")] == ["listen_address"]
        assert http_get(d.url + "/healthz")[0] == 200  # still where it was
