"""Pod attribution on the Kubernetes of 2026, end to end: the daemon on the fake NVML, a fake kubelet
serving answers encoded from its own api.proto, and (for the money) a real Prometheus and
``gpu-exporter report``.

Every way of handing out a GPU is on one node at once: a DRA claim of NVIDIA's driver, GKE's device
plugin with time-sharing, HAMi shares, and NVIDIA's device plugin; plus what names no GPU (a minor
number no GPU has, an IMEX channel of another DRA driver).  The minor numbers are not the indexes,
as on a node where the kernel probed the GPUs in another order, so a key read as an index would
give the wrong pod.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cost_helpers import PRICING, three_gpu_node
from tests.exporter_helpers import RunningDaemon, run_daemon, value, wait_for
from tests.fake_kubelet import FakeClaim, dra_pod, fake_kubelet, pod
from tests.fakenvml import Scenario
from tests.fakenvml.presets import h100_sxm
from tests.prometheus_helpers import prometheus
from tests.test_report_holders_live import report  # the report on node-a's last minute, as JSON
from tests.timing import LATE_S, NEVER_S

pytestmark = pytest.mark.integration  # the daemon, and a real Prometheus

GIB = 1024**3
GPU = "nvidia.com/gpu"
MINORS = (4, 2, 7)  # GPU 0 is /dev/nvidia4, GPU 1 /dev/nvidia2, GPU 2 /dev/nvidia7


def config(path: Path, socket: Path, **extra: Any) -> Path:
    k8s = {"pod_attribution": "on", "pod_resources_socket": str(socket), "refresh_interval": "200ms",
           "timeout": f"{LATE_S:.0f}s"}  # fmt: skip
    path.write_text(yaml.safe_dump({"kubernetes": k8s, **extra}))
    return path


def node(path: Path) -> Scenario:
    s = Scenario(path)
    for i, minor in enumerate(MINORS):
        h100_sxm(s.add_gpu(), "k8s2026", i, util=80, mem_used=20 * GIB, power_mw=400_000).minor_number(minor)
    s.write()
    return s


def uuid(s: Scenario, i: int) -> str:
    return str(s.gpu(i).values["uuid"])


def holders(d: RunningDaemon) -> dict[str, tuple[str, str, str]]:
    out = {}
    for (name, labels), _ in d.metrics().items():
        if name == "gpu_up":
            ls = dict(labels)
            out[ls["gpu"]] = (ls.get("namespace", ""), ls.get("pod", ""), ls.get("container", ""))
    return out


def test_dra_gke_and_hami_pods_on_one_node(tmp_path: Path) -> None:
    s = node(tmp_path / "node.scn")
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [
            dra_pod("ml", "dra-train", "main", FakeClaim("train-gpu", "ml", ["gpu-4"])),  # GPU 0
            pod("ml", "gke-a", ("server", GPU, ["nvidia2/vgpu0"])),  # GPU 1, time-shared
            pod("ml", "gke-b", ("server", GPU, ["nvidia2/vgpu1"])),
            pod("ml", "hami", ("main", GPU, [uuid(s, 2) + "-3"])),  # GPU 2
            dra_pod("ml", "ghost", "main", FakeClaim("ghost-gpu", "ml", ["gpu-9"])),  # no /dev/nvidia9 here
            dra_pod("ml", "imex", "main", FakeClaim("fabric", "ml", ["channel-0"], driver="compute-domain.nvidia.com")),
        ]
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path)
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:
            want = {"0": ("ml", "dra-train", "main"), "1": ("ml", "gke-a,gke-b", "server"), "2": ("ml", "hami", "main")}
            wait_for(lambda: holders(d) == want, timeout=NEVER_S, what="every pod on its GPU")
            info = [dict(ls) for (n, ls), _ in d.metrics().items() if n == "gpu_holder_info"]
            dra = [i for i in info if i["pod"] == "dra-train"]
            assert len(dra) == 1 and (dra[0]["claim_namespace"], dra[0]["claim_name"]) == ("ml", "train-gpu")
            assert dra[0]["gpu"] == "0" and dra[0]["device_uuid"] == uuid(s, 0)
            assert {i["pod"] for i in info} == {"dra-train", "gke-a", "gke-b", "hami"}  # never the ghost
            m = d.metrics()
            unattributed = {r: value(m, "gpu_exporter_pod_attribution_unattributed_devices", reason=r) for r in
                            ("no_such_device", "other_driver", "unparsed", "vfio", "bad_claim")}  # fmt: skip
            assert unattributed == {"no_such_device": 1, "other_driver": 1, "unparsed": 0, "vfio": 0, "bad_claim": 0}
            said = [
                (e["reason"], e["device"]) for e in d.log if e.get("event") == "pod_attribution_device_unattributed"
            ]
            assert sorted(said) == [("no_such_device", "minor:9"), ("other_driver", "compute-domain.nvidia.com")]


def test_mig_devices_through_dra_and_gke(tmp_path: Path) -> None:
    """An A100 (minor 3) in MIG mode: a 3g.40gb at placement 4 claimed through DRA by its name, a
    1g.10gb at placement 0 given by GKE's plugin by its GPU instance; nobody holds the whole GPU."""
    s = Scenario(tmp_path / "node.scn")
    g = s.add_gpu().identity("NVIDIA A100-SXM4-80GB", "GPU-0c8e3f1a-2b4d-4e6f-8a0b-1c2d3e4f5a6b")
    g.minor_number(3).memory(81920 * 1024**2, 20 * GIB, reserved=0).mig_mode(True, max_devices=7)
    big = g.add_mig("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "MIG-1a2b3c4d-0000-5000-8000-000000000001", 2, 0,
                    profile_id=9, placement_start=4)  # fmt: skip
    small = g.add_mig("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG-1a2b3c4d-0000-5000-8000-000000000002", 9, 0,
                      profile_id=19, placement_start=0)  # fmt: skip
    big.memory(40192 * 1024**2, 10 * GIB, reserved=0)
    small.memory(9728 * 1024**2, GIB, reserved=0)
    s.write()
    with fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = [
            dra_pod("ml", "big", "main", FakeClaim("mig-3g", "ml", ["gpu-3-mig-3g40gb-9-4"])),
            pod("ml", "small", ("main", GPU, ["nvidia3/gi9"])),
            # The same profile at another placement: no such MIG device here, so nobody's.
            dra_pod("ml", "elsewhere", "main", FakeClaim("mig-other", "ml", ["gpu-3-mig-3g40gb-9-0"])),
        ]
        cfg = config(tmp_path / "c.yaml", kubelet.socket_path)
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "200ms") as d:

            def mig_pods() -> dict[str, str]:
                return {dict(ls)["mig_profile"]: dict(ls)["pod"] for (n, ls) in d.metrics() if n == "gpu_mig_info"}

            wait_for(lambda: mig_pods() == {"3g.40gb": "big", "1g.10gb": "small"}, timeout=NEVER_S, what="MIG pods")
            assert holders(d) == {"0": ("", "", "")}
            assert value(d.metrics(), "gpu_exporter_pod_attribution_unattributed_devices", reason="no_such_device") == 1


