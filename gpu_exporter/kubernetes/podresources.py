"""The kubelet's PodResources v1 ``List`` answer, decoded from protobuf's wire format.

Only the fields pod attribution reads are kept (field numbers are the kubelet's, from
k8s.io/kubelet/pkg/apis/podresources/v1/api.proto)::

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2;
                               repeated DynamicResource dynamic_resources = 5; }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; }
    DynamicResource          { string claim_name = 2; string claim_namespace = 3;
                               repeated ClaimResource claim_resources = 4; }
    ClaimResource            { string driver_name = 2; string pool_name = 3; string device_name = 4;
                               optional string share_id = 5; }

``DynamicResource`` is DRA's (KubeletPodResourcesDynamicResources, on by default since Kubernetes
1.34); ``share_id`` came in 1.35 (kubelet 5aff898c).  Everything else (CPU ids, memory, topology,
CDI device names, fields a later kubelet adds) is
skipped as protobuf skips unknown fields, and a known field sent with another wire type is skipped
as protobuf does.  Decoding these four messages by hand is why the exporter needs neither the
protobuf runtime nor generated code (about 2 MiB resident); tests compare this decoder with
protobuf's own parser on generated messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "AnswerTooLarge",
    "ClaimResource",
    "ContainerDevices",
    "ContainerResources",
    "DynamicResource",
    "PodResources",
    "WireError",
    "decode_list_response",
]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_FIXED_SIZE = {_I64: 8, _I32: 4}
_MAX_VARINT_BYTES = 10
_MAX_FIELD_NUMBER = 2**29 - 1


# What a node's answer may hold.  The bytes are capped by the call (16 MiB); these cap what they
# become: 16 MiB of empty pods (b"\x0a\x00" * 8e6) took 85 s and 2.7 GB to decode.  Kubernetes
# supports 110 pods per node by default and few clusters raise it past 500; a pod's containers and
# their devices come to tens of fields.
MAX_PODS = 5_000
MAX_CLAIMS = 5_000  # DRA claims of all containers: a pod uses a few (10,000 is no node's answer)
MAX_FIELDS = 250_000  # every field of every message, unknown ones included
_CLOCK_EVERY = 4096  # fields between two looks at the deadline


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message (truncated, a bad wire type, bad UTF-8)."""


class AnswerTooLarge(WireError):
    """A well-formed answer beyond what a node holds (pods, fields) or than the time left to decode it."""


class _Budget:
    """Fields, claims and time left to decode one answer."""

    def __init__(
        self, fields: int, deadline: float | None, clock: Callable[[], float], claims: int = MAX_CLAIMS
    ) -> None:
        self.claims = claims
        self.max_claims = claims
        self.fields = fields
        self.max_fields = fields
        self.deadline = deadline
        self.clock = clock
        self._until_look = _CLOCK_EVERY

    def claim(self) -> None:
        self.claims -= 1
        if self.claims < 0:
            raise AnswerTooLarge(f"the answer lists more than {self.max_claims} DRA claims")

    def charge(self, n: int) -> None:
        self.fields -= n
        if self.fields < 0:
            raise AnswerTooLarge(f"the answer holds more than {self.max_fields} fields")
        self._until_look -= n
        if self._until_look <= 0 and self.deadline is not None:
            self._until_look = _CLOCK_EVERY
            if self.clock() > self.deadline:
                raise AnswerTooLarge("the answer could not be decoded before the call's deadline")


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimResource:
    """One device of a DRA claim: the driver, pool and device name triplet names it uniquely."""

    driver_name: str
    pool_name: str
    device_name: str
    share_id: str | None = None  # None: the field was not sent (the device is not shared by capacity)


