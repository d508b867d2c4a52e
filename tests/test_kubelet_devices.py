"""Which GPU each device the kubelet lists names, for every way of handing GPUs out in 2026: NVIDIA's
device plugin, GKE's, HAMi and DRA with NVIDIA's driver; and what names none, counted, never guessed.

The answers are encoded with protobuf from the kubelet's own api.proto (tests/podresources) and read
by the exporter's decoder, as on a node.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpu_exporter.kubernetes.attribution import Attributor, ProcInfo
from gpu_exporter.kubernetes.devices import DeviceTable, Unattributed, build_device_map, claim_device_key
from gpu_exporter.kubernetes.podresources import AnswerTooLarge, ClaimResource, decode_list_response
from gpu_exporter.serving.metrics import RenderOptions, gpu_families
from gpu_exporter.snapshot import GpuReading, GpuStatic, MigReading, NodeSnapshot, PodRef, ProcessReading
from tests.podresources import api_pb2

GPU = "nvidia.com/gpu"
UUID0 = "GPU-8f6b4b3a-1c2d-4e5f-8a9b-0c1d2e3f4a50"
UUID1 = "GPU-8f6b4b3a-1c2d-4e5f-8a9b-0c1d2e3f4a51"


def accept(resource: str) -> bool:
    return resource == GPU or resource.startswith("nvidia.com/mig-")


def claim(name: str, namespace: str, *devices: str, driver: str = "gpu.nvidia.com",
          share_id: str | None = None) -> api_pb2.DynamicResource:  # fmt: skip
    resources = []
    for d in devices:
        r = api_pb2.ClaimResource(driver_name=driver, pool_name="node-a", device_name=d)
        if share_id is not None:
            r.share_id = share_id
        resources.append(r)
    return api_pb2.DynamicResource(claim_name=name, claim_namespace=namespace, claim_resources=resources)


def container(name: str, *, ids: list[str] | None = None, resource: str = GPU,
              claims: list[api_pb2.DynamicResource] | None = None) -> api_pb2.ContainerResources:  # fmt: skip
    devices = [api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)] if ids else []
    return api_pb2.ContainerResources(name=name, devices=devices, dynamic_resources=claims or [])


def answer(*pods: tuple[str, str, list[api_pb2.ContainerResources]]) -> bytes:
    return api_pb2.ListPodResourcesResponse(
        pod_resources=[api_pb2.PodResources(namespace=ns, name=n, containers=cs) for ns, n, cs in pods]
    ).SerializeToString()


def table(*pods: tuple[str, str, list[api_pb2.ContainerResources]]) -> DeviceTable:
    return build_device_map(decode_list_response(answer(*pods)), accept)


def static(index: int, uuid: str, minor: int | None) -> GpuStatic:
    return GpuStatic(index=index, uuid=uuid, name="NVIDIA H100 80GB HBM3", pci_bus_id="", minor_number=minor)


def gpu(
    index: int, uuid: str, minor: int | None, *procs: ProcessReading, migs: tuple[MigReading, ...] = ()
) -> GpuReading:
    return GpuReading(index=index, uuid=uuid, up=True, static=static(index, uuid, minor), processes=procs, migs=migs)


def mig(index: int, gi: int, profile_id: int | None, start: int | None, profile: str = "1g.10gb") -> MigReading:
    return MigReading(index=index, uuid=f"MIG-0000000{index}-1111-2222-3333-444444444444", profile=profile,
                      gpu_instance_id=gi, compute_instance_id=0, gpu_instance_profile_id=profile_id,
                      placement_start=start)  # fmt: skip


# -- DRA: NVIDIA's driver names -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "key"),
    [
        ("gpu-0", "minor:0"),
        ("gpu-17", "minor:17"),
        # v25.12 on: gpu-<minor>-mig-<profile, dots dropped>-<profile id>-<placement start>
        ("gpu-0-mig-1g10gb-19-0", "minor:0:mig:19:0"),
        ("gpu-3-mig-3g40gb-2-4", "minor:3:mig:2:4"),
        ("gpu-1-mig-1g10gb-me-20-6", "minor:1:mig:20:6"),  # a profile with an attribute (+me -> -me)
        ("gpu-2-mig-7g80gb-0-0", "minor:2:mig:0:0"),
        # v25.3 to v25.8: gpu-<minor>-mig-<profile id>-<placement start>-<placement size>
        ("gpu-0-mig-9-4-2", "minor:0:mig:9:4"),
        ("gpu-1-mig-19-6-1", "minor:1:mig:19:6"),
    ],
)
def test_nvidia_dra_device_names(device: str, key: str) -> None:
    assert claim_device_key(ClaimResource("gpu.nvidia.com", "node-a", device)) == key


@pytest.mark.parametrize(
    ("driver", "device", "reason"),
    [
        ("compute-domain.nvidia.com", "channel-0", "other_driver"),  # an IMEX channel, not a GPU
        ("gpu.example.com", "gpu-0", "other_driver"),  # another vendor's gpu-0 is not ours
        ("", "gpu-0", "other_driver"),
        ("gpu.nvidia.com", "gpu-vfio-0", "vfio"),  # passed to a VM: NVML on the node does not see it
        ("gpu.nvidia.com", "gpu-01", "unparsed"),  # Go's %d writes no leading zero
        ("gpu.nvidia.com", "gpu-", "unparsed"),
        ("gpu.nvidia.com", "gpu-0-mig-", "unparsed"),
        ("gpu.nvidia.com", "gpu-0-mig-1g10gb-19", "unparsed"),
        ("gpu.nvidia.com", "GPU-0", "unparsed"),
        ("gpu.nvidia.com", "gpu-0\n", "unparsed"),
        ("gpu.nvidia.com", "gpu-99999999999", "unparsed"),
        ("gpu.nvidia.com", "gpu-0-mig-1G10GB-19-0", "unparsed"),  # the driver lowercases profiles
    ],
)
def test_a_dra_device_that_names_no_gpu_says_why(driver: str, device: str, reason: str) -> None:
    got = claim_device_key(ClaimResource(driver, "node-a", device))
    assert isinstance(got, Unattributed) and got.reason == reason
    assert (driver if reason == "other_driver" else device) in got.what  # what the log line names


def test_a_dra_pod_beside_a_device_plugin_pod_gets_its_gpu() -> None:
    """The issue's case: one device-plugin pod and one DRA pod; the DRA pod used to get nothing."""
    t = table(
        ("ml", "plugin-pod", [container("main", ids=[UUID0])]),
        ("ml", "dra-pod", [container("main", claims=[claim("train-gpu", "ml", "gpu-1")])]),
    )
    assert dict(t.holders) == {
        UUID0: (PodRef("ml", "plugin-pod", "main"),),
        "minor:1": (PodRef("ml", "dra-pod", "main"),),
    }
    (ref,) = t.holders["minor:1"]
    assert (ref.claim_namespace, ref.claim_name) == ("ml", "train-gpu")
    assert t.unattributed == ()


