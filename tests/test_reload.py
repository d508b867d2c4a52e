"""SIGHUP re-reads the config file, as Prometheus does: rules, receivers and the web config change
without a restart; a bad file keeps the running configuration; what cannot change says so.
"""

from __future__ import annotations

import itertools
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerting_helpers import EVERY_ALERT_ALONE, Alertmanager, Received, free_port, webhook_receiver
from tests.exporter_helpers import RunningDaemon, http_get, parse_exposition, run_daemon, value, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import gpu_uuid, h100_sxm, preset
from tests.web_helpers import basic, hashed

pytestmark = pytest.mark.integration


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
    write(cfg, {"poll_interval": "200ms", "web_listen_address": "127.0.0.1:0"})
    with run_daemon(scenario.path, "--config", str(cfg), listen_flag=False) as d:
        wait_for(lambda: http_get(d.url + "/readyz")[0] == 200, what="ready")
        write(cfg, {"poll_interval": "200ms", "web_listen_address": "127.0.0.1:1"})
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: bool(events(d, "config_reloaded")), what="the reload")
        # Named by the rule, though the file wrote its old key.
        assert [e.get("setting") for e in events(d, "setting_needs_restart")] == ["web_listen_address"]
        assert http_get(d.url + "/healthz")[0] == 200  # still where it was


# -- what a reload keeps, and what it changes at once ------------------------------------------------
GIB = 1024**3


def two_full_gpus(path: Path) -> Scenario:
    """Two H100s with 95% of their memory used: GpuMemoryHigh fires on both at once (for: 0s)."""
    s = Scenario(path)
    for i in range(2):
        h100_sxm(s.add_gpu(), "reload", i, util=90, mem_used=int(0.95 * 81559 * 1024**2), power_mw=400_000)
    s.write()
    return s


def counter(d: RunningDaemon, name: str, **labels: str) -> float:
    return value(d.metrics(), name, **labels) or 0.0


def polls(d: RunningDaemon) -> float:
    return counter(d, "gpu_exporter_poll_duration_seconds_count")


def wait_polls(d: RunningDaemon, n: int) -> None:
    start = polls(d)
    wait_for(lambda: polls(d) >= start + n, timeout=30 + n, what=f"{n} more polls")


def memory_alerts(bodies: list[Any]) -> list[str]:
    """The GPU of each GpuMemoryHigh alert in the bodies, in the order they came."""
    return [a["labels"]["gpu"] for b in bodies for a in (b if isinstance(b, list) else b.get("alerts", []))
            if a["labels"]["alertname"] == "GpuMemoryHigh" and a.get("status", "firing") == "firing"]  # fmt: skip


