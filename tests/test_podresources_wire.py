"""The PodResources decoder against protobuf's own encoder and parser.

The exporter decodes the kubelet's ``ListPodResourcesResponse`` by hand
(gpu_exporter/kubernetes/podresources.py).  Whatever protobuf encodes, the decoder must read the
same pods, containers, resource names, device ids and DRA claims, skipping the fields it does not
read (CPU ids, memory, topology, CDI devices, and fields of every wire type a later kubelet may
add); whatever protobuf refuses to parse, the decoder refuses too, with WireError and nothing else.
"""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.kubernetes.podresources import (
    MAX_CLAIMS,
    AnswerTooLarge,
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
    WireError,
    decode_list_response,
)
from tests.hypothesis_budget import examples
from tests.podresources import api_pb2

# Wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit.
MAX_FIELD_NUMBER = 2**29 - 1


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


# -- what protobuf builds ------------------------------------------------------------------------

text = st.text(max_size=12)
device_ids = st.lists(st.one_of(text, st.sampled_from(["GPU-0", "MIG-1", "0", "1:3", "GPU-0::2"])), max_size=4)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def container_devices(draw: st.DrawFn) -> api_pb2.ContainerDevices:
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=i) for i in draw(st.lists(int64s, max_size=2))])
    return api_pb2.ContainerDevices(
        resource_name=draw(st.one_of(text, st.just("nvidia.com/gpu"))),
        device_ids=draw(device_ids),
        topology=topology if draw(st.booleans()) else None,
    )


@st.composite
def claim_resources(draw: st.DrawFn) -> api_pb2.ClaimResource:
    share = draw(st.one_of(st.none(), text))
    return api_pb2.ClaimResource(
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in draw(st.lists(text, max_size=2))],
        driver_name=draw(st.one_of(text, st.just("gpu.nvidia.com"))),
        pool_name=draw(text),
        device_name=draw(st.one_of(text, st.sampled_from(["gpu-0", "gpu-1-mig-1g10gb-19-0"]))),
        **({} if share is None else {"share_id": share}),
    )


@st.composite
def dynamic_resources(draw: st.DrawFn) -> api_pb2.DynamicResource:
    return api_pb2.DynamicResource(
        claim_name=draw(text), claim_namespace=draw(text), claim_resources=draw(st.lists(claim_resources(), max_size=3))
    )


@st.composite
def container_resources(draw: st.DrawFn) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=draw(text),
        devices=draw(st.lists(container_devices(), max_size=3)),
        cpu_ids=draw(st.lists(int64s, max_size=4)),
        memory=[
            api_pb2.ContainerMemory(memory_type=t, size=n)
            for t, n in draw(st.lists(st.tuples(text, st.integers(0, 2**64 - 1)), max_size=2))
        ],
        dynamic_resources=draw(st.lists(dynamic_resources(), max_size=2)),
    )


@st.composite
def list_responses(draw: st.DrawFn) -> api_pb2.ListPodResourcesResponse:
    pods = [
        api_pb2.PodResources(
            name=draw(text),
            namespace=draw(text),
            containers=draw(st.lists(container_resources(), max_size=3)),
            cpu_ids=draw(st.lists(int64s, max_size=2)),
        )
        for _ in range(draw(st.integers(0, 4)))
    ]
    return api_pb2.ListPodResourcesResponse(pod_resources=pods)


def expected(response: api_pb2.ListPodResourcesResponse) -> tuple[PodResources, ...]:
    """What the decoder must give: protobuf's reading of the same bytes, in the decoder's types."""
    return tuple(
        PodResources(
            name=p.name,
            namespace=p.namespace,
            containers=tuple(
                ContainerResources(
                    name=c.name,
                    devices=tuple(ContainerDevices(d.resource_name, tuple(d.device_ids)) for d in c.devices),
                    dynamic_resources=tuple(
                        DynamicResource(
                            r.claim_name,
                            r.claim_namespace,
                            tuple(
                                ClaimResource(
                                    x.driver_name,
                                    x.pool_name,
                                    x.device_name,
                                    x.share_id if x.HasField("share_id") else None,
                                )
                                for x in r.claim_resources
                            ),
                        )
                        for r in c.dynamic_resources
                    ),
                )
                for c in p.containers
            ),
        )
        for p in response.pod_resources
    )


