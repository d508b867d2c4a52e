"""A webhook fed directly, delivered by its own thread: what the receiver gets and when.

The routing itself is pure state (tests/test_webhook_routing.py); these run the delivery thread
against real loopback receivers, with the route's clock under the test's control where timing
matters.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import structlog.testing

from gpu_exporter.alerting.delivery import AlertmanagerReceiver, Notifier, Receiver, WebhookReceiver
from gpu_exporter.alerting.engine import FIRING, RESOLVED, Alert, sendable
from gpu_exporter.alerting.routing import Notification
from gpu_exporter.alerting.settings import ReceiverSettings, WebhookSettings
from tests.alerting_helpers import HoldingReceiver, holding_receiver, webhook_receiver
from tests.exporter_helpers import wait_for
from tests.test_alert_delivery import T0, FakeClock, Outcomes, alert
from tests.timing import LATE_S, NEVER_S

pytestmark = pytest.mark.integration

GENERATOR = "http://node-a:9445/alerts"


class Backoffs(threading.Condition):
    """A receiver's condition that records each backoff its thread waits out (the only ``wait_for``
    with a timeout), and when the wait began: what the backoff is, without timing this machine."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple[float, float]] = []  # (monotonic start, seconds)

    def wait_for(self, predicate: Any, timeout: float | None = None) -> Any:
        if timeout is not None:
            self.waits.append((time.monotonic(), timeout))
        return super().wait_for(predicate, timeout)

    @property
    def seconds(self) -> list[float]:
        return [s for _, s in self.waits]


def record_backoffs(r: Receiver) -> Backoffs:
    """Before ``r.start()``."""
    r._cond = Backoffs()
    return r._cond


def assert_waited_out(backoffs: Backoffs) -> None:
    """Each retry came only after the backoff before it (a lower bound: a busy machine is later)."""
    for (began, seconds), (next_began, _) in zip(backoffs.waits, backoffs.waits[1:], strict=False):
        assert next_began - began >= seconds, (seconds, next_began - began)


def receiver(url: str, outcomes: Outcomes, clock: Any = time.time, **settings: Any) -> WebhookReceiver:
    s = WebhookSettings(url=url, name="ops", **{"group_wait": 0, "group_interval": 1, **settings})
    # A made-up clock drives both: the receiver plans its flushes on the one it is given as steady.
    steady = time.monotonic if clock is time.time else clock
    return WebhookReceiver(s, outcomes, generator_url=lambda: GENERATOR, clock=clock, steady=steady)


def test_the_payload_points_back_at_this_daemon() -> None:
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        r = receiver(hook.url, outcomes)
        r.start()
        r.submit([alert()], time.time())
        wait_for(lambda: outcomes.count("sent") == 1, what="the notification")
        r.stop()
    (req,) = hook.requests
    assert req.body["externalURL"] == "http://node-a:9445"
    assert [a["generatorURL"] for a in req.body["alerts"]] == [GENERATOR]
    assert req.body["receiver"] == "ops" and req.body["version"] == "4"


def test_a_notification_with_nothing_to_send_does_not_hold_back_the_next_group() -> None:
    """Without send_resolved, a group whose alerts all resolved needs a notification (Alertmanager
    logs it) that sends nothing; another group due at the same moment still goes out then."""
    clock = FakeClock(T0)
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        r = receiver(hook.url, outcomes, clock=clock, send_resolved=False, group_interval=60)
        r.start()
        r.submit([alert("GpuLost")], T0)
        wait_for(lambda: outcomes.count("sent") == 1, what="the first notification")
        clock.now = T0 + 60  # GpuLost's group is due again, and a new group with it
        r.submit([alert("GpuLost", state=RESOLVED, resolved_at=T0 + 30), alert("GpuXidError", at=T0 + 60)], T0 + 60)
        wait_for(lambda: len(hook.requests) == 2, timeout=10, what="the new group's notification")
        time.sleep(0.3)  # anything else would have been sent by now: the clock stands still
        r.stop()
    assert [[a["labels"]["alertname"] for a in req.body["alerts"]] for req in hook.requests] == [
        ["GpuLost"], ["GpuXidError"]]  # fmt: skip
    assert outcomes.count("sent") == 2, "a notification with nothing in it is not counted as sent"
    assert len(r) == 0


