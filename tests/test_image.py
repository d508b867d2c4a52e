"""The Dockerfile built by a real image builder (podman, with Debian's runc), and the image run.

tests/test_dockerfile.py replays the Dockerfile's steps without an engine; this builds it for real:
every instruction, the build stage's wheelhouse bind-mounted into the runtime stage, USER,
ENTRYPOINT and HEALTHCHECK. Then the image runs ``--version`` and ``--once --simulate``, and runs
the daemon as the base DaemonSet does (its uid, every capability dropped, a read-only root, no new
privileges, /tmp on a tmpfs, the ConfigMap's file, the kubelet's socket directory mounted
read-only) against the fake NVML and a fake kubelet, and must attribute a pod.

What is not real: the base image. ``python:3.11-slim`` comes from Docker Hub, which these machines
cannot reach; a stand-in is made here with debootstrap from Debian bookworm (the release that
image is built on) with its python3.11, and given that name in a podman storage of the tests' own
(~/.cache/gpu-exporter-tests/podman), so that nothing outside it sees the name. It is made once
and reused.

Needs root, podman, runc and debootstrap (.ci/setup installs them); elsewhere it is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.alerting_helpers import free_port
from tests.exporter_helpers import http_get, parse_exposition, wait_for
from tests.fake_kubelet import FakeKubelet, pod
from tests.fakenvml import Scenario, build_library
from tests.fakenvml.presets import h100_sxm
from tests.test_deploy_k8s import BASE, POD_RESOURCES_MOUNT, kustomize, of_kind, one, pod_spec

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
STORE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpu-exporter-tests" / "podman"
BASE_PACKAGES = "python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
STAND_IN = "localhost/gpu-exporter-tests/debian-python:bookworm"
IMAGE = "localhost/gpu-exporter:test"
GIB = 1024**3
# The machine's hard limit on open files may be below podman's default for containers.
ULIMITS = ["--ulimit", "nofile=1024:4096", "--ulimit", "nproc=4096:4096"]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("podman", "runc", "debootstrap"):
        if not shutil.which(tool):
            return f"{tool} is missing (bash .ci/setup installs it)"
    return None


pytestmark = [pytest.mark.integration, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["podman", "--root", str(STORE / "root"), "--runroot", str(STORE / "run"), "--runtime", "runc", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def dockerfile_base() -> str:
    """The first stage's base image with its ARG default filled in, e.g. python:3.11-slim."""
    text = DOCKERFILE.read_text()
    version = re.search(r"^ARG PYTHON_VERSION=(\S+)", text, flags=re.MULTILINE)
    base = re.search(r"^FROM (\S+)", text, flags=re.MULTILINE)
    assert version and base
    return base.group(1).replace("${PYTHON_VERSION}", version.group(1))


def stand_in_base() -> str:
    """The stand-in for the Dockerfile's base, made once, under the name the Dockerfile asks for."""
    name = dockerfile_base()
    assert re.fullmatch(r"python:3\.11-slim", name), f"{name}: the bookworm stand-in has Python 3.11 only"
    if podman("image", "exists", STAND_IN, check=False).returncode != 0:
        with tempfile.TemporaryDirectory(prefix="gpu-exporter-rootfs-") as rootfs:
            out = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", rootfs,
                 "http://deb.debian.org/debian"],
                capture_output=True, text=True, timeout=1200,
            )  # fmt: skip
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
            tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
            cmd = ["podman", "--root", str(STORE / "root"), "--runroot", str(STORE / "run"), "import",
                   "--change", 'CMD ["python3"]', "-", STAND_IN]  # fmt: skip
            imported = subprocess.run(cmd, stdin=tar.stdout, capture_output=True, text=True, timeout=600)
            assert tar.stdout is not None
            tar.stdout.close()
            assert tar.wait(timeout=60) == 0 and imported.returncode == 0, imported.stderr
    podman("tag", STAND_IN, f"docker.io/library/{name}")
    return name


