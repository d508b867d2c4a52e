"""Every command docs/deploying.md (the README's "Deploying") shows is run here, as written.

A command that needs a cluster, a Docker engine or a Grafana host says so in a trailing
``# needs ...`` comment; those are listed, not run.  A command added to the README without a
runner here fails the first test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.exporter_helpers import DAEMON_STOP_S, http_get, wait_for
from tests.fakenvml import subprocess_env
from tests.fakenvml.presets import SCENARIO_DIR
from tests.timing import LATE_S

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEPLOYING = ROOT / "docs" / "deploying.md"
VENV_BIN = Path(sys.executable).parent


def deploying_section() -> str:
    return DEPLOYING.read_text().split("\n## ", 1)[1]


def shown_commands() -> tuple[list[str], list[str]]:
    """(commands to run, commands that need outside infrastructure) from the sh blocks."""
    run: list[str] = []
    outside: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", deploying_section(), flags=re.DOTALL):
        for line in block.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            (outside if re.search(r"  # needs ", line) else run).append(line)
    return run, outside


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch directory that sees the repo's deploy/ and alerts/, so outputs land outside the repo."""
    d = tmp_path_factory.mktemp("readme")
    for name in ("deploy", "alerts"):
        (d / name).symlink_to(ROOT / name)
    return d


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


def shell(cmd: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def base_env(home: Path) -> dict[str, str]:
    env = subprocess_env(SCENARIO_DIR / "h100-8x-training.scn")  # the fake NVIDIA driver
    env["HOME"] = str(home)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def serve_briefly(cmd: str, cwd: Path, env: dict[str, str]) -> None:
    """Start a daemon command, see /metrics and /readyz answer on the default port, stop it."""
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: _answers("http://127.0.0.1:9445/readyz"), timeout=30, what=f"{cmd!r} serving")
        status, _, body = http_get("http://127.0.0.1:9445/metrics")
        assert status == 200 and b"gpu_up{" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DAEMON_STOP_S + LATE_S) == 0, proc.stderr.read() if proc.stderr else ""


def _answers(url: str) -> bool:
    try:
        return http_get(url)[0] == 200
    except OSError:
        return False


Runner = Callable[[str, Path, Path], None]


def _ok(cmd: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    out = shell(cmd, cwd, base_env(home))
    assert out.returncode == 0, f"{cmd}\n{out.stdout}\n{out.stderr}"
    return out


def _succeeds(cmd: str, cwd: Path, home: Path) -> None:
    _ok(cmd, cwd, home)


def _once(cmd: str, cwd: Path, home: Path) -> None:
    assert "GPU 0  NVIDIA H100 80GB HBM3" in _ok(cmd, cwd, home).stdout


def _pip_install(cmd: str, cwd: Path, home: Path) -> None:
    # "pip install ." from a checkout: a copy of the files a checkout has.
    src = cwd / "checkout"
    if not src.exists():
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, src / name)
        shutil.copytree(ROOT / "gpu_exporter", src / "gpu_exporter", ignore=shutil.ignore_patterns("__pycache__"))
    _ok(cmd, src, home)
    assert (home / "gpu-exporter" / "bin" / "gpu-exporter").exists()


def _kustomize(cmd: str, cwd: Path, home: Path) -> None:
    docs = list(yaml.safe_load_all(_ok(cmd, cwd, home).stdout))
    assert {"DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap"} <= {d["kind"] for d in docs}


def _configmap(cmd: str, cwd: Path, home: Path) -> None:
    _ok(cmd, cwd, home)
    out = cwd / cmd.rsplit("> ", 1)[1].strip()
    doc = yaml.safe_load(out.read_text())
    assert doc["kind"] == "ConfigMap"
    if "labelled" in out.name:
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert {"gpu-fleet.json", "gpu-node.json"} <= doc["data"].keys()


def _serve(cmd: str, cwd: Path, home: Path) -> None:
    serve_briefly(cmd, cwd, base_env(home))