def record_retries(r: WebhookReceiver, clock: FakeClock) -> list[tuple[str, float, float]]:
    """Each failed notification as (group key, when it failed, when the group is tried again), on
    the made-up clock: what each group's backoff is, exactly."""
    seen: list[tuple[str, float, float]] = []
    failed = r.route.failed

    def recording(n: Notification, retry_at: float) -> None:
        seen.append((n.group.key, clock.now, retry_at))
        failed(n, retry_at)

    r.route.failed = recording  # type: ignore[method-assign]
    return seen


def wake(r: WebhookReceiver) -> None:
    """The delivery thread looks again (after the test moved the made-up clock)."""
    r.submit([], 0.0)


def test_failures_back_off_exponentially_and_a_success_starts_the_backoff_again() -> None:
    clock = FakeClock(T0)
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        hook.status = 503
        r = receiver(hook.url, outcomes, clock=clock, group_interval=3600)
        r.min_backoff, r.max_backoff = 0.05, 3.0
        retries = record_retries(r, clock)
        r.start()
        r.submit([alert(gpu="0")], T0)
        for i in range(5):
            wait_for(lambda i=i: len(retries) > i, what=f"failure {i + 1}")
            clock.now = retries[i][2]  # the retry is due: not a moment before (each fails at the last retry_at)
            wake(r)
        wait_for(lambda: len(retries) >= 6, what="the sixth failure")
        backoffs = [at - failed for _, failed, at in retries[:6]]
        assert backoffs == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6], abs=1e-6)
        assert [failed for _, failed, _ in retries[1:6]] == [at for _, _, at in retries[:5]]
        hook.status = 200
        clock.now = retries[5][2]
        wake(r)
        wait_for(lambda: outcomes.count("sent") == 1, timeout=10, what="delivery once the receiver answers")
        hook.status = 503
        clock.now += 3600  # the group's next tick, with a change to send
        r.submit([alert(gpu="1", at=clock.now)], clock.now)
        wait_for(lambda: len(retries) == 7, what="the failure after the success")
        # The minimum backoff again, not the doubling of the one before the success.
        assert retries[6][2] - retries[6][1] == pytest.approx(0.05, abs=1e-6), retries
        r.stop()


def test_the_notifier_gives_every_receiver_every_alert_and_an_empty_batch_to_none() -> None:
    outcomes = Outcomes()
    am = AlertmanagerReceiver(ReceiverSettings(url="http://127.0.0.1:9/am"), outcomes, queue_size=10, valid_for=60,
                              generator_url=lambda: GENERATOR)  # fmt: skip
    hook = receiver("http://127.0.0.1:9/hook", outcomes)
    n = Notifier([am, hook])  # not started: what they were given stays queued
    n.send([], T0)
    assert (len(am), len(hook)) == (0, 0)
    n.send([alert(gpu="0"), alert(gpu="1")], T0)
    assert (len(am), len(hook)) == (2, 2)


# -- the delivery thread, either receiver ---------------------------------------------------------------
def am(url: str, outcomes: Outcomes, **kw: Any) -> AlertmanagerReceiver:
    return AlertmanagerReceiver(ReceiverSettings(url=url), outcomes, queue_size=kw.pop("queue_size", 10),
                                valid_for=60, generator_url=lambda: GENERATOR, **kw)  # fmt: skip


def test_an_idle_receiver_sleeps() -> None:
    """A receiver with nothing to send costs no CPU (a delivery thread that spins would take a core)."""
    with webhook_receiver() as hook:
        receivers = [am(hook.url, Outcomes()), receiver(hook.url, Outcomes(), group_wait=1.2)]
        for r in receivers:
            r.start()
        receivers[1].submit([alert()], time.time())  # a group waiting for its group_wait, due in 1.2 s
        cpu = time.process_time()
        time.sleep(1.0)
        used = time.process_time() - cpu
        for r in receivers:
            r.stop()
    assert used < 0.3, f"{used:.2f} s of CPU in 1 s while idle"