@pytest.fixture(scope="module")
def image() -> str:
    STORE.mkdir(parents=True, exist_ok=True)
    stand_in_base()
    # The machine's CA bundle, for pip inside the build (a TLS-inspecting proxy may sit in between).
    certs = ["-v", "/etc/ssl/certs:/etc/ssl/certs:ro"] if Path("/etc/ssl/certs").is_dir() else []
    podman("build", "--pull=never", "--network", "host", "--format", "docker", *ULIMITS, *certs,
           "-f", str(DOCKERFILE), "-t", IMAGE, str(ROOT), timeout=1200)  # fmt: skip
    return IMAGE


def run(image: str, *args: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return podman("run", "--rm", *ULIMITS, *options, image, *args, timeout=300, check=False)


def test_the_image_runs_once_simulate(image: str) -> None:
    version = run(image, "--version", options=("--network", "none"))
    assert version.returncode == 0 and version.stdout.strip() == "gpu-exporter 0.1.0", version.stderr
    out = run(image, "--once", "--simulate", "--simulate.gpus", "2", "--format", "json", options=("--network", "none"))
    assert out.returncode in (0, 1), out.stderr  # 1: the simulated GPUs have findings
    doc = json.loads(out.stdout)
    assert doc["nvml_up"] is True and len(doc["gpus"]) == 2


def test_the_image_config(image: str) -> None:
    (info,) = json.loads(podman("image", "inspect", image).stdout)
    config = info["Config"]
    assert config["User"] == "65532:65532" and config["Entrypoint"] == ["gpu-exporter"]
    assert "9445/tcp" in config["ExposedPorts"]
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["Env"] and "NVIDIA_DRIVER_CAPABILITIES=utility" in config["Env"]
    assert info["Healthcheck"]["Test"][0] == "CMD" and "/healthz" in " ".join(info["Healthcheck"]["Test"])
    whoami = run(image, options=("--network", "none", "--entrypoint", "id"))
    assert whoami.stdout.split()[:2] == ["uid=65532(gpu-exporter)", "gid=65532(gpu-exporter)"]


def test_the_healthcheck_passes_while_the_daemon_serves(image: str) -> None:
    """HEALTHCHECK serves `podman run`/`docker run` (Kubernetes uses the probes): in a network
    namespace of its own, the daemon on its default port, as the image starts it."""
    name = f"gpu-exporter-health-{os.getpid()}"
    podman("run", "-d", "--name", name, "--network", "none", *ULIMITS, image, "--simulate")
    try:
        deadline = time.monotonic() + 60
        while podman("healthcheck", "run", name, check=False).returncode != 0:
            assert podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip() == "running"
            assert time.monotonic() < deadline, podman("logs", name, check=False).stderr[-3000:]
            time.sleep(0.5)
        podman("stop", "--time", "10", name)
        assert podman("healthcheck", "run", name, check=False).returncode != 0  # stopped: unhealthy
    finally:
        podman("rm", "-f", name, check=False)


@pytest.fixture
def node() -> Iterator[tuple[Path, Scenario, FakeKubelet]]:
    """The fake NVML's files and a kubelet socket directory as the kubelet makes it (0750, root)."""
    work = Path(tempfile.mkdtemp(prefix="gpu-exporter-image-"))
    s = Scenario(work / "scenario" / "node.scn")
    (work / "scenario").mkdir()
    for i in range(2):
        h100_sxm(s.add_gpu(), "image", i, util=50, mem_used=10 * GIB, power_mw=300_000)
    s.write()
    kubelet = FakeKubelet(work / "pod-resources" / "kubelet.sock")
    kubelet.socket_path.parent.mkdir(mode=0o750)
    kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [str(s.gpu(1).values["uuid"])]))]
    kubelet.start()
    kubelet.socket_path.chmod(0o755)
    try:
        yield work, s, kubelet
    finally:
        kubelet.stop()
        shutil.rmtree(work, ignore_errors=True)