def test_one_claim_in_several_pods_is_a_shared_gpu() -> None:
    """A claim several pods reference (or devices shared by capacity, share_id) lists every pod under
    the GPU, as time-slicing does; the processes' pods are then picked as for time-slicing."""
    shared = claim("shared-gpu", "ml", "gpu-0")
    t = table(
        ("ml", "a", [container("main", claims=[shared])]),
        ("ml", "b", [container("main", claims=[shared])]),
        ("ml", "c", [container("main", claims=[claim("mine", "ml", "gpu-0", share_id="5f0c")])]),
    )
    assert [r.pod for r in t.holders["minor:0"]] == ["a", "b", "c"]


def test_a_claim_of_another_driver_is_counted_and_its_gpu_claim_still_read() -> None:
    t = table(("ml", "p", [container("main", claims=[
        claim("fabric", "ml", "channel-0", driver="compute-domain.nvidia.com"),
        claim("gpu", "ml", "gpu-2", "gpu-3"),
    ])]))  # fmt: skip
    assert set(t.holders) == {"minor:2", "minor:3"}
    assert t.unattributed == (Unattributed("other_driver", "compute-domain.nvidia.com"),)


@pytest.mark.parametrize(("name", "namespace"), [("gpu", ""), ("", "ml"), ("gpu", "other-ns")])
def test_a_claim_without_a_namespace_or_name_gives_no_pod(name: str, namespace: str) -> None:
    """Each of its devices is counted, named by the claim; the container's next claim is still read."""
    bad = claim(name, namespace, "gpu-0", "gpu-1")
    t = table(("ml", "p", [container("main", claims=[bad, claim("good", "ml", "gpu-2")])]))
    assert dict(t.holders) == {"minor:2": (PodRef("ml", "p", "main"),)}
    assert t.unattributed == (Unattributed("bad_claim", f"{namespace}/{name}"),) * 2