def test_stop_ends_the_thread_promptly_even_with_a_request_hanging() -> None:
    """stop() waits 1 s for the thread; the request hangs for its timeout of NEVER_S, so a stop that
    waited for it would miss 1 s + LATE_S."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(NEVER_S)
    try:
        r = AlertmanagerReceiver(ReceiverSettings(url=f"http://127.0.0.1:{listener.getsockname()[1]}",
                                                  timeout=NEVER_S),
                                 Outcomes(), queue_size=10, valid_for=60, generator_url=lambda: GENERATOR)  # fmt: skip
        r.start()
        r.submit([alert()], T0)
        conn, _ = listener.accept()  # the request is in flight, waiting for an answer that never comes
        started = time.monotonic()
        r.stop()
        assert time.monotonic() - started < 1.0 + LATE_S
        conn.close()
    finally:
        listener.close()
    idle = am("http://127.0.0.1:9/am", Outcomes())
    idle.start()
    idle.stop()
    assert not idle.alive, "a stopped receiver's thread has ended"


def test_stop_says_how_many_alerts_were_not_delivered(capsys: pytest.CaptureFixture[str]) -> None:
    r = am("http://127.0.0.1:9/am", Outcomes())  # nothing listens there: nothing is delivered
    r.start()
    r.submit([alert(gpu="0"), alert(gpu="1")], T0)
    time.sleep(0.2)
    r.stop()
    out = capsys.readouterr()
    line = next(x for x in (out.out + out.err).splitlines() if "notifications_undelivered_at_shutdown" in x)
    assert "alerts=2" in line


def test_a_failed_notification_says_what_failed() -> None:
    """An operator reading the log learns why nothing arrived: the error's kind and text, and that
    it will be tried again."""
    with structlog.testing.capture_logs() as logs:
        r = am("http://127.0.0.1:9/am", Outcomes())  # nothing listens there: refused
        r.min_backoff = 5.0  # one try while the test looks
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: any(e["event"] == "notification_failed" for e in logs), what="the failure's log line")
        r.stop()
    failed = next(e for e in logs if e["event"] == "notification_failed")
    assert failed["error"].startswith("URLError: ") and "Connection refused" in failed["error"], failed
    assert failed["receiver"] == r.name and failed["will_retry"] is True


def test_an_alertmanager_url_with_a_trailing_slash_gets_the_api_path_once() -> None:
    with webhook_receiver() as hook:
        outcomes = Outcomes()
        r = am(hook.url + "/", outcomes)
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: outcomes.count("sent") == 1, what="the delivery")
        r.stop()
    (req,) = hook.requests
    assert req.path == "/hook/api/v2/alerts"
    assert [a["generatorURL"] for a in req.body] == [GENERATOR]


def test_a_failing_alertmanager_is_retried_with_backoff_not_in_a_loop() -> None:
    with webhook_receiver() as hook:
        hook.status = 503
        outcomes = Outcomes()
        r = am(hook.url, outcomes)
        r.min_backoff, r.max_backoff = 0.05, 3.0
        backoffs = record_backoffs(r)
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: len(backoffs.waits) >= 5, what="five backoffs")
        r.stop()
    # 0.05, 0.1, 0.2, ...: each try after the backoff before it; in a loop, hundreds a second.
    assert backoffs.seconds[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]
    assert_waited_out(backoffs)
    assert outcomes.count("retried") <= len(backoffs.waits) + 1


def test_successive_alerts_are_delivered_without_waiting_a_backoff() -> None:
    with webhook_receiver() as hook:
        outcomes = Outcomes()
        r = am(hook.url, outcomes)
        r.min_backoff = 0.5
        backoffs = record_backoffs(r)
        r.start()
        for i in range(5):
            r.submit([alert(gpu=str(i))], T0 + i)
            wait_for(lambda i=i: outcomes.count("sent") == i + 1, what=f"delivery {i}")
        r.stop()
    assert backoffs.waits == [], "a backoff after a success"


def test_over_queue_size_the_alert_updated_longest_ago_goes_first() -> None:
    outcomes = Outcomes()
    r = am("http://127.0.0.1:9/am", outcomes, queue_size=2)  # not started: the queue only fills
    r.submit([alert(gpu="0"), alert(gpu="1")], T0)
    r.submit([alert(gpu="0")], T0 + 60)  # GPU 0 re-sent: now the most recent
    r.submit([alert(gpu="2")], T0 + 61)
    assert sorted(a.label_dict["gpu"] for a in r._firing.values()) == ["0", "2"]
    gone = [alert(gpu=g, state=RESOLVED, resolved_at=T0 + 70) for g in "345"]
    r2 = am("http://127.0.0.1:9/am", Outcomes(), queue_size=2)
    r2.submit(gone[:2], T0 + 70)
    r2.submit([gone[0]], T0 + 130)
    r2.submit([gone[2]], T0 + 131)
    assert sorted(a.label_dict["gpu"] for a in r2._resolved.values()) == ["3", "5"]


def test_a_webhook_group_is_notified_after_group_wait_with_nothing_else_arriving() -> None:
    with webhook_receiver() as hook:
        outcomes = Outcomes()
        r = receiver(hook.url, outcomes, group_wait=0.5)
        r.start()
        r.submit([alert()], time.time())
        wait_for(lambda: outcomes.count("sent") == 1, timeout=5, what="the notification after group_wait")
        r.stop()


def test_a_webhook_repeats_an_unchanged_group_after_repeat_interval() -> None:
    with webhook_receiver() as hook:
        outcomes = Outcomes()
        r = receiver(hook.url, outcomes, group_interval=0.2, repeat_interval=0.5)
        r.start()
        r.submit([alert()], time.time())
        wait_for(lambda: outcomes.count("sent") >= 2, timeout=10, what="the repeat")
        r.stop()
    assert outcomes.count("retried") == 0


def test_basic_auth_with_a_user_name_and_no_password_sends_an_empty_password() -> None:
    with webhook_receiver() as hook:
        outcomes = Outcomes()
        r = AlertmanagerReceiver(ReceiverSettings(url=hook.url, basic_auth_username="am"), outcomes, queue_size=10,
                                 valid_for=60, generator_url=lambda: GENERATOR)  # fmt: skip
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: outcomes.count("sent") == 1, what="the delivery")
        r.stop()
    (req,) = hook.requests
    assert req.headers["Authorization"] == "Basic YW06"  # base64 of "am:"
    assert req.headers["Content-Type"] == "application/json"


def test_a_receiver_that_never_answers_times_out_and_is_retried() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts, never answers
    try:
        outcomes = Outcomes()
        r = AlertmanagerReceiver(ReceiverSettings(url=f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.3),
                                 outcomes, queue_size=10, valid_for=60, generator_url=lambda: GENERATOR)  # fmt: skip
        r.min_backoff = 0.05
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: outcomes.count("retried") >= 2, timeout=10, what="the timed-out request retried")
        r.stop()
    finally:
        listener.close()


@pytest.mark.parametrize("size", [10, 64 * 1024, 100 * 1024])
def test_a_reply_with_a_body_of_any_length_is_a_delivery(size: int) -> None:
    body = b"x" * size

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        outcomes = Outcomes()
        r = am(f"http://127.0.0.1:{server.server_address[1]}", outcomes)
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: outcomes.count("sent") == 1, what="the delivery")
        time.sleep(0.2)
        r.stop()
    finally:
        server.shutdown()
        server.server_close()
    assert outcomes.count("retried") == 0


def test_a_bug_that_keeps_failing_a_send_backs_off_too() -> None:
    outcomes = Outcomes()
    r = am("http://127.0.0.1:9/am", outcomes)

    def broken() -> str:
        raise RuntimeError("a bug")

    r._generator_url = broken
    r.min_backoff, r.max_backoff = 0.05, 3.0
    r.start()
    r.submit([alert()], T0)
    wait_for(lambda: outcomes.count("retried") >= 3, what="three failed attempts")
    r.stop()
    assert r._backoff >= 4 * r.min_backoff, "each failure doubles the wait before the next attempt"


def test_stop_ends_a_thread_waiting_out_a_long_backoff() -> None:
    outcomes = Outcomes()
    r = am("http://127.0.0.1:9/am", outcomes)  # refused: the first send fails
    r.min_backoff = 30.0
    r.start()
    r.submit([alert()], T0)
    wait_for(lambda: outcomes.count("retried") == 1, what="the first failure")
    r.stop()
    assert not r.alive, "the thread should end at once, not after its 30 s backoff"


# -- groups on their own schedules: a slow receiver and a critical alert -------------------------------
class Looks(threading.Condition):
    """A receiver's condition that counts each time its delivery thread goes back to waiting: it has
    looked at everything that came before and started every request it would."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.count += 1  # under the lock, as wait() is called
        return super().wait(timeout)