def podman_options_for(pod: dict[str, object]) -> list[str]:
    """The rendered pod's security context, as podman options."""
    psc = pod["securityContext"]
    containers = pod["containers"]
    assert isinstance(psc, dict) and isinstance(containers, list) and len(containers) == 1
    sc = containers[0]["securityContext"]
    opts = ["--user", f"{psc['runAsUser']}:{psc['runAsGroup']}"]
    # RuntimeDefault is podman's own default seccomp profile: nothing to add for it.
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    if sc["capabilities"] == {"drop": ["ALL"]}:
        opts += ["--cap-drop", "ALL"]
    if sc["readOnlyRootFilesystem"]:
        opts.append("--read-only")
    if sc["allowPrivilegeEscalation"] is False:
        opts += ["--security-opt", "no-new-privileges"]
    return opts


def test_the_image_runs_as_the_daemonset_and_attributes_pods(
    image: str, node: tuple[Path, Scenario, FakeKubelet]
) -> None:
    work, s, kubelet = node
    docs = kustomize(BASE)
    pod = pod_spec(docs)
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    options = podman_options_for(pod)
    for m in container["volumeMounts"]:
        v = volumes[m["name"]]
        if "configMap" in v:  # the ConfigMap's files, as the kubelet projects them
            cm = next(c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"] == v["configMap"]["name"])
            d = work / "configmap"
            d.mkdir()
            for key, text in cm["data"].items():
                (d / key).write_text(text)
            options += ["-v", f"{d}:{m['mountPath']}:ro"]
        elif "emptyDir" in v:
            options += ["--tmpfs", m["mountPath"]]
        elif "hostPath" in v:
            assert m["mountPath"] == POD_RESOURCES_MOUNT and m["readOnly"] is True
            options += ["-v", f"{kubelet.socket_path.parent}:{m['mountPath']}:ro"]
    # What the NVIDIA toolkit would inject: here the fake libnvidia-ml.so.1 and its scenario.
    lib = build_library()
    options += ["-v", f"{lib.parent}:/usr/lib/fake-nvml:ro", "-e", "LD_LIBRARY_PATH=/usr/lib/fake-nvml",
                "-v", f"{s.path.parent}:/scenario:ro", "-e", f"FAKE_NVML_SCENARIO=/scenario/{s.path.name}"]  # fmt: skip
    for e in container["env"]:
        options += ["-e", f"{e['name']}={e.get('value', 'gpu-node-1')}"]  # NODE_NAME from the downward API
    port = free_port()
    name = f"gpu-exporter-test-{os.getpid()}-{port}"
    args = [*container["args"], "--web.listen-address", f"127.0.0.1:{port}", "--poll.interval", "1s"]
    podman("run", "-d", "--name", name, "--network", "host", *ULIMITS, *options, image, *args)
    try:

        def pods_on_metrics() -> dict[str, str]:
            try:
                status, _, body = http_get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return {}
            if status != 200:
                return {}
            return {dict(ls)["gpu"]: dict(ls).get("pod", "") for (n, ls) in parse_exposition(body.decode())
                    if n == "gpu_up"}  # fmt: skip

        deadline = time.monotonic() + 90
        while pods_on_metrics() != {"0": "", "1": "trainer-0"}:
            state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            assert state == "running", podman("logs", name, check=False).stderr[-3000:]
            assert time.monotonic() < deadline, podman("logs", name, check=False).stderr[-3000:]
            time.sleep(0.5)
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, timeout=30, what="/readyz")
        # The process really runs as the pod says: uid 0 with no capability.
        status = podman("exec", name, "cat", "/proc/1/status").stdout
        fields = dict(line.split(":", 1) for line in status.splitlines())
        assert fields["Uid"].split()[0] == "0" and int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0
        assert fields["NoNewPrivs"].strip() == "1"
        wrote = podman("exec", name, "touch", "/opt/x", check=False)
        assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr
        logs = podman("logs", name).stderr
        assert "pod_attribution_on" in logs and '"level": "error"' not in logs, logs[-3000:]
        assert one(docs, "DaemonSet")  # the base this ran is the one that renders
    finally:
        podman("rm", "-f", name, check=False)