def test_a_device_plugin_id_in_no_known_form_is_counted_beside_those_read() -> None:
    t = table(("ml", "p", [container("main", ids=["nvidia0", "fpga-3", "GPU-a::1"])]))
    assert set(t.holders) == {"minor:0", "GPU-a"}
    assert t.unattributed == (Unattributed("unparsed", "fpga-3"),)


def test_ten_thousand_claims_are_refused_with_a_clear_error() -> None:
    claims = [claim(f"c{i}", "ml", f"gpu-{i % 8}") for i in range(10_000)]
    data = answer(("ml", "p", [container("main", claims=claims)]))
    with pytest.raises(AnswerTooLarge, match="more than 5000 DRA claims"):
        decode_list_response(data)
    assert len(decode_list_response(data, max_claims=10_000)[0].containers[0].dynamic_resources) == 10_000


# -- GKE and HAMi, through the same answer -------------------------------------------------------


def test_gke_and_hami_ids_through_the_kubelets_answer() -> None:
    t = table(
        ("ml", "gke-whole", [container("main", ids=["nvidia0"])]),
        ("ml", "gke-shared-a", [container("main", ids=["nvidia1/vgpu0"])]),
        ("ml", "gke-shared-b", [container("main", ids=["nvidia1/vgpu1"])]),
        ("ml", "gke-mig", [container("main", ids=["nvidia2/gi3/vgpu0"], resource=GPU)]),
        ("ml", "hami", [container("main", ids=[f"{UUID1}-3"])]),
    )
    assert {k: [r.pod for r in v] for k, v in t.holders.items()} == {
        "minor:0": ["gke-whole"],
        "minor:1": ["gke-shared-a", "gke-shared-b"],
        "minor:2:gi:3": ["gke-mig"],
        UUID1: ["hami"],
    }


# -- the snapshot: each key finds its device, or is counted --------------------------------------


def node_gpus() -> tuple[GpuReading, ...]:
    """Minor numbers in another order than the indexes, as on a node where they differ."""
    return (
        gpu(0, UUID0, 3),
        gpu(
            1,
            UUID1,
            1,
            migs=(mig(0, gi=3, profile_id=9, start=4, profile="3g.40gb"), mig(1, gi=9, profile_id=19, start=2)),
        ),
    )


def test_keys_find_gpus_by_minor_number_and_migs_by_instance_or_placement() -> None:
    a, b, c, d = (PodRef("ml", n, "main") for n in "abcd")
    mapping = {"minor:3": (a,), "minor:1:gi:9": (b,), "minor:1:mig:9:4": (c,), "minor:0": (d,)}
    pods = Attributor(lambda: mapping, lambda pid: ProcInfo(visible=False))
    out = pods.attach(node_gpus())
    assert out[0].pods == (a,)  # minor 3 is GPU 0, not GPU 3
    assert out[1].pods == ()
    assert out[1].migs[0].pods == (c,)  # DRA: profile 9 at placement 4
    assert out[1].migs[1].pods == (b,)  # GKE: GPU instance 9
    # minor:0 is no GPU of this node: counted, and d is given nothing.
    assert pods.unattributed()["no_such_device"] == 1
    assert all(d not in g.pods for g in out)


def test_a_gpu_without_a_minor_number_is_not_found_by_one() -> None:
    pods = Attributor(lambda: {"minor:0": (PodRef("ml", "p", "main"),)}, lambda pid: ProcInfo(visible=False))
    out = pods.attach((gpu(0, UUID0, None),))
    assert out[0].pods == () and pods.unattributed()["no_such_device"] == 1


def test_unattributed_devices_are_counted_by_reason_and_logged_once() -> None:
    skipped = (Unattributed("other_driver", "compute-domain.nvidia.com"), Unattributed("unparsed", "x"))
    pods = Attributor(lambda: {"minor:7": (PodRef("ml", "p", "main"),)}, lambda pid: ProcInfo(visible=False),
                      unattributed=lambda: skipped)  # fmt: skip
    with capture_logs() as logs:
        for _ in range(3):
            pods.attach(node_gpus())
    assert pods.unattributed() == {"other_driver": 1, "unparsed": 1, "vfio": 0, "bad_claim": 0, "no_such_device": 1}
    lines = [e for e in logs if e["event"] == "pod_attribution_device_unattributed"]
    assert len(lines) == 1 and lines[0]["device"] == "minor:7" and lines[0]["holders"] == ["ml/p"]


