"""Item 1 of issue 15, on a real kernel: the base's security context reaches the kubelet's socket.

The kubelet creates /var/lib/kubelet/pod-resources with mode 0750, owned by root (setupDataDirs in
pkg/kubelet/kubelet.go), and its kubelet.sock owned by root, writable by root alone. This test
builds the same thing around a fake kubelet (a real gRPC server), then runs the real daemon as the
rendered DaemonSet runs it:
- in a mount namespace of its own, where the directory is bind-mounted read-only (the
  DaemonSet's hostPath volume with ``readOnly: true``);
- with the uid and gid of the pod's securityContext, every capability dropped (the bounding set
  too, so not even root gets one back at exec) and no_new_privs (allowPrivilegeEscalation: false).

The base (uid 0) must attribute pods; the non-root overlay's uid, given the same mount, must not
(which is why that overlay removes the mount and turns attribution off).

Needs root and ``unshare``/``setpriv`` (util-linux), as CI has; elsewhere it is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.exporter_helpers import RunningDaemon, _drain, _listening_port, value, wait_for
from tests.fake_kubelet import FakeKubelet, pod
from tests.fakenvml import Scenario, subprocess_env
from tests.fakenvml.presets import h100_sxm
from tests.test_deploy_k8s import BASE, EXAMPLES, POD_RESOURCES_MOUNT, kustomize, pod_spec

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024**3


def _have_namespaces() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not _have_namespaces(), reason="needs root, unshare -m and setpriv"),
]


def _runs_as(uid: int, python: str, env: dict[str, str]) -> bool:
    out = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", python, "-c",
         "import gpu_exporter.cli, grpc, pydantic_settings"],
        env=env, capture_output=True, timeout=60,
    )  # fmt: skip
    return out.returncode == 0


def interpreter_for(uid: int) -> tuple[str, dict[str, str]]:
    """A Python that ``uid`` may execute, with this checkout and its virtualenv's packages.

    The virtualenv's own interpreter may live under a directory only root can enter (pyenv under
    /root); the system's Python of the same minor version loads the same packages then.
    """
    site = sysconfig.get_paths()["purelib"]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), site]), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (os.path.realpath(sys.executable), f"/usr/bin/{minor}", f"/usr/local/bin/{minor}"):
        if os.path.exists(candidate) and _runs_as(uid, candidate, env):
            return candidate, env
    pytest.skip(f"no Python {minor} that uid {uid} may run with this checkout's packages")


@pytest.fixture
def node(world: Path) -> Iterator[tuple[Scenario, FakeKubelet, Path]]:
    """Three GPUs, a kubelet whose pod-resources directory and socket are as the kubelet makes
    them, and an empty directory where the container's mount goes."""
    s = Scenario(world / "node.scn")
    for i in range(3):
        h100_sxm(s.add_gpu(), "k8s-node", i, util=50, mem_used=10 * GIB, power_mw=300_000)
    s.write()
    (world / "node.scn").chmod(0o644)
    kubelet_dir = world / "var-lib-kubelet" / "pod-resources"
    kubelet_dir.parent.mkdir(mode=0o750)
    kubelet_dir.mkdir(mode=0o750)
    os.chown(kubelet_dir, 0, 0)
    kubelet = FakeKubelet(kubelet_dir / "kubelet.sock")
    kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [str(s.gpu(0).values["uuid"])]))]
    kubelet.start()
    # As the kubelet's listener leaves it under its umask 022: root's, not group- or world-writable.
    kubelet.socket_path.chmod(0o755)
    st = kubelet.socket_path.stat()
    assert stat.S_ISSOCK(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(kubelet_dir.stat().st_mode) == 0o750
    mount_point = world / "container" / "pod-resources"
    mount_point.mkdir(parents=True)
    for d in (world / "container", mount_point):
        d.chmod(0o755)
    try:
        yield s, kubelet, mount_point
    finally:
        kubelet.stop()


@contextmanager
def daemon_as_the_pod(pod: dict[str, object], s: Scenario, kubelet: FakeKubelet, mount_point: Path,
                      world: Path) -> Iterator[RunningDaemon]:  # fmt: skip
    sc = pod["securityContext"]
    assert isinstance(sc, dict)
    uid, gid = int(sc["runAsUser"]), int(sc["runAsGroup"])
    python, py_env = interpreter_for(uid)
    config = world / f"config-{uid}.yaml"
    config.write_text(yaml.safe_dump({
        "node_name": "gpu-node-1",
        "kubernetes": {"pod_attribution": "on", "pod_resources_socket": str(mount_point / "kubelet.sock"),
                       "refresh_interval": "200ms", "timeout": "1s"},
    }))  # fmt: skip
    config.chmod(0o644)
    env = subprocess_env(s.path, base=py_env)
    source = kubelet.socket_path.parent
    script = (
        f'mount --bind "{source}" "{mount_point}" && mount -o remount,bind,ro "{mount_point}" && '
        f"exec setpriv --reuid={uid} --regid={gid} --clear-groups --inh-caps=-all --bounding-set=-all "
        f'--no-new-privs -- "$@"'
    )
    cmd = [python, "-m", "gpu_exporter", "--config", str(config), "--web.listen-address", "127.0.0.1:0",
           "--log.format", "json", "--poll.interval", "200ms"]  # fmt: skip
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd],
                            env=env, cwd=world, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    log: list[dict[str, object]] = []
    drain = threading.Thread(target=_drain, args=(proc, log), daemon=True)
    drain.start()
    try:
        d = RunningDaemon(proc, _listening_port(proc, log, timeout=60), log)
        # What the kernel says of the process that serves: the pod's ids, and no capability at all.
        status = dict(line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines())
        assert status["Uid"].split()[:2] == [str(uid), str(uid)] and status["Gid"].split()[0] == str(gid)
        for caps in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status[caps], 16) == 0, (caps, status[caps])
        assert status["NoNewPrivs"].strip() == "1"
        yield d
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        drain.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()


