"""Never standing in the way of a GPU reset or a driver upgrade (issue 36, item 3).

An open NVML holds the driver's device files; while any client holds them, ``nvidia-smi -r`` refuses
to reset a GPU ("There can't be any applications using these devices (... monitoring application
like other instance of nvidia-smi)", NVIDIA's nvidia-smi documentation) and a driver upgrade cannot
unload the module.  The fake holds a lock for them while NVML is initialised in a process
(fakenvml.c's hold_devices), which ``gpu_reset`` asks for as the reset would.  The daemon lets go of
NVML on SIGUSR1 and takes it again on SIGUSR2, or when ``--poll.release-for`` runs out."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from tests import assert_mentions
from tests.exporter_helpers import RunningDaemon, http_get, run_daemon, value, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm
from tests.fakenvml.runtime import gpu_reset

GIB = 2**30


def two_gpus(scenario: Scenario) -> None:
    for i in range(2):
        h100_sxm(scenario.add_gpu(), "release", i, util=90, mem_used=40 * GIB, power_mw=400_000)
    scenario.write()


def test_the_fake_refuses_a_reset_while_any_nvml_init_is_open(scenario: Scenario, nvml: Any) -> None:
    """The model itself: refused from the first nvmlInit until the last nvmlShutdown (nvml.h keeps a
    reference count: "Shutdown only occurs when the reference count reaches zero")."""
    two_gpus(scenario)
    assert gpu_reset(scenario.path) is None  # nobody has the driver open
    nvml.nvmlInit()
    nvml.nvmlInit()
    refusal = gpu_reset(scenario.path)
    assert refusal is not None
    assert_mentions(refusal, "in use by another client")
    nvml.nvmlShutdown()
    assert gpu_reset(scenario.path) is not None, "one init is still open"
    nvml.nvmlShutdown()
    assert gpu_reset(scenario.path) is None


def released(d: RunningDaemon) -> float | None:
    return value(d.metrics(), "gpu_exporter_nvml_released")


def gpus_up(d: RunningDaemon) -> int:
    s = d.metrics()
    return sum(1 for i in (0, 1) if value(s, "gpu_up", gpu=str(i)) == 1)


@pytest.mark.integration
def test_sigusr1_lets_go_of_nvml_for_a_reset_and_sigusr2_takes_it_again(scenario: Scenario) -> None:
    two_gpus(scenario)
    with run_daemon(scenario.path, "--poll.interval", "0.2s") as d:
        wait_for(lambda: gpus_up(d) == 2, what="both GPUs up")
        assert released(d) == 0
        assert gpu_reset(scenario.path) is not None, "the model: a polling daemon holds the driver"
        os.kill(d.proc.pid, signal.SIGUSR1)
        # The admin's reset, as soon as the exporter has let go: never refused because of us.
        wait_for(lambda: gpu_reset(scenario.path) is None, what="the reset to be accepted")
        wait_for(lambda: released(d) == 1, what="gpu_exporter_nvml_released 1")
        s = d.metrics()
        assert value(s, "gpu_exporter_nvml_up") == 0
        assert value(s, "gpu_up", gpu="0") is None, "a released GPU is not shown as read, nor as lost"
        status, _, body = http_get(d.url + "/readyz")
        assert status == 503
        assert_mentions(body.decode(), "released", "SIGUSR2")
        (said,) = [e for e in d.log if e.get("event") == "nvml_released"]
        assert_mentions(str(said["detail"]), "SIGUSR2", "600 s")  # the default --poll.release-for
        # Polls go on meanwhile (liveness: the poll count grows), and none takes the driver.
        polls = value(d.metrics(), "gpu_exporter_poll_duration_seconds_count")
        assert polls is not None
        for n in range(1, 4):
            wait_for(lambda n=n: value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") >= polls + 2 * n,
                     what=f"{2 * n} more polls")  # fmt: skip
            assert released(d) == 1 and gpu_reset(scenario.path) is None
        os.kill(d.proc.pid, signal.SIGUSR2)
        wait_for(lambda: gpus_up(d) == 2 and released(d) == 0, what="both GPUs up again")
        assert gpu_reset(scenario.path) is not None
        assert any(e.get("event") == "nvml_resumed" and e.get("reason") == "on request" for e in d.log)
        assert d.proc.poll() is None


@pytest.mark.integration
def test_a_release_ends_by_itself_after_poll_release_for(scenario: Scenario) -> None:
    """Nobody sent SIGUSR2 (the admin's script died midway): NVML is taken again when the release
    runs out, so a forgotten release does not leave the GPUs unwatched for good."""
    two_gpus(scenario)
    with run_daemon(scenario.path, "--poll.interval", "0.2s", "--poll.release-for", "2s") as d:
        wait_for(lambda: gpus_up(d) == 2, what="both GPUs up")
        os.kill(d.proc.pid, signal.SIGUSR1)
        wait_for(lambda: released(d) == 1, what="released")
        assert gpu_reset(scenario.path) is None
        wait_for(lambda: gpus_up(d) == 2 and released(d) == 0, timeout=30, what="taken again after 2 s")
        assert any(e.get("event") == "nvml_resumed" and e.get("reason") == "the release ran out" for e in d.log)


@pytest.mark.integration
def test_a_resume_while_not_released_and_a_second_release_change_nothing(scenario: Scenario) -> None:
    """Neither signal ends the daemon (by default both would), and each is idempotent."""
    two_gpus(scenario)
    with run_daemon(scenario.path, "--poll.interval", "0.2s") as d:
        wait_for(lambda: gpus_up(d) == 2, what="both GPUs up")
        os.kill(d.proc.pid, signal.SIGUSR2)  # not released: nothing to do
        wait_for(lambda: any(e.get("event") == "nvml_not_released" for e in d.log), what="the SIGUSR2 handled")
        assert gpus_up(d) == 2 and released(d) == 0
        assert not any(e.get("event") == "nvml_resumed" for e in d.log)
        for _ in range(2):
            os.kill(d.proc.pid, signal.SIGUSR1)
            wait_for(lambda: released(d) == 1 and gpu_reset(scenario.path) is None, what="released")
        os.kill(d.proc.pid, signal.SIGUSR2)
        wait_for(lambda: gpus_up(d) == 2 and released(d) == 0, what="up again")
        assert d.proc.poll() is None


@pytest.mark.integration
def test_sigterm_lets_go_of_the_driver_at_once(scenario: Scenario) -> None:
    """A pod deleted for a driver upgrade (the GPU operator's paused-for-driver-upgrade label) ends
    within its grace period and holds nothing after."""
    two_gpus(scenario)
    with run_daemon(scenario.path, "--poll.interval", "0.2s") as d:
        wait_for(lambda: gpus_up(d) == 2, what="both GPUs up")
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait(timeout=10)  # the chart's terminationGracePeriodSeconds
        assert gpu_reset(scenario.path) is None
