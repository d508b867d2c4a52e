"""A fake kubelet: a real gRPC server speaking PodResources v1 on a unix socket.

Tests change ``pods`` at will (pod churn), make ``List`` hang (``hang`` seconds, or ``math.inf``
until ``release()``) or fail (``fail``: aborts with UNAVAILABLE), and stop and start the server
(the kubelet restarting, or its socket appearing late).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from tests.podresources import api_pb2, api_pb2_grpc

# A unix socket path must fit in sockaddr_un (108 bytes); pytest's tmp_path can be longer.
MAX_SOCKET_PATH = 100


@dataclass
class FakeClaim:
    """A DRA resource claim, allocated ``devices`` (device names) of ``driver``'s pool."""

    name: str
    namespace: str
    devices: list[str]
    driver: str = "gpu.nvidia.com"
    pool: str = "node-a"


@dataclass
class FakeContainer:
    name: str
    resource_name: str
    device_ids: list[str]
    claims: list[FakeClaim] = field(default_factory=list)


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: list[FakeContainer] = field(default_factory=list)


def pod(namespace: str, name: str, *containers: tuple[str, str, list[str]]) -> FakePod:
    """``pod("ns", "p", ("main", "nvidia.com/gpu", ["GPU-a"]))``; one container may repeat, once per resource."""
    return FakePod(namespace, name, [FakeContainer(c, r, list(ids)) for c, r, ids in containers])


def dra_pod(namespace: str, name: str, container: str, *claims: FakeClaim) -> FakePod:
    """A pod whose container holds its GPUs through DRA claims (no device plugin resource)."""
    return FakePod(namespace, name, [FakeContainer(container, "", [], list(claims))])


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.pods: list[FakePod] = []
        self.fail = False
        self.calls = 0  # List calls answered or refused
        self.lock = threading.Lock()
        self._hang = 0.0
        self._released = threading.Event()
        self._server: grpc.Server | None = None

    # -- switches --------------------------------------------------------------------------------

    @property
    def hang(self) -> float:
        """Seconds each ``List`` blocks before answering: 0 answers at once, ``math.inf`` until ``release()``."""
        return self._hang

    @hang.setter
    def hang(self, seconds: float) -> None:
        self._released.clear()
        self._hang = seconds

    def release(self) -> None:
        """Lets every hanging ``List`` answer, and later ones answer at once."""
        self._hang = 0.0
        self._released.set()

    # -- server ----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        assert self._server is None, "already running"
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-kubelet"))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port("unix:" + str(self.socket_path))
        server.start()
        self._server = server

    def stop(self) -> None:
        """Stops the server and removes its socket, as a kubelet going down does."""
        self._released.set()  # nothing stays blocked in a handler
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    # -- the API ---------------------------------------------------------------------------------

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        with self.lock:
            self.calls += 1
            pods = [FakePod(p.namespace, p.name, list(p.containers)) for p in self.pods]
            fail, hang = self.fail, self._hang
        if hang > 0:
            self._released.wait(None if math.isinf(hang) else hang)
        if fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake kubelet: failing on purpose")
        response = api_pb2.ListPodResourcesResponse()
        for p in pods:
            containers: dict[str, api_pb2.ContainerResources] = {}
            for c in p.containers:
                cr = containers.setdefault(c.name, api_pb2.ContainerResources(name=c.name))
                if c.resource_name:
                    cr.devices.append(api_pb2.ContainerDevices(resource_name=c.resource_name, device_ids=c.device_ids))
                for claim in c.claims:
                    cr.dynamic_resources.append(api_pb2.DynamicResource(
                        claim_name=claim.name, claim_namespace=claim.namespace,
                        claim_resources=[api_pb2.ClaimResource(driver_name=claim.driver, pool_name=claim.pool,
                                                               device_name=d) for d in claim.devices],
                    ))  # fmt: skip
            response.pod_resources.append(
                api_pb2.PodResources(name=p.name, namespace=p.namespace, containers=list(containers.values()))
            )
        return response

    def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        with self.lock:
            devices: dict[str, list[str]] = {}
            for p in self.pods:
                for c in p.containers:
                    if c.resource_name:
                        devices.setdefault(c.resource_name, []).extend(c.device_ids)
        return api_pb2.AllocatableResourcesResponse(
            devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices.items()]
        )


def socket_path_in(tmp_path: Path) -> Path:
    """Where a test's kubelet socket goes: under ``tmp_path`` unless that path is too long for a socket."""
    path = tmp_path / "pod-resources" / "kubelet.sock"
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    return Path(tempfile.mkdtemp(prefix="kubelet-")) / "kubelet.sock"


@contextmanager
def fake_kubelet(tmp_path: Path, *, start: bool = True) -> Iterator[FakeKubelet]:
    """A fake kubelet with its socket under ``tmp_path``; ``start=False`` leaves the socket absent."""
    kubelet = FakeKubelet(socket_path_in(tmp_path))
    if start:
        kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
        if tmp_path not in kubelet.socket_path.parents:
            shutil.rmtree(kubelet.socket_path.parent, ignore_errors=True)
