"""Each GPU's minor number, N of /dev/nvidiaN (nvmlDeviceGetMinorNumber): how GKE's device plugin
(nvidia<N>) and NVIDIA's DRA driver (gpu-<N>) name a GPU to the kubelet.  Read with the static facts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.exporter_helpers import make_poller
from tests.fakenvml import Err, Scenario
from tests.fakenvml.runtime import call_count as calls


def test_the_fake_answers_every_linux_gpu_its_own_node(scenario: Scenario, nvml: Any) -> None:
    """nvml.h: "Supported only for Linux", where each GPU has its node: unset, the GPU's index."""
    N = nvml
    for i in range(3):
        scenario.add_gpu().identity("NVIDIA L4", f"GPU-{i}")
    scenario.gpu(2).minor_number(7)
    scenario.write()
    N.nvmlInit()
    assert [N.nvmlDeviceGetMinorNumber(N.nvmlDeviceGetHandleByIndex(i)) for i in range(3)] == [0, 1, 7]


def test_the_static_facts_carry_the_minor_number(scenario: Scenario, nvml: Any) -> None:
    """Minor numbers need not follow the index (the kernel numbers nodes as it probes the cards)."""
    for i, minor in enumerate((3, 0, None)):
        g = scenario.add_gpu().identity("NVIDIA L4", f"GPU-{i}")
        if minor is not None:
            g.minor_number(minor)
    scenario.write()
    poller, errors = make_poller()
    snap = poller.poll()
    assert [g.static.minor_number if g.static else -1 for g in snap.gpus] == [3, 0, 2]
    assert not [k for k in errors.counts if k[0] == "nvmlDeviceGetMinorNumber"]
    poller.close()


@pytest.mark.parametrize("err", ["NOT_SUPPORTED", "UNKNOWN"])
def test_a_gpu_without_one_reads_none_and_is_asked_only_at_refreshes(scenario: Scenario, nvml: Any,
                                                                      err: str) -> None:  # fmt: skip
    """A Windows host answers NOT_SUPPORTED: None, counted once.  The number is a static fact, so it
    is asked at discovery and static refreshes only, never per poll."""
    scenario.add_gpu().identity("NVIDIA L4", "GPU-0").minor_number(Err(err))
    scenario.write()
    poller, errors = make_poller()
    before = calls("nvmlDeviceGetMinorNumber")
    for _ in range(3):
        static = poller.poll().gpus[0].static
        assert static is not None and static.minor_number is None
    assert calls("nvmlDeviceGetMinorNumber") - before == 1
    assert errors.counts[("nvmlDeviceGetMinorNumber", err.lower())] == 1
    poller.close()
