"""A GPU that vanishes stays lost until it answers (issue 49, point 3).

After a driver reload, or a release (SIGUSR1) and a resume (SIGUSR2), the driver numbers the GPUs it
finds afresh: a node back with 3 of its 4 GPUs lists GPUs 0-2, and the GPU that was 3 is now 2.
Before, the missing GPU simply left the snapshot: its ``gpu_up`` series ended instead of saying 0,
and the alert engine resolved its ``GpuLost`` (the GPU now under its index cleared it too, alerts
being keyed by index) while nothing was fixed.  The fake driver models the reload: a GPU taken out
of the scenario file is not counted at the next ``nvmlInit`` and the GPUs after it move down.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.accounting.states import DOWN, classify
from gpu_exporter.alerting.engine import FIRING, RESOLVED, Alert, RuleEngine
from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.settings.config import load_settings
from gpu_exporter.snapshot import GpuReading, GpuStatic, JobRef, NodeSnapshot
from gpu_exporter.sources.backend import SystemInfo
from gpu_exporter.sources.nvml import NvmlBackend
from gpu_exporter.sources.poller import Poller
from tests.alerting_helpers import WebhookReceiver, webhook_receiver
from tests.exporter_helpers import ErrorLog, RunningDaemon, run_daemon, samples_of, value, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import gpu_uuid, h100_sxm
from tests.fakenvml.runtime import driver_monotonic, driver_wall_clock

GIB = 2**30
T0 = 1_800_000_000.0
STEP = 15.0
UUIDS = [gpu_uuid("vanish", i) for i in range(4)]


def four_gpus(scenario: Scenario) -> None:
    for i in range(4):
        h100_sxm(scenario.add_gpu(), "vanish", i, util=90, mem_used=40 * GIB, power_mw=400_000)
    scenario.write()


class Clock:
    """The poller's and the engine's steady clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def poller_on(clock: Clock) -> Poller:
    errors = ErrorLog()
    backend = NvmlBackend(errors, profiling_interval=0.1, monotonic=driver_monotonic, wall=driver_wall_clock,
                          slow_interval=0.0)  # fmt: skip
    return Poller(backend, errors=errors, wall_clock=lambda: T0 + clock.now, monotonic=clock)


def rules() -> RulesSettings:
    return load_settings({"rules": {"GpuLost": {"for": "0s"}}}).rules


