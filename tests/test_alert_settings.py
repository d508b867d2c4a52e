"""Alerting settings that cannot work are refused at load: exit 2, naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_exporter.alerting.settings import WebhookSettings, receiver_url
from gpu_exporter.cli import main
from gpu_exporter.once import UNKNOWN

BAD_URLS = [
    ("http://a b/", "spaces or control characters"),
    ("http://host/path\twith-tab", "spaces or control characters"),
    ("http://host/\x00", "spaces or control characters"),
    ("ftp://host/hook", "http:// or https://"),
    ("hooks.example/gpu", "http:// or https://"),
    ("http:///hook", "no host"),
    ("http://:9093/", "no host"),
    ("http://host:99999/", "not a valid URL"),
    ("http://host:port/", "not a valid URL"),
    ("http://host:0/", "port 0"),
    ("http://user:secret@host/", "credentials in the URL"),
    ("http://exa_mple..com/", "not a valid host name"),
    ("http://[::1/", "not a valid URL"),
]


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
def test_a_url_that_cannot_work_is_refused(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        receiver_url(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9093", "https://am.example:9093/", "http://[::1]:8080/hook",
                                 "https://hooks.example/gpu?token=a%20b", "http://alertmanager-operated.monitoring.svc:9093",
                                 "http://münchen.example/hook", "http://gpu_alerts.local/"])  # fmt: skip
def test_urls_that_work_are_taken_as_they_are(url: str) -> None:
    assert receiver_url(url) == url


@pytest.mark.parametrize(
    ("alerting", "needles"),
    [
        ({"webhooks": [{"url": "http://a b/"}]}, ["alerting.webhooks.0.url", "'http://a b/'", "spaces"]),
        ({"alertmanagers": [{"url": "http://am:9093"}, {"url": "http://am:99999"}]},
         ["alerting.alertmanagers.1.url", "not a valid URL"]),
        ({"resend_interval": 100000000000},
         ["alerting.resend_interval", "100000000000", "less than or equal to 86400"]),
        ({"resend_interval": "0s"}, ["alerting.resend_interval", "greater than 0"]),
        ({"resolved_retention": "720h"}, ["alerting.resolved_retention", "less than or equal to 604800"]),
        ({"queue_size": 0}, ["alerting.queue_size", "greater than or equal to 1"]),
        ({"webhooks": [{"url": "http://h/", "timeout": "1h"}]},
         ["alerting.webhooks.0.timeout", "less than or equal to 300"]),
        ({"webhooks": [{"url": "http://h/", "group_interval": "0s"}]},
         ["alerting.webhooks.0.group_interval", "greater than 0"]),
        ({"webhooks": [{"url": "http://h/", "repeat_interval": "9600h"}]}, ["alerting.webhooks.0.repeat_interval"]),
        ({"webhooks": [{"url": "http://h/", "group_wait": "2h"}]}, ["alerting.webhooks.0.group_wait"]),
        ({"webhooks": [{"url": "http://h/", "group_by": ["alertname", "no-dash"]}]}, ["group_by", "no-dash"]),
        ({"webhooks": [{"url": "http://h/", "group_by": ["...", "node"]}]}, ["group_by", "'...'"]),
        ({"webhooks": [{"url": "http://h/", "name": ""}]}, ["alerting.webhooks.0.name"]),
        ({"external_url": "gpu-node:9445"}, ["alerting.external_url", "http:// or https://"]),
    ],
)  # fmt: skip
def test_bad_alerting_settings_are_refused_naming_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], alerting: dict[str, object], needles: list[str]
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"alerting": alerting}))
    assert main(["--config", str(cfg), "--once", "--simulate"]) == UNKNOWN  # --once is a check
    err = capsys.readouterr().err
    assert err.startswith("gpu-exporter: invalid ")
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize(("rules", "needle"), [
    ({"GpuLost": {"for": "9600h"}}, "rules.GpuLost.for"),
    ({"GpuUnderutilized": {"window": 1e12}}, "rules.GpuUnderutilized.window"),
])  # fmt: skip
def test_rule_durations_out_of_range_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            rules: dict[str, object], needle: str) -> None:  # fmt: skip
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"rules": rules}))
    assert main(["--config", str(cfg), "--once", "--simulate"]) == UNKNOWN  # --once is a check
    err = capsys.readouterr().err
    assert needle in err and "less than or equal to 2592000" in err


def test_a_bad_url_from_a_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--alerting.webhook-url", "http://a b/", "--once", "--simulate"]) == UNKNOWN  # --once is a check
    assert "invalid alerting.webhooks.0.url" in capsys.readouterr().err


def test_webhook_routing_defaults_are_alertmanagers() -> None:
    w = WebhookSettings(url="http://h/")
    assert (w.group_by, w.group_wait, w.group_interval, w.repeat_interval, w.send_resolved) == (
        ["alertname", "node"], 30.0, 300.0, 4 * 3600.0, True)  # fmt: skip
    assert w.receiver == "webhook" and WebhookSettings(url="http://h/", name="ops").receiver == "ops"