# -- the pod's UID and its claim on gpu_holder_info ----------------------------------------------

POD_UID = "0b8f0c3e-1d2a-4b5c-8d9e-370918639585"
OTHER_UID = "7d1e5c3e-1d2a-4b5c-8d9e-000000000001"


def proc(pid: int) -> ProcessReading:
    return ProcessReading(pid=pid, name="python3", used_memory_bytes=1 << 30)


def holder_info(gpus: tuple[GpuReading, ...]) -> list[dict[str, str]]:
    opts = RenderOptions(5, ("namespace", "pod", "container"), frozenset(), False, False)
    snap = NodeSnapshot(taken_at=0, duration_seconds=0, nvml_up=True, gpus=gpus)
    fams = {f.name: f for f in gpu_families(snap, opts)}
    return [s.labels for s in fams["gpu_holder_info"].samples]


def test_a_pods_uid_comes_from_its_own_processes_cgroups() -> None:
    ref = PodRef("ml", "train", "main", claim_name="train-gpu", claim_namespace="ml")
    procs = {10: ProcInfo(True, True, POD_UID, "train"), 11: ProcInfo(True, True, POD_UID, "train")}
    out = Attributor(lambda: {"minor:3": (ref,)}, procs.__getitem__).attach((gpu(0, UUID0, 3, proc(10), proc(11)),))
    (info,) = holder_info(out)
    assert (info["uid"], info["claim_namespace"], info["claim_name"], info["pod"]) == (
        POD_UID,
        "ml",
        "train-gpu",
        "train",
    )
    assert info["kind"] == "pod" and info["device_uuid"] == UUID0


@pytest.mark.parametrize(
    "procs",
    [
        # A process of another pod on the device (a privileged monitoring pod): its HOSTNAME is its own.
        {10: ProcInfo(True, True, OTHER_UID, "monitor")},
        # The pod's processes disagree on their UID.
        {10: ProcInfo(True, True, POD_UID, "train"), 11: ProcInfo(True, True, OTHER_UID, "train")},
        # The process's cgroup carries no pod UID, or /proc cannot be read.
        {10: ProcInfo(True, True, None, "train")},
        {10: ProcInfo(False)},
    ],
)
def test_a_uid_nothing_vouches_for_is_left_unsaid(procs: dict[int, ProcInfo]) -> None:
    ref = PodRef("ml", "train", "main")
    gpus = (gpu(0, UUID0, 3, *(proc(pid) for pid in procs)),)
    out = Attributor(lambda: {UUID0: (ref,)}, procs.__getitem__).attach(gpus)
    assert [i["uid"] for i in holder_info(out)] == [""]


def test_one_uid_vouched_for_by_two_pods_is_neither_pods() -> None:
    """A tenant's pod whose HOSTNAME is set to another pod's name, on another GPU the other holds."""
    a, b = PodRef("ml", "train", "main"), PodRef("ml", "train-b", "main")
    procs = {10: ProcInfo(True, True, POD_UID, "train"), 11: ProcInfo(True, True, POD_UID, "train-b")}
    out = Attributor(lambda: {UUID0: (a,), UUID1: (b,)}, procs.__getitem__).attach(
        (gpu(0, UUID0, 0, proc(10)), gpu(1, UUID1, 1, proc(11)))
    )
    assert [i["uid"] for i in holder_info(out)] == ["", ""]


# -- the join's corners (what the mutation run found untested) ------------------------------------


def test_nothing_is_unattributed_before_the_first_poll() -> None:
    pods = Attributor(lambda: {}, lambda pid: ProcInfo(visible=False))
    assert pods.unattributed() == {"other_driver": 0, "unparsed": 0, "vfio": 0, "bad_claim": 0, "no_such_device": 0}


