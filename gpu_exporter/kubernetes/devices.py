"""What each device the kubelet lists names: a GPU or a MIG device, as a key the snapshot's devices
are looked up by, or the reason it names none.

Four ways of handing out NVIDIA GPUs reach the kubelet's PodResources answer, each naming devices
its own way (every form below is taken from the source named, never guessed):

* **NVIDIA's device plugin** (``nvidia.com/gpu``, ``nvidia.com/mig-*``): ``GPU-<uuid>`` and
  ``MIG-<uuid>`` (``DEVICE_ID_STRATEGY=uuid``, the default), or ``N`` and ``G:M`` (``index``); with
  time-slicing each GPU is advertised several times as ``<id>::<replica>``.
* **GKE's device plugin** (GoogleCloudPlatform/container-engine-accelerators 992db81,
  pkg/gpu/nvidia/manager.go and mig/mig.go): ``nvidia<minor>``, the GPU of ``/dev/nvidia<minor>``;
  ``nvidia<minor>/gi<id>``, its MIG GPU instance ``<id>``; either with ``/vgpu<i>`` appended for
  time-sharing (gpusharing/gpusharing.go: ``nvidia0/vgpu0``, ``nvidia0/gi1/vgpu0``).
* **HAMi** (Project-HAMi/HAMi 4707fb0, nvinternal/rm/devices.go): each share of a GPU is
  ``<uuid>-<i>`` (``fmt.Sprintf("%v-%v", dev.ID, i)``, ``GPU-…-0`` to ``-9`` by default); its MIG
  devices keep their own ids.
* **DRA with NVIDIA's driver** (``gpu.nvidia.com``; NVIDIA/k8s-dra-driver-gpu 2240711,
  cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go): ``gpu-<minor>`` for a GPU, and for a MIG
  device ``gpu-<minor>-mig-<profile>-<profile id>-<placement start>`` with the profile's dots
  dropped (``gpu-0-mig-1g10gb-19-0``, v25.12 on) or, from v25.3 to v25.8,
  ``gpu-<minor>-mig-<profile id>-<placement start>-<placement size>``.  ``gpu-vfio-<i>`` is a GPU
  passed to a virtual machine, which NVML on the node does not see.  Devices of any other driver
  (``compute-domain.nvidia.com``'s IMEX channels, another vendor's) are not GPUs of ours.

The keys: ``GPU-…``/``MIG-…`` as they are; ``index:N`` and ``index:G:M``; ``minor:N``;
``minor:N:gi:G``; ``minor:N:mig:P:S`` (GPU instance profile id P at placement start S).  Sharing
needs no key of its own: every container given a share of a device is listed under the device.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..snapshot import PodRef
from .podresources import ClaimResource, PodResources

__all__ = [
    "DRA_DRIVER",
    "REASONS",
    "DeviceMap",
    "DeviceTable",
    "build_device_map",
    "claim_device_key",
    "device_plugin_key",
    "gpu_keys",
    "mig_keys",
]

DRA_DRIVER = "gpu.nvidia.com"

# Why a device the kubelet lists is given to no GPU (the reason label of
# gpu_exporter_pod_attribution_unattributed_devices).
OTHER_DRIVER = "other_driver"  # a DRA device of a driver other than NVIDIA's GPU driver
UNPARSED = "unparsed"  # a name in no form above
VFIO = "vfio"  # a GPU passed through to a virtual machine: not on this node's NVML
BAD_CLAIM = "bad_claim"  # a claim without a name or namespace, or in another namespace than its pod
NO_SUCH_DEVICE = "no_such_device"  # well formed, but no GPU or MIG device of the node has it
REASONS = (OTHER_DRIVER, UNPARSED, VFIO, BAD_CLAIM, NO_SUCH_DEVICE)

_NUM = r"(0|[1-9][0-9]{0,8})"  # a number as Go's %d writes it, small enough for any minor or id
_INDEX = re.compile(rf"{_NUM}(?::{_NUM})?")
_GKE = re.compile(rf"nvidia{_NUM}(?:/gi{_NUM})?(?:/vgpu{_NUM})?")
_HEX = "[0-9a-fA-F]"
_UUID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_HAMI = re.compile(rf"(GPU-{_UUID})-{_NUM}")
_DRA_GPU = re.compile(rf"gpu-{_NUM}")
# The driver's own pattern (canonicalMigNameRegex, mig.go), with numbers bounded.
_DRA_MIG = re.compile(rf"gpu-{_NUM}-mig-([a-z0-9][a-z0-9.-]*?)-{_NUM}-{_NUM}")
_DRA_VFIO = re.compile(rf"gpu-vfio-{_NUM}")


@dataclass(frozen=True, slots=True)
class Unattributed:
    """A device given to a container that names no GPU: why, and what it was (for the log)."""

    reason: str
    what: str


def device_plugin_key(device_id: str) -> str | Unattributed:
    """The key of a device plugin's id (NVIDIA's, GKE's or HAMi's), or why it has none."""
    base = device_id.strip().partition("::")[0]  # NVIDIA's time-slicing replica
    if _INDEX.fullmatch(base):
        return "index:" + base
    if m := _GKE.fullmatch(base):
        minor, gi, _vgpu = m.groups()
        return f"minor:{minor}" + (f":gi:{gi}" if gi is not None else "")
    if m := _HAMI.fullmatch(base):
        return m.group(1)
    if base.startswith(("GPU-", "MIG-")):  # a UUID as NVML gives it (R450's MIG-GPU-<uuid>/<gi>/<ci> too)
        return base
    return Unattributed(UNPARSED, device_id)


def claim_device_key(resource: ClaimResource) -> str | Unattributed:
    """The key of a device a DRA claim was allocated, or why it has none."""
    if resource.driver_name != DRA_DRIVER:
        return Unattributed(OTHER_DRIVER, resource.driver_name)
    name = resource.device_name
    if m := _DRA_GPU.fullmatch(name):
        return f"minor:{m.group(1)}"
    if m := _DRA_MIG.fullmatch(name):
        minor, profile, a, b = m.groups()
        if profile.isdigit():  # v25.3-v25.8: profile id, placement start, placement size
            return f"minor:{minor}:mig:{profile}:{a}"
        return f"minor:{minor}:mig:{a}:{b}"
    if _DRA_VFIO.fullmatch(name):
        return Unattributed(VFIO, name)
    return Unattributed(UNPARSED, f"{resource.driver_name}/{name}")


def gpu_keys(index: int, uuid: str, minor: int | None) -> tuple[str, ...]:
    """Every key a GPU may be listed under."""
    return (uuid, f"index:{index}", *((f"minor:{minor}",) if minor is not None else ()))


def mig_keys(
    gpu_index: int,
    minor: int | None,
    index: int,
    uuid: str,
    gpu_instance_id: int | None,
    profile_id: int | None,
    placement_start: int | None,
) -> tuple[str, ...]:
    """Every key MIG device ``index`` of a GPU may be listed under."""
    keys = [uuid, f"index:{gpu_index}:{index}"]
    if minor is not None and gpu_instance_id is not None:
        keys.append(f"minor:{minor}:gi:{gpu_instance_id}")
    if minor is not None and profile_id is not None and placement_start is not None:
        keys.append(f"minor:{minor}:mig:{profile_id}:{placement_start}")
    return tuple(keys)


DeviceMap = MappingProxyType[str, tuple[PodRef, ...]]


@dataclass(frozen=True, slots=True)
class DeviceTable:
    """One kubelet answer, read: device key -> the containers holding it (sorted, each once), and the
    devices given to containers that name no GPU."""

    holders: DeviceMap
    unattributed: tuple[Unattributed, ...] = ()


def build_device_map(pods: Sequence[PodResources], accept: Callable[[str], bool]) -> DeviceTable:
    """Device key -> holders, for the device plugins' resources ``accept`` takes and every DRA claim."""
    holders: dict[str, set[PodRef]] = {}
    skipped: list[Unattributed] = []
    for pod in pods:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for devices in container.devices:
                if not accept(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    _add(holders, skipped, device_plugin_key(device_id), ref)
            for claim in container.dynamic_resources:
                if not claim.claim_name or claim.claim_namespace != pod.namespace:
                    # A claim lives in its pod's namespace (a pod can name no other): one that says
                    # otherwise, or nothing, is no answer a kubelet gives, and names no one.
                    what = f"{claim.claim_namespace}/{claim.claim_name}"
                    skipped.extend(Unattributed(BAD_CLAIM, what) for _ in claim.claim_resources)
                    continue
                claimed = PodRef(pod.namespace, pod.name, container.name, claim_name=claim.claim_name,
                                 claim_namespace=claim.claim_namespace)  # fmt: skip
                for resource in claim.claim_resources:
                    _add(holders, skipped, claim_device_key(resource), claimed)
    table = {key: tuple(sorted(refs, key=_ref_order)) for key, refs in sorted(holders.items())}
    return DeviceTable(MappingProxyType(table), tuple(skipped))


def _add(holders: dict[str, set[PodRef]], skipped: list[Unattributed], key: str | Unattributed, ref: PodRef) -> None:
    if isinstance(key, Unattributed):
        skipped.append(key)
    else:
        holders.setdefault(key, set()).add(ref)


def _ref_order(ref: PodRef) -> tuple[str, str, str, str]:
    return ref.namespace, ref.pod, ref.container, ref.claim_name
