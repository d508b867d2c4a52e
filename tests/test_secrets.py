"""Secrets stay secret (issue 28, point 8, and 11's removed receivers).

A bearer token with a trailing newline failed on every send forever and went into the log; config
errors printed credentialed URLs, numeric passwords and whole receivers (on stderr, in --once's
JSON and in config_reload_failed); an unnamed receiver's URL (a Slack webhook's secret path) became
a metric label; there was no way to keep a secret out of the command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.alerting.delivery import AlertmanagerReceiver, WebhookReceiver
from gpu_exporter.alerting.engine import FIRING, Alert, sendable
from gpu_exporter.daemon import Daemon
from gpu_exporter.settings.config import ConfigError, load_settings
from gpu_exporter.settings.redaction import redact_text, redacted
from gpu_exporter.sources.simulated import SimulatedBackend
from tests.alerting_helpers import webhook_receiver
from tests.exporter_helpers import parse_exposition
from tests.timing import NEVER_S, wait_until

pytestmark = pytest.mark.integration

SECRETS = ("S3CRETPASS", "T0KEN-abc", "XYZSECRETPATH", "123456")
ALERT = Alert(sendable({"alertname": "GpuLost", "severity": "critical", "gpu": "0", "node": "n1"}), (), FIRING,
              active_at=1.8e9, fired_at=1.8e9)  # fmt: skip


def no_secret_in(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret} shown in: {text[:500]}"


def received_auth(hook: Any) -> list[str]:
    with hook.lock:
        return [r.headers.get("Authorization", "") for r in hook.requests]


@pytest.mark.parametrize("written", ["T0KEN-abc\n", "  T0KEN-abc\r\n\n"])
def test_a_token_file_ending_in_a_newline_is_sent_without_it(tmp_path: Path, written: str) -> None:
    token = tmp_path / "token"
    token.write_text(written)  # what `kubectl create secret --from-file` and `echo > file` leave
    with webhook_receiver() as hook:
        settings = load_settings({"alerting": {"alertmanagers": [{"url": hook.url, "bearer_token_file": str(token)}]}})
        seen: list[tuple[str, str]] = []
        r = AlertmanagerReceiver(settings.alerting.alertmanagers[0], lambda n, o: seen.append((n, o)),
                                 queue_size=10, valid_for=60, generator_url=lambda: "http://x/alerts")  # fmt: skip
        r.start()
        try:
            r.submit([ALERT], now=time.monotonic())
            assert wait_until(lambda: received_auth(hook))
        finally:
            r.stop()
    assert received_auth(hook) == ["Bearer T0KEN-abc"] and seen[-1][1] == "sent"


def test_yaml_block_token_is_stripped_and_whitespace_inside_refused_without_echo() -> None:
    block = yaml.safe_load("bearer_token: |\n  T0KEN-abc\n")["bearer_token"]
    assert block == "T0KEN-abc\n"
    s = load_settings({"alerting": {"alertmanagers": [{"url": "http://am:9093", "bearer_token": block}]}})
    token = s.alerting.alertmanagers[0].bearer_token
    assert token is not None and token.get_secret_value() == "T0KEN-abc"
    assert "T0KEN" not in repr(s) and "T0KEN" not in str(s.alerting)
    with pytest.raises(ConfigError) as e:
        load_settings({"alerting": {"alertmanagers": [{"url": "http://am:9093", "bearer_token": "T0KEN abc"}]}})
    assert "whitespace" in str(e.value)
    no_secret_in(str(e.value))


BAD_CONFIGS: dict[str, dict[str, Any]] = {
    "credentialed URL": {"alerting": {"webhooks": [{"url": "https://user:S3CRETPASS@hooks.example/x"}]}},
    "numeric password": {"alerting": {"alertmanagers": [{"url": "http://am:9093", "basic_auth_username": "u",
                                                         "basic_auth_password": 123456}]}},
    "receiver with both secrets": {"alerting": {"webhooks": [{
        "url": "https://hooks.slack.com/services/XYZSECRETPATH", "bearer_token": "T0KEN-abc",
        "basic_auth_username": "u", "basic_auth_password": "S3CRETPASS"}]}},
    "secret URL with a bad option": {"alerting": {"webhooks": [{
        "url": "https://hooks.slack.com/services/XYZSECRETPATH", "group_wait": "soon"}]}},
}  # fmt: skip


@pytest.mark.parametrize("config", BAD_CONFIGS.values(), ids=list(BAD_CONFIGS))
def test_config_errors_never_show_a_secret(tmp_path: Path, config: dict[str, Any]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config))
    base = [sys.executable, "-m", "gpu_exporter", "--simulate", "--config", str(cfg)]
    for extra in (["--web.listen-address", "127.0.0.1:0"], ["--once"], ["--once", "--format", "json"]):
        out = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=NEVER_S)
        assert out.returncode in (2, 3), out
        assert out.stderr.startswith("gpu-exporter: invalid alerting"), out.stderr
        no_secret_in(out.stdout, out.stderr)
        if "json" in extra:
            assert json.loads(out.stdout)["status"] == "UNKNOWN"


def test_a_failed_reload_logs_no_secret(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    from gpu_exporter.cli import reload

    daemon = Daemon(load_settings({"simulate": True}), lambda errors: SimulatedBackend(1))
    bad = BAD_CONFIGS["receiver with both secrets"]

    def reread() -> Any:
        return load_settings(bad)

    with capture_logs() as logs:
        reload(daemon, reread)
    (failed,) = [e for e in logs if e["event"] == "config_reload_failed"]
    no_secret_in(json.dumps(failed))


def test_secret_files_are_read_again_on_reload(tmp_path: Path) -> None:
    token = tmp_path / "token"
    url = tmp_path / "url"
    token.write_text("T0KEN-abc\n")
    with webhook_receiver() as hook:
        url.write_text(hook.url + "\n")
        cfg = {"alerting": {"webhooks": [{"url_file": str(url), "bearer_token_file": str(token), "group_wait": "0s",
                                          "group_interval": "1s"}]}}  # fmt: skip
        daemon = Daemon(load_settings({**cfg, "simulate": True}), lambda errors: SimulatedBackend(1))
        try:
            (r,) = daemon.notifier.receivers
            assert r.name == f"http://127.0.0.1:{hook.port}"  # named without the URL's path
            token.write_text("T0KEN-new\n")  # a rotated Secret
            daemon.reload(load_settings({**cfg, "simulate": True}))
            (r2,) = daemon.notifier.receivers
            assert r2 is not r
            assert isinstance(r2, WebhookReceiver)
            r2.submit([ALERT], now=time.monotonic())
            assert wait_until(lambda: received_auth(hook))
        finally:
            daemon.notifier.stop()
    assert received_auth(hook) == ["Bearer T0KEN-new"]


def test_an_unnamed_receiver_is_labelled_without_its_path_and_a_removed_one_leaves_metrics() -> None:
    slack = "https://hooks.slack.com/services/XYZSECRETPATH"
    cfg = {
        "simulate": True,
        "alerting": {"webhooks": [{"url": slack}, {"url": slack + "2"}, {"url": slack, "name": "ops"}]},
    }
    daemon = Daemon(load_settings(cfg), lambda errors: SimulatedBackend(1))
    body = daemon.exposition.body().decode()
    no_secret_in(body)
    receivers = {labels for n, labels in parse_exposition(body) if n == "gpu_exporter_notifications_total"}
    names = {dict(labels)["receiver"] for labels in receivers}
    assert names == {"https://hooks.slack.com #1", "https://hooks.slack.com #2", "ops"}
    daemon.reload(load_settings({"simulate": True, "alerting": {"webhooks": [{"url": slack, "name": "ops"}]}}))
    daemon.exposition.invalidate()
    body = daemon.exposition.body().decode()
    names = {
        dict(labels)["receiver"] for n, labels in parse_exposition(body) if n == "gpu_exporter_notifications_total"
    }
    assert names == {"ops"}, "a removed receiver's series stayed"
    daemon.notifier.stop()


def test_redaction_by_key_and_by_url() -> None:
    tree = {
        "url": "https://u:S3CRETPASS@h.example:8443/p/XYZSECRETPATH?x=1",
        "bearer_token": "T0KEN-abc",
        "nested": [{"basic_auth_password": "123456", "basic_auth_username": "u"}],
        "bearer_token_file": "/f",
    }
    shown = redacted(tree)
    no_secret_in(json.dumps(shown))
    assert shown["url"] == "https://u:***@h.example:8443/..." and shown["bearer_token_file"] == "/f"
    assert shown["nested"][0]["basic_auth_username"] == "u"
    assert redact_text("error at http://h/XYZSECRETPATH: refused") == "error at http://h/...: refused"