def test_every_unmatched_device_is_logged_once_up_to_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_exporter.kubernetes.attribution as attribution

    mapping = {f"minor:{n}": (PodRef("ml", f"p{n}", "main"),) for n in (10, 11, 12, 13)}
    monkeypatch.setattr(attribution, "MAX_LOGGED_UNMATCHED", 3)
    pods = Attributor(lambda: mapping, lambda pid: ProcInfo(visible=False))
    with capture_logs() as logs:
        pods.attach(node_gpus())
        pods.attach(node_gpus())
    said = [e["device"] for e in logs if e["event"] == "pod_attribution_device_unattributed"]
    assert said == ["minor:10", "minor:11", "minor:12"]  # the fourth only counted
    assert pods.unattributed()["no_such_device"] == 4


def test_a_device_unmatched_later_is_logged_after_those_logged_before() -> None:
    mapping = {"minor:10": (PodRef("ml", "a", "main"),)}
    pods = Attributor(lambda: mapping, lambda pid: ProcInfo(visible=False))
    with capture_logs() as logs:
        pods.attach(node_gpus())
        mapping["minor:11"] = (PodRef("ml", "b", "main"),)
        pods.attach(node_gpus())
    said = [e["device"] for e in logs if e["event"] == "pod_attribution_device_unattributed"]
    assert said == ["minor:10", "minor:11"]


def test_a_process_of_a_pod_with_several_containers_on_the_device_gets_the_pod_and_its_uid() -> None:
    a, b = PodRef("ml", "train", "main"), PodRef("ml", "train", "sidecar")
    procs = {10: ProcInfo(True, True, POD_UID, "train")}
    (g,) = Attributor(lambda: {UUID0: (a, b)}, procs.__getitem__).attach((gpu(0, UUID0, 0, proc(10)),))
    ref = g.processes[0].pod
    assert ref is not None and (ref.namespace, ref.pod, ref.container, ref.uid) == ("ml", "train", "", POD_UID)


def test_uids_reach_the_processes_and_the_mig_devices() -> None:
    ref = PodRef("ml", "train", "main")
    procs = {10: ProcInfo(True, True, POD_UID, "train"), 11: ProcInfo(True, True, POD_UID, "train")}
    m = replace_procs(mig(0, gi=1, profile_id=19, start=0), proc(11))
    (g,) = Attributor(lambda: {UUID0: (ref,), m.uuid: (ref,)}, procs.__getitem__).attach(
        (gpu(0, UUID0, 0, proc(10), migs=(m,)),)
    )
    assert [r.uid for r in g.pods] == [POD_UID] and [r.uid for r in g.migs[0].pods] == [POD_UID]
    assert g.processes[0].pod is not None and g.processes[0].pod.uid == POD_UID
    assert g.migs[0].processes[0].pod is not None and g.migs[0].processes[0].pod.uid == POD_UID


def test_a_mig_process_that_disagrees_loses_the_uid_it_claimed() -> None:
    ref = PodRef("ml", "train", "main")
    m = replace_procs(mig(0, gi=1, profile_id=19, start=0), proc(11))
    procs = {10: ProcInfo(True, True, POD_UID, "train"), 11: ProcInfo(True, True, OTHER_UID, "train")}
    (g,) = Attributor(lambda: {UUID0: (ref,), m.uuid: (ref,)}, procs.__getitem__).attach(
        (gpu(0, UUID0, 0, proc(10), migs=(m,)),)
    )
    assert g.migs[0].processes[0].pod is not None and g.migs[0].processes[0].pod.uid == ""


def test_a_process_that_disagrees_loses_the_uid_it_claimed() -> None:
    ref = PodRef("ml", "train", "main")
    procs = {10: ProcInfo(True, True, POD_UID, "train"), 11: ProcInfo(True, True, OTHER_UID, "train")}
    (g,) = Attributor(lambda: {UUID0: (ref,)}, procs.__getitem__).attach((gpu(0, UUID0, 0, proc(10), proc(11)),))
    assert [p.pod.uid for p in g.processes if p.pod is not None] == ["", ""]


def test_a_shared_mig_device_picks_each_processs_pod_by_its_claim() -> None:
    a, b = PodRef("ml", "nb-a", "main"), PodRef("ml", "nb-b", "main")
    m = replace_procs(mig(0, gi=1, profile_id=19, start=0), proc(10), proc(11))
    procs = {10: ProcInfo(True, True, POD_UID, "nb-a"), 11: ProcInfo(True, True, OTHER_UID, "nb-b")}
    (g,) = Attributor(lambda: {m.uuid: (a, b)}, procs.__getitem__).attach((gpu(0, UUID0, 0, migs=(m,)),))
    assert [p.pod for p in g.migs[0].processes] == [a, b]