def test_an_unchanged_receiver_keeps_its_queue_across_a_reload(tmp_path: Path) -> None:
    """Alerts queued for an Alertmanager that is down, and for a webhook that refuses, are delivered
    once each after a reload that changed something else: the reload neither drops nor repeats them.
    resend_interval is 10 min, so a receiver made anew would have nothing to send for 10 min."""
    s = two_full_gpus(tmp_path / "node.scn")
    cfg = tmp_path / "c.yaml"
    with webhook_receiver() as behind_am, webhook_receiver() as direct:
        direct.status = 503
        (tmp_path / "am").mkdir()
        am = Alertmanager(free_port(), tmp_path / "am")  # not started: down
        (tmp_path / "am" / "alertmanager.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "hook", **EVERY_ALERT_ALONE},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": behind_am.url}]}],
        }))  # fmt: skip
        alerting = {"resend_interval": "10m", "alertmanagers": [{"url": am.url, "name": "am"}],
                    "webhooks": [{"url": direct.url, "name": "hook", **EVERY_ALERT_ALONE}]}  # fmt: skip
        rules = {"GpuMemoryHigh": {"for": "0s"}}
        write(cfg, {"poll_interval": "200ms", "node_name": "n1", "rules": rules, "alerting": alerting})
        try:
            with run_daemon(s.path, "--config", str(cfg)) as d:
                wait_for(lambda: counter(d, "gpu_exporter_notification_queue_length", receiver="am") == 2
                         and counter(d, "gpu_exporter_notification_queue_length", receiver="hook") == 2
                         and counter(d, "gpu_exporter_notifications_total", receiver="am", outcome="retried") > 0
                         and counter(d, "gpu_exporter_notifications_total", receiver="hook", outcome="retried") > 0,
                         what="both alerts queued for both receivers")  # fmt: skip

                # Another setting changes; the receivers' do not.
                write(cfg, {"poll_interval": "200ms", "node_name": "n1", "alerting": alerting,
                            "rules": {**rules, "GpuLost": {"for": "5s"}}})  # fmt: skip
                d.proc.send_signal(signal.SIGHUP)
                wait_for(lambda: bool(events(d, "config_reloaded")), what="the reload")
                assert counter(d, "gpu_exporter_notification_queue_length", receiver="am") == 2
                assert counter(d, "gpu_exporter_notification_queue_length", receiver="hook") == 2
                assert not events(d, "notifications_undelivered_at_shutdown"), "a receiver was replaced"

                am.start()
                direct.status = 200
                wait_for(lambda: sorted(memory_alerts([r.body for r in behind_am.requests])) == ["0", "1"]
                         and sorted(memory_alerts([r.body for r in direct.requests])) == ["0", "1"], timeout=60,
                         what="the queued alerts at both receivers")  # fmt: skip
                wait_for(lambda: counter(d, "gpu_exporter_notification_queue_length", receiver="am") == 0
                         and counter(d, "gpu_exporter_notification_queue_length", receiver="hook") == 0,
                         what="empty queues")  # fmt: skip
                sent = counter(d, "gpu_exporter_notifications_total", receiver="am", outcome="sent")
                wait_polls(d, 10)
                # Once each: one send to Alertmanager carried both, and nothing was sent again.
                assert sent == 1 == counter(d, "gpu_exporter_notifications_total", receiver="am", outcome="sent")
                assert sorted(memory_alerts([r.body for r in direct.requests])) == ["0", "1"]
                assert sorted(memory_alerts([r.body for r in behind_am.requests])) == ["0", "1"]
        finally:
            am.stop()


def test_a_new_resend_interval_applies_to_a_kept_alertmanager_receiver(tmp_path: Path) -> None:
    """A firing alert is valid for 4 resend intervals from each send (endsAt), as Prometheus does;
    after a reload that changes resend_interval, the kept receiver sends with the new figure."""
    s = two_full_gpus(tmp_path / "node.scn")
    cfg = tmp_path / "c.yaml"
    rules = {"GpuMemoryHigh": {"for": "0s"}}
    with webhook_receiver() as am:  # stands in for Alertmanager's API: records what is posted, and when
        alerting = {"alertmanagers": [{"url": f"http://127.0.0.1:{am.port}", "name": "am"}]}
        write(cfg, {"poll_interval": "200ms", "rules": rules, "alerting": {**alerting, "resend_interval": "1s"}})
        with run_daemon(s.path, "--config", str(cfg)) as d:
            wait_for(lambda: len(am.requests) >= 3, what="three sends")

            write(cfg, {"poll_interval": "200ms", "rules": rules, "alerting": {**alerting, "resend_interval": "5s"}})
            d.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: bool(events(d, "config_reloaded")), what="the reload")
            reloaded = len(am.requests)
            wait_for(lambda: len(am.requests) >= reloaded + 3, timeout=40, what="three sends after the reload")
            assert not events(d, "notifications_undelivered_at_shutdown"), "the receiver was replaced"

    def valid_for(r: Received) -> list[float]:
        return [datetime.fromisoformat(a["endsAt"]).timestamp() - r.at for a in r.body]

    # The sends either side of the reload, less the one each side that may have crossed it.
    before, after = am.requests[: reloaded - 1], am.requests[reloaded + 1 :]
    assert len(before) >= 2 and len(after) >= 2
    # 4 x 1 s before, 4 x 5 s after, less the moments between sending and arriving.
    assert all(2.5 <= v <= 4.0 for r in before for v in valid_for(r)), [valid_for(r) for r in before]
    assert all(17.5 <= v <= 20.0 for r in after for v in valid_for(r)), [valid_for(r) for r in after]
    # And it re-sends every 5 s now, not every 1 s.
    gaps = [b.at - a.at for a, b in itertools.pairwise(after)]
    assert all(g >= 4.0 for g in gaps), gaps


