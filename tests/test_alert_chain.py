"""The whole alerting chain against a real Alertmanager 0.25: the daemon on the fake NVML, a real
Alertmanager, recording webhooks behind it and beside it, a fake kubelet and receivers that speak
garbage.  Each test is one way an operator could be told something wrong.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerting_helpers import Alertmanager, WebhookReceiver, alertmanager, raw_receiver, webhook_receiver
from tests.exporter_helpers import RunningDaemon, http_get, run_daemon, value, wait_for
from tests.fake_kubelet import fake_kubelet, pod
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm
from tests.prometheus_helpers import prometheus
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration

GIB = 1024**3
TOTAL = 81559 * 1024**2
GARBAGE = ["not-http", "truncated", "hang-up", "long-header", "bad-status"]


def node(path: Path, gpus: int = 3) -> Scenario:
    s = Scenario(path)
    for i in range(gpus):
        g = h100_sxm(s.add_gpu(), "chain", i, util=90, mem_used=40 * GIB, power_mw=400_000)
        g.add_process(50_000 + i, 39 * GIB, name="python3")
    s.write()
    return s


def memory(s: Scenario, gpu: int, ratio: float) -> None:
    s.gpu(gpu).memory(TOTAL, int(ratio * TOTAL), reserved=0)
    s.write()


def config(path: Path, alerting: dict[str, Any], **extra: Any) -> Path:
    rules = {"GpuMemoryHigh": {"for": "0s"}, "GpuPcieLinkDegraded": {"for": "0s"}, "GpuLost": {"for": "0s"}}
    path.write_text(yaml.safe_dump({"node_name": "n1", "rules": rules,
                                    "alerting": {"resend_interval": "1s", **alerting}, **extra}))  # fmt: skip
    return path


def statuses(hook: WebhookReceiver, alertname: str, **labels: str) -> list[str]:
    return [a["status"] for a in hook.alerts()
            if a["labels"]["alertname"] == alertname and labels.items() <= a["labels"].items()]  # fmt: skip


def counter(d: RunningDaemon, outcome: str) -> float:
    return value(d.metrics(), "gpu_exporter_notifications_total", outcome=outcome) or 0


def polls(d: RunningDaemon) -> float:
    return value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0


def wait_polls(d: RunningDaemon, n: int) -> None:
    """Until the daemon has polled ``n`` more times (and evaluated and re-sent its alerts as often)."""
    start = polls(d)
    wait_for(lambda: polls(d) >= start + n, timeout=30 + n, what=f"{n} more polls")


def am_alerts(am: Alertmanager) -> list[dict[str, Any]]:
    with urllib.request.urlopen(am.url + "/api/v2/alerts", timeout=NEVER_S) as r:
        alerts: list[dict[str, Any]] = json.loads(r.read())
        return alerts


# -- 1. an Alertmanager outage longer than 4 resend intervals ---------------------------------------
def test_an_outage_longer_than_four_resend_intervals_gives_no_false_resolution(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    with webhook_receiver() as hook, alertmanager(hook.url, tmp_path / "am") as am:
        cfg = config(tmp_path / "c.yaml", {"alertmanagers": [{"url": am.url}]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: value(d.metrics(), "gpu_up", gpu="2") == 1, what="GPU 2 read once")
            s.gpu(2).lost()
            memory(s, 1, 0.95)
            wait_for(lambda: statuses(hook, "GpuLost", gpu="2") == ["firing"]
                     and statuses(hook, "GpuMemoryHigh", gpu="1") == ["firing"], what="both alerts firing")  # fmt: skip
            # Alertmanager logs a notification just after the webhook answered; after one more
            # send it has, so its notification log (kept in --storage.path) knows of both.
            sent = counter(d, "sent")
            wait_for(lambda: counter(d, "sent") > sent, what="one more send")
            am.stop()
            stopped = time.monotonic()
            memory(s, 1, 0.5)  # GPU 1's alert resolves during the outage; GPU 2 stays lost
            retried = counter(d, "retried")
            # 10 s down: more than 4 x resend_interval (1 s), so every endsAt sent before is past.
            wait_for(lambda: time.monotonic() - stopped > 10, timeout=20, what="the outage")
            assert counter(d, "retried") > retried
            # Held per alert, not per resend: 2 alerts, whatever the length of the outage.
            assert value(d.metrics(), "gpu_exporter_notification_queue_length") == 2
            am.start()  # on the same --storage.path
            wait_for(lambda: statuses(hook, "GpuMemoryHigh", gpu="1") == ["firing", "resolved"], timeout=45,
                     what="the outage's resolution")  # fmt: skip
            restarted_sent = counter(d, "sent")
            # A false resolution came about 3 s after the restart; watch for 5 more sends.
            wait_for(lambda: counter(d, "sent") >= restarted_sent + 5, timeout=30, what="five sends after the restart")
            assert statuses(hook, "GpuLost", gpu="2") == ["firing"], "no false all-clear, no re-fire"
            assert statuses(hook, "GpuMemoryHigh", gpu="1") == ["firing", "resolved"], "the resolution, once"
            (lost,) = [a for a in am_alerts(am) if a["labels"]["alertname"] == "GpuLost"]
            assert lost["status"]["state"] == "active"
            assert datetime.fromisoformat(lost["endsAt"]).timestamp() > time.time()


# -- 2. a kubelet restart during a firing alert -------------------------------------------------------
def test_a_kubelet_restart_during_a_firing_alert_gives_no_resolution_and_no_refire(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    memory(s, 0, 0.95)
    uuid0 = str(s.gpu(0).values["uuid"])
    with fake_kubelet(tmp_path) as kubelet, webhook_receiver() as hook, alertmanager(hook.url, tmp_path / "am") as am:
        kubelet.pods = [pod("ml", "train-a", ("main", "nvidia.com/gpu", [uuid0]))]
        k8s = {"pod_attribution": "on", "pod_resources_socket": str(kubelet.socket_path),
               "refresh_interval": "200ms", "timeout": "500ms"}  # fmt: skip
        cfg = config(tmp_path / "c.yaml", {"alertmanagers": [{"url": am.url}]}, kubernetes=k8s)
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            refreshes = {o: value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome=o)
                         for o in ("ok", "error", "missing")}  # fmt: skip
            assert refreshes["error"] == 0 and refreshes["missing"] == 0, "every outcome exists from the start"
            wait_for(lambda: statuses(hook, "GpuMemoryHigh", pod="train-a") == ["firing"], what="firing with its pod")

            def refreshed(outcome: str) -> float:
                return value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome=outcome) or 0

            kubelet.stop()  # the kubelet restarts: its socket goes away ...
            wait_for(lambda: refreshed("missing") >= 10, what="two seconds without a socket")
            assert value(d.metrics(), "gpu_up", gpu="0", pod="train-a") == 1, "series keep their labels"
            kubelet.fail = True
            kubelet.start()  # ... comes back, and fails for a while before it answers
            wait_for(lambda: refreshed("error") >= 10, what="two seconds of errors")
            kubelet.fail = False
            ok = refreshed("ok")
            wait_for(lambda: refreshed("ok") > ok, what="the kubelet answering again")
            sent = counter(d, "sent")
            wait_for(lambda: counter(d, "sent") >= sent + 3, what="three more sends")
            assert statuses(hook, "GpuMemoryHigh") == ["firing"]
            alerts = json.loads(http_get(d.url + "/api/v1/alerts")[2])["data"]["alerts"]
            assert [a["labels"]["pod"] for a in alerts if a["labels"]["alertname"] == "GpuMemoryHigh"] == ["train-a"]
            memory(s, 0, 0.5)
            wait_for(lambda: statuses(hook, "GpuMemoryHigh", pod="train-a") == ["firing", "resolved"], timeout=30,
                     what="the real resolution")  # fmt: skip
            assert statuses(hook, "GpuMemoryHigh") == ["firing", "resolved"]
            assert value(d.metrics(), "gpu_exporter_pod_attribution_expired_total") == 0


# -- 3. a receiver that speaks garbage, then answers properly -----------------------------------------
def test_garbage_in_front_of_alertmanager_is_counted_retried_and_survived(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    with webhook_receiver() as hook, alertmanager(hook.url, tmp_path / "am") as am, \
            raw_receiver(GARBAGE, then="proxy", upstream=am.url) as front:  # fmt: skip
        cfg = config(tmp_path / "c.yaml", {"alertmanagers": [{"url": f"http://127.0.0.1:{front.port}", "name": "am"}]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            memory(s, 0, 0.95)
            wait_for(
                lambda: statuses(hook, "GpuMemoryHigh") == ["firing"], timeout=60, what="the alert, past the garbage"
            )
            assert front.replies[: len(GARBAGE)] == GARBAGE
            assert value(d.metrics(), "gpu_exporter_notifications_total", receiver="am", outcome="retried") == len(
                GARBAGE
            )
            # The delivery thread lives on: the resolution follows.
            memory(s, 0, 0.5)
            wait_for(lambda: statuses(hook, "GpuMemoryHigh") == ["firing", "resolved"], timeout=30,
                     what="the resolution")  # fmt: skip
            assert not [e for e in d.log if "Traceback" in json.dumps(e)]


# -- 5. empty label values -------------------------------------------------------------------------------
def test_a_gpu_lost_before_its_uuid_was_read_is_sent_without_a_uuid_label_everywhere(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn", gpus=2)
    s.gpu(1).lost()  # before the daemon starts: its UUID is never read
    s.write()
    with webhook_receiver() as via_am, webhook_receiver() as direct, alertmanager(via_am.url, tmp_path / "am") as am:
        prompt = {"url": direct.url, "group_wait": "0s", "group_interval": "1s"}
        cfg = config(tmp_path / "c.yaml", {"alertmanagers": [{"url": am.url}], "webhooks": [prompt]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: statuses(via_am, "GpuLost") == ["firing"] and statuses(direct, "GpuLost") == ["firing"],
                     what="GpuLost at both webhooks")  # fmt: skip
            (a,) = via_am.alerts()
            (b,) = direct.alerts()
            want = {"alertname": "GpuLost", "severity": "critical", "gpu": "1", "node": "n1"}
            assert a["labels"] == b["labels"] == want
            assert a["fingerprint"] == b["fingerprint"], "one alert, one fingerprint, via Alertmanager or not"
            (stored,) = am_alerts(am)
            assert stored["fingerprint"] == b["fingerprint"]
            listed = json.loads(http_get(d.url + "/api/v1/alerts")[2])["data"]["alerts"]
            assert [x["labels"] for x in listed] == [want]
            assert "uuid unknown" in b["annotations"]["description"]
            for req in direct.requests:
                for labels in (req.body["groupLabels"], req.body["commonLabels"],
                               *(x["labels"] for x in req.body["alerts"])):  # fmt: skip
                    assert all(labels.values()), labels
            assert b"(uuid unknown)" in http_get(d.url + "/alerts")[2]


# -- 6. the direct webhook side by side with a real Alertmanager ----------------------------------------
ROUTE = {"group_by": ["alertname", "node"], "group_wait": "1s", "group_interval": "2s", "repeat_interval": "1h"}


def instant(t: str) -> str:
    """An RFC 3339 time as milliseconds since the epoch (Alertmanager trims trailing zeros)."""
    if t.startswith("0001-01-01"):
        return "zero"
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?Z", t)
    assert m, t
    whole = datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
    return f"{whole:.0f}.{(m.group(2) or '0').ljust(3, '0')[:3]}"


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """A notification, less what must differ: the sender's own URL."""
    out = {k: v for k, v in body.items() if k not in ("externalURL", "alerts")}
    out["alerts"] = [{**a, "startsAt": instant(a["startsAt"]), "endsAt": instant(a["endsAt"])} for a in body["alerts"]]
    return out


