"""Joining the kubelet's device assignments into snapshots: GPUs, MIG devices and processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpu_exporter.kubernetes.attribution import Attributor, ProcInfo, read_proc
from gpu_exporter.serving.metrics import RenderOptions, gpu_families
from gpu_exporter.snapshot import GpuReading, MigReading, NodeSnapshot, PodRef, ProcessReading, pod_label_values
from tests.timing import NEVER_S

pytestmark = pytest.mark.integration

A = PodRef("ml", "trainer-0", "main")
B = PodRef("ml", "notebook-7", "jupyter")
C = PodRef("infer", "triton-2", "server")


def gpu(index: int, uuid: str, *procs: ProcessReading, migs: tuple[MigReading, ...] = ()) -> GpuReading:
    return GpuReading(index=index, uuid=uuid, up=True, processes=procs, migs=migs)


def proc(pid: int, used: int = 1) -> ProcessReading:
    return ProcessReading(pid=pid, name="python3", used_memory_bytes=used)


def uid_of(name: str | None) -> str:
    """A pod UID as the kubelet makes them, one per pod name."""
    n = abs(hash(name)) % 10**12
    return f"0b8f0c3e-1d2a-4b5c-8d9e-{n:012d}"


def in_pod(hostname: str | None = None, uid: str | None = None) -> ProcInfo:
    """A process of the pod named ``hostname`` (its cgroup carries that pod's UID unless ``uid`` says otherwise)."""
    return ProcInfo(visible=True, in_pod=True, pod_uid=uid or uid_of(hostname), hostname=hostname)


def test_whole_gpus_by_uuid_and_by_index() -> None:
    mapping = {"GPU-a": (A,), "index:1": (C,)}
    out = Attributor(lambda: mapping, lambda pid: in_pod()).attach((gpu(0, "GPU-a", proc(10)), gpu(1, "GPU-b")))
    assert out[0].pods == (A,) and out[0].processes[0].pod == A
    assert out[1].pods == (C,)


def test_time_slicing_picks_the_process_pod_by_hostname() -> None:
    mapping = {"GPU-a": (A, B)}
    procs = {10: in_pod("trainer-0"), 11: in_pod("notebook-7"), 12: in_pod(None)}
    out = Attributor(lambda: mapping, procs.__getitem__).attach((gpu(0, "GPU-a", proc(10), proc(11), proc(12)),))
    g = out[0]
    assert g.pods == (B, A)  # both holders, in a stable order
    assert [p.pod for p in g.processes] == [A, B, None]  # without a hostname the pod is unknown
    assert pod_label_values(g.pods) == ("ml", "notebook-7,trainer-0", "jupyter,main")


def test_node_processes_get_no_pod() -> None:
    out = Attributor(lambda: {"GPU-a": (A,)}, lambda pid: ProcInfo(visible=True, in_pod=False)).attach(
        (gpu(0, "GPU-a", proc(1)),)
    )
    assert out[0].processes[0].pod is None  # Xorg on a GPU that a pod holds is still not the pod's


def test_without_host_pid_a_single_holder_still_attributes() -> None:
    hidden = ProcInfo(visible=False)
    one = Attributor(lambda: {"GPU-a": (A,)}, lambda pid: hidden).attach((gpu(0, "GPU-a", proc(10)),))
    assert one[0].processes[0].pod == A
    shared = Attributor(lambda: {"GPU-a": (A, B)}, lambda pid: hidden).attach((gpu(0, "GPU-a", proc(10)),))
    assert shared[0].processes[0].pod is None


def test_mig_devices_by_uuid_and_index() -> None:
    m0 = MigReading(0, "MIG-x", "3g.40gb", 1, 0, processes=(proc(20),))
    m1 = MigReading(1, "MIG-y", "1g.10gb", 13, 0, processes=(proc(21),))
    mapping = {"MIG-x": (A,), "index:0:1": (C,)}
    out = Attributor(lambda: mapping, lambda pid: in_pod()).attach(
        (gpu(0, "GPU-a", proc(20), proc(21), migs=(m0, m1)),)
    )
    g = out[0]
    assert [m.pods for m in g.migs] == [(A,), (C,)]
    assert [m.processes[0].pod for m in g.migs] == [A, C]
    assert g.pods == ()  # nobody holds the whole GPU
    assert [p.pod for p in g.processes] == [None, None]  # two pods on the parent: needs a hostname to pick


def test_pods_leave_with_the_mapping_and_the_cache_is_pruned() -> None:
    mapping: dict[str, tuple[PodRef, ...]] = {"GPU-a": (A,)}
    calls: list[int] = []

    def reader(pid: int) -> ProcInfo:
        calls.append(pid)
        return in_pod()

    attr = Attributor(lambda: mapping, reader)
    attr.attach((gpu(0, "GPU-a", proc(10)),))
    attr.attach((gpu(0, "GPU-a", proc(10)),))
    assert calls == [10]  # /proc is read once per process, not per poll
    mapping.clear()
    out = attr.attach((gpu(0, "GPU-a", proc(11)),))
    assert out[0].pods == () and out[0].processes[0].pod is None


def test_pod_labels_on_series() -> None:
    snap = NodeSnapshot(taken_at=0, duration_seconds=0, nvml_up=True,
                        gpus=Attributor(lambda: {"GPU-a": (A,)}, lambda pid: in_pod()).attach(
                            (gpu(0, "GPU-a", proc(10, 5)), gpu(1, "GPU-b"))))  # fmt: skip
    opts = RenderOptions(pod_labels=("k8s_namespace", "k8s_pod", "k8s_container"))
    samples = {(s.name, tuple(sorted(s.labels.items()))) for fam in gpu_families(snap, opts) for s in fam.samples}
    up0 = next(dict(ls) for n, ls in samples if n == "gpu_up" and ("gpu", "0") in ls)
    assert (up0["k8s_namespace"], up0["k8s_pod"], up0["k8s_container"]) == ("ml", "trainer-0", "main")
    up1 = next(dict(ls) for n, ls in samples if n == "gpu_up" and ("gpu", "1") in ls)
    assert up1["k8s_pod"] == ""  # nobody holds it: an empty label, which Prometheus treats as absent
    proc_labels = next(dict(ls) for n, ls in samples if n == "gpu_process_memory_used_bytes")
    assert proc_labels["k8s_pod"] == "trainer-0" and proc_labels["pid"] == "10"
    info = [dict(ls) for n, ls in samples if n == "gpu_pod_info"]
    assert info == [{"gpu": "0", "uuid": "GPU-a", "k8s_namespace": "ml", "k8s_pod": "trainer-0",
                     "k8s_container": "main", "device_uuid": "GPU-a"}]  # fmt: skip
    assert not any(n == "gpu_pod_info" for n, _ in
                   {(s.name, 0) for fam in gpu_families(snap) for s in fam.samples})  # fmt: skip


def test_read_proc_of_a_real_process(tmp_path: Path) -> None:
    env = {**os.environ, "HOSTNAME": "trainer-0"}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + NEVER_S  # until the child has exec'd: seconds on a busy machine
        info = read_proc(p.pid)
        while info.hostname is None and time.monotonic() < deadline:
            time.sleep(0.01)
            info = read_proc(p.pid)
        assert info.visible and info.hostname == "trainer-0"
        # The child shares this test's cgroup: in a pod only if the test itself runs in one.
        assert info.in_pod == ("kubepods" in Path("/proc/self/cgroup").read_text())
    finally:
        p.kill()
        p.wait()
    assert read_proc(999_999_999) == ProcInfo(visible=False)


# -- claims checked against pod UIDs (issue 28, point 5) -------------------------------------------------
def test_a_pod_that_claims_another_pods_name_is_not_billed_as_it() -> None:
    """A pod's heavy process run with HOSTNAME=victim was labelled pod="victim" and billed to it."""
    victim, attacker = PodRef("ml", "victim", "main"), PodRef("ml", "attacker", "main")
    mapping = {"GPU-a": (attacker, victim)}
    procs = {10: in_pod("victim"), 20: in_pod("victim", uid=uid_of("attacker")), 21: in_pod("attacker")}
    with capture_logs() as logs:
        out = Attributor(lambda: mapping, procs.__getitem__).attach((gpu(0, "GPU-a", proc(10), proc(20), proc(21)),))
    pods = {p.pid: p.pod for p in out[0].processes}
    assert pods[20] is None and pods[21] is None  # the attacker's UID claims two names: refused altogether
    assert pods[10] is None  # the name is contested this round: nobody gets it
    refused = [e for e in logs if e["event"] == "pod_attribution_claim_refused"]
    assert {e["pod_uid"] for e in refused} == {uid_of("attacker"), uid_of("victim")}


def test_a_name_stays_with_the_uid_it_was_given_to() -> None:
    """The victim ran first; later, while the victim's pod still holds the GPU but has no process on
    it, another UID claiming the victim's name is refused.  When the pod is gone, a new pod of that
    name (a new UID) gets it."""
    victim, attacker = PodRef("ml", "victim", "main"), PodRef("ml", "attacker", "main")
    holders: dict[str, tuple[PodRef, ...]] = {"GPU-a": (attacker, victim)}
    procs = {10: in_pod("victim"), 20: in_pod("victim", uid=uid_of("attacker")),
             30: in_pod("victim", uid=uid_of("victim, recreated"))}  # fmt: skip
    a = Attributor(lambda: holders, procs.__getitem__)
    assert a.attach((gpu(0, "GPU-a", proc(10)),))[0].processes[0].pod == victim
    assert a.attach((gpu(0, "GPU-a", proc(20)),))[0].processes[0].pod is None
    holders = {"GPU-a": (attacker,)}  # the victim's pod is deleted
    assert a.attach((gpu(0, "GPU-a"),))[0].pods == (attacker,)
    holders = {"GPU-a": (attacker, victim)}  # and created again, with a new UID
    assert a.attach((gpu(0, "GPU-a", proc(30)),))[0].processes[0].pod == victim


def test_processes_of_one_pod_that_disagree_are_not_attributed() -> None:
    mapping = {"GPU-a": (A, B)}
    uid = uid_of("trainer-0")
    procs = {10: in_pod("trainer-0", uid=uid), 11: in_pod("notebook-7", uid=uid)}
    out = Attributor(lambda: mapping, procs.__getitem__).attach((gpu(0, "GPU-a", proc(10), proc(11)),))
    assert [p.pod for p in out[0].processes] == [None, None]


def test_a_process_without_a_pod_uid_is_not_attributed_on_a_shared_gpu() -> None:
    mapping = {"GPU-a": (A, B)}
    procs = {10: ProcInfo(visible=True, in_pod=True, pod_uid=None, hostname="trainer-0")}
    out = Attributor(lambda: mapping, procs.__getitem__).attach((gpu(0, "GPU-a", proc(10)),))
    assert out[0].processes[0].pod is None