def protobuf_reading(data: bytes) -> tuple[PodResources, ...] | None:
    """protobuf's own parse of ``data`` (None where it refuses it)."""
    message = api_pb2.ListPodResourcesResponse()
    try:
        message.ParseFromString(data)
    except DecodeError:
        return None
    return expected(message)


# Fields no version of the messages declares (6 and up: 4 and 5 are memory and claims), one of each
# wire type a proto3 kubelet can send.
unknown_fields = st.lists(
    st.one_of(
        st.builds(lambda n, v: key(n, 0) + varint(v), st.integers(6, MAX_FIELD_NUMBER), st.integers(0, 2**64 - 1)),
        st.builds(lambda n, b: key(n, 1) + b, st.integers(6, MAX_FIELD_NUMBER), st.binary(min_size=8, max_size=8)),
        st.builds(lambda n, b: length_delimited(n, b), st.integers(6, MAX_FIELD_NUMBER), st.binary(max_size=20)),
        st.builds(lambda n, b: key(n, 5) + b, st.integers(6, MAX_FIELD_NUMBER), st.binary(min_size=4, max_size=4)),
    ),
    max_size=3,
).map(b"".join)


# -- what a user relies on -----------------------------------------------------------------------


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(list_responses())
def test_reads_what_protobuf_wrote(response: api_pb2.ListPodResourcesResponse) -> None:
    assert decode_list_response(response.SerializeToString()) == expected(response)


@settings(max_examples=examples(200), deadline=None)
@given(list_responses(), unknown_fields, unknown_fields, unknown_fields, unknown_fields)
def test_skips_fields_a_later_kubelet_adds_at_every_level(
    response: api_pb2.ListPodResourcesResponse, top: bytes, in_pod: bytes, in_container: bytes, in_devices: bytes
) -> None:
    """Memory, dynamic resources or anything newer: unknown fields of every wire type, anywhere."""
    devices = length_delimited(2, length_delimited(1, b"nvidia.com/gpu") + in_devices + length_delimited(2, b"GPU-x"))
    container = length_delimited(3, length_delimited(1, b"main") + in_container + devices)
    pod = length_delimited(1, in_pod + length_delimited(1, b"p") + container + length_delimited(2, b"ns"))
    data = top + response.SerializeToString() + top + pod
    assert protobuf_reading(data) is not None
    assert decode_list_response(data) == protobuf_reading(data)
    assert decode_list_response(data)[-1] == PodResources(
        "p", "ns", (ContainerResources("main", (ContainerDevices("nvidia.com/gpu", ("GPU-x",)),)),)
    )


@settings(max_examples=examples(500), deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_either_read_as_protobuf_reads_them_or_refused(data: bytes) -> None:
    theirs = protobuf_reading(data)
    refused = ""
    try:
        ours = decode_list_response(data)
    except WireError as e:
        ours, refused = None, str(e)
    if theirs is None:
        assert ours is None, "protobuf refuses these bytes, so must the decoder"
    elif ours is None:  # stricter only where proto3 never goes: proto2's groups
        assert "wire type 3" in refused or "wire type 4" in refused
    else:
        assert ours == theirs


@settings(max_examples=examples(300), deadline=None)
@given(list_responses(), st.data())
def test_a_cut_short_answer_is_refused_never_half_read(
    response: api_pb2.ListPodResourcesResponse, data: st.DataObject
) -> None:
    whole = response.SerializeToString()
    if not whole:
        return
    cut = data.draw(st.integers(0, len(whole) - 1))
    if protobuf_reading(whole[:cut]) is None:
        with pytest.raises(WireError):
            decode_list_response(whole[:cut])
    else:  # a cut that falls between whole pods is a shorter, valid answer
        assert decode_list_response(whole[:cut]) == protobuf_reading(whole[:cut])


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\x0a\x05ab", "field 1 says 5 bytes, 2 are left"),
        (b"\x0a", "cut short"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "runs past 10 bytes"),
        (b"\x00\x01", "field number 0 "),
        (key(MAX_FIELD_NUMBER + 1, 0) + b"\x00", "outside 1..536870911"),
        (b"\x0b\x0c", "wire type 3"),
        (b"\x0f", "wire type 7"),
        (b"\x09\x01\x02", "field 1 is cut short"),
        (length_delimited(1, length_delimited(1, b"\xff\xfe")), "not UTF-8"),
    ],
)
def test_a_malformed_answer_says_what_is_wrong(data: bytes, says: str) -> None:
    with pytest.raises(WireError, match=says):
        decode_list_response(data)
    assert protobuf_reading(data) is None or data.startswith(b"\x0b"), "protobuf refuses it too"