def by_group(hook: WebhookReceiver) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    with hook.lock:
        for r in hook.requests:
            out.setdefault(r.body["groupKey"], []).append(comparable(r.body))
    return out


@contextmanager
def side_by_side(tmp_path: Path, s: Scenario, route: dict[str, Any]) -> Iterator[tuple[RunningDaemon, WebhookReceiver,
                                                                                     WebhookReceiver]]:  # fmt: skip
    with webhook_receiver() as via_am, webhook_receiver() as direct, \
            alertmanager(via_am.url, tmp_path / "am", route=route, receiver="ops") as am:  # fmt: skip
        webhook = {"url": direct.url, "name": "ops", **route}
        cfg = config(tmp_path / "c.yaml", {"alertmanagers": [{"url": am.url}], "webhooks": [webhook]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            yield d, via_am, direct


def test_the_direct_webhook_notifies_as_alertmanager_does(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn", gpus=2)
    with side_by_side(tmp_path, s, ROUTE) as (d, via_am, direct):

        def step(expected_total: int) -> None:
            for hook in (via_am, direct):
                wait_for(lambda h=hook: len(h.requests) >= expected_total, timeout=30,
                         what=f"{expected_total} notifications")  # fmt: skip

        memory(s, 0, 0.95)  # GpuMemoryHigh (warning) on GPU 0
        step(1)
        memory(s, 1, 0.99)  # warning and critical on GPU 1: same group
        step(2)
        s.gpu(0).pcie(gen=1, width=8)  # a second group
        s.write()
        step(3)
        memory(s, 0, 0.5)  # GPU 0's warning resolves; GPU 1's go on
        step(4)
        memory(s, 1, 0.5)
        s.gpu(0).pcie(gen=5, width=16)
        s.write()
        step(6)  # both groups resolved
        wait_polls(d, 25)  # five more seconds: nothing else may arrive on either side
        ours, theirs = by_group(direct), by_group(via_am)
        assert ours == theirs
        memory_key = '{}:{alertname="GpuMemoryHigh", node="n1"}'
        assert [[(a["labels"]["gpu"], a["labels"]["severity"], a["status"]) for a in n["alerts"]]
                for n in ours[memory_key]] == [
            [("0", "warning", "firing")],
            [("0", "warning", "firing"), ("1", "critical", "firing"), ("1", "warning", "firing")],
            [("0", "warning", "resolved"), ("1", "critical", "firing"), ("1", "warning", "firing")],
            [("0", "warning", "resolved"), ("1", "critical", "resolved"), ("1", "warning", "resolved")],
        ]  # fmt: skip
        assert [n["status"] for n in ours['{}:{alertname="GpuPcieLinkDegraded", node="n1"}']] == ["firing", "resolved"]


def test_the_direct_webhook_repeats_as_alertmanager_does(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn", gpus=1)
    route = {**ROUTE, "group_interval": "1s", "repeat_interval": "3s"}
    with side_by_side(tmp_path, s, route) as (_, via_am, direct):
        memory(s, 0, 0.95)
        for hook in (via_am, direct):
            wait_for(lambda h=hook: len(h.requests) >= 3, timeout=30, what="two repeats")
        first_three = [by_group(h)['{}:{alertname="GpuMemoryHigh", node="n1"}'][:3] for h in (direct, via_am)]
        assert first_three[0] == first_three[1]
        assert first_three[0][0] == first_three[0][1] == first_three[0][2], "a repeat is the same notification"


# -- 7. what the daemon cannot say about itself --------------------------------------------------------
def test_a_dead_daemon_reads_like_an_all_clear_and_only_the_prometheus_side_rule_says_otherwise(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn", gpus=1)
    doc = yaml.safe_load((Path(__file__).resolve().parent.parent / "alerts" / "gpu-exporter.rules.yml").read_text())
    (health,) = [g for g in doc["groups"] if g["name"] == "gpu-exporter.health"]
    for rule in health["rules"]:
        rule["for"] = "2s"
    rules = tmp_path / "health.yml"
    rules.write_text(yaml.safe_dump({"groups": [health]}))
    with webhook_receiver() as hook, alertmanager(hook.url, tmp_path / "am") as am:
        cfg = config(tmp_path / "c.yaml", {"alertmanagers": [{"url": am.url}]})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d, \
                prometheus([f"127.0.0.1:{d.port}"], tmp_path / "prom", rule_files=[rules]) as prom:  # fmt: skip
            memory(s, 0, 0.95)
            wait_for(lambda: statuses(hook, "GpuMemoryHigh") == ["firing"], what="the alert")
            wait_for(lambda: prom.targets_up(), what="the daemon scraped")
            d.proc.kill()
            # Alertmanager ends the alert 4 x resend_interval after the last send: it looks resolved.
            wait_for(lambda: statuses(hook, "GpuMemoryHigh") == ["firing", "resolved"], timeout=30,
                     what="Alertmanager expiring the alert")  # fmt: skip
            wait_for(lambda: {a["labels"]["alertname"] for a in prom.alerts() if a["state"] == "firing"}
                     >= {"GpuExporterDown"}, timeout=30, what="the Prometheus-side health rule")  # fmt: skip
