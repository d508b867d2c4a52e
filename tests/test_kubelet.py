"""Pod attribution from the kubelet's PodResources API, against a real gRPC server on a unix socket."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gpu_exporter.kubernetes import kubelet as kubelet_module
from gpu_exporter.kubernetes.devices import Unattributed, device_plugin_key
from gpu_exporter.kubernetes.kubelet import PodRef, PodResourcesWatcher
from tests import assert_mentions
from tests.fake_kubelet import FakeKubelet, fake_kubelet, pod, socket_path_in
from tests.timing import LATE_S, NEVER_S, wait_until

GPU = "nvidia.com/gpu"


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, outcome: str) -> None:
        with self.lock:
            self.seen.append(outcome)

    @property
    def last(self) -> str | None:
        with self.lock:
            return self.seen[-1] if self.seen else None


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with fake_kubelet(tmp_path) as k:
        yield k


@contextmanager
def watcher_for(path: Path, **kwargs: Any) -> Iterator[PodResourcesWatcher]:
    kwargs.setdefault("timeout", LATE_S)  # calls that should succeed: a busy machine is slow, not wrong
    w = PodResourcesWatcher(str(path), **kwargs)
    try:
        yield w
    finally:
        w.stop()


def ref(namespace: str, name: str, container: str = "main") -> PodRef:
    return PodRef(namespace=namespace, pod=name, container=container)


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


# -- what the mapping holds ----------------------------------------------------------------------


def test_whole_gpus_by_uuid(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("ml", "trainer-0", ("main", GPU, ["GPU-aaaa", "GPU-bbbb"])),
        pod("ml", "infer-7", ("server", GPU, ["GPU-cccc"]), ("sidecar", "cpu", ["0", "1"])),
        pod("kube-system", "no-gpus", ("main", "cpu", ["2"])),
    ]
    outcomes = Outcomes()
    with watcher_for(kubelet.socket_path, outcome=outcomes) as w:
        assert not w.available
        assert w.refresh()
        assert dict(w.devices()) == {
            "GPU-aaaa": (ref("ml", "trainer-0"),),
            "GPU-bbbb": (ref("ml", "trainer-0"),),
            "GPU-cccc": (ref("ml", "infer-7", "server"),),
        }
        assert w.available
        assert outcomes.seen == ["ok"]


def test_mig_devices(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("a", "small", ("main", "nvidia.com/mig-1g.10gb", ["MIG-1111", "MIG-2222"])),
        pod("b", "big", ("main", "nvidia.com/mig-3g.40gb", ["MIG-3333"]), ("main", GPU, ["GPU-dddd"])),
        # Time-sliced MIG devices, renamed by the plugin: still a MIG prefix.
        pod("c", "shared", ("main", "nvidia.com/mig-1g.10gb.shared", ["MIG-4444::1"])),
    ]
    with watcher_for(kubelet.socket_path) as w:
        assert w.refresh()
        assert dict(w.devices()) == {
            "MIG-1111": (ref("a", "small"),),
            "MIG-2222": (ref("a", "small"),),
            "MIG-3333": (ref("b", "big"),),
            "GPU-dddd": (ref("b", "big"),),
            "MIG-4444": (ref("c", "shared"),),
        }


def test_time_slicing_lists_every_pod_on_the_gpu(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("team-b", "notebook", ("main", GPU, ["GPU-x::1"])),
        pod("team-a", "notebook", ("main", GPU, ["GPU-x::0"])),
        # Two replicas of the same GPU in one container count once.
        pod("team-a", "batch", ("worker", GPU, ["GPU-x::2", "GPU-x::3"]), ("helper", GPU, ["GPU-y::0"])),
    ]
    with watcher_for(kubelet.socket_path) as w:
        assert w.refresh()
        assert dict(w.devices()) == {
            "GPU-x": (ref("team-a", "batch", "worker"), ref("team-a", "notebook"), ref("team-b", "notebook")),
            "GPU-y": (ref("team-a", "batch", "helper"),),
        }


def test_index_style_ids(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("ns", "whole", ("main", GPU, ["0"])),
        pod("ns", "sliced", ("main", GPU, ["1::2"])),
        pod("ns", "mig", ("main", "nvidia.com/mig-1g.5gb", ["0:1", "2:0::3"])),
    ]
    with watcher_for(kubelet.socket_path) as w:
        assert w.refresh()
        assert dict(w.devices()) == {
            "index:0": (ref("ns", "whole"),),
            "index:1": (ref("ns", "sliced"),),
            "index:0:1": (ref("ns", "mig"),),
            "index:2:0": (ref("ns", "mig"),),
        }


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("GPU-8f6b4b3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "GPU-8f6b4b3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"),
        ("MIG-0e2e0e6c-1a2b-5c3d-9e8f-7a6b5c4d3e2f", "MIG-0e2e0e6c-1a2b-5c3d-9e8f-7a6b5c4d3e2f"),
        ("MIG-GPU-abcd/1/0", "MIG-GPU-abcd/1/0"),  # the pre-R470 MIG id form
        ("GPU-abc::3", "GPU-abc"),
        ("MIG-abc::0", "MIG-abc"),
        ("0", "index:0"),
        ("12", "index:12"),
        ("1::2", "index:1"),
        ("0:1", "index:0:1"),
        ("3:2::7", "index:3:2"),
        # GKE's device plugin: the minor number, a MIG GPU instance, time-sharing on either.
        ("nvidia0", "minor:0"),
        ("nvidia12", "minor:12"),
        ("nvidia1/vgpu3", "minor:1"),
        ("nvidia0/gi1", "minor:0:gi:1"),
        ("nvidia0/gi7/vgpu0", "minor:0:gi:7"),
        # HAMi: a share of a GPU is its UUID and the share's number.
        ("GPU-8f6b4b3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b-0", "GPU-8f6b4b3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"),
        ("GPU-8f6b4b3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b-9", "GPU-8f6b4b3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"),
    ],
)
def test_device_plugin_ids(raw: str, key: str) -> None:
    assert device_plugin_key(raw) == key


@pytest.mark.parametrize(
    "raw", ["some-other-id", "nvidia", "nvidia01", "nvidia0/gi", "nvidia0/ci0", "nvidia0/vgpu1/gi0", "01", "1:2:3", ""]
)
def test_a_device_id_in_no_known_form_names_no_gpu(raw: str) -> None:
    assert device_plugin_key(raw) == Unattributed("unparsed", raw)


def test_only_gpu_resources_count_by_default(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("ns", "p", ("main", GPU, ["GPU-a"]), ("main", "cpu", ["0"]), ("main", "example.com/foo", ["GPU-b"])),
        pod("ns", "q", ("main", "nvidia.com/gpu-other", ["GPU-c"]), ("main", "amd.com/gpu", ["1"])),
    ]
    with watcher_for(kubelet.socket_path) as w:
        assert w.refresh()
        assert dict(w.devices()) == {"GPU-a": (ref("ns", "p"),)}


def test_resource_names_are_configurable(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("ns", "p", ("main", GPU, ["GPU-a"]), ("main", "example.com/foo", ["GPU-b"])),
        pod("ns", "q", ("main", "example.com/mig-x", ["MIG-c"]), ("main", "nvidia.com/mig-1g.5gb", ["MIG-d"])),
        pod("ns", "r", ("main", "nvidia.com/gpu.shared", ["GPU-e::1"])),
    ]
    names = ("example.com/foo", "nvidia.com/gpu.shared")
    with watcher_for(kubelet.socket_path, resource_names=names, resource_prefixes=("example.com/mig-",)) as w:
        assert w.refresh()
        assert dict(w.devices()) == {
            "GPU-b": (ref("ns", "p"),),
            "MIG-c": (ref("ns", "q"),),
            "GPU-e": (ref("ns", "r"),),
        }


def test_the_mapping_is_immutable(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
    with watcher_for(kubelet.socket_path) as w:
        assert w.refresh()
        devices = w.devices()
        with pytest.raises(TypeError):
            devices["GPU-z"] = ()  # type: ignore[index]
        with pytest.raises(AttributeError):
            devices["GPU-a"][0].pod = "other"  # type: ignore[misc]


# -- change over time ----------------------------------------------------------------------------


def test_pod_churn(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ns", "old", ("main", GPU, ["GPU-a"])), pod("ns", "stays", ("main", GPU, ["GPU-b"]))]
    with watcher_for(kubelet.socket_path) as w:
        assert w.refresh()
        before = w.devices()
        assert set(before) == {"GPU-a", "GPU-b"}
        kubelet.pods = [pod("ns", "stays", ("main", GPU, ["GPU-b"])), pod("ns", "new", ("main", GPU, ["GPU-c"]))]
        assert dict(w.devices()) == dict(before)  # nothing changes until the next refresh
        assert w.refresh()
        assert dict(w.devices()) == {"GPU-b": (ref("ns", "stays"),), "GPU-c": (ref("ns", "new"),)}
        kubelet.pods = []
        assert w.refresh()
        assert dict(w.devices()) == {}
        assert dict(before) == {"GPU-a": (ref("ns", "old"),), "GPU-b": (ref("ns", "stays"),)}  # old map untouched


def test_background_thread_refreshes_on_its_interval(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ns", "first", ("main", GPU, ["GPU-a"]))]
    outcomes = Outcomes()
    with watcher_for(kubelet.socket_path, refresh_interval=0.05, outcome=outcomes) as w:
        w.start()
        assert wait_until(lambda: "GPU-a" in w.devices()), "the first refresh runs at start"
        kubelet.pods = [pod("ns", "second", ("main", GPU, ["GPU-b"]))]
        assert wait_until(lambda: dict(w.devices()) == {"GPU-b": (ref("ns", "second"),)})
        calls = kubelet.calls
        assert wait_until(lambda: kubelet.calls >= calls + 3), "keeps refreshing"
        w.stop()
        stopped_at = kubelet.calls
    time.sleep(0.2)  # a few intervals: no more calls once stopped
    assert kubelet.calls <= stopped_at + 1
    assert set(outcomes.seen) == {"ok"}


# -- failures ------------------------------------------------------------------------------------


class FakeClock:
    """Monotonic seconds that a test moves on by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Expiries:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_a_failing_kubelet_keeps_the_last_good_mapping_then_drops_it_after_the_bound(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
    outcomes, expiries, clock = Outcomes(), Expiries(), FakeClock()
    good = {"GPU-a": (ref("ns", "p"),)}
    with capture_logs() as logs, watcher_for(kubelet.socket_path, outcome=outcomes, keep_last_good_for=300,
                                             expired=expiries, clock=clock) as w:  # fmt: skip
        assert w.refresh()
        kubelet.fail = True
        for _ in range(3):
            clock.now += 99
            assert not w.refresh()
            assert dict(w.devices()) == good, "a failed refresh keeps the pods of the last successful one"
            assert not w.available
        assert outcomes.seen == ["ok", "error", "error", "error"]
        failures = events(logs, "pod_attribution_failed")
        assert len(failures) == 1, "one warning per distinct reason, not one per refresh"
        assert failures[0]["log_level"] == "warning"
        assert failures[0]["reason"] == "UNAVAILABLE"
        assert "failing on purpose" in failures[0]["error"]
        assert expiries.count == 0 and not events(logs, "pod_attribution_expired")
        clock.now += 3  # 300 s since the last success
        assert not w.refresh()
        assert dict(w.devices()) == {}, "no pod labels from a kubelet silent for longer than the bound"
        expired = events(logs, "pod_attribution_expired")
        assert expiries.count == 1 and len(expired) == 1
        assert expired[0]["log_level"] == "warning" and expired[0]["devices"] == 1
        clock.now += 1000
        assert not w.refresh()
        assert expiries.count == 1, "dropped, logged and counted once"
        assert len(events(logs, "pod_attribution_expired")) == 1
        kubelet.fail = False
        assert w.refresh()
        assert dict(w.devices()) == good
        assert w.available
        assert outcomes.last == "ok"
        assert len(events(logs, "pod_attribution_on")) == 2  # at first, and again on recovery


def test_a_pod_leaves_only_when_a_successful_list_no_longer_shows_it(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"])), pod("ns", "q", ("main", GPU, ["GPU-b"]))]
    with watcher_for(kubelet.socket_path) as w:
        assert w.refresh()
        kubelet.pods = [kubelet.pods[1]]
        kubelet.fail = True
        assert not w.refresh()
        assert set(w.devices()) == {"GPU-a", "GPU-b"}
        kubelet.fail = False
        assert w.refresh()
        assert set(w.devices()) == {"GPU-b"}


def test_hanging_kubelet_costs_at_most_the_timeout(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
    outcomes = Outcomes()
    timeout = 0.5
    with watcher_for(kubelet.socket_path, timeout=timeout, outcome=outcomes) as w:
        assert w.refresh()
        kubelet.hang = math.inf
        results: list[bool] = []
        t0 = time.monotonic()
        caller = threading.Thread(target=lambda: results.append(w.refresh()))
        caller.start()
        assert wait_until(lambda: kubelet.calls == 2)
        caller.join(timeout + LATE_S)
        elapsed = time.monotonic() - t0
        assert results == [False]
        assert timeout * 0.9 <= elapsed < timeout + LATE_S
        assert dict(w.devices()) == {"GPU-a": (ref("ns", "p"),)}, "the last good mapping outlives a timeout"
        assert outcomes.last == "error"
        kubelet.release()
        assert w.refresh(), "the next refresh tries again"
        assert dict(w.devices()) == {"GPU-a": (ref("ns", "p"),)}


def test_readers_get_the_last_mapping_while_a_call_hangs(kubelet: FakeKubelet) -> None:
    """The call hangs until released and has NEVER_S: a reader that waited for it would still be
    waiting, so getting the mapping while the call is in flight proves it did not."""
    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
    with watcher_for(kubelet.socket_path, timeout=NEVER_S) as w:
        assert w.refresh()
        kubelet.hang = math.inf
        caller = threading.Thread(target=w.refresh)
        caller.start()
        assert wait_until(lambda: kubelet.calls == 2)
        assert dict(w.devices()) == {"GPU-a": (ref("ns", "p"),)}
        in_flight = caller.is_alive()
        kubelet.release()
        caller.join(NEVER_S)
    assert in_flight, "the reader waited for the call"


def test_stop_returns_promptly_while_the_kubelet_hangs(kubelet: FakeKubelet) -> None:
    """The kubelet hangs and the call has NEVER_S: only stop()'s cancel can end it within LATE_S."""
    kubelet.hang = math.inf
    outcomes = Outcomes()
    w = PodResourcesWatcher(str(kubelet.socket_path), timeout=NEVER_S, refresh_interval=0.05, outcome=outcomes)
    w.start()
    assert not outcomes.seen, "start() does not wait for the kubelet"
    assert wait_until(lambda: kubelet.calls >= 1)
    s0 = time.monotonic()
    w.stop()
    assert time.monotonic() - s0 < kubelet_module.STOP_JOIN_S + LATE_S
    assert wait_until(lambda: not w._thread.is_alive(), timeout=LATE_S), "the closed channel ends the call"
    assert not w.refresh(), "a stopped watcher does not call again"


def test_a_socket_that_never_speaks_grpc(tmp_path: Path) -> None:
    """Something listens on the socket but never answers (a wedged kubelet): bounded by the timeout."""
    path = socket_path_in(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)  # connections queue in the backlog; nobody ever accepts or answers
    outcomes = Outcomes()
    try:
        with watcher_for(path, timeout=0.3, outcome=outcomes) as w:
            t0 = time.monotonic()
            assert not w.refresh()
            assert time.monotonic() - t0 < 0.3 + LATE_S
            assert outcomes.seen == ["error"]
            assert dict(w.devices()) == {}
    finally:
        listener.close()


def test_missing_socket_turns_attribution_off_then_on(tmp_path: Path) -> None:
    outcomes = Outcomes()
    with (
        fake_kubelet(tmp_path, start=False) as kubelet,
        capture_logs() as logs,
        watcher_for(kubelet.socket_path, outcome=outcomes) as w,
    ):
        for _ in range(3):
            assert not w.refresh()
        assert outcomes.seen == ["missing"] * 3
        assert not w.available
        assert dict(w.devices()) == {}
        off = events(logs, "pod_attribution_off")
        assert len(off) == 1, "one line, then quiet checks"
        assert off[0]["log_level"] == "info"
        assert_mentions(off[0]["detail"], "pod-resources socket", str(kubelet.socket_path), "not found",
                        "pod attribution is off")  # fmt: skip
        assert not events(logs, "pod_attribution_failed")

        kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
        kubelet.start()
        assert w.refresh()
        assert w.available
        assert outcomes.last == "ok"
        assert dict(w.devices()) == {"GPU-a": (ref("ns", "p"),)}
        on = events(logs, "pod_attribution_on")
        assert len(on) == 1 and on[0]["log_level"] == "info"


def test_kubelet_restart(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
    outcomes = Outcomes()
    with watcher_for(kubelet.socket_path, outcome=outcomes) as w:
        assert w.refresh()
        kubelet.stop()  # its socket goes away while it restarts
        assert not w.refresh()
        assert dict(w.devices()) == {"GPU-a": (ref("ns", "p"),)}, "a restart is no reason to forget the pods"
        kubelet.pods = [pod("ns", "q", ("main", GPU, ["GPU-a"]))]
        kubelet.start()
        assert w.refresh(), "a new channel: no wait for gRPC's reconnect backoff"
        assert dict(w.devices()) == {"GPU-a": (ref("ns", "q"),)}
        assert outcomes.seen == ["ok", "missing", "ok"]


def test_a_kubelet_gone_for_longer_than_the_bound_takes_the_pods_with_it(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
    clock, expiries = FakeClock(), Expiries()
    with watcher_for(kubelet.socket_path, keep_last_good_for=60, clock=clock, expired=expiries) as w:
        assert w.refresh()
        kubelet.stop()
        clock.now += 59.9
        assert not w.refresh()
        assert "GPU-a" in w.devices()
        clock.now += 0.1
        assert not w.refresh()
        assert dict(w.devices()) == {} and expiries.count == 1


def test_background_thread_finds_a_late_socket(tmp_path: Path) -> None:
    outcomes = Outcomes()
    with fake_kubelet(tmp_path, start=False) as kubelet:
        kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
        with watcher_for(kubelet.socket_path, refresh_interval=0.05, outcome=outcomes) as w:
            w.start()
            assert wait_until(lambda: outcomes.seen.count("missing") >= 2)
            kubelet.start()
            assert wait_until(lambda: w.available)
            assert dict(w.devices()) == {"GPU-a": (ref("ns", "p"),)}


# -- robustness ----------------------------------------------------------------------------------


def test_start_never_raises(tmp_path: Path) -> None:
    def broken_outcome(outcome: str) -> None:
        raise RuntimeError("metrics are broken")

    # No such directory; a callback that raises; started twice; started after stop.
    w = PodResourcesWatcher(str(tmp_path / "no" / "such" / "kubelet.sock"), refresh_interval=0.01,
                            outcome=broken_outcome)  # fmt: skip
    w.start()
    w.start()
    assert wait_until(lambda: not w.available and w._state == "missing")
    w.stop()
    w.start()
    w.stop()

    # A path that exists but is not a socket: the call fails, nothing escapes.
    outcomes = Outcomes()
    (tmp_path / "not-a-socket").mkdir()
    w = PodResourcesWatcher(str(tmp_path / "not-a-socket"), timeout=0.5, outcome=outcomes)
    assert not w.refresh()
    assert outcomes.seen == ["error"]
    w.stop()

    # Never started: stop() is harmless.
    PodResourcesWatcher(str(tmp_path / "x.sock")).stop()


def test_refresh_survives_a_raising_outcome_callback(kubelet: FakeKubelet) -> None:
    def broken_outcome(outcome: str) -> None:
        raise RuntimeError("metrics are broken")

    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
    with capture_logs() as logs, watcher_for(kubelet.socket_path, outcome=broken_outcome) as w:
        assert w.refresh()
        assert w.refresh()
        assert "GPU-a" in w.devices()
        assert len(events(logs, "pod_attribution_outcome_callback_failed")) == 1


def test_an_unexpected_error_is_a_failed_refresh(kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise KeyError("surprise")

    kubelet.pods = [pod("ns", "p", ("main", GPU, ["GPU-a"]))]
    outcomes = Outcomes()
    with capture_logs() as logs, watcher_for(kubelet.socket_path, outcome=outcomes) as w:
        assert w.refresh()
        with monkeypatch.context() as m:
            m.setattr(kubelet_module, "build_device_map", broken)
            assert not w.refresh()
            assert not w.refresh()
        assert dict(w.devices()) == {"GPU-a": (ref("ns", "p"),)}
        failures = events(logs, "pod_attribution_failed")
        assert len(failures) == 1 and failures[0]["reason"] == "KeyError" and failures[0]["exc_info"] is True
        assert w.refresh()
        assert outcomes.seen == ["ok", "error", "error", "ok"]


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        PodResourcesWatcher(timeout=0)
    with pytest.raises(ValueError):
        PodResourcesWatcher(refresh_interval=-1)
    with pytest.raises(ValueError):
        PodResourcesWatcher(keep_last_good_for=0)
