"""Pod attribution end to end: the daemon, the fake NVML and a fake kubelet on a unix socket."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerting_helpers import webhook_receiver
from tests.exporter_helpers import RunningDaemon, http_get, run_daemon, value, wait_for
from tests.fake_kubelet import fake_kubelet, pod
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm, mig_uuid, preset
from tests.timing import LATE_S, NEVER_S

pytestmark = pytest.mark.integration

GIB = 1024**3


def config(path: Path, socket: Path, **extra: Any) -> Path:
    # Refreshes that should succeed get LATE_S: a busy machine makes the fake kubelet slow, not wrong.
    k8s = {"pod_attribution": "on", "pod_resources_socket": str(socket), "refresh_interval": "200ms",
           "timeout": f"{LATE_S:.0f}s", **extra.pop("kubernetes", {})}  # fmt: skip
    path.write_text(yaml.safe_dump({"kubernetes": k8s, **extra}))
    return path


def holders(d: RunningDaemon, metric: str = "gpu_up") -> dict[str, tuple[str, str, str]]:
    """gpu -> (namespace, pod, container) on ``metric``."""
    out = {}
    for (name, labels), _ in d.metrics().items():
        if name == metric:
            ls = dict(labels)
            out[ls["gpu"]] = (ls.get("namespace", ""), ls.get("pod", ""), ls.get("container", ""))
    return out


def gpu0(d: RunningDaemon) -> tuple[str, str, str]:
    return holders(d).get("0", ("", "", ""))


def node(path: Path, live_pids: list[int] | None = None) -> Scenario:
    s = Scenario(path)
    for i in range(3):
        g = h100_sxm(s.add_gpu(), "pods", i, util=90, mem_used=40 * GIB, power_mw=400_000)
        for pid in live_pids or []:
            if pid % 3 == i:
                g.add_process(pid, GIB)
    s.write()
    return s


def uuid(s: Scenario, i: int) -> str:
    return str(s.gpu(i).values["uuid"])


def test_whole_gpus_time_slicing_churn_and_alerts(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    s.gpu(2).memory(81559 * 1024**2, int(0.97 * 81559 * 1024**2), reserved=0)  # an alert with pod labels
    s.write()
    with fake_kubelet(tmp_path) as kubelet, webhook_receiver() as hook:
        kubelet.pods = [
            pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [uuid(s, 0)])),
            # Time-slicing: two pods on replicas of GPU 1, under the renamed resource.
            pod("ml", "nb-a", ("jupyter", "nvidia.com/gpu.shared", [uuid(s, 1) + "::0"])),
            pod("ml", "nb-b", ("jupyter", "nvidia.com/gpu.shared", [uuid(s, 1) + "::1"])),
            pod("infer", "triton-2", ("server", "nvidia.com/gpu", [uuid(s, 2)])),
            pod("other", "cpu-job", ("app", "example.com/foo", ["dev0"])),  # not a GPU: ignored
        ]
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path, rules={"GpuMemoryHigh": {"for": "0s"}},
                     alerting={"webhooks": [{"url": hook.url, "group_wait": "0s", "group_interval": "1s"}],
                               "resend_interval": "1s"})  # fmt: skip
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: gpu0(d)[1] == "trainer-0", what="pod labels on GPU 0")
            h = holders(d)
            assert h == {"0": ("ml", "trainer-0", "main"), "1": ("ml", "nb-a,nb-b", "jupyter"),
                         "2": ("infer", "triton-2", "server")}  # fmt: skip
            assert holders(d, "gpu_utilization_ratio") == h  # every per-GPU series carries them
            info = {(dict(ls)["pod"], dict(ls)["device_uuid"]) for (n, ls) in d.metrics() if n == "gpu_pod_info"}
            assert info == {("trainer-0", uuid(s, 0)), ("nb-a", uuid(s, 1)), ("nb-b", uuid(s, 1)),
                            ("triton-2", uuid(s, 2))}  # fmt: skip
            # The alert on GPU 2 names the pod that holds it.
            wait_for(lambda: any(a["labels"].get("pod") == "triton-2" for a in hook.alerts()), what="alert labels")
            # A poll can come before the kubelet's first answer (on a busy machine, often): the alert
            # fires without pod labels first, then as another alert with them.
            alert = next(a for a in hook.alerts() if a["labels"]["alertname"] == "GpuMemoryHigh"
                         and a["labels"].get("pod") == "triton-2")  # fmt: skip
            assert alert["labels"]["namespace"] == "infer" and alert["labels"]["container"] == "server"
            # Pod churn: trainer-0 leaves, a new pod takes GPU 0.
            kubelet.pods = [p for p in kubelet.pods if p.name != "trainer-0"]
            wait_for(lambda: gpu0(d) == ("", "", ""), what="the pod's labels gone")
            kubelet.pods.append(pod("ml", "trainer-1", ("main", "nvidia.com/gpu", [uuid(s, 0)])))
            wait_for(lambda: gpu0(d) == ("ml", "trainer-1", "main"), what="the new pod")
            assert (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="ok") or 0) >= 3


def test_mig_devices_are_attributed(tmp_path: Path) -> None:
    s = preset("a100-mig", tmp_path / "node.scn")
    s.write()
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [
            pod("ml", "big", ("main", "nvidia.com/mig-3g.40gb", [mig_uuid("mig", 0, 0)])),
            pod("ml", "small", ("main", "nvidia.com/mig-1g.10gb", [mig_uuid("mig", 0, 2)])),
        ]
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path)
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:

            def mig_pods() -> dict[str, str]:
                return {dict(ls)["mig_profile"]: dict(ls)["pod"] for (n, ls) in d.metrics() if n == "gpu_mig_info"}

            wait_for(lambda: mig_pods() == {"3g.40gb": "big", "2g.20gb": "", "1g.10gb": "small"}, what="MIG pods")
            assert gpu0(d) == ("", "", "")  # no pod holds the whole GPU


def test_a_hanging_kubelet_stalls_neither_polls_nor_scrapes(tmp_path: Path) -> None:
    """The kubelet call hangs for its timeout, NEVER_S: polls or scrapes that waited for it would
    stall that long, not the LATE_S allowed here."""
    s = node(tmp_path / "node.scn")
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [uuid(s, 0)]))]
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path, kubernetes={"timeout": f"{NEVER_S:.0f}s"})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: gpu0(d)[1] == "trainer-0", what="attribution")
            with kubelet.lock:  # every call counted from now on hangs
                kubelet.hang = float("inf")
                calls = kubelet.calls
            wait_for(lambda: kubelet.calls > calls, what="a refresh hanging")
            polls = value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_poll_duration_seconds_count") or 0) >= polls + 5,
                     timeout=LATE_S, what="polls continuing")  # fmt: skip
            for _ in range(5):
                t1 = time.monotonic()
                http_get(d.url + "/metrics")
                assert time.monotonic() - t1 < LATE_S
            assert gpu0(d)[1] == "trainer-0", "the last good labels, while the refresh hangs"
            kubelet.release()
            kubelet.hang = 0


def test_a_kubelet_that_keeps_timing_out_keeps_the_last_good_labels(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [uuid(s, 0)]))]
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path, kubernetes={"timeout": "2s"})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: gpu0(d)[1] == "trainer-0", what="attribution")
            kubelet.hang = float("inf")
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="error") or 0) >= 1,
                     what="the failed refresh counted")  # fmt: skip
            # A kubelet that hangs keeps the last good labels (within keep_last_good_for).
            errors = value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="error") or 0
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="error") or 0)
                     >= errors + 2, timeout=10, what="two more failed refreshes")  # fmt: skip
            assert gpu0(d)[1] == "trainer-0"
            kubelet.release()
            kubelet.hang = 0
            wait_for(lambda: gpu0(d)[1] == "trainer-0", timeout=20, what="recovery")


def test_missing_socket_turns_attribution_off_with_one_line(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    with fake_kubelet(tmp_path, start=False) as kubelet:
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path)
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="missing") or 0) >= 3,
                     what="refreshes finding no socket")  # fmt: skip
            assert value(d.metrics(), "gpu_up", gpu="0") == 1  # metrics carry on
            off = [e for e in d.log if e.get("event") == "pod_attribution_off"]
            assert len(off) == 1 and str(kubelet.socket_path) in json.dumps(off[0])
            kubelet.pods = [pod("ml", "late", ("main", "nvidia.com/gpu", [uuid(s, 0)]))]
            kubelet.start()  # the kubelet comes up later
            wait_for(lambda: gpu0(d)[1] == "late", what="attribution on once the socket appears")


def test_attribution_off_leaves_no_pod_labels(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"kubernetes": {"pod_attribution": "off"}}))
    with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
        wait_for(lambda: value(d.metrics(), "gpu_up", gpu="0") == 1, what="first poll")
        labels = next(dict(ls) for (n, ls) in d.metrics() if n == "gpu_up")
        assert set(labels) == {"gpu", "uuid"}
        assert not [n for (n, _) in d.metrics() if n == "gpu_pod_info"]


def test_the_kubelet_socket_vanishing_and_coming_back(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [uuid(s, 0)]))]
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path)
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: gpu0(d)[1] == "trainer-0", what="attribution")
            kubelet.stop()  # the kubelet restarts: its socket is gone for a while
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="missing") or 0) >= 3,
                     what="refreshes finding no socket")  # fmt: skip
            assert gpu0(d) == ("ml", "trainer-0", "main"), "the last good labels outlive a restart"
            assert value(d.metrics(), "gpu_up", gpu="0") == 1
            kubelet.start()
            ok = value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="ok") or 0
            wait_for(lambda: (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="ok") or 0) > ok,
                     what="attribution back")  # fmt: skip
            assert gpu0(d)[1] == "trainer-0"


def test_pod_labels_are_dropped_after_keep_last_good_for_with_a_log_line_and_a_count(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [uuid(s, 0)]))]
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path, kubernetes={"keep_last_good_for": "1s"})
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            wait_for(lambda: gpu0(d)[1] == "trainer-0", what="attribution")
            m = d.metrics()
            assert value(m, "gpu_exporter_pod_attribution_expired_total") == 0
            assert [value(m, "gpu_exporter_kubelet_refreshes_total", outcome=o) for o in ("error", "missing")] == [0, 0]
            kubelet.fail = True
            wait_for(lambda: gpu0(d) == ("", "", ""), what="labels dropped after the bound")
            assert value(d.metrics(), "gpu_exporter_pod_attribution_expired_total") == 1
            expired = [e for e in d.log if e.get("event") == "pod_attribution_expired"]
            assert len(expired) == 1 and expired[0]["level"] == "warning"
            kubelet.fail = False
            wait_for(lambda: gpu0(d)[1] == "trainer-0", what="attribution back")
            assert value(d.metrics(), "gpu_exporter_pod_attribution_expired_total") == 1