class Node:
    """The poller and the engine, one poll and one evaluation a step apart; what was sent, kept."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.poller = poller_on(self.clock)
        self.engine = RuleEngine(rules(), "n1", resend_interval=STEP)
        self.books = Accountant(threshold=0.1)
        self.sent: list[Alert] = []

    def step(self) -> NodeSnapshot:
        self.clock.now += STEP
        snap = self.poller.poll()
        self.sent += self.engine.evaluate(snap).to_send
        self.books.observe(snap)
        return snap

    def booked(self) -> dict[tuple[int, str], str]:
        """(index, UUID) -> state of each GPU in the books."""
        return {(a.index, a.uuid): a.state for a in self.books.view().gpus}

    def lost_alerts(self, uuid: str) -> list[tuple[str, str]]:
        """(state, gpu label) of each GpuLost of ``uuid`` sent so far, in order."""
        return [(a.state, a.label_dict["gpu"]) for a in self.sent
                if a.label_dict["alertname"] == "GpuLost" and a.label_dict.get("uuid") == uuid]  # fmt: skip


def by_uuid(snap: NodeSnapshot) -> dict[str, GpuReading]:
    return {g.uuid: g for g in snap.gpus}


def test_a_gpu_missing_after_a_release_stays_down_and_its_gpulost_fires_until_it_answers(
    scenario: Scenario, nvml: Any
) -> None:
    four_gpus(scenario)
    node = Node()
    try:
        assert [g.up for g in node.step().gpus] == [True] * 4
        scenario.gpu(2).lost()  # falls off the bus
        scenario.write()
        node.step()
        assert node.lost_alerts(UUIDS[2]) == [(FIRING, "2")]
        # The admin's reset: NVML let go of, the driver reloaded, and it finds three GPUs.
        node.poller.release(0)
        node.step()
        gone = scenario.gpus.pop(2)
        scenario.write()
        node.poller.resume()
        with structlog.testing.capture_logs() as logs:
            snap = node.step()
            for _ in range(3):
                node.step()
        listed = {g.uuid: (g.index, g.up) for g in snap.gpus}
        assert listed == {UUIDS[0]: (0, True), UUIDS[1]: (1, True), UUIDS[3]: (2, True), UUIDS[2]: (2, False)}
        missing = by_uuid(snap)[UUIDS[2]]
        assert missing.error is not None and "restart gpu-exporter" in missing.error
        s = samples_of(snap)
        assert value(s, "gpu_up", gpu="2", uuid=UUIDS[2]) == 0, "its last labels, 0"
        assert value(s, "gpu_up", gpu="2", uuid=UUIDS[3]) == 1
        assert classify(missing, 0.1) == DOWN
        # The books: the missing GPU down under its last labels; the one that moved booked once, where it is.
        assert node.booked() == {(0, UUIDS[0]): "busy", (1, UUIDS[1]): "busy", (2, UUIDS[2]): DOWN,
                                 (2, UUIDS[3]): "busy"}  # fmt: skip
        # Never resolved: re-sent as firing at every resend, under its last labels.
        assert node.lost_alerts(UUIDS[2]) == [(FIRING, "2")] * 6
        active = [a for a in node.engine.active() if a.label_dict["alertname"] == "GpuLost"]
        assert [(a.state, a.label_dict["uuid"]) for a in active] == [(FIRING, UUIDS[2])]
        warned = [e for e in logs if e["event"] == "gpu_missing"]
        assert [(e["log_level"], e["gpu"], e["uuid"]) for e in warned] == [("warning", 2, UUIDS[2])], "said once"
        # It answers again (back after its reset, as GPU 3): GpuLost is resolved, under its last labels.
        node.poller.release(0)
        node.step()
        before = len(node.lost_alerts(UUIDS[2]))
        scenario.gpus.append(gone.recovered())
        scenario.write()
        node.poller.resume()
        with structlog.testing.capture_logs() as logs:
            back = node.step()
            node.step()
        assert {g.uuid: (g.index, g.up) for g in back.gpus} == {
            UUIDS[0]: (0, True), UUIDS[1]: (1, True), UUIDS[3]: (2, True), UUIDS[2]: (3, True)}  # fmt: skip
        sent = node.lost_alerts(UUIDS[2])
        assert sent[:before] == [(FIRING, "2")] * before
        assert sent[before:] == [(RESOLVED, "2")] * 2
        assert not [a for a in node.engine.active() if a.label_dict["alertname"] == "GpuLost"]
        assert node.booked() == {(0, UUIDS[0]): "busy", (1, UUIDS[1]): "busy", (2, UUIDS[3]): "busy",
                                 (3, UUIDS[2]): "busy"}  # fmt: skip
        said = [(e["log_level"], e["uuid"]) for e in logs if e["event"].startswith("gpu_missing")]
        assert said == [("warning", UUIDS[2])]
    finally:
        node.poller.close()


def test_a_gpu_that_moves_to_a_missing_ones_index_neither_clears_nor_shares_its_alerts() -> None:
    """The engine alone: GPU c lost at index 2, and after a reload GPU d there answering."""
    engine = RuleEngine(rules(), "n1", resend_interval=STEP)

    def evaluate(t: float, *gpus: GpuReading) -> list[Alert]:
        return engine.evaluate(NodeSnapshot(taken_at=T0 + t, duration_seconds=0.01, nvml_up=True, gpus=gpus)).to_send

    c, d = UUIDS[2], UUIDS[3]
    evaluate(0, GpuReading(index=2, uuid=c, up=False, error="lost"), GpuReading(index=3, uuid=d, up=False, error="x"))
    sent = evaluate(STEP, GpuReading(index=2, uuid=d, up=True), GpuReading(index=2, uuid=c, up=False, error="gone"))
    got = sorted((a.state, a.label_dict["uuid"], a.label_dict["gpu"], a.starts_at) for a in sent)
    # c goes on firing from when it fell (not cleared by d and fired anew); d answers, so its own
    # GpuLost (under its old index) is what is resolved.
    assert got == [(FIRING, c, "2", T0), (RESOLVED, d, "3", T0)]


def test_a_restart_forgets_a_gpu_the_driver_no_longer_lists(scenario: Scenario, nvml: Any) -> None:
    """How an operator says a GPU was removed for good: a new process knows only what the driver lists."""
    four_gpus(scenario)
    first = Node()
    try:
        first.step()
    finally:
        first.poller.close()
    scenario.gpus.pop(2)
    scenario.write()
    again = Node()
    try:
        snap = again.step()
    finally:
        again.poller.close()
    assert [(g.uuid, g.up) for g in snap.gpus] == [(UUIDS[i], True) for i in (0, 1, 3)]


# -- the real daemon, its direct webhook as the receiver -------------------------------------------------
def lost_statuses(hook: WebhookReceiver, uuid: str) -> list[str]:
    return [a["status"] for a in hook.alerts()
            if a["labels"]["alertname"] == "GpuLost" and a["labels"].get("uuid") == uuid]  # fmt: skip


def released(d: RunningDaemon) -> bool:
    return value(d.metrics(), "gpu_exporter_nvml_released") == 1


@pytest.mark.integration
def test_the_daemon_never_resolves_a_vanished_gpus_gpulost_until_it_answers(scenario: Scenario, tmp_path: Path) -> None:
    four_gpus(scenario)
    c, d_uuid = UUIDS[2], UUIDS[3]
    with webhook_receiver() as hook:
        # Every notification repeated each second: the receiver hears the group's state over and over.
        route = {"url": hook.url, "group_by": ["alertname", "node"], "group_wait": "0s", "group_interval": "1s",
                 "repeat_interval": "1s"}  # fmt: skip
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({"node_name": "n1", "rules": {"GpuLost": {"for": "0s"}},
                                       "alerting": {"resend_interval": "1s", "webhooks": [route]}}))  # fmt: skip
        with run_daemon(scenario.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: value(d.metrics(), "gpu_up", uuid=d_uuid) == 1, what="four GPUs up")
            scenario.gpu(2).lost()
            scenario.write()
            wait_for(lambda: "firing" in lost_statuses(hook, c), what="GpuLost of GPU 2 at the webhook")
            # The admin's reset: SIGUSR1, the driver reloaded with three GPUs, SIGUSR2.
            os.kill(d.proc.pid, signal.SIGUSR1)
            wait_for(lambda: released(d), what="NVML let go of")
            gone = scenario.gpus.pop(2)
            scenario.write()
            os.kill(d.proc.pid, signal.SIGUSR2)
            wait_for(lambda: value(d.metrics(), "gpu_up", gpu="2", uuid=d_uuid) == 1, what="GPU 3 read as GPU 2")
            heard = len(lost_statuses(hook, c))
            wait_for(lambda: len(lost_statuses(hook, c)) >= heard + 3 or "resolved" in lost_statuses(hook, c),
                     timeout=30, what="three more notifications")  # fmt: skip
            assert "resolved" not in lost_statuses(hook, c), "resolved though the GPU never answered"
            s = d.metrics()
            assert value(s, "gpu_up", gpu="2", uuid=c) == 0, "the vanished GPU, down under its last labels"
            assert value(s, "gpu_up", gpu="3", uuid=d_uuid) is None
            (said,) = [e for e in list(d.log) if e.get("event") == "gpu_missing"]
            assert (said["level"], said["uuid"], said["gpu"]) == ("warning", c, 2)
            # Back after its reset (the driver lists it as GPU 3): resolved.
            os.kill(d.proc.pid, signal.SIGUSR1)
            wait_for(lambda: released(d), what="NVML let go of again")
            scenario.gpus.append(gone.recovered())
            scenario.write()
            os.kill(d.proc.pid, signal.SIGUSR2)
            wait_for(lambda: lost_statuses(hook, c)[-1:] == ["resolved"], timeout=30, what="GpuLost resolved")
            s = d.metrics()
            assert value(s, "gpu_up", gpu="3", uuid=c) == 1 and value(s, "gpu_up", gpu="2", uuid=c) is None


class Listed:
    """A backend listing the GPUs of ``uuids``, in that order: a driver reload is a change of the list
    and a release and a resume of the poller."""

    def __init__(self, uuids: list[str]) -> None:
        self.uuids = uuids

    def open(self) -> SystemInfo:
        return SystemInfo(driver_version="580.65.06", cuda_version="13.0", gpu_count=len(self.uuids))

    def close(self) -> None:
        pass

    def count(self) -> int:
        return len(self.uuids)

    def read_static(self, index: int) -> GpuStatic:
        return GpuStatic(index=index, uuid=self.uuids[index], name="NVIDIA H100 80GB HBM3", pci_bus_id="")

    def read_gpu(self, static: GpuStatic) -> GpuReading:
        return GpuReading(index=static.index, uuid=static.uuid, up=True, static=static)

    def xid_counts(self, uuid: str) -> Mapping[int, int]:
        return {79: 1} if uuid == UUIDS[2] else {}


def test_a_vanished_gpu_holds_nothing_its_old_index_is_assigned_to() -> None:
    """Attribution by index (Slurm's job files, the kubelet's device IDs) is the live GPU's there."""
    backend = Listed(list(UUIDS))
    job = JobRef("4242", "alice")

    def attach(gpus: tuple[GpuReading, ...]) -> tuple[GpuReading, ...]:
        return tuple(replace(g, jobs=(job,)) if g.index == 2 else g for g in gpus)

    clock = Clock()
    poller = Poller(backend, errors=ErrorLog(), attach=attach, monotonic=clock, wall_clock=clock)
    poller.poll()
    poller.release(0)
    backend.uuids.pop(2)
    poller.resume()
    snap = poller.poll()
    got = {g.uuid: (g.index, g.up, g.jobs, dict(g.xid_errors_total)) for g in snap.gpus if g.index == 2}
    assert got == {UUIDS[3]: (2, True, (job,), {}), UUIDS[2]: (2, False, (), {79: 1})}