def one_held_gpu(path: Path, util: int) -> Scenario:
    """An L4 (GPU-Util is its activity signal) that a process holds, at ``util``% utilization."""
    s = Scenario(path)
    g = s.add_gpu().identity("NVIDIA L4", gpu_uuid("reload", 0)).pci("00000000:3A:00.0").minor_number(0)
    g.utilization(util, 5).memory(23034 * 1024**2, 4 * GIB, reserved=300 * 1024**2).power(30_000, 72_000)
    g.temperature(40).add_process(31_000, 4 * GIB, name="python3")
    s.write()
    return s


def test_a_new_idle_threshold_changes_the_books_and_the_alert_from_the_next_poll(tmp_path: Path) -> None:
    """GpuUnderutilized's threshold is the books' idea of idle too: after a SIGHUP that raises it above
    the GPU's 30% utilization, its time is counted allocated-but-idle, not busy, and the alert fires."""
    s = one_held_gpu(tmp_path / "node.scn", util=30)
    cfg = tmp_path / "c.yaml"
    rule = {"window": "1s", "for": "0s"}
    write(cfg, {"poll_interval": "200ms", "rules": {"GpuUnderutilized": {**rule, "threshold": 0.10}}})

    def seconds(d: RunningDaemon, state: str) -> float:
        m = d.metrics()
        return sum(v for (n, ls), v in m.items() if n == "gpu_state_seconds_total" and ("state", state) in ls)

    def underutilized(d: RunningDaemon) -> float:
        return counter(d, "gpu_exporter_alerts", alertname="GpuUnderutilized", alertstate="firing")

    with run_daemon(s.path, "--config", str(cfg)) as d:
        wait_polls(d, 3)
        busy, idle = seconds(d, "busy"), seconds(d, "allocated_idle")
        wait_polls(d, 5)
        # 30% is at or above 10%: busy time grows, and nothing else.
        assert seconds(d, "busy") > busy + 0.5 and seconds(d, "allocated_idle") == idle == 0
        assert underutilized(d) == 0

        write(cfg, {"poll_interval": "200ms",
                    "rules": {"GpuUnderutilized": {**rule, "threshold": 0.50, "clear_threshold": 0.60}}})  # fmt: skip
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: bool(events(d, "config_reloaded")), what="the reload")
        # At most the poll in flight during the reload is counted by the old threshold.
        wait_polls(d, 2)
        busy, idle = seconds(d, "busy"), seconds(d, "allocated_idle")
        assert idle > 0, "the first poll after the reload is not counted allocated-but-idle"
        wait_polls(d, 5)
        assert seconds(d, "busy") == busy, "busy time grew under a threshold above the GPU's utilization"
        assert seconds(d, "allocated_idle") > idle + 0.5
        wait_for(lambda: underutilized(d) == 1, what="GpuUnderutilized at the new threshold")


def test_a_new_price_holds_from_the_reload_without_a_restart(scenario: Scenario, tmp_path: Path) -> None:
    """Issue 48: a price change took a restart (the log said setting_needs_restart), so the books went
    on pricing the GPU at the old price.  Now gpu_price_per_hour says the new price from the reload on."""
    preset("pcie-degraded", scenario.path).write()
    cfg = tmp_path / "c.yaml"
    write(cfg, {"poll_interval": "200ms", "pricing": {"currency": "USD", "models": {"A100": 2.5}}})

    def price(d: RunningDaemon) -> float | None:
        return value(parse_exposition(http_get(d.url + "/metrics")[2].decode()), "gpu_price_per_hour", gpu="0")

    with run_daemon(scenario.path, "--config", str(cfg)) as d:
        wait_for(lambda: price(d) == 2.5, what="the first price")
        write(cfg, {"poll_interval": "200ms", "pricing": {"currency": "USD", "models": {"A100": 3.25}}})
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: bool(events(d, "config_reloaded")), what="the reload")
        wait_for(lambda: price(d) == 3.25, what="the new price")
        assert not events(d, "setting_needs_restart")
        # And a pricing section taken away leaves the GPU unpriced: no made-up price stays.
        write(cfg, {"poll_interval": "200ms"})
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: len(events(d, "config_reloaded")) == 2, what="the second reload")
        wait_for(lambda: price(d) is None, what="no price")