@dataclass(frozen=True, slots=True)
class DynamicResource:
    """One DRA resource claim a container uses."""

    claim_name: str
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]
    dynamic_resources: tuple[DynamicResource, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def decode_list_response(
    data: bytes,
    *,
    max_pods: int = MAX_PODS,
    max_fields: int = MAX_FIELDS,
    max_claims: int = MAX_CLAIMS,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[PodResources, ...]:
    """The pods of one serialized ``ListPodResourcesResponse``; raises WireError if malformed, and
    AnswerTooLarge past ``max_pods`` pods, ``max_claims`` DRA claims, ``max_fields`` fields or
    ``deadline`` (on ``clock``)."""
    budget = _Budget(max_fields, deadline, clock, max_claims)
    pods: list[PodResources] = []
    for value in _length_delimited(memoryview(data), 1, budget):
        if len(pods) == max_pods:
            raise AnswerTooLarge(f"the answer lists more than {max_pods} pods")
        pods.append(_pod(value, budget))
    return tuple(pods)


def _pod(data: memoryview, budget: _Budget) -> PodResources:
    name = namespace = ""
    containers: list[ContainerResources] = []
    for number, value in _len_fields(data, budget):
        if number == 1:
            name = _text(value)
        elif number == 2:
            namespace = _text(value)
        elif number == 3:
            containers.append(_container(value, budget))
    return PodResources(name=name, namespace=namespace, containers=tuple(containers))


def _container(data: memoryview, budget: _Budget) -> ContainerResources:
    name = ""
    devices: list[ContainerDevices] = []
    claims: list[DynamicResource] = []
    for number, value in _len_fields(data, budget):
        if number == 1:
            name = _text(value)
        elif number == 2:
            devices.append(_devices(value, budget))
        elif number == 5:
            budget.claim()
            claims.append(_claim(value, budget))
    return ContainerResources(name=name, devices=tuple(devices), dynamic_resources=tuple(claims))


def _claim(data: memoryview, budget: _Budget) -> DynamicResource:
    name = namespace = ""
    resources: list[ClaimResource] = []
    for number, value in _len_fields(data, budget):
        if number == 2:
            name = _text(value)
        elif number == 3:
            namespace = _text(value)
        elif number == 4:
            resources.append(_claim_resource(value, budget))
    return DynamicResource(claim_name=name, claim_namespace=namespace, claim_resources=tuple(resources))


def _claim_resource(data: memoryview, budget: _Budget) -> ClaimResource:
    driver = pool = device = ""
    share_id: str | None = None
    for number, value in _len_fields(data, budget):
        if number == 2:
            driver = _text(value)
        elif number == 3:
            pool = _text(value)
        elif number == 4:
            device = _text(value)
        elif number == 5:
            share_id = _text(value)
    return ClaimResource(driver_name=driver, pool_name=pool, device_name=device, share_id=share_id)


def _devices(data: memoryview, budget: _Budget) -> ContainerDevices:
    resource_name = ""
    device_ids: list[str] = []
    for number, value in _len_fields(data, budget):
        if number == 1:
            resource_name = _text(value)
        elif number == 2:
            device_ids.append(_text(value))
    return ContainerDevices(resource_name=resource_name, device_ids=tuple(device_ids))


def _length_delimited(data: memoryview, wanted: int, budget: _Budget) -> Iterator[memoryview]:
    for number, value in _len_fields(data, budget):
        if number == wanted:
            yield value


def _len_fields(data: memoryview, budget: _Budget) -> Iterator[tuple[int, memoryview]]:
    """(field number, bytes) of every length-delimited field, after checking the whole message.

    Walking it all first means a truncated tail fails the message even when the fields before it
    were read, as protobuf's parser does; the walk keeps nothing, so a message of millions of tiny
    fields costs no memory before the budget refuses it.  Every other wire type is skipped (this API
    reads strings and messages only).
    """
    _walk(data, budget)
    return _fields(data)


def _walk(data: memoryview, budget: _Budget) -> None:
    """Check the whole message, charging its fields to ``budget`` as they are met (a message of
    millions of fields is refused at the budget, not after it has been walked)."""
    count = 0
    at, end = 0, len(data)
    while at < end:
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if not 0 < number <= _MAX_FIELD_NUMBER:
            raise WireError(f"field number {number} at byte {at} is outside 1..{_MAX_FIELD_NUMBER}")
        count += 1
        if count == _CLOCK_EVERY:
            budget.charge(count)
            count = 0
        if kind == _LEN:
            size, at = _varint(data, at)
            if size > end - at:
                raise WireError(f"field {number} says {size} bytes, {end - at} are left")
            at += size
        elif kind == _VARINT:
            _, at = _varint(data, at)
        elif kind in _FIXED_SIZE:
            at += _FIXED_SIZE[kind]
            if at > end:
                raise WireError(f"field {number} is cut short")
        else:  # 3 and 4 are proto2 groups, never in this API; 6 and 7 do not exist
            raise WireError(f"field {number} has wire type {kind}, which this message cannot hold")
    budget.charge(count)


def _fields(data: memoryview) -> Iterator[tuple[int, memoryview]]:
    """The length-delimited fields of a message ``_walk`` has checked."""
    at, end = 0, len(data)
    while at < end:
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if kind == _LEN:
            size, at = _varint(data, at)
            yield number, data[at : at + size]
            at += size
        elif kind == _VARINT:
            _, at = _varint(data, at)
        else:
            at += _FIXED_SIZE[kind]


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    if at < len(data) and data[at] < 0x80:  # tags and lengths of this API: nearly always one byte
        return data[at], at + 1
    value = shift = 0
    for i in range(at, min(at + _MAX_VARINT_BYTES, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, i + 1
        shift += 7
    if len(data) - at >= _MAX_VARINT_BYTES:
        raise WireError(f"a varint at byte {at} runs past 10 bytes")
    raise WireError(f"a varint at byte {at} is cut short")


def _text(value: memoryview) -> str:
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"a string field is not UTF-8 ({e.reason} at byte {e.start})") from None
