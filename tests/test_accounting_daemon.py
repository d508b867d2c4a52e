"""The books through the real daemon and the fake NVML: /metrics carries the state counters, memory
peaks, last activity and prices, passes ``promtool check metrics``, and labels processes with their
user."""

from __future__ import annotations

import os
import pwd
import time
from typing import Any

import pytest

from gpu_exporter.accounting.ledger import Accountant
from gpu_exporter.daemon import Daemon
from gpu_exporter.serving.accounting_metrics import accounting_families
from gpu_exporter.serving.metrics import RenderOptions
from gpu_exporter.settings.config import load_settings
from gpu_exporter.snapshot import GpuReading, GpuStatic, NodeSnapshot, PodRef, ProcessReading
from gpu_exporter.sources.nvml import NvmlBackend
from tests.cost_helpers import H100_PRICE, L4_PRICE, PRICING, three_gpu_node
from tests.exporter_helpers import parse_exposition, value
from tests.fakenvml import Scenario
from tests.test_exporter_promtool import promtool_check

pytestmark = pytest.mark.integration

GIB = 1024**3


def test_metrics_of_the_books_pass_promtool_and_add_up(scenario: Scenario, nvml: Any, live_process: Any) -> None:
    s = three_gpu_node(scenario.path)
    s.gpu(0).add_process(live_process.pid, 1 * GIB, sm=50)  # a real process: its user comes from /proc
    s.write()
    daemon = Daemon(load_settings({"pricing": PRICING}), lambda errors: NvmlBackend(errors, profiling_interval=0.1))
    try:
        first = daemon.poll_once()
        time.sleep(0.3)
        last = daemon.poll_once()
        body = daemon.exposition.body()
    finally:
        daemon.poller.close()
    promtool_check(body)
    m = parse_exposition(body.decode())
    me = pwd.getpwuid(os.getuid()).pw_name
    assert value(m, "gpu_process_memory_used_bytes", gpu="0", pid=str(live_process.pid)) == 1 * GIB
    assert value(m, "gpu_process_memory_used_bytes", gpu="0", pid=str(live_process.pid), user=me) == 1 * GIB
    assert value(m, "gpu_process_memory_used_bytes", gpu="1", user="unknown") == 10 * GIB  # not in /proc
    step = last.steady_at - first.steady_at  # the books count steady time, not the wall clock's
    # One state per GPU took the whole step; the two processes of GPU 0 split it by their SM utilization.
    states = {(dict(k)["gpu"], dict(k)["state"], dict(k)["user"]): v for (n, k), v in m.items()
              if n == "gpu_state_seconds_total" and v}  # fmt: skip
    assert set(states) >= {("1", "allocated_idle", "unknown"), ("2", "idle", "")}
    assert {g for g, _, _ in states} == {"0", "1", "2"}
    for gpu in ("0", "1", "2"):
        assert sum(v for (g, _, _), v in states.items() if g == gpu) == step
    assert {st for g, st, _ in states if g == "0"} == {"busy"}
    assert value(m, "gpu_price_per_hour", gpu="0", currency="USD") == H100_PRICE
    assert value(m, "gpu_price_per_hour", gpu="2", currency="USD") == L4_PRICE
    assert value(m, "gpu_energy_price_per_kwh", gpu="2") == PRICING["energy_per_kwh"]
    assert value(m, "gpu_memory_used_max_bytes", gpu="1") == 10 * GIB
    assert value(m, "gpu_last_active_timestamp_seconds", gpu="0") == last.taken_at  # shown: the wall clock
    assert value(m, "gpu_last_active_timestamp_seconds", gpu="1") is None  # never busy: absent, not 0


def test_without_pricing_there_is_no_money_series(scenario: Scenario, nvml: Any) -> None:
    three_gpu_node(scenario.path).write()
    daemon = Daemon(load_settings(), NvmlBackend)
    try:
        daemon.poll_once()
        body = daemon.exposition.body().decode()
    finally:
        daemon.poller.close()
    assert "gpu_state_seconds_total{" in body
    assert "gpu_price_per_hour{" not in body and "gpu_energy_price_per_kwh{" not in body


def test_state_series_carry_their_holders_pod_and_the_others_the_joined_pods() -> None:
    a, b = PodRef("ml", "train-a", "main"), PodRef("ml", "serve-b", "main")
    static = GpuStatic(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", pci_bus_id="0")
    g = GpuReading(index=0, uuid="GPU-0", up=True, static=static, utilization_ratio=0.9, memory_used_bytes=GIB,
                   pods=(a, b), processes=(ProcessReading(1, "p", GIB, pod=a, sm_utilization_ratio=0.3),
                                           ProcessReading(2, "q", GIB, pod=b, sm_utilization_ratio=0.1)))  # fmt: skip
    books = Accountant(threshold=0.1, pod_mode=True)
    books.observe(NodeSnapshot(taken_at=100.0, duration_seconds=0, nvml_up=True, gpus=(g,)))
    books.observe(NodeSnapshot(taken_at=108.0, duration_seconds=0, nvml_up=True, gpus=(g,)))
    fams = {f.name: f for f in accounting_families(books.view(), RenderOptions(pod_labels=("namespace", "pod",
                                                                                          "container")))}  # fmt: skip
    busy = {
        s.labels["pod"]: round(s.value, 9) for s in fams["gpu_state_seconds"].samples if s.labels["state"] == "busy"
    }
    assert busy == {"train-a": 6.0, "serve-b": 2.0}
    (peak,) = fams["gpu_memory_used_max_bytes"].samples
    assert peak.labels["pod"] == "serve-b,train-a" and peak.labels["namespace"] == "ml"
