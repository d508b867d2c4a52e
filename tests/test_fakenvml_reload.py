"""The scenario file is re-read when it changes, by rename or in place, under concurrent readers."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import Counter, Scenario
from tests.timing import NEVER_S


def gpu(scenario: Scenario, util: int, mem: int) -> None:
    g = scenario.add_gpu().identity(
        f"gpu{len(scenario.gpus)}", f"GPU-00000000-0000-0000-0000-{len(scenario.gpus):012d}"
    )
    g.utilization(util, mem).memory(1000, util * 10)


def test_atomic_rename_is_seen(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    gpu(scenario, 10, 20)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    assert N.nvmlDeviceGetUtilizationRates(h).gpu == 10
    scenario.gpu(0).utilization(90, 80)
    gpu(scenario, 1, 2)
    scenario.write()
    assert N.nvmlDeviceGetUtilizationRates(h).gpu == 90
    assert N.nvmlDeviceGetCount() == 2


def test_rewrite_in_place_is_seen_even_within_one_timestamp_tick(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    gpu(scenario, 10, 20)
    scenario.write_in_place()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    for util in (11, 12, 13, 14):  # same size, same inode, microseconds apart
        scenario.gpu(0).utilization(util, 20)
        scenario.write_in_place()
        assert N.nvmlDeviceGetUtilizationRates(h).gpu == util


def test_counters_keep_counting_across_reloads(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    gpu(scenario, 10, 20)
    scenario.gpu(0).energy(Counter(1000, 1_000_000))
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    time.sleep(0.2)
    before = N.nvmlDeviceGetTotalEnergyConsumption(h)
    assert before > 100_000
    scenario.gpu(0).utilization(50, 50)  # an unrelated change
    scenario.write()
    assert N.nvmlDeviceGetTotalEnergyConsumption(h) >= before  # no reset to 1000
    scenario.gpu(0).energy(Counter(1000, 0))  # rate changed: continue from where it was, then hold
    scenario.write()
    held = N.nvmlDeviceGetTotalEnergyConsumption(h)
    assert held >= before
    time.sleep(0.05)
    assert N.nvmlDeviceGetTotalEnergyConsumption(h) == held
    scenario.gpu(0).energy(Counter(5, 0))  # a new base is an explicit reset
    scenario.write()
    assert N.nvmlDeviceGetTotalEnergyConsumption(h) == 5


def test_a_broken_rewrite_is_ignored_and_reported(
    scenario: Scenario, nvml: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    N = nvml
    gpu(scenario, 10, 20)
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    text = scenario.path.read_text()
    scenario.path.write_text(text.replace("util.gpu = 10", "util.gpu = ten"))
    assert N.nvmlDeviceGetUtilizationRates(h).gpu == 10  # the previous state stays in force
    err = capfd.readouterr().err
    assert f"{scenario.path}:" in err and "util.gpu" in err and "ten" in err
    scenario.path.write_text(text.replace("util.gpu = 10", "util.gpu = 77"))
    assert N.nvmlDeviceGetUtilizationRates(h).gpu == 77


def test_half_written_file_is_not_read_as_zeros(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    for i in range(4):
        gpu(scenario, 10 + i, 20)
    scenario.write()
    N.nvmlInit()
    text = scenario.path.read_text()
    scenario.path.write_text(text[: len(text) // 2])  # caught mid-write: no final 'end'
    assert N.nvmlDeviceGetCount() == 4
    assert N.nvmlDeviceGetUtilizationRates(N.nvmlDeviceGetHandleByIndex(3)).gpu == 13


def _writer(scenario: Scenario, stop: threading.Event, counts: dict[str, int]) -> None:
    versions = [(10, 20), (90, 80)]
    i = 0
    while not stop.is_set():
        util, mem = versions[i % 2]
        scenario.gpu(0).utilization(util, mem).memory(1000, util * 10)
        if i % 2:
            scenario.write_in_place()
        else:
            scenario.write()
        i += 1
        counts["writes"] = i
        time.sleep(0.001)


@pytest.mark.slow  # hammered for 1.5 s: the whole suite runs it, --fast leaves it out
def test_readers_hammering_while_the_file_is_rewritten(scenario: Scenario, nvml: Any, tmp_path: Path) -> None:
    N = nvml
    gpu(scenario, 10, 20)
    gpu(scenario, 50, 50)
    scenario.write()
    N.nvmlInit()
    handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    stop = threading.Event()
    counts = {"writes": 0}
    problems: list[str] = []
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            try:
                u = N.nvmlDeviceGetUtilizationRates(handles[0])
                m = N.nvmlDeviceGetMemoryInfo(handles[0], version=N.nvmlMemory_v2)
                if (u.gpu, u.memory) not in ((10, 20), (90, 80)):
                    problems.append(f"torn utilization {u.gpu},{u.memory}")
                if m.total != 1000 or m.used not in (100, 900):
                    problems.append(f"bad memory {m.total},{m.used}")
                if N.nvmlDeviceGetUtilizationRates(handles[1]).gpu != 50:
                    problems.append("gpu 1 changed")
                if N.nvmlDeviceGetCount() != 2:
                    problems.append("count changed")
                reads[0] += 1
            except N.NVMLError as e:
                problems.append(f"error {e}")

    readers = [threading.Thread(target=reader) for _ in range(3)]
    writer = threading.Thread(target=_writer, args=(scenario, stop, counts))
    for t in [*readers, writer]:
        t.start()
    # At least 1.5 s and until enough happened (a busy machine does less in 1.5 s), or a problem shows.
    started = time.monotonic()
    while not problems and time.monotonic() - started < NEVER_S:
        if time.monotonic() - started >= 1.5 and counts["writes"] > 50 and reads[0] > 100:
            break
        time.sleep(0.05)
    stop.set()
    for t in [*readers, writer]:
        t.join(timeout=NEVER_S)
    assert not problems, problems[:5]
    assert counts["writes"] > 50 and reads[0] > 100