def holder_of_gpu0(d: RunningDaemon) -> str:
    for (name, labels), _ in d.metrics().items():
        if name == "gpu_up" and ("gpu", "0") in labels:
            return dict(labels).get("pod", "")
    return ""


def test_the_base_security_context_attributes_pods_through_a_read_only_mount(
    node: tuple[Scenario, FakeKubelet, Path], world: Path
) -> None:
    s, kubelet, mount_point = node
    pod = pod_spec(kustomize(BASE))
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == POD_RESOURCES_MOUNT)
    assert mount["readOnly"] is True and pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    with daemon_as_the_pod(pod, s, kubelet, mount_point, world) as d:
        wait_for(lambda: holder_of_gpu0(d) == "trainer-0", timeout=30, what="pod labels from the kubelet")
        assert (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="ok") or 0) >= 1
        assert not (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="error") or 0)
        # The mount really is read-only for it: the daemon's namespace refuses a write there.
        probe = subprocess.run(["nsenter", "-t", str(d.proc.pid), "-m", "touch", str(mount_point / "x")],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        assert probe.returncode != 0 and "Read-only file system" in probe.stderr


def test_the_non_root_uid_cannot_reach_the_socket(node: tuple[Scenario, FakeKubelet, Path], world: Path) -> None:
    """Why components/non-root drops the mount: as 65532, the same mount gives no pod labels."""
    s, kubelet, mount_point = node
    pod = pod_spec(kustomize(EXAMPLES / "non-root"))
    with daemon_as_the_pod(pod, s, kubelet, mount_point, world) as d:
        wait_for(lambda: (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="error") or 0) >= 2,
                 timeout=30, what="refreshes failing")  # fmt: skip
        assert holder_of_gpu0(d) == ""
        assert not (value(d.metrics(), "gpu_exporter_kubelet_refreshes_total", outcome="ok") or 0)
        failures = [e for e in d.log if e.get("event") == "pod_attribution_failed"]
        assert failures and "ermission denied" in json.dumps(failures), d.log