# -- the money: an idle GPU held through DRA or GKE is reclaimed from its pod, never released -----


@pytest.fixture(scope="module")
def minute_of_pods(tmp_path_factory: pytest.TempPathFactory, fake_nvml_lib: Path) -> Iterator[Any]:
    """A minute of the three-GPU cost node: GPU 1 (an idle H100, minor 1) held through a DRA claim, the
    idle L4 (GPU 2, minor 2) by a GKE pod, the busy H100 by nobody."""
    tmp = tmp_path_factory.mktemp("pods2026")
    s = three_gpu_node(tmp / "node.scn")
    s.write()
    with fake_kubelet(tmp) as kubelet:
        kubelet.pods = [
            dra_pod("ml", "dra-train", "main", FakeClaim("train-gpu", "ml", ["gpu-1"])),
            pod("infer", "gke-server", ("server", GPU, ["nvidia2"])),
        ]
        cfg = config(tmp / "c.yaml", kubelet.socket_path, node_name="node-a", pricing=PRICING)
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "1s") as d, \
                prometheus([f"127.0.0.1:{d.port}"], tmp / "prom", labels={"node": "node-a"}) as prom:  # fmt: skip
            wait_for(lambda: len(prom.query('count by (gpu) (gpu_state_seconds_total{pod!=""})')) == 2,
                     timeout=NEVER_S, what="the pods' state counters")  # fmt: skip
            started = time.time()
            wait_for(lambda: time.time() - started >= 68, timeout=120, interval=1, what="a minute of history")
            yield prom


def test_an_idle_gpu_held_through_dra_or_gke_is_reclaimed_from_its_pod(minute_of_pods: Any) -> None:
    recs = {r["gpu"]: r for r in report(minute_of_pods, "--min-history", "30s")["recommendations"]}
    assert recs["1"]["kind"] == "reclaim" and recs["1"]["suggested"] == "reclaim from pod ml/dra-train"
    assert recs["2"]["kind"] == "reclaim" and recs["2"]["suggested"] == "reclaim from pod infer/gke-server"
    assert all(r["kind"] != "release" for r in recs.values())