def record_looks(r: Receiver) -> Looks:
    """Before ``r.start()``."""
    r._cond = Looks()
    return r._cond


def submit_and_settle(r: WebhookReceiver, looks: Looks, alerts: list[Any], now: float) -> None:
    """Submit ``alerts`` and return once the delivery thread has looked at them: what it did not
    start by then, it will not start until something else changes."""
    with looks:  # the thread is waiting or busy, never halfway through a look
        seen = looks.count
        r.submit(alerts, now)
    wait_for(lambda: looks.count > seen, what="the delivery thread to look at what came")


def warning(gpu: str, at: float = T0) -> Alert:
    labels = sendable({"alertname": "GpuMemoryHigh", "severity": "warning", "gpu": gpu, "node": "n1"})
    return Alert(labels, (("summary", f"memory of {gpu}"),), FIRING, active_at=at, fired_at=at)


EIGHT_WARNINGS = [warning(str(g)) for g in range(8)]
BY_GPU = {"group_by": ["alertname", "node", "gpu"]}


def slow(hook: HoldingReceiver, outcomes: Outcomes, **settings: Any) -> tuple[WebhookReceiver, Looks]:
    clock = FakeClock(T0)
    # Requests are held as long as the test likes: none times out (its retry would wait for the made-up clock).
    r = receiver(hook.url, outcomes, clock=clock, **{**BY_GPU, "timeout": 300, **settings})
    looks = record_looks(r)
    r.start()
    return r, looks