def test_a_claim_without_a_pod_uid_does_not_block_the_real_one() -> None:
    """A process whose cgroup names no pod UID claims nb-a: the real nb-a's claim still counts."""
    a, b = PodRef("ml", "nb-a", "main"), PodRef("ml", "nb-b", "main")
    procs = {10: ProcInfo(True, True, POD_UID, "nb-a"), 11: ProcInfo(True, True, None, "nb-a")}
    (g,) = Attributor(lambda: {UUID0: (a, b)}, procs.__getitem__).attach((gpu(0, UUID0, 0, proc(10), proc(11)),))
    assert [p.pod for p in g.processes] == [a, None]


def replace_procs(m: MigReading, *procs: ProcessReading) -> MigReading:
    from dataclasses import replace

    return replace(m, processes=procs)


@pytest.mark.parametrize(
    ("cgroup", "environ", "want"),
    [
        # cgroup v2, systemd driver: the UID's dashes are underscores in the slice name.
        (b"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b8f0c3e_1d2a_4b5c_8d9e_370918639585"
         b".slice/cri-containerd-ab.scope\n", b"PATH=/bin\0HOSTNAME=train\0HOME=/\0",
         ProcInfo(True, True, POD_UID, "train")),
        # cgroupfs driver, dashes as they are.
        (b"0::/kubepods/besteffort/pod0b8f0c3e-1d2a-4b5c-8d9e-370918639585/ab\n", b"HOSTNAME=x\0",
         ProcInfo(True, True, POD_UID, "x")),
        # A node process: no pod, whatever its environment says.
        (b"0::/system.slice/xorg.service\n", b"HOSTNAME=train\0", ProcInfo(True, False, None, "train")),
        (b"0::/kubepods.slice/x\n", b"HOME=/\0", ProcInfo(True, True, None, None)),
        (b"0::/kubepods.slice/x\n", None, ProcInfo(True, True, None, None)),  # environ unreadable
        # A cgroup named in bytes that are not UTF-8 (its creator chose them): read, not a crash.
        (b"0::/kubepods.slice/\xff\xfe/pod0b8f0c3e-1d2a-4b5c-8d9e-370918639585\n", b"HOSTNAME=t\0",
         ProcInfo(True, True, POD_UID, "t")),
    ],
)  # fmt: skip
def test_read_proc_reads_the_pod_uid_and_hostname(tmp_path: Path, cgroup: bytes, environ: bytes | None,
                                                  want: ProcInfo) -> None:  # fmt: skip
    from gpu_exporter.kubernetes.attribution import read_proc

    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_bytes(cgroup)
    if environ is not None:
        (tmp_path / "42" / "environ").write_bytes(environ)
    assert read_proc(42, str(tmp_path)) == want
    assert read_proc(43, str(tmp_path)) == ProcInfo(visible=False)


def test_a_refused_claim_is_logged_once_naming_the_other_claimants() -> None:
    a, b = PodRef("ml", "nb-a", "main"), PodRef("ml", "nb-b", "main")
    procs = {10: ProcInfo(True, True, POD_UID, "nb-a"), 11: ProcInfo(True, True, OTHER_UID, "nb-a")}
    pods = Attributor(lambda: {UUID0: (a, b)}, lambda pid: procs[pid])
    gpus = (gpu(0, UUID0, 0, proc(10), proc(11)),)
    with capture_logs() as logs:
        pods.attach(gpus)
        pods.attach(gpus)
        # The other UID now also claims nb-b: only that conflict is new.
        procs[12] = ProcInfo(True, True, OTHER_UID, "nb-b")
        pods.attach((gpu(0, UUID0, 0, proc(10), proc(11), proc(12)),))
    said = [(e["pod_uid"], e["hostname"], e["also_claimed_by"]) for e in logs
            if e["event"] == "pod_attribution_claim_refused"]  # fmt: skip
    assert said == [(POD_UID, "nb-a", [OTHER_UID]), (OTHER_UID, "nb-a", [POD_UID]), (OTHER_UID, "nb-b", [])]
