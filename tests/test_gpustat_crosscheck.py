"""An independent NVML consumer reads the fake: gpustat must report what the scenario says.

A layout or unit mistake that our own reader shared with the fake would pass our tests and
still fail here, because gpustat was written against the real driver.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import spawn_sleeper
from tests.fakenvml import Scenario, subprocess_env

pytestmark = pytest.mark.integration

MIB = 1024**2


@pytest.fixture
def live_pids() -> Iterator[list[int]]:
    procs = [spawn_sleeper() for _ in range(3)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_gpustat_reports_what_the_scenario_says(scenario: Scenario, live_pids: list[int]) -> None:
    a, b, c = live_pids
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
    g.utilization(93, 40).memory(81559 * MIB, 70000 * MIB, reserved=512 * MIB).codec(5, 6)
    g.temperature(67).power(612_345, 700_000)
    g.add_process(a, 40000 * MIB)
    g.add_process(b, 30000 * MIB)
    g = scenario.add_gpu().identity("NVIDIA GeForce RTX 3060", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    g.utilization(4, 1).memory(12288 * MIB, 300 * MIB, reserved=250 * MIB).codec(0, 0)
    g.temperature(35).fans(41).power(13_900, 170_000)
    g.add_process(c, 300 * MIB, kind="graphics")
    scenario.write()

    out = subprocess.run(
        [sys.executable, "-m", "gpustat", "--json"],
        env=subprocess_env(scenario.path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    assert json.loads(out.stdout)["driver_version"] == "550.54.15"
    assert [(x["index"], x["name"], x["uuid"]) for x in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555"),
        (1, "NVIDIA GeForce RTX 3060", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"),
    ]
    h100, rtx = gpus
    # gpustat reads memory through the v2 struct when it can: used excludes the reserved part.
    assert (h100["memory.used"], h100["memory.total"]) == (70000, 81559)
    assert (rtx["memory.used"], rtx["memory.total"]) == (300, 12288)
    assert (h100["utilization.gpu"], h100["utilization.enc"], h100["utilization.dec"]) == (93, 5, 6)
    assert h100["temperature.gpu"] == 67 and rtx["temperature.gpu"] == 35
    assert (h100["power.draw"], h100["enforced.power.limit"]) == (612, 700)  # mW -> W
    assert (rtx["power.draw"], rtx["enforced.power.limit"]) == (13, 170)
    assert h100["fan.speed"] is None and rtx["fan.speed"] == 41  # a passively cooled card has none
    procs = {(p["pid"], p["gpu_memory_usage"]) for p in h100["processes"]}
    assert procs == {(a, 40000), (b, 30000)}
    assert [(p["pid"], p["gpu_memory_usage"]) for p in rtx["processes"]] == [(c, 300)]
    assert all("python" in p["command"] for p in h100["processes"])