def test_a_new_gpu_lost_is_sent_while_a_slow_receiver_holds_eight_warnings() -> None:
    """Issue 50's attack: 8 GpuMemoryHigh groups pending, a receiver that takes its time. With the
    default of 4 places, 3 warnings go out and the GpuLost takes the place kept for a critical alert,
    while the receiver still holds every warning; before, it waited for all 8 to be answered."""
    outcomes = Outcomes()
    with holding_receiver() as hook:
        r, looks = slow(hook, outcomes)
        assert r.max_concurrent == 4, "the default"
        r.submit(EIGHT_WARNINGS, T0)
        hook.arrived(3)
        submit_and_settle(r, looks, [alert("GpuLost", gpu="5")], T0)
        held = hook.arrived(4)
        assert [h.alertnames for h in held] == [["GpuMemoryHigh"]] * 3 + [["GpuLost"]]
        assert not any(h.answered.is_set() for h in held), "no warning was answered before the GpuLost arrived"
        hook.release_all()
        wait_for(lambda: outcomes.count("sent") == 9, what="every group delivered")
        r.stop()
    assert sorted(h.group for h in hook.requests) == sorted(
        [f'{{}}:{{alertname="GpuMemoryHigh", gpu="{g}", node="n1"}}' for g in range(8)]
        + ['{}:{alertname="GpuLost", gpu="5", node="n1"}']), "each group once, none lost"  # fmt: skip
    assert hook.peak == 4