RUNNERS: dict[str, Runner] = {
    "python3 -m venv ~/gpu-exporter": _succeeds,
    "~/gpu-exporter/bin/pip install .": _pip_install,
    "~/gpu-exporter/bin/gpu-exporter --once": _once,
    "~/gpu-exporter/bin/gpu-exporter": _serve,
    "kubectl kustomize deploy/k8s/base": _kustomize,
    "kubectl kustomize deploy/k8s/examples": _kustomize,
    "promtool check rules alerts/gpu-exporter.rules.yml": _succeeds,
    "promtool test rules alerts/tests/gpu-exporter.rules.test.yml": _succeeds,
    "gpu-exporter --alerting.alertmanager-url http://alertmanager:9093": _serve,
    "amtool check-config deploy/k8s/examples/alertmanager.yml": _succeeds,
    "kubectl -n monitoring create configmap gpu-exporter-dashboards --from-file=deploy/grafana/dashboards/"
    " --dry-run=client -o yaml > dashboards-configmap.yaml": _configmap,
    "kubectl label --local -f dashboards-configmap.yaml grafana_dashboard=1"
    " -o yaml > dashboards-configmap-labelled.yaml": _configmap,
}  # fmt: skip

OUTSIDE = {
    "python3 -m venv /opt/gpu-exporter/venv && /opt/gpu-exporter/venv/bin/pip install .  # needs root on the GPU host",
    "useradd --system --no-create-home --shell /usr/sbin/nologin gpu-exporter  # needs root on the GPU host",
    "install -m 0644 deploy/systemd/gpu-exporter.service /etc/systemd/system/  # needs root on the GPU host",
    "systemctl daemon-reload && systemctl enable --now gpu-exporter  # needs root and systemd on the GPU host",
    "podman build -t registry.example.com/gpu-exporter:0.1.0 .  # needs a container engine and Docker Hub"
    " (python:3.11-slim)",
    "podman push registry.example.com/gpu-exporter:0.1.0  # needs your registry",
    "podman run --rm registry.example.com/gpu-exporter:0.1.0 --once --simulate  # needs the image built above",
    "kubectl get runtimeclass nvidia  # needs a cluster",
    "kubectl create namespace gpu-exporter  # needs a cluster",
    "kubectl label namespace gpu-exporter pod-security.kubernetes.io/enforce=privileged  # needs a cluster",
    "helm install gpu-exporter deploy/helm/gpu-exporter -n gpu-exporter"
    " -f deploy/helm/examples/kube-prometheus-stack.yaml  # needs a cluster",
    "helm install gpu-exporter deploy/helm/gpu-exporter -n gpu-exporter"
    " -f deploy/helm/examples/dcgm-exporter.yaml  # needs a cluster",
    "kubectl apply -k deploy/k8s/examples  # needs a cluster with the prometheus-operator CRDs",
    "kubectl -n gpu-exporter rollout status daemonset/gpu-exporter  # needs a cluster",
    "kubectl apply -f dashboards-configmap-labelled.yaml  # needs a cluster",
    "PROMETHEUS_URL=http://prometheus.example:9090 docker compose -f deploy/grafana/docker-compose.yaml up -d"
    "  # needs a Docker engine",
}  # fmt: skip


def test_every_command_shown_has_a_runner() -> None:
    run, outside = shown_commands()
    assert set(run) == set(RUNNERS), "a README command without a runner here, or a runner for a removed one"
    assert set(outside) == OUTSIDE


def test_the_helm_steps_build_the_image_and_label_the_namespace_first() -> None:
    """A newcomer found no published image and a Helm line that skipped the Pod Security label
    docs/helm.md asks for: the README builds and pushes the image, then labels the namespace as
    docs/helm.md does, before any ``helm install``."""
    _, outside = shown_commands()
    first_helm = next(i for i, c in enumerate(outside) if c.startswith("helm install"))
    before = [c.split("  # needs ")[0] for c in outside[:first_helm]]
    assert any(c.startswith("podman build ") for c in before) and any(c.startswith("podman push ") for c in before)
    helm_doc = (ROOT / "docs" / "helm.md").read_text()
    asked = re.findall(r"^\s*(kubectl (?:create|label) namespace .*)$", helm_doc, flags=re.M)
    assert asked and all(c in before for c in asked), (asked, before)
    assert "There is no published image" in deploying_section()


def test_the_commands_in_order(workdir: Path, home: Path) -> None:
    run, _ = shown_commands()
    for cmd in run:  # in README order: later commands use what earlier ones made
        RUNNERS[cmd](cmd, workdir, home)


def test_the_prometheus_config_snippet(tmp_path: Path) -> None:
    snippet = re.search(r"```yaml\n(# prometheus.yml.*?)```", deploying_section(), flags=re.DOTALL)
    assert snippet
    config = yaml.safe_load(snippet.group(1))
    config["rule_files"] = [str(ROOT / "alerts" / "gpu-exporter.rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    promtool = shutil.which("promtool")
    assert promtool
    out = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
