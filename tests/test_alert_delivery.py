"""Alert delivery: to webhooks and to a real Alertmanager; retried whatever goes wrong, nothing lost."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.alerting.delivery import AlertmanagerReceiver, WebhookReceiver, rfc3339
from gpu_exporter.alerting.engine import FIRING, RESOLVED, Alert, fingerprint, sendable
from gpu_exporter.alerting.settings import ReceiverSettings, WebhookSettings, receiver_origin
from tests.alerting_helpers import WebhookReceiver as Hook
from tests.alerting_helpers import alertmanager, raw_receiver, webhook_receiver
from tests.exporter_helpers import DAEMON_STOP_S, http_get, run_daemon, value, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import preset
from tests.timing import LATE_S, NEVER_S

pytestmark = pytest.mark.integration


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# A webhook fed directly, routed without delay: a notification at once, then every second.
PROMPT = {"group_wait": "0s", "group_interval": "1s"}

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


# -- the Alertmanager receiver: current state per alert ----------------------------------------------
T0 = 1_800_000_000.0


def alert(name: str = "GpuLost", gpu: str = "0", state: str = FIRING, at: float = T0,
          resolved_at: float | None = None) -> Alert:  # fmt: skip
    labels = sendable({"alertname": name, "severity": "critical", "gpu": gpu, "uuid": f"GPU-{gpu}", "node": "n1"})
    return Alert(labels, (("summary", f"{name} on {gpu}"),), state, active_at=at, fired_at=at,
                 resolved_at=resolved_at)  # fmt: skip


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, receiver: str, outcome: str) -> None:
        with self.lock:
            self.seen.append((receiver, outcome))

    def count(self, outcome: str) -> int:
        with self.lock:
            return sum(1 for _, o in self.seen if o == outcome)


def am_receiver(
    url: str,
    outcomes: Outcomes,
    queue_size: int = 100,
    valid_for: float = 4.0,
    clock: Callable[[], float] = time.time,
    **settings: Any,
) -> AlertmanagerReceiver:
    return AlertmanagerReceiver(
        ReceiverSettings(url=url, **settings),
        outcomes,
        queue_size=queue_size,
        valid_for=valid_for,
        generator_url=lambda: "http://n1:9445/alerts",
        clock=clock,
        steady=time.monotonic if clock is time.time else clock,
    )


def posted(hook: Hook) -> list[list[dict[str, Any]]]:
    """The bodies an Alertmanager receiver posted (each a list of alerts)."""
    with hook.lock:
        return [r.body for r in hook.requests]


@pytest.mark.parametrize("failure", [500, 503, 429])
def test_failed_deliveries_are_retried_until_they_succeed(failure: int) -> None:
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        hook.status = failure
        r = am_receiver(hook.url, outcomes)
        r.start()
        for i in range(5):
            r.submit([alert(gpu=str(i))], T0)
        wait_for(lambda: outcomes.count("retried") >= 1, what="a retry")
        hook.status = 200
        wait_for(lambda: len(r) == 0, timeout=20, what="everything delivered")
        r.stop()
    delivered = {a["labels"]["gpu"] for body in posted(hook) for a in body}
    assert delivered == {"0", "1", "2", "3", "4"}
    assert outcomes.count("sent") == len(posted(hook)) and outcomes.count("dropped") == 0
    assert all(req.path == "/hook/api/v2/alerts" for req in hook.requests)


def test_the_queue_holds_the_latest_state_of_each_alert_not_its_history() -> None:
    clock = FakeClock(T0)
    outcomes = Outcomes()
    r = am_receiver("http://127.0.0.1:9/am", outcomes, clock=clock)  # not started: nothing drains it
    for i in range(100):  # an outage: the same firing alert re-sent every interval
        r.submit([alert(gpu="0"), alert(gpu="1")], T0 + i)
    assert len(r) == 2
    r.submit([alert(gpu="1", state=RESOLVED, resolved_at=T0 + 150)], T0 + 150)
    assert len(r) == 2, "the resolution replaces GPU 1's firing state"
    # GPU 1 fires again later: its resolution and its new firing both wait, the resolution first.
    r.submit([alert(gpu="1", at=T0 + 200)], T0 + 200)
    assert [(a.label_dict["gpu"], a.state) for a in r._resolved.values()] == [("1", RESOLVED)]
    assert sorted(a.label_dict["gpu"] for a in r._firing.values()) == ["0", "1"]
    assert outcomes.seen == []


def test_endsat_is_computed_when_the_batch_is_sent_not_when_it_was_queued() -> None:
    clock = FakeClock(T0)
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        r = am_receiver(hook.url, outcomes, valid_for=20.0, clock=clock)
        r.submit([alert(gpu="2"), alert(gpu="3", state=RESOLVED, resolved_at=T0 + 1)], T0)
        clock.now = T0 + 3600  # delivered an hour later, after an outage
        r.start()
        wait_for(lambda: outcomes.count("sent") == 1, what="the delivery")
        r.stop()
    (body,) = posted(hook)
    by_gpu = {a["labels"]["gpu"]: a for a in body}
    assert [a["labels"]["gpu"] for a in body] == ["3", "2"], "resolutions first"
    assert by_gpu["2"]["endsAt"] == rfc3339(T0 + 3600 + 20.0), "valid from the moment of sending"
    assert by_gpu["2"]["startsAt"] == rfc3339(T0)
    assert by_gpu["3"]["endsAt"] == rfc3339(T0 + 1), "a resolution keeps the time it resolved"


def test_more_alerts_than_queue_size_drops_the_oldest_counted_and_logged(capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = Outcomes()
    r = am_receiver("http://127.0.0.1:9/nothing-listens", outcomes, queue_size=2)
    for i in range(5):  # not started: nothing drains the queue
        r.submit([alert(gpu=str(i))], T0)
    assert outcomes.count("dropped") == 3 and len(r) == 2
    assert sorted(a.label_dict["gpu"] for a in r._firing.values()) == ["3", "4"]
    captured = capsys.readouterr()
    assert (captured.out + captured.err).count("notification_dropped") == 3


def test_over_queue_size_a_resolution_goes_before_a_firing_alert() -> None:
    outcomes = Outcomes()
    r = am_receiver("http://127.0.0.1:9/nothing-listens", outcomes, queue_size=2)
    r.submit([alert(gpu="0", state=RESOLVED, resolved_at=T0 + 1)], T0 + 1)
    r.submit([alert(gpu="1"), alert(gpu="2")], T0 + 2)
    assert outcomes.count("dropped") == 1
    assert (list(r._resolved), sorted(a.label_dict["gpu"] for a in r._firing.values())) == ([], ["1", "2"])


def test_a_state_that_arrives_while_a_request_is_in_flight_is_sent_next() -> None:
    release = threading.Event()
    bodies: list[Any] = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            release.wait(NEVER_S)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    outcomes = Outcomes()
    try:
        r = am_receiver(f"http://127.0.0.1:{server.server_address[1]}", outcomes)
        r.start()
        first = alert(gpu="0")
        r.submit([first], T0)
        wait_for(lambda: len(bodies) == 1, what="the first request in flight")
        newer = replace(first, annotations=(("summary", "newer"),))
        r.submit([newer], T0 + 1)
        release.set()
        wait_for(lambda: outcomes.count("sent") == 2, what="the newer state sent after the first request")
        r.stop()
    finally:
        server.shutdown()
        server.server_close()
    assert [b[0]["annotations"]["summary"] for b in bodies] == ["GpuLost on 0", "newer"]


def test_rejected_notifications_are_not_retried() -> None:
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        hook.status = 400
        r = am_receiver(hook.url, outcomes)
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: outcomes.count("rejected") == 1, what="the rejection")
        assert len(r) == 0
        r.stop()
    assert outcomes.count("retried") == 0


def test_auth_headers() -> None:
    with webhook_receiver() as hook:
        auths: tuple[tuple[dict[str, Any], str], ...] = (
            ({"bearer_token": "s3cret"}, "Bearer s3cret"),
            ({"basic_auth_username": "am", "basic_auth_password": "pw"}, "Basic YW06cHc="),
        )
        for settings, want in auths:
            r = am_receiver(hook.url, Outcomes(), **settings)
            r.start()
            r.submit([alert()], T0)
            wait_for(lambda: len(hook.requests) > 0, what="a request")
            r.stop()
            assert hook.requests.pop().headers["Authorization"] == want


# -- receivers that speak garbage ---------------------------------------------------------------------
GARBAGE = ["not-http", "truncated", "hang-up", "long-header", "bad-status"]


def test_an_alertmanager_receiver_survives_garbage_and_delivers_once_the_receiver_answers() -> None:
    outcomes = Outcomes()
    with raw_receiver(GARBAGE) as raw:
        r = am_receiver(raw.url, outcomes)
        r.min_backoff = 0.05  # the daemon's 0.5 s doubling is tried in test_alert_chain
        r.start()
        r.submit([alert(gpu="0")], T0)
        wait_for(lambda: outcomes.count("sent") == 1, timeout=60, what="delivery after the garbage")
        assert r.alive
        r.submit([alert(gpu="0", state=RESOLVED, resolved_at=T0 + 5)], T0 + 5)
        wait_for(lambda: outcomes.count("sent") == 2, what="the next notification")
        assert r.alive
        r.stop()
    assert raw.replies == [*GARBAGE, "http", "http"]
    assert outcomes.count("retried") == len(GARBAGE), "every bad reply is counted"
    assert [[a["labels"]["gpu"] for a in b] for b in raw.bodies] == [["0"], ["0"]]
    assert raw.bodies[1][0]["endsAt"] == rfc3339(T0 + 5)


def test_a_webhook_survives_garbage_and_delivers_once_the_receiver_answers() -> None:
    outcomes = Outcomes()
    with raw_receiver(GARBAGE) as raw:
        r = WebhookReceiver(WebhookSettings(url=raw.url, name="ops", group_wait=0, group_interval=1), outcomes,
                            generator_url=lambda: "http://n1:9445/alerts")  # fmt: skip
        r.min_backoff = 0.05
        r.start()
        r.submit([alert(gpu="0")], time.time())
        wait_for(lambda: outcomes.count("sent") == 1, timeout=60, what="delivery after the garbage")
        assert r.alive
        r.stop()
    assert raw.replies == [*GARBAGE, "http"]
    assert outcomes.count("retried") == len(GARBAGE)
    (body,) = raw.bodies
    assert body["receiver"] == "ops" and body["alerts"][0]["labels"]["gpu"] == "0"


def test_the_delivery_thread_survives_a_bug_in_building_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        r = am_receiver(hook.url, outcomes)
        broken = iter([RuntimeError("a bug"), KeyError("another")])

        def generator_url() -> str:
            error = next(broken, None)
            if error is not None:
                raise error
            return "http://n1:9445/alerts"

        r._generator_url = generator_url
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: outcomes.count("sent") == 1, timeout=20, what="delivery after two failures")
        assert r.alive
        r.stop()
    assert outcomes.count("retried") == 2


# -- the daemon end to end ---------------------------------------------------------------------------
def test_webhook_gets_alertmanager_payload_v4(scenario: Scenario, tmp_path: Path) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with webhook_receiver() as hook:
        cfg = write_config(tmp_path / "c.yaml", {"webhooks": [{"url": hook.url, "name": "ops", **PROMPT}]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: "GpuPcieLinkDegraded" in names(hook.alerts(), "firing"), what="the firing alert")
            body = next(r.body for r in hook.requests
                        if "GpuPcieLinkDegraded" in {a["labels"]["alertname"] for a in r.body["alerts"]})  # fmt: skip
            assert body["version"] == "4" and body["receiver"] == "ops"
            alert = next(a for a in body["alerts"] if a["labels"]["alertname"] == "GpuPcieLinkDegraded")
            assert alert["labels"] == {"alertname": "GpuPcieLinkDegraded", "severity": "warning", "gpu": "0",
                                       "uuid": s.gpu(0).values["uuid"], "node": "node-a"}  # fmt: skip
            assert "Gen1 x8" in alert["annotations"]["description"]
            assert alert["generatorURL"].endswith("/alerts")
            assert alert["fingerprint"] == fingerprint(tuple(sorted(alert["labels"].items())))
            assert alert["status"] == "firing" and alert["endsAt"] == "0001-01-01T00:00:00Z"
            # Grouped as an Alertmanager route with group_by [alertname, node] groups it.
            assert body["groupKey"] == '{}:{alertname="GpuPcieLinkDegraded", node="node-a"}'
            assert body["groupLabels"] == {"alertname": "GpuPcieLinkDegraded", "node": "node-a"}
            assert body["commonLabels"] == alert["labels"] and body["status"] == "firing"
            assert body["externalURL"] == alert["generatorURL"].removesuffix("/alerts")
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
            # The daemon goes on re-sending the resolution to its routes (as Prometheus does to
            # Alertmanager); the webhook still hears of it once, and of the firing alert once.
            polls = value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0) >= polls + 20,
                     what="four more seconds of polls")  # fmt: skip
            degraded = [a["status"] for a in hook.alerts() if a["labels"]["alertname"] == "GpuPcieLinkDegraded"]
            assert degraded == ["firing", "resolved"]


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
            # Alertmanager logs a notification just after the webhook answered; one more send from
            # the daemon, and it has, so the restart below finds it in its notification log.
            sent = value(d.metrics(), "gpu_exporter_notifications_total", outcome="sent") or 0
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_notifications_total", outcome="sent") or 0) > sent,
                     what="one more send")  # fmt: skip
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
            assert value(d.metrics(), "gpu_exporter_notifications_total", outcome="dropped") == 0
            d.proc.send_signal(signal.SIGTERM)
            assert d.proc.wait(timeout=DAEMON_STOP_S + LATE_S) == 0


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
        outcomes = Outcomes()
        trusting = am_receiver(hook.url, outcomes, ca_file=str(ca))
        trusting.start()
        trusting.submit([alert()], T0)
        wait_for(lambda: outcomes.seen == [(receiver_origin(hook.url), "sent")],
                 what="delivery over TLS with the custom CA")  # fmt: skip
        trusting.stop()
        untrusting_outcomes = Outcomes()
        untrusting = am_receiver(hook.url, untrusting_outcomes)
        untrusting.start()
        untrusting.submit([alert()], T0)
        wait_for(lambda: untrusting_outcomes.count("retried") >= 1, what="a refused certificate")
        untrusting.stop()
        assert len(hook.requests) == 1


def test_a_hanging_receiver_blocks_neither_polls_nor_scrapes(scenario: Scenario, tmp_path: Path) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
        # A send waits NEVER_S for the answer: polls held up by it would stall for longer than the
        # wait for five more polls below (LATE_S + LATE_S).
        cfg = write_config(tmp_path / "c.yaml", {"webhooks": [{"url": url, "timeout": f"{NEVER_S:.0f}s", **PROMPT}]},
                           rules={"GpuPcieLinkDegraded": {"for": "0s"}})  # fmt: skip
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: value(d.metrics(), "gpu_exporter_notification_queue_length") == 1,
                     what="a notification stuck in delivery")  # fmt: skip
            polls = value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0) >= polls + 5,
                     timeout=LATE_S, what="polls going on")  # fmt: skip
            healthy(s)
            s.write()
            wait_for(lambda: value(d.metrics(), "gpu_exporter_alerts", alertname="GpuPcieLinkDegraded") is None,
                     what="the rule engine moving on")  # fmt: skip


def test_receivers_from_flags(scenario: Scenario, tmp_path: Path) -> None:
    s = preset("pcie-degraded", scenario.path)
    s.write()
    with webhook_receiver() as hook:
        cfg = write_config(tmp_path / "c.yaml", {})  # fast rules only; the receiver comes from the flag
        with run_daemon(s.path, "--config", str(cfg), "--alerting.webhook-url", hook.url, "--node.name", "n7") as d:
            # The receiver exists, with every outcome at 0, before it has sent anything.  Unnamed, it is
            # named after its URL's scheme, host and port: a webhook's path may be its secret.
            name = receiver_origin(hook.url)
            assert name == f"http://127.0.0.1:{hook.port}" and hook.url.endswith("/hook")
            m = d.metrics()
            assert [value(m, "gpu_exporter_notifications_total", receiver=name, outcome=o)
                    for o in ("sent", "retried", "rejected", "dropped")] == [0, 0, 0, 0]  # fmt: skip
            # A flag's webhook routes with Alertmanager's defaults: the new group waits 30 s.
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_notification_queue_length", receiver=name)
                              or 0) >= 1, what="the alert waiting in its group")  # fmt: skip
            assert hook.requests == []
            raw = http_get(d.url + "/api/v1/alerts")[2]
            assert {a["labels"]["node"] for a in json.loads(raw)["data"]["alerts"]} == {"n7"}
