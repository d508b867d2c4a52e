"""A real Podman container holds a GPU: a process inside it, listed by the fake NVML, is attributed
to that container by name, from Podman's own API socket (``podman system service``), by ``--once``
and by the daemon; without the socket, by its short ID.

Podman, runc and the stand-in base image are those of tests/test_image.py (rootful, in the tests'
own podman storage).  The exporter runs on the host, as a systemd unit would, reading the
container's process through /proc.  Needs root, podman, runc and debootstrap; elsewhere it is skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.exporter_helpers import run_daemon, wait_for
from tests.fakenvml import Scenario, subprocess_env
from tests.test_image import STAND_IN, STORE, ULIMITS, _missing, podman, stand_in_base
from tests.timing import NEVER_S

pytestmark = [pytest.mark.integration, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]

GIB = 1024**3


class Container(NamedTuple):
    name: str
    id: str
    pid: int


@pytest.fixture(scope="module")
def container() -> Iterator[Container]:
    STORE.mkdir(parents=True, exist_ok=True)
    stand_in_base()
    name = f"gpu-holder-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, "--network", "none", *ULIMITS, STAND_IN, "sleep", "3600", timeout=120)
    try:
        info = json.loads(podman("inspect", name).stdout)[0]
        pid = int(info["State"]["Pid"])
        assert pid > 0 and Path(f"/proc/{pid}").exists()
        yield Container(name, info["Id"], pid)
    finally:
        podman("rm", "-f", "-t", "0", name, check=False, timeout=120)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Podman's API (Docker-compatible and its own), as ``systemctl start podman.socket`` would serve it."""
    sock = tmp_path_factory.mktemp("podman-api") / "podman.sock"
    cmd = ["podman", "--root", str(STORE / "root"), "--runroot", str(STORE / "run"), "--runtime", "runc",
           "system", "service", "--time=0", f"unix://{sock}"]  # fmt: skip
    service = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + NEVER_S
        while not sock.exists():
            assert service.poll() is None, service.stderr.read() if service.stderr else b""
            assert time.monotonic() < deadline, "podman's API socket did not appear"
            time.sleep(0.05)
        yield sock
    finally:
        service.terminate()
        try:
            service.wait(timeout=10)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(timeout=10)


def node_with(scenario: Scenario, c: Container) -> None:
    """One H100 whose only process is the container's, as NVML lists a container's CUDA process."""
    g = scenario.add_gpu().identity("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555")
    g.utilization(3, 1).memory(80 * GIB, 20 * GIB).temperature(40)
    g.add_process(c.pid, 20 * GIB, name="sleep", sm=2)
    scenario.write()


def config(tmp_path: Path, podman_socket: str) -> Path:
    path = tmp_path / "holders.yml"
    path.write_text(f"containers:\n  attribution: on\n  podman_socket: {podman_socket}\n  docker_socket: ''\n")
    return path


def once(scenario: Scenario, cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_exporter", "--once", "--config", str(cfg), *args],
                          env=subprocess_env(scenario.path), capture_output=True, text=True,
                          timeout=NEVER_S)  # fmt: skip


def test_the_container_holding_the_gpu_is_named_by_podmans_api(
    scenario: Scenario, container: Container, api: Path, tmp_path: Path
) -> None:
    node_with(scenario, container)
    cfg = config(tmp_path, str(api))
    out = once(scenario, cfg, "--format", "json")
    assert out.returncode in (0, 1), out.stderr
    (g,) = json.loads(out.stdout)["gpus"]
    (p,) = g["gpu_process_memory_used_bytes"]
    assert (p["pid"], p["container_name"]) == (container.pid, container.name)
    (holder,) = g["gpu_holder_info"]
    # Every label of gpu_holder_info is a key (README: a fixed shape), null where this holder has none.
    assert {k: v for k, v in holder.items() if v is not None} == {
        "kind": "container", "container_engine": "podman", "container_id": container.id[:12],
        "container_name": container.name, "device_uuid": g["uuid"], "value": 1}  # fmt: skip
    assert {"uid", "claim_namespace", "claim_name"} <= holder.keys()
    table = once(scenario, cfg).stdout
    assert f"container {container.name} (engine podman, id {container.id[:12]})" in table
    summary = next(line for line in table.splitlines() if line.startswith("   0  NVIDIA"))
    assert summary.rstrip().endswith(f"container {container.name}")


def test_without_the_api_the_container_is_named_by_its_short_id(
    scenario: Scenario, container: Container, tmp_path: Path
) -> None:
    node_with(scenario, container)
    out = once(scenario, config(tmp_path, str(tmp_path / "no-podman.sock")), "--format", "json")
    (g,) = json.loads(out.stdout)["gpus"]
    assert g["gpu_process_memory_used_bytes"][0]["container_name"] == container.id[:12]


def test_the_daemon_labels_the_gpu_and_keeps_the_containers_books(
    scenario: Scenario, container: Container, api: Path, tmp_path: Path
) -> None:
    node_with(scenario, container)
    with run_daemon(scenario.path, "--config", str(config(tmp_path, str(api))), "--poll.interval", "0.2s") as d:

        def held() -> float:
            return sum(v for (n, labels), v in d.metrics().items() if n == "gpu_state_seconds_total"
                       and dict(labels).get("container_name") == container.name)  # fmt: skip

        wait_for(lambda: held() > 0, timeout=NEVER_S, what="the container's seconds in the books")
        series = d.metrics()
    util = [dict(labels) for (n, labels) in series if n == "gpu_utilization_ratio"]
    assert [u["container_name"] for u in util] == [container.name]
    books = [dict(labels) for (n, labels), v in series.items() if n == "gpu_state_seconds_total" and v > 0]
    assert {(b["container_engine"], b["container_id"], b["container_name"], b["state"]) for b in books} == {
        ("podman", container.id[:12], container.name, "allocated_idle")}  # fmt: skip
    errors = {dict(labels)["source"]: v for (n, labels), v in series.items() if n == "gpu_exporter_holder_errors_total"}
    assert errors == {"engine_api": 0}
