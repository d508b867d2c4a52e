"""Alert delivery: to webhooks and to a real Alertmanager, retried in order, nothing lost."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.alerting.delivery import Receiver
from gpu_exporter.alerting.settings import ReceiverSettings
from tests.alerting_helpers import alertmanager, webhook_receiver
from tests.exporter_helpers import http_get, run_daemon, value, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import preset

FAST_RULES = {
    "GpuPcieLinkDegraded": {"for": "0s"},
    "GpuPcieBottleneck": {"for": "0s"},
    "GpuMemoryHigh": {"for": "0s"},
}


def write_config(path: Path, alerting: dict[str, Any], rules: dict[str, Any] | None = None) -> Path:
    path.write_text(yaml.safe_dump({"node_name": "node-a", "rules": rules or FAST_RULES,
                                    "alerting": {"resend_interval": "1s", **alerting}}))  # fmt: skip
    return path


def healthy(s: Scenario) -> None:
    s.gpu(0).pcie(gen=4, width=16, rx_kbps=400_000, tx_kbps=100_000)


def degraded(s: Scenario) -> None:
    s.gpu(0).pcie(gen=1, width=8, rx_kbps=1_860_000, tx_kbps=310_000)


def names(alerts: list[dict[str, Any]], status: str) -> list[str]:
    return [a["labels"]["alertname"] for a in alerts if a["status"] == status]


# -- the receiver's queue -----------------------------------------------------------------------------
@pytest.mark.parametrize("failure", [500, 503, 429])
def test_failed_deliveries_are_retried_in_order_until_they_succeed(failure: int) -> None:
    outcomes: list[tuple[str, str]] = []
    with webhook_receiver() as hook:
        hook.status = failure
        r = Receiver(ReceiverSettings(url=hook.url), "webhook", 100, lambda n, o: outcomes.append((n, o)))
        r.start()
        for i in range(5):
            r.submit(json.dumps({"n": i}).encode())
        wait_for(lambda: (hook.url, "retried") in outcomes, what="a retry")
        hook.status = 200
        wait_for(lambda: len(hook.requests) == 5, timeout=20, what="all five delivered")
        r.stop()
    assert [req.body["n"] for req in hook.requests] == [0, 1, 2, 3, 4]
    assert outcomes.count((r.name, "sent")) == 5
    assert len(r) == 0


def test_a_full_queue_drops_the_oldest_counted_and_logged(capsys: pytest.CaptureFixture[str]) -> None:
    outcomes: list[str] = []
    r = Receiver(ReceiverSettings(url="http://127.0.0.1:9/nothing-listens"), "webhook", 2,
                 lambda n, o: outcomes.append(o))  # fmt: skip
    for i in range(5):  # not started: nothing drains the queue
        r.submit(json.dumps({"n": i}).encode())
    assert outcomes == ["dropped"] * 3 and len(r) == 2
    captured = capsys.readouterr()
    assert (captured.out + captured.err).count("notification_dropped") == 3


def test_rejected_notifications_are_not_retried() -> None:
    outcomes: list[str] = []
    with webhook_receiver() as hook:
        hook.status = 400
        r = Receiver(ReceiverSettings(url=hook.url), "webhook", 10, lambda n, o: outcomes.append(o))
        r.start()
        r.submit(b"{}")
        wait_for(lambda: outcomes == ["rejected"], what="the rejection")
        r.stop()


def test_auth_headers() -> None:
    with webhook_receiver() as hook:
        for settings, want in (
            (ReceiverSettings(url=hook.url, bearer_token="s3cret"), "Bearer s3cret"),
            (ReceiverSettings(url=hook.url, basic_auth_username="am", basic_auth_password="pw"), "Basic YW06cHc="),
        ):
            r = Receiver(settings, "webhook", 10, lambda n, o: None)
            r.start()
            r.submit(b"{}")
            wait_for(lambda: len(hook.requests) > 0, what="a request")
            r.stop()
            assert hook.requests.pop().headers["Authorization"] == want


# -- the daemon end to end ---------------------------------------------------------------------------
def test_webhook_gets_alertmanager_payload_v4(scenario: Scenario, tmp_path: Path) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with webhook_receiver() as hook:
        cfg = write_config(tmp_path / "c.yaml", {"webhooks": [{"url": hook.url, "name": "ops"}]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: "GpuPcieLinkDegraded" in names(hook.alerts(), "firing"), what="the firing alert")
            body = next(r.body for r in hook.requests if r.body["status"] == "firing")
            assert body["version"] == "4" and body["receiver"] == "ops"
            alert = next(a for a in body["alerts"] if a["labels"]["alertname"] == "GpuPcieLinkDegraded")
            assert alert["labels"] == {"alertname": "GpuPcieLinkDegraded", "severity": "warning", "gpu": "0",
                                       "uuid": s.gpu(0).values["uuid"], "node": "node-a"}  # fmt: skip
            assert "Gen1 x8" in alert["annotations"]["description"]
            assert alert["generatorURL"].endswith("/alerts") and alert["fingerprint"]
            # State is visible: metric, JSON and page.
            assert value(d.metrics(), "gpu_exporter_alerts", alertname="GpuPcieLinkDegraded",
                         alertstate="firing") == 1  # fmt: skip
            status, _, raw = http_get(d.url + "/api/v1/alerts")
            listed = {a["labels"]["alertname"] for a in json.loads(raw)["data"]["alerts"]}
            assert status == 200 and {"GpuPcieLinkDegraded", "GpuPcieBottleneck"} <= listed
            assert b"GpuPcieBottleneck" in http_get(d.url + "/alerts")[2]
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_notifications_total", receiver="ops",
                                    outcome="sent") or 0) >= 1, what="the sent counter")  # fmt: skip
            healthy(s)
            s.write()
            wait_for(lambda: "GpuPcieLinkDegraded" in names(hook.alerts(), "resolved"), what="the resolution")


def test_alertmanager_delivers_alert_and_resolution(scenario: Scenario, tmp_path: Path) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with webhook_receiver() as hook, alertmanager(hook.url, tmp_path / "am") as am:
        cfg = write_config(tmp_path / "c.yaml", {"alertmanagers": [{"url": am.url}]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms"):
            wait_for(lambda: "GpuPcieLinkDegraded" in names(hook.alerts(), "firing"), what="firing via Alertmanager")
            alert = next(a for a in hook.alerts() if a["labels"]["alertname"] == "GpuPcieLinkDegraded")
            assert alert["labels"]["node"] == "node-a" and alert["labels"]["severity"] == "warning"
            healthy(s)
            s.write()
            wait_for(lambda: "GpuPcieLinkDegraded" in names(hook.alerts(), "resolved"), timeout=30,
                     what="resolved via Alertmanager")  # fmt: skip


def test_alertmanager_outage_loses_nothing(scenario: Scenario, tmp_path: Path) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.gpu(0).memory(40 * 1024**3, 10 * 1024**3, reserved=0)
    s.write()
    with webhook_receiver() as hook, alertmanager(hook.url, tmp_path / "am") as am:
        cfg = write_config(tmp_path / "c.yaml", {"alertmanagers": [{"url": am.url}]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: "GpuPcieLinkDegraded" in names(hook.alerts(), "firing"), what="firing before")
            am.stop()
            # During the outage: one alert resolves, another starts firing.
            healthy(s)
            s.gpu(0).memory(40 * 1024**3, 39 * 1024**3, reserved=0)
            s.write()
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_notifications_total", outcome="retried") or 0) >= 2,
                     what="retries during the outage")  # fmt: skip
            assert (value(d.metrics(), "gpu_exporter_notification_queue_length") or 0) >= 1
            am.start()
            wait_for(lambda: "GpuPcieLinkDegraded" in names(hook.alerts(), "resolved")
                     and "GpuMemoryHigh" in names(hook.alerts(), "firing"), timeout=45,
                     what="the outage's resolution and new alert")  # fmt: skip
            assert value(d.metrics(), "gpu_exporter_notifications_total", outcome="dropped") is None
            d.proc.send_signal(signal.SIGTERM)
            assert d.proc.wait(timeout=5) == 0


def _make_ca_and_server_cert(d: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate for 127.0.0.1, made with openssl."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=test CA")  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"
    )
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")  # fmt: skip
    return d / "ca.pem", d / "server.pem", d / "server.key"


def test_custom_ca(tmp_path: Path) -> None:
    ca, cert, key = _make_ca_and_server_cert(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    with webhook_receiver(ssl_context=ctx) as hook:
        assert hook.url.startswith("https://")
        outcomes: list[str] = []
        trusting = Receiver(ReceiverSettings(url=hook.url, ca_file=str(ca)), "webhook", 10,
                            lambda n, o: outcomes.append(o))  # fmt: skip
        trusting.start()
        trusting.submit(b"{}")
        wait_for(lambda: outcomes == ["sent"], what="delivery over TLS with the custom CA")
        trusting.stop()
        untrusting_outcomes: list[str] = []
        untrusting = Receiver(ReceiverSettings(url=hook.url), "webhook", 10,
                              lambda n, o: untrusting_outcomes.append(o))  # fmt: skip
        untrusting.start()
        untrusting.submit(b"{}")
        wait_for(lambda: "retried" in untrusting_outcomes, what="a refused certificate")
        untrusting.stop()
        assert len(hook.requests) == 1


def test_a_hanging_receiver_blocks_neither_polls_nor_scrapes(scenario: Scenario, tmp_path: Path) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
        cfg = write_config(tmp_path / "c.yaml", {"webhooks": [{"url": url, "timeout": "30s"}]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: value(d.metrics(), "gpu_exporter_notification_queue_length") == 1,
                     what="a notification stuck in delivery")  # fmt: skip
            polls = value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0
            t0 = time.monotonic()
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0) >= polls + 5,
                     what="polls going on")  # fmt: skip
            assert time.monotonic() - t0 < 5
            healthy(s)
            s.write()
            wait_for(lambda: value(d.metrics(), "gpu_exporter_alerts", alertname="GpuPcieLinkDegraded") is None,
                     what="the rule engine moving on")  # fmt: skip


def test_receivers_from_flags(scenario: Scenario, tmp_path: Path) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with webhook_receiver() as hook:
        cfg = write_config(tmp_path / "c.yaml", {})  # fast rules only; the receiver comes from the flag
        with run_daemon(s.path, "--config", str(cfg), "--alerting.webhook-url", hook.url, "--node.name", "n7"):
            wait_for(lambda: "GpuPcieLinkDegraded" in names(hook.alerts(), "firing"), what="the firing alert")
            assert hook.alerts()[0]["labels"]["node"] == "n7"
