"""XID events delivered through NVML event sets."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fakenvml import EVENT_XID_CRITICAL, Err, Scenario
from tests.timing import NEVER_S


def two_gpus(scenario: Scenario) -> None:
    scenario.add_gpu().identity("a", "GPU-00000000-0000-0000-0000-000000000001")
    scenario.add_gpu().identity("b", "GPU-00000000-0000-0000-0000-000000000002")


def test_queued_xids_are_delivered_in_order_once(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    two_gpus(scenario)
    scenario.gpu(1).add_xid(79).add_xid(48)
    scenario.write()
    N.nvmlInit()
    es = N.nvmlEventSetCreate()
    for i in range(2):
        h = N.nvmlDeviceGetHandleByIndex(i)
        assert N.nvmlDeviceGetSupportedEventTypes(h) & N.nvmlEventTypeXidCriticalError
        N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
    got = []
    for _ in range(2):
        e = N.nvmlEventSetWait(es, 1000)
        assert e.eventType == N.nvmlEventTypeXidCriticalError
        got.append((N.nvmlDeviceGetIndex(e.device), e.eventData, e.gpuInstanceId))
    assert got == [(1, 79, 0xFFFFFFFF), (1, 48, 0xFFFFFFFF)]
    t0 = time.monotonic()
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(es, 100)
    assert time.monotonic() - t0 >= 0.1
    N.nvmlEventSetFree(es)


def test_appending_to_the_scenario_queues_an_event_for_a_waiting_reader(scenario: Scenario, nvml: Any) -> None:
    import threading

    N = nvml
    two_gpus(scenario)
    scenario.write()
    N.nvmlInit()
    es = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, es)
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(N.nvmlEventSetWait(es, int(NEVER_S * 1000))))
    waiter.start()
    time.sleep(0.05)
    scenario.gpu(0).add_xid(94, gpu_instance_id=3, compute_instance_id=0)
    scenario.write()
    waiter.join(timeout=NEVER_S)
    assert result and result[0].eventData == 94 and result[0].gpuInstanceId == 3


def test_delayed_xid(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    two_gpus(scenario)
    scenario.gpu(0).add_xid(63, after_s=0.3)
    scenario.write()
    N.nvmlInit()
    es = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(es, 0)
    assert N.nvmlEventSetWait(es, 3000).eventData == 63


def test_each_event_set_gets_its_own_copy(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    two_gpus(scenario)
    scenario.write()
    N.nvmlInit()
    sets = [N.nvmlEventSetCreate() for _ in range(2)]
    for es in sets:
        N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, es)
    scenario.gpu(0).add_xid(31)  # occurs now, with both sets watching
    scenario.write()
    assert [N.nvmlEventSetWait(es, 1000).eventData for es in sets] == [31, 31]


def test_a_set_records_only_what_occurs_once_it_watches(scenario: Scenario, nvml: Any) -> None:
    """nvml.h: nvmlDeviceRegisterEvents "Starts recording of events": an event that occurred before
    a set watched its GPU is not in it, so one that occurs between freeing a set and registering
    the next is lost.  (One due before the GPU's first registration in the process waits for it.)"""
    N = nvml
    two_gpus(scenario)
    scenario.gpu(0).add_xid(48)  # before anyone registered: waits for the first registration
    scenario.write()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    first = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, first)
    assert N.nvmlEventSetWait(first, 1000).eventData == 48
    N.nvmlEventSetFree(first)
    scenario.gpu(0).add_xid(31)  # nobody watches GPU 0 now
    scenario.write()
    N.nvmlDeviceGetCount()  # the fake reads the changed scenario at a call: the event has occurred
    second = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, second)
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(second, 100)  # neither 48 nor 31: both occurred before it watched
    scenario.gpu(0).add_xid(63)
    scenario.write()
    assert N.nvmlEventSetWait(second, 1000).eventData == 63
    N.nvmlEventSetFree(second)


def test_unregistered_devices_and_types_are_not_delivered(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    two_gpus(scenario)
    scenario.gpu(1).add_xid(79)
    scenario.write()
    N.nvmlInit()
    es = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, es)
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(1), N.nvmlEventTypePState, es)
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(es, 50)


def test_devices_without_event_support(scenario: Scenario, nvml: Any) -> None:
    N = nvml
    two_gpus(scenario)
    scenario.gpu(0).supported_events(Err("NOT_SUPPORTED"))
    scenario.gpu(1).supported_events(0x4)  # PState only
    scenario.write()
    N.nvmlInit()
    es = N.nvmlEventSetCreate()
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetSupportedEventTypes(N.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(1), EVENT_XID_CRITICAL, es)


def test_events_via_delivers_a_gpus_xid_to_another_gpus_set_naming_its_own_device(
    scenario: Scenario, nvml: Any
) -> None:
    """The `events.via` quirk (NVIDIA's mock library): GPU 1's XID arrives in the set that watches GPU
    0, its event naming GPU 1; the set that watches GPU 1 gets nothing."""
    N = nvml
    two_gpus(scenario)
    scenario.gpu(1).events_via(0).add_xid(79)
    scenario.write()
    N.nvmlInit()
    sets = [N.nvmlEventSetCreate() for _ in range(2)]
    for i, es in enumerate(sets):
        N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(i), N.nvmlEventTypeXidCriticalError, es)
    e = N.nvmlEventSetWait(sets[0], 1000)
    assert (N.nvmlDeviceGetIndex(e.device), e.eventData) == (1, 79)
    for es in sets:
        with pytest.raises(N.NVMLError_Timeout):
            N.nvmlEventSetWait(es, 50)
        N.nvmlEventSetFree(es)