@pytest.mark.parametrize("places", [2, 4, 8])
def test_no_more_requests_in_flight_than_max_concurrent_requests(places: int) -> None:
    """Critical alerts that come while every place is taken wait for one, and go first when one frees
    (before warnings that were due earlier); warnings never take the last place."""
    outcomes = Outcomes()
    with holding_receiver() as hook:
        r, looks = slow(hook, outcomes, max_concurrent_requests=places)
        r.submit(EIGHT_WARNINGS, T0)
        hook.arrived(places - 1)
        submit_and_settle(r, looks, [], T0)
        assert r.in_flight == places - 1, "a warning took the place kept for a critical alert"
        criticals = [alert("GpuLost", gpu="5"), alert("GpuXidError", gpu="6"), alert("GpuEccUncorrectable", gpu="7")]
        submit_and_settle(r, looks, criticals, T0)
        assert r.in_flight == places, "one critical alert in the kept place, the others wait"
        for h in hook.arrived(2):
            h.release()  # two places free, one after the other
        after = [h.alertnames[0] for h in hook.arrived(places + 2)[places:]]
        assert sorted(after) == ["GpuEccUncorrectable", "GpuXidError"], "criticals first, not the warnings due before"
        hook.release_all()
        wait_for(lambda: outcomes.count("sent") == 11, what="every group delivered")
        r.stop()
    assert hook.peak == places
    assert len({h.group for h in hook.requests}) == len(hook.requests) == 11


def test_with_one_place_a_firing_critical_alert_goes_next() -> None:
    """``max_concurrent_requests: 1`` sends one request at a time, as before; a critical alert then
    waits for the request in flight only, not for the warnings queued before it."""
    outcomes = Outcomes()
    with holding_receiver() as hook:
        r, looks = slow(hook, outcomes, max_concurrent_requests=1)
        r.submit(EIGHT_WARNINGS, T0)
        (first,) = hook.arrived(1)
        submit_and_settle(r, looks, [alert("GpuLost", gpu="5")], T0)
        assert r.in_flight == 1
        first.release()
        assert hook.arrived(2)[1].alertnames == ["GpuLost"]
        hook.release_all()
        wait_for(lambda: outcomes.count("sent") == 9, what="every group delivered")
        r.stop()
    assert hook.peak == 1


def test_a_resolution_never_overtakes_the_firing_notification_of_its_group() -> None:
    """One notification of a group at a time: a resolution that comes, and becomes due, while the
    firing notification is in flight waits for its outcome, however many places are free."""
    outcomes = Outcomes()
    with holding_receiver() as hook:
        r, looks = slow(hook, outcomes, max_concurrent_requests=8)
        r.submit([alert("GpuLost")], T0)
        (firing,) = hook.arrived(1)
        r._clock.now = T0 + 5  # type: ignore[attr-defined]  # the group's next tick has passed
        submit_and_settle(r, looks, [alert("GpuLost", state=RESOLVED, resolved_at=T0 + 4)], T0 + 5)
        assert r.in_flight == 1 and len(hook.requests) == 1
        firing.release()
        resolution = hook.arrived(2)[1]
        resolution.release()
        wait_for(lambda: outcomes.count("sent") == 2, what="the resolution delivered")
        r.stop()
    assert [h.body["status"] for h in hook.requests] == ["firing", "resolved"]
    assert firing.group == resolution.group
    assert hook.peak == 1 and len(r) == 0


def test_a_failing_group_backs_off_alone() -> None:
    """The receiver refuses one group (503) and takes the others: that group backs off, from
    ``min_backoff``, on its own; the others are delivered at once, not after its backoff."""
    outcomes = Outcomes()
    with holding_receiver() as hook:
        hook.hold = False
        hook.status_for = lambda body: 503 if body["groupLabels"]["alertname"] == "GpuLost" else 200
        r = receiver(hook.url, outcomes, clock=(clock := FakeClock(T0)), **BY_GPU)
        r.min_backoff, r.max_backoff = 300.0, 1000.0  # a receiver-wide backoff would hold everything past NEVER_S
        retries = record_retries(r, clock)
        r.start()
        r.submit([alert("GpuLost")], T0)
        wait_for(lambda: len(retries) == 1, what="the failure")
        r.submit([alert("GpuXidError", gpu="1"), warning("2")], T0)
        wait_for(lambda: outcomes.count("sent") == 2, what="the other groups, delivered meanwhile")
        for i in (1, 2):
            clock.now = retries[i - 1][2]
            wake(r)
            wait_for(lambda i=i: len(retries) > i, what=f"retry {i}")
        r.stop()
    assert [at - failed for _, failed, at in retries] == [300.0, 600.0, 1000.0], "doubling up to max_backoff"
    names = [h.alertnames[0] for h in hook.requests]
    assert (names[0], sorted(names[1:3]), names[3:]) == ("GpuLost", ["GpuMemoryHigh", "GpuXidError"], ["GpuLost"] * 2)


