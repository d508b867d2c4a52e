"""A webhook fed directly is routed as an Alertmanager route would route it.

The route is pure state driven with made-up times here; the side-by-side test at the end feeds the
same alert sequence to a real Alertmanager 0.25 with the same route and to the direct webhook,
and compares what the two recorded.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_exporter.alerting.engine import FIRING, RESOLVED, Alert, sendable
from gpu_exporter.alerting.routing import LOG_RETENTION_S, Notification, Route, go_quote, group_key, label_set_string
from gpu_exporter.alerting.settings import WebhookSettings

T0 = 1_800_000_000.0


def alert(name: str = "GpuLost", gpu: str = "0", node: str = "n1", state: str = FIRING, at: float = T0,
          resolved_at: float | None = None, severity: str = "critical", **extra: str) -> Alert:  # fmt: skip
    labels = sendable({"alertname": name, "severity": severity, "gpu": gpu, "node": node, **extra})
    return Alert(labels, (("summary", f"{name} {gpu}"),), state, active_at=at, fired_at=at, resolved_at=resolved_at)


def route(**settings: Any) -> Route:
    base: dict[str, Any] = {"url": "http://h/", "name": "ops", "group_wait": 30, "group_interval": 300,
                            "repeat_interval": 4 * 3600}  # fmt: skip
    return Route(WebhookSettings(**{**base, **settings}))


def deliver(r: Route, now: float) -> list[dict[str, Any]]:
    """Everything due at ``now``, delivered: the payloads sent."""
    out = []
    for n in r.due(now):
        doc = r.payload(n, external_url="http://n1:9445", generator_url="http://n1:9445/alerts")
        r.delivered(n, now)
        if doc is not None:
            out.append(doc)
    return out


def summary(doc: dict[str, Any]) -> tuple[str, str, list[tuple[str, str]]]:
    return doc["groupKey"], doc["status"], [(a["labels"]["gpu"], a["status"]) for a in doc["alerts"]]


def test_group_key_is_alertmanagers() -> None:
    assert group_key({"alertname": "GpuLost", "node": "n1"}) == '{}:{alertname="GpuLost", node="n1"}'
    assert group_key({}) == "{}:{}"
    assert label_set_string({"b": 'say "hi"\n', "a": "ü\\"}) == '{a="ü\\\\", b="say \\"hi\\"\\n"}'
    assert go_quote("\x07\x01\x7f") == '"\\a\\x01\\x7f"'


def test_new_group_waits_group_wait_and_collects_what_comes_meanwhile() -> None:
    r = route()
    r.insert([alert(gpu="0")], T0)
    assert r.next_due() == T0 + 30
    assert deliver(r, T0 + 29) == []
    r.insert([alert(gpu="1", at=T0 + 10)], T0 + 10)
    (doc,) = deliver(r, T0 + 30)
    assert summary(doc) == ('{}:{alertname="GpuLost", node="n1"}', "firing", [("0", "firing"), ("1", "firing")])
    assert doc["groupLabels"] == {"alertname": "GpuLost", "node": "n1"}
    assert doc["commonLabels"] == {"alertname": "GpuLost", "severity": "critical", "node": "n1"}
    assert doc["receiver"] == "ops" and doc["version"] == "4" and doc["truncatedAlerts"] == 0
    assert [a["endsAt"] for a in doc["alerts"]] == ["0001-01-01T00:00:00Z"] * 2


def test_an_alert_that_started_before_group_wait_is_flushed_at_once() -> None:
    r = route()
    r.insert([alert(at=T0 - 60)], T0)
    assert r.next_due() == T0
    assert len(deliver(r, T0)) == 1


def test_groups_by_alertname_and_node_and_leave_out_missing_labels() -> None:
    r = route(group_wait=0)
    r.insert([alert("GpuLost", "0"), alert("GpuLost", "1", node="n2"), alert("GpuMemoryHigh", "0"),
              Alert(sendable({"alertname": "NoNode"}), (), FIRING, T0, T0)], T0)  # fmt: skip
    keys = sorted(doc["groupKey"] for doc in deliver(r, T0))
    assert keys == ['{}:{alertname="GpuLost", node="n1"}', '{}:{alertname="GpuLost", node="n2"}',
                    '{}:{alertname="GpuMemoryHigh", node="n1"}', '{}:{alertname="NoNode"}']  # fmt: skip
    everything = route(group_wait=0, group_by=["..."])
    everything.insert([alert("GpuLost", "0"), alert("GpuLost", "1")], T0)
    assert len(deliver(everything, T0)) == 2


def test_a_change_waits_for_the_next_group_interval_and_nothing_is_repeated_before_repeat_interval() -> None:
    r = route(group_wait=0, group_interval=300, repeat_interval=3600)
    r.insert([alert(gpu="0")], T0)
    assert len(deliver(r, T0)) == 1
    for t in range(60, 3601, 60):  # the daemon re-sends the firing alert every minute: no news
        r.insert([alert(gpu="0")], T0 + t)
        assert deliver(r, T0 + t) == [], t
    r.insert([alert(gpu="1", at=T0 + 3610)], T0 + 3610)
    assert r.next_due() == T0 + 3900, "the group's tick, not group_wait"
    (doc,) = deliver(r, T0 + 3900)
    assert summary(doc)[2] == [("0", "firing"), ("1", "firing")]
    assert deliver(r, T0 + 3900 + 3300) == []
    assert deliver(r, T0 + 3900 + 3600) == []  # exactly repeat_interval later: not yet, as in Alertmanager
    assert deliver(r, T0 + 3900 + 3601) == []  # between ticks
    (repeat,) = deliver(r, T0 + 3900 + 3900)  # the first tick after repeat_interval
    assert summary(repeat) == summary(doc)


def test_a_resolution_is_sent_once_though_the_daemon_resends_it() -> None:
    r = route(group_wait=0, group_interval=60)
    r.insert([alert(gpu="0"), alert(gpu="1")], T0)
    deliver(r, T0)
    gone = alert(gpu="1", state=RESOLVED, resolved_at=T0 + 100)
    r.insert([alert(gpu="0"), gone], T0 + 100)
    (doc,) = deliver(r, T0 + 120)
    assert summary(doc)[1:] == ("firing", [("0", "firing"), ("1", "resolved")])
    assert doc["alerts"][1]["endsAt"] == "2027-01-15T08:01:40.000Z"
    for t in range(180, 900, 60):  # Prometheus-style re-sends of the resolution for 15 min
        r.insert([alert(gpu="0"), gone], T0 + t)
        assert deliver(r, T0 + t) == [], t
    # All resolved: one last notification, then the group is gone.
    r.insert([alert(gpu="0", state=RESOLVED, resolved_at=T0 + 900)], T0 + 900)
    (last,) = deliver(r, T0 + 960)
    assert summary(last)[1:] == ("resolved", [("0", "resolved")])
    assert r.groups == {}
    r.insert([alert(gpu="0", state=RESOLVED, resolved_at=T0 + 900)], T0 + 1000)  # re-sent once more
    assert deliver(r, T0 + 1000) == [] and r.groups == {}


def test_a_failed_resolution_is_retried_until_it_is_delivered() -> None:
    r = route(group_wait=0, group_interval=60)
    r.insert([alert()], T0)
    deliver(r, T0)
    r.insert([alert(state=RESOLVED, resolved_at=T0 + 10)], T0 + 10)
    for attempt, t in enumerate((60, 61, 63, 67, 75)):  # the receiver is down: backing off
        (n,) = r.due(T0 + t)
        assert [a.state for a in n.alerts] == [RESOLVED], attempt
        r.failed(n, retry_at=T0 + t + 2**attempt)
        assert r.next_due() == T0 + t + 2**attempt
    (n,) = r.due(T0 + 91)
    r.delivered(n, T0 + 91)
    assert r.groups == {} and r.due(T0 + 500) == []


def test_without_send_resolved_only_firing_alerts_are_sent() -> None:
    r = route(group_wait=0, group_interval=60, send_resolved=False)
    r.insert([alert(gpu="0"), alert(gpu="1")], T0)
    deliver(r, T0)
    r.insert([alert(gpu="1", state=RESOLVED, resolved_at=T0 + 10)], T0 + 10)
    assert deliver(r, T0 + 60) == [], "a partial resolution is no news without send_resolved"
    r.insert([alert(gpu="0", state=RESOLVED, resolved_at=T0 + 70)], T0 + 70)
    assert deliver(r, T0 + 120) == [], "nor is the last one; the log forgets the group all the same"
    assert r.log['{}:{alertname="GpuLost", node="n1"}'].firing == frozenset()
    r.insert([alert(gpu="0", at=T0 + 130)], T0 + 130)
    (doc,) = deliver(r, T0 + 130)
    assert summary(doc)[2] == [("0", "firing")]


def test_alerts_come_in_alertmanagers_order() -> None:
    r = route(group_wait=0, group_by=["alertname"])
    r.insert([alert(gpu="10"), alert(gpu="9"), alert(gpu="1", instance="b:9445"), alert(gpu="2", instance="a:9445"),
              alert(gpu="3", job="x", extra="1"), alert(gpu="0", severity="warning")], T0)  # fmt: skip
    (doc,) = deliver(r, T0)
    # job first, then instance; then fewer labels first; then by the first differing label value.
    assert [a["labels"]["gpu"] for a in doc["alerts"]] == ["3", "2", "1", "0", "10", "9"]


def test_a_delivery_does_not_hide_a_change_that_came_in_while_it_was_sent() -> None:
    r = route(group_wait=0, group_interval=60)
    r.insert([alert(gpu="0")], T0)
    (n,) = r.due(T0)
    assert isinstance(n, Notification)
    r.insert([alert(gpu="1", at=T0 + 1)], T0 + 1)  # arrives while the request is in flight
    r.delivered(n, T0 + 2)
    assert r.waiting() == 2
    (doc,) = deliver(r, T0 + 60)
    assert summary(doc)[2] == [("0", "firing"), ("1", "firing")]
    assert r.waiting() == 0


@pytest.mark.parametrize("by", [["alertname"], ["alertname", "node", "gpu"], ["..."]])
def test_every_alert_is_in_exactly_one_group(by: list[str]) -> None:
    r = route(group_wait=0, group_by=by)
    alerts = [alert(name, gpu, node) for name in ("A", "B") for gpu in "01" for node in ("n1", "n2")]
    r.insert(alerts, T0)
    docs = deliver(r, T0)
    sent = sorted(tuple(sorted(a["labels"].items())) for d in docs for a in d["alerts"])
    assert sent == sorted(a.labels for a in alerts)


def test_an_alert_that_fired_and_resolved_within_group_wait_is_never_notified() -> None:
    r = route(group_wait=30)
    r.insert([alert()], T0)
    r.insert([alert(state=RESOLVED, resolved_at=T0 + 10)], T0 + 10)
    assert deliver(r, T0 + 30) == [], "nobody heard of it firing: its resolution is no news"
    assert r.groups == {}


def test_after_the_first_flush_an_old_alert_waits_for_the_tick() -> None:
    r = route(group_wait=30, group_interval=300)
    r.insert([alert(gpu="0")], T0)
    deliver(r, T0 + 30)
    # An alert that fired long ago (a new label set of an old alert) joins the group.
    r.insert([alert(gpu="1", at=T0 - 3600)], T0 + 40)
    assert r.next_due() == T0 + 330
    assert deliver(r, T0 + 40) == []


def test_fewer_labels_sort_first() -> None:
    r = route(group_wait=0, group_by=["alertname"])
    r.insert([alert(gpu="0", extra="x"), alert(gpu="1")], T0)
    (doc,) = deliver(r, T0)
    assert [a["labels"]["gpu"] for a in doc["alerts"]] == ["1", "0"]


# -- what the mutation run found unguarded -----------------------------------------------------------
def test_the_whole_webhook_body_is_alertmanagers() -> None:
    r = route(group_wait=0, group_interval=60)
    firing = Alert(
        sendable({"alertname": "GpuLost", "severity": "critical", "gpu": "0", "node": "n1"}),
        (("description", "gone"), ("summary", "GpuLost 0")),
        FIRING,
        active_at=T0 - 30,
        fired_at=T0,
    )
    r.insert([firing, alert(gpu="1", state=RESOLVED, resolved_at=T0 + 5)], T0 + 5)  # fmt: skip
    (doc,) = deliver(r, T0 + 5)
    common = {"alertname": "GpuLost", "node": "n1", "severity": "critical"}
    assert doc == {
        "receiver": "ops", "status": "firing",
        "alerts": [
            {"status": "firing", "labels": {**common, "gpu": "0"},
             "annotations": {"description": "gone", "summary": "GpuLost 0"}, "startsAt": "2027-01-15T08:00:00.000Z",
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://n1:9445/alerts",
             "fingerprint": firing.fingerprint},
            {"status": "resolved", "labels": {**common, "gpu": "1"}, "annotations": {"summary": "GpuLost 1"},
             "startsAt": "2027-01-15T08:00:00.000Z", "endsAt": "2027-01-15T08:00:05.000Z",
             "generatorURL": "http://n1:9445/alerts", "fingerprint": alert(gpu="1").fingerprint},
        ],
        "groupLabels": {"alertname": "GpuLost", "node": "n1"}, "commonLabels": common,
        "commonAnnotations": {}, "externalURL": "http://n1:9445", "version": "4",
        "groupKey": '{}:{alertname="GpuLost", node="n1"}', "truncatedAlerts": 0,
    }  # fmt: skip


def test_common_annotations_are_those_every_alert_shares() -> None:
    r = route(group_wait=0)
    shared = (("runbook_url", "https://runbooks/gpu"),)
    one = Alert(sendable({"alertname": "A", "node": "n1", "gpu": "0"}), (*shared, ("summary", "0")), FIRING, T0, T0)
    two = Alert(sendable({"alertname": "A", "node": "n1", "gpu": "1"}), (*shared, ("summary", "1")), FIRING, T0, T0)
    r.insert([one, two], T0)
    (doc,) = deliver(r, T0)
    assert doc["commonAnnotations"] == {"runbook_url": "https://runbooks/gpu"}


def test_non_printable_label_values_are_quoted_as_go_quotes_them_in_the_group_key() -> None:
    # Go's strconv.Quote: \u for the Basic Multilingual Plane, \U beyond it.
    assert go_quote("\u00a0\uffff") == '"\\u00a0\\uffff"'
    assert go_quote("\U000e0001") == '"\\U000e0001"'
    assert go_quote("\U00010000é") == '"\U00010000é"'  # printable beyond the BMP stays as it is


def test_equal_sized_label_sets_order_as_prometheus_label_set_before() -> None:
    # LabelSet.Before walks the union of both sets' names in order: the first name only one set
    # has puts the set *without* it first.
    with_a, with_b = alert(gpu="0", a_extra="x"), alert(gpu="0", b_extra="x")
    for given in ([with_a, with_b], [with_b, with_a]):
        r = route(group_wait=0, group_by=["alertname"])
        r.insert(given, T0)
        (doc,) = deliver(r, T0)
        assert [next(k for k in a["labels"] if k.endswith("_extra")) for a in doc["alerts"]] == ["b_extra", "a_extra"]


def test_only_a_new_state_counts_as_waiting_not_the_same_state_sent_again() -> None:
    r = route(group_wait=0, group_interval=60)
    r.insert([alert(gpu="0")], T0)
    deliver(r, T0)
    r.insert([alert(gpu="0")], T0 + 15)  # the daemon's resend: nothing new
    assert r.waiting() == 0
    r.insert([alert(gpu="0", state=RESOLVED, resolved_at=T0 + 20)], T0 + 20)  # same start, new state
    assert r.waiting() == 1
    deliver(r, T0 + 60)
    assert r.waiting() == 0


def test_a_group_with_no_news_at_its_tick_has_nothing_waiting() -> None:
    r = route(group_wait=0, group_interval=300)
    r.insert([alert()], T0)
    deliver(r, T0)
    # It resolves and fires again between two ticks: Alertmanager sees the same firing alert.
    r.insert([alert(state=RESOLVED, resolved_at=T0 + 10)], T0 + 10)
    r.insert([alert(at=T0 + 20)], T0 + 20)
    assert r.waiting() == 1
    assert deliver(r, T0 + 300) == []
    assert r.waiting() == 0


def test_an_alert_exactly_group_wait_old_waits_for_group_wait() -> None:
    # Alertmanager flushes at once only an alert that started *before* now - group_wait.
    r = route(group_wait=30)
    r.insert([alert(at=T0 - 30)], T0)
    assert r.next_due() == T0 + 30
    r2 = route(group_wait=30)
    r2.insert([alert(at=T0 - 30.001)], T0)
    assert r2.next_due() == T0


def test_a_group_not_yet_due_does_not_hold_back_one_that_is() -> None:
    r = route(group_wait=30, group_by=["alertname"])
    r.insert([alert("A")], T0)
    r.insert([alert("B", at=T0 - 3600)], T0 + 1)  # started long ago: due at once
    assert [d["groupLabels"] for d in deliver(r, T0 + 1)] == [{"alertname": "B"}]


def test_the_notification_log_forgets_a_gone_group_after_the_retention_only() -> None:
    r = route(group_wait=0, group_interval=60)
    r.insert([alert()], T0)
    deliver(r, T0)
    r.insert([alert(state=RESOLVED, resolved_at=T0 + 10)], T0 + 10)
    deliver(r, T0 + 60)
    assert r.groups == {} and list(r.log) == ['{}:{alertname="GpuLost", node="n1"}']
    r.insert([alert("Other")], T0 + 60 + LOG_RETENTION_S)  # something else keeps the route ticking
    deliver(r, T0 + 61 + LOG_RETENTION_S)
    assert list(r.log) == ['{}:{alertname="Other", node="n1"}']


# -- groups on their own schedules, with places for requests -------------------------------------------
def test_a_group_with_a_notification_in_flight_waits_for_its_outcome() -> None:
    r = route(group_wait=0, group_interval=60)
    r.insert([alert()], T0)
    deliver(r, T0)
    r.insert([alert(gpu="1", at=T0 + 10)], T0 + 10)
    (n,) = r.due(T0 + 60)
    r.insert([alert(state=RESOLVED, resolved_at=T0 + 70)], T0 + 70)
    assert r.next_due() is None and r.due(T0 + 130) == [], "the resolution waits for the firing's outcome"
    r.failed(n, retry_at=T0 + 131)
    assert r.next_due() == T0 + 120, "the tick passed during the flight: due again at once"
    (both,) = r.due(T0 + 131)
    assert [(a.label_dict["gpu"], a.state) for a in both.alerts] == [("0", RESOLVED), ("1", FIRING)]
    r.rejected(both)
    assert r.next_due() == T0 + 191, "after a rejection, the group's next tick"


def test_with_free_places_criticals_go_first_and_the_reserved_place_is_theirs() -> None:
    r = route(group_wait=0, group_by=["alertname", "gpu"])
    r.insert([alert("GpuMemoryHigh", gpu=str(g), severity="warning", at=T0 - 10 + g) for g in range(4)], T0)
    r.insert([alert("GpuLost", gpu="9")], T0 + 5)  # due after the warnings, goes before them
    r.insert([alert("GpuLost", gpu="8", state=RESOLVED, resolved_at=T0)], T0 + 5)  # not firing: no priority
    assert r.next_due(free=1, reserved=1) == T0 + 5, "only the critical group may take the reserved place"
    assert r.next_due(free=0) is None
    (first,) = r.due(T0 + 5, free=1, reserved=1)
    assert first.group.labels["alertname"] == "GpuLost"
    assert r.next_due(free=1, reserved=1) is None, "no warning takes the reserved place"
    two = r.due(T0 + 5, free=3, reserved=1)
    assert [n.group.labels["gpu"] for n in two] == ["0", "1"], "the longest due first, one place left"
    assert r.next_due(free=2, reserved=1) == T0, "the warnings left wait, due as they were"
    assert [n.group.labels["gpu"] for n in r.due(T0 + 6)] == ["2", "3"]


def test_a_group_that_needs_nothing_moves_on_without_a_place() -> None:
    """A tick with nothing to send takes no place: its resolutions are dropped all the same."""
    r = route(group_wait=0, group_interval=60, send_resolved=False)
    r.insert([alert()], T0)
    (n,) = r.due(T0)
    r.delivered(n, T0)
    r.insert([alert(gpu="1", severity="warning"), alert(state=RESOLVED, resolved_at=T0 + 1)], T0 + 1)
    assert r.due(T0 + 60, free=0) == [] and r.next_due() == T0 + 60


def test_a_firing_critical_group_goes_before_warnings_due_earlier() -> None:
    r = route(group_wait=0, group_by=["alertname", "gpu"])
    r.insert([alert("GpuMemoryHigh", gpu="0", severity="warning")], T0)
    r.insert([alert("GpuMemoryHigh", gpu="1", severity="critical")], T0 + 1)
    r.insert([alert("GpuMemoryHigh", gpu="2", severity="warning")], T0 + 2)
    r.insert([alert("GpuLost", gpu="3")], T0 + 3)
    assert [n.group.labels["gpu"] for n in r.due(T0 + 3, free=3)] == ["1", "3", "0"]