def test_a_known_field_with_another_wire_type_is_skipped_as_protobuf_skips_it() -> None:
    # Field 1 of a pod (its name) sent as a varint; field 3 (containers) as a fixed32.
    pod = key(1, 0) + varint(7) + length_delimited(2, b"ns") + key(3, 5) + b"\x00\x00\x00\x00"
    data = length_delimited(1, pod)
    assert decode_list_response(data) == protobuf_reading(data) == (PodResources("", "ns", ()),)


def test_repeated_names_keep_the_last_and_repeated_lists_add_up() -> None:
    pod = length_delimited(1, b"first") + length_delimited(1, b"second") + length_delimited(2, b"ns")
    data = length_delimited(1, pod) + length_delimited(1, length_delimited(1, b"other"))
    assert decode_list_response(data) == protobuf_reading(data)
    assert [p.name for p in decode_list_response(data)] == ["second", "other"]


def test_an_empty_answer_is_no_pods() -> None:
    assert decode_list_response(b"") == () == protobuf_reading(b"")


def test_a_dra_claim_is_read_with_its_devices_and_share_id() -> None:
    """A container holding a GPU through DRA: its claim, namespace and devices, an absent share id
    told apart from an empty one (the field is ``optional``)."""
    claim = api_pb2.DynamicResource(
        claim_name="train-gpu",
        claim_namespace="ml",
        claim_resources=[
            api_pb2.ClaimResource(cdi_devices=[api_pb2.CDIDevice(name="k8s.gpu.nvidia.com/claim=uid-gpu-0")],
                                  driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-0"),
            api_pb2.ClaimResource(driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-1", share_id=""),
        ],
    )  # fmt: skip
    sent = api_pb2.ContainerResources(name="main", dynamic_resources=[claim])
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[api_pb2.PodResources(name="p", namespace="ml", containers=[sent])]
    )
    (pod,) = decode_list_response(response.SerializeToString())
    (container,) = pod.containers
    assert container.dynamic_resources == (
        DynamicResource("train-gpu", "ml", (
            ClaimResource("gpu.nvidia.com", "node-a", "gpu-0", None),
            ClaimResource("gpu.nvidia.com", "node-a", "gpu-1", ""),
        )),
    )  # fmt: skip


@pytest.mark.parametrize("limit", [1, 3])
def test_claims_are_refused_one_past_the_limit(limit: int) -> None:
    claim = api_pb2.DynamicResource(claim_name="c", claim_namespace="ml")

    def answer(n: int) -> bytes:
        sent = api_pb2.ContainerResources(name="main", dynamic_resources=[claim] * n)
        pods = [api_pb2.PodResources(name="p", namespace="ml", containers=[sent])]
        return api_pb2.ListPodResourcesResponse(pod_resources=pods).SerializeToString()

    (pod,) = decode_list_response(answer(limit), max_claims=limit)
    assert len(pod.containers[0].dynamic_resources) == limit
    with pytest.raises(AnswerTooLarge, match=f"more than {limit} DRA claims"):
        decode_list_response(answer(limit + 1), max_claims=limit)
    assert MAX_CLAIMS == 5_000
    assert len(decode_list_response(answer(MAX_CLAIMS))[0].containers[0].dynamic_resources) == MAX_CLAIMS
    with pytest.raises(AnswerTooLarge, match="more than 5000 DRA claims"):
        decode_list_response(answer(MAX_CLAIMS + 1))