def test_stop_with_requests_in_flight_ends_the_receiver_and_starts_nothing_more(
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Shutdown does not wait out requests a receiver holds (only ``timeout`` in all), says how many
    alerts were not delivered and how many requests were in flight, and sends nothing after."""
    outcomes = Outcomes()
    with holding_receiver() as hook:
        r, _ = slow(hook, outcomes)
        r.submit(EIGHT_WARNINGS, T0)
        held = hook.arrived(3)
        r.stop(timeout=0.1)  # the requests are held for NEVER_S: a stop that waited for them fails
        assert r.in_flight == 3, "stop returned with the requests still held"
        wait_for(lambda: not r.alive, what="the delivery thread to end")  # told to, it may be scheduled late
        hook.release_all()
        for h in held:
            assert h.answered.wait(NEVER_S)
        wait_for(lambda: r.in_flight == 0, what="the answered requests to end")
    assert len(hook.requests) == 3, "nothing is sent after stop"
    assert outcomes.count("sent") == 3, "an answer that comes after stop still counts"
    out = capsys.readouterr()
    line = next(x for x in (out.out + out.err).splitlines() if "notifications_undelivered_at_shutdown" in x)
    assert "alerts=8" in line and "in_flight=3" in line


def test_a_slow_webhook_holds_back_no_other_receiver() -> None:
    """Two webhooks behind one Notifier: the one whose receiver holds every request delays nothing of the other's."""
    outcomes = Outcomes()
    with holding_receiver() as held, webhook_receiver() as quick:
        n = Notifier([receiver(held.url, outcomes), receiver(quick.url, outcomes)])
        n.start()
        n.send([alert("GpuLost")], time.time())
        held.arrived(1)
        wait_for(lambda: len(quick.requests) == 1, what="the other receiver's notification")
        n.stop()


def test_a_request_that_gets_no_thread_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of threads (a container's pids limit): the group backs off as after a failed request,
    and goes out once a thread can be had; the delivery thread goes on."""
    refusals = [RuntimeError("can't start new thread")]

    class Scarce(threading.Thread):
        def start(self) -> None:
            if self.name.endswith("-send") and refusals:
                raise refusals.pop()
            super().start()

    monkeypatch.setattr("gpu_exporter.alerting.delivery.threading.Thread", Scarce)
    clock = FakeClock(T0)
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        r = receiver(hook.url, outcomes, clock=clock)
        r.min_backoff = 7.0
        retries = record_retries(r, clock)
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: len(retries) == 1, what="the group put back")
        assert r.in_flight == 0 and r.alive
        clock.now = retries[0][2]
        wake(r)
        wait_for(lambda: outcomes.count("sent") == 1, what="the notification, once a thread is had")
        r.stop()
    assert retries == [('{}:{alertname="GpuLost", node="n1"}', T0, T0 + 7.0)]
    assert len(hook.requests) == 1 and outcomes.count("retried") == 1


def test_a_bug_in_building_a_webhook_request_backs_the_group_off_and_it_goes_out_after() -> None:
    clock = FakeClock(T0)
    outcomes = Outcomes()
    with webhook_receiver() as hook:
        r = receiver(hook.url, outcomes, clock=clock)
        bugs = [RuntimeError("a bug")]

        def generator_url() -> str:
            if bugs:
                raise bugs.pop()
            return GENERATOR

        r._generator_url = generator_url
        r.min_backoff = 2.0
        retries = record_retries(r, clock)
        r.start()
        r.submit([alert()], T0)
        wait_for(lambda: len(retries) == 1, what="the group put back")
        assert outcomes.count("retried") == 1 and r.in_flight == 0
        clock.now = retries[0][2]
        wake(r)
        wait_for(lambda: outcomes.count("sent") == 1, what="the notification after the bug")
        r.stop()
    assert retries[0][1:] == (T0, T0 + 2.0) and len(hook.requests) == 1
