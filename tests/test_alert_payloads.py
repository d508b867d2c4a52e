"""What a receiver and the alerts page show of an alert the rules raised: its labels (pod labels
included), when it started firing, its annotations and value, in a stable order.

The alerts come from the engine on a scripted trace, so these pin the whole path from a reading to
the bytes a receiver gets, not a hand-made ``Alert``.
"""

from __future__ import annotations

import json
from typing import Any

from gpu_exporter.alerting.delivery import alertmanager_alert
from gpu_exporter.alerting.engine import FIRING, RESOLVED, Alert, RuleEngine
from gpu_exporter.alerting.routing import ZERO_TIME, Route, rfc3339
from gpu_exporter.alerting.settings import WebhookSettings
from gpu_exporter.serving.alerts_page import alerts_html, alerts_json
from gpu_exporter.snapshot import GpuReading, PodRef
from tests import assert_mentions
from tests.test_rules import GIB, T0, fast_rules, gpu, snap

FULL = int(0.95 * 80 * GIB)
TRAIN = (PodRef("ml", "train-0", "main"),)
URL = "http://node-a:9445/alerts"


def engine(**rules: dict[str, Any]) -> RuleEngine:
    return RuleEngine(fast_rules(**rules), "node-a", resend_interval=3600, pod_labels=("namespace", "pod", "container"))


def memory_alert_sent_at(e: RuleEngine, t: float, **kw: Any) -> list[Alert]:
    sent = e.evaluate(snap(T0 + t, gpu(memory_used_bytes=FULL, **kw))).to_send
    return [a for a in sent if a.label_dict["alertname"] == "GpuMemoryHigh"]


def test_alertmanager_gets_pod_labels_annotations_and_the_time_the_alert_fired() -> None:
    e = engine(GpuMemoryHigh={"for": "60s"})
    for t in range(0, 60, 15):
        assert memory_alert_sent_at(e, t, pods=TRAIN) == []  # pending
    (fired,) = memory_alert_sent_at(e, 60, pods=TRAIN)
    now = T0 + 61
    assert alertmanager_alert(fired, now, 240.0, URL) == {
        "labels": {"alertname": "GpuMemoryHigh", "severity": "warning", "gpu": "0", "uuid": "GPU-0", "node": "node-a",
                   "namespace": "ml", "pod": "train-0", "container": "main"},
        "annotations": {"summary": "GPU 0 (NVIDIA H100 80GB HBM3) memory is 95% full",
                        "description": "76.0 of 80.0 GiB used (95%); threshold 90%."},
        "startsAt": rfc3339(T0 + 60),  # when it fired, as Prometheus sends it, not when it became pending
        "endsAt": rfc3339(now + 240.0),
        "generatorURL": URL,
    }  # fmt: skip
    (resolved,) = [a for a in e.evaluate(snap(T0 + 75, gpu(pods=TRAIN))).to_send if a.state == RESOLVED]
    doc = alertmanager_alert(resolved, T0 + 80, 240.0, URL)
    assert (doc["startsAt"], doc["endsAt"]) == (rfc3339(T0 + 60), rfc3339(T0 + 75))
    assert doc["labels"]["pod"] == "train-0"


def test_a_gpu_shared_by_several_pods_names_them_all_and_one_without_pods_has_no_pod_labels() -> None:
    e = engine(GpuMemoryHigh={"for": "0s"})
    shared = (PodRef("ml", "b", "main"), PodRef("ml", "a", "main"), PodRef("ci", "c", "test"))
    (a,) = memory_alert_sent_at(e, 0, pods=shared)
    assert {k: a.label_dict[k] for k in ("namespace", "pod", "container")} == {
        "namespace": "ci,ml", "pod": "c,a,b", "container": "test,main"}  # fmt: skip
    plain = RuleEngine(fast_rules(GpuMemoryHigh={"for": "0s"}), "node-a")  # pod labels switched off
    sent = plain.evaluate(snap(T0, gpu(memory_used_bytes=FULL, pods=shared))).to_send
    assert {"namespace", "pod", "container"}.isdisjoint(sent[0].label_dict)
    (unheld,) = memory_alert_sent_at(engine(GpuMemoryHigh={"for": "0s"}), 0)
    assert {"namespace", "pod", "container"}.isdisjoint(unheld.label_dict)


def test_a_direct_webhook_gets_the_same_alert_in_alertmanagers_webhook_format() -> None:
    e = engine(GpuMemoryHigh={"for": "30s"})
    memory_alert_sent_at(e, 0, pods=TRAIN)
    memory_alert_sent_at(e, 15, pods=TRAIN)
    (fired,) = memory_alert_sent_at(e, 30, pods=TRAIN)
    r = Route(WebhookSettings(url="http://hook.example/", name="ops", group_wait=0))
    r.insert([fired], T0 + 30)
    (n,) = r.due(T0 + 30)
    doc = r.payload(n, external_url="http://node-a:9445", generator_url=URL)
    assert doc is not None
    (item,) = doc["alerts"]
    assert item["labels"] == alertmanager_alert(fired, T0 + 30, 1.0, URL)["labels"]
    assert_mentions(item["annotations"]["summary"], "GPU 0", "NVIDIA H100 80GB HBM3", "memory", "95% full")
    assert (item["status"], item["startsAt"], item["endsAt"]) == (FIRING, rfc3339(T0 + 30), ZERO_TIME)
    assert doc["commonLabels"]["pod"] == "train-0" and doc["groupLabels"] == {"alertname": "GpuMemoryHigh",
                                                                              "node": "node-a"}  # fmt: skip


def test_the_alerts_page_lists_alerts_in_a_stable_order_with_state_start_and_value() -> None:
    e = engine(GpuMemoryHigh={"for": "0s"}, GpuLost={"for": "60s"})
    readings = [GpuReading(index=2, uuid="GPU-2", up=False, error="lost"), gpu(index=1, uuid="GPU-1",
                memory_used_bytes=int(0.99 * 80 * GIB)), gpu(memory_used_bytes=FULL)]  # fmt: skip
    e.evaluate(snap(T0, *readings))
    e.evaluate(snap(T0 + 15, *reversed(readings)))  # the order GPUs come in does not matter
    page = json.loads(alerts_json(e.active()))["data"]["alerts"]
    shown = [(a["labels"]["alertname"], a["labels"]["gpu"], a["labels"]["severity"], a["state"], a["activeAt"],
              a["value"]) for a in page]  # fmt: skip
    assert shown == [
        ("GpuLost", "2", "critical", "pending", rfc3339(T0), "0"),
        ("GpuMemoryHigh", "0", "warning", "firing", rfc3339(T0), "0.95"),
        ("GpuMemoryHigh", "1", "critical", "firing", rfc3339(T0), "0.99"),
        ("GpuMemoryHigh", "1", "warning", "firing", rfc3339(T0), "0.99"),
    ]
    html = alerts_html(e.active()).decode()
    assert html.index("GPU-2") < html.index("GPU-0") < html.index("GPU-1")
