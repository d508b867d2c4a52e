"""deploy/k8s: the kustomize base (and the example overlay) checked by the real tools.

kubectl kustomize renders it (offline: only local files), kubernetes-validate checks every
built-in object against the bundled OpenAPI schemas of Kubernetes 1.29 and of the newest version
it ships, the prometheus-operator objects get a structural check, the ConfigMap's config file is
loaded by the exporter's own settings code, amtool routes the example Alertmanager
configuration, and checkov scans the manifests and the Dockerfile (offline: --skip-download).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate.utils  # type: ignore[import-untyped]
import pytest
import yaml

from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.config import load_settings

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
EXAMPLES = K8S / "examples"
VENV_BIN = Path(sys.executable).parent
NAMESPACE = "gpu-exporter"
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"),
}
BUILTIN_GROUPS = {"", "apps", "batch", "policy", "autoscaling"}  # plus every *.k8s.io group
OLDEST_SUPPORTED = "1.29.0"
NEWEST_BUNDLED = str(kubernetes_validate.utils.latest_version())

Doc = dict[str, Any]


def tool(name: str) -> str:
    """A command installed into this virtualenv (next to the running interpreter)."""
    path = shutil.which(name, path=str(VENV_BIN))
    assert path is not None, f"{name} is not installed in {VENV_BIN}; run .ci/setup"
    return path


def kustomize(directory: Path) -> list[Doc]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def is_builtin(doc: Doc) -> bool:
    group = doc["apiVersion"].rpartition("/")[0]
    return group in BUILTIN_GROUPS or group.endswith(".k8s.io")


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str) -> Doc:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def uncomment_settings(text: str) -> str:
    """Commented-out settings start with "#" in the first column, followed by the line as it was
    ("#key: value", "#  nested: value"); prose comments are "# text" or indented."""
    return re.sub(r"^#(?=[^\s#]| {2,})", "", text, flags=re.MULTILINE)


@pytest.fixture(scope="module")
def base() -> list[Doc]:
    return kustomize(BASE)


@pytest.fixture(scope="module")
def overlay() -> list[Doc]:
    return kustomize(EXAMPLES)


@pytest.fixture(scope="module")
def daemonset(base: list[Doc]) -> Doc:
    return one(base, "DaemonSet")


@pytest.fixture(scope="module")
def container(daemonset: Doc) -> Doc:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: Doc = containers[0]
    return c


# --- rendering and schemas ----------------------------------------------------------------------


def test_base_renders_the_expected_objects(base: list[Doc]) -> None:
    kinds = sorted(d["kind"] for d in base)
    assert kinds == sorted(
        [
            *("Namespace", "ServiceAccount", "ConfigMap", "Service", "NetworkPolicy", "PriorityClass", "DaemonSet"),
            *("ServiceMonitor", "PrometheusRule"),
        ]
    )
    for doc in base:
        assert is_builtin(doc) or (doc["apiVersion"], doc["kind"]) in CRD_KINDS, doc["kind"]
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "gpu-exporter"
        assert labels["app.kubernetes.io/part-of"] == "gpu-exporter"
        cluster_scoped = doc["kind"] in {"Namespace", "PriorityClass"}
        assert doc["metadata"].get("namespace") == (None if cluster_scoped else NAMESPACE), doc["kind"]
    assert one(base, "Namespace")["metadata"]["name"] == NAMESPACE


def test_the_generated_prometheusrule_is_included_unchanged(base: list[Doc]) -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert "prometheusrule.yaml" in kustomization["resources"]
    source = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    rendered = one(base, "PrometheusRule")
    assert rendered["spec"] == source["spec"]


def test_the_image_is_set_by_kustomize(container: Doc) -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["name"] == "gpu-exporter"
    assert container["image"] == f"{image['newName']}:{image['newTag']}"
    assert image["newTag"] != "latest"
    assert re.fullmatch(r"[a-z0-9./-]+", image["newName"]), "image repositories must be lowercase"


@pytest.mark.parametrize("version", [OLDEST_SUPPORTED, NEWEST_BUNDLED])
@pytest.mark.parametrize("which", ["base", "examples"])
def test_builtin_objects_validate_strictly(
    which: str, version: str, base: list[Doc], overlay: list[Doc], tmp_path: Path
) -> None:
    # The schema of exactly this version is bundled (kubernetes-validate would otherwise fall back
    # silently to an older one).
    assert version in kubernetes_validate.utils.all_versions()
    docs = [d for d in (base if which == "base" else overlay) if is_builtin(d)]
    path = tmp_path / "builtin.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    out = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "-k", version, str(path)], capture_output=True, text=True, timeout=120
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert text.count("passed for resource") == len(docs), text
    assert "WARN" not in text and "ERROR" not in text, text


def test_newest_bundled_version_is_newer_than_the_oldest_supported() -> None:
    from packaging.version import Version

    assert Version(NEWEST_BUNDLED) > Version(OLDEST_SUPPORTED)


# --- the DaemonSet ------------------------------------------------------------------------------


def test_daemonset_runs_only_on_gpu_nodes(daemonset: Doc) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_daemonset_environment(container: Doc) -> None:
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # A GPU request would take a GPU away from the workloads; the toolkit injects them all.
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})


def test_daemonset_security_context(daemonset: Doc, container: Doc) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["runAsNonRoot"] is True and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsUser"] >= 10000
    # The same UID as the image's USER.
    user = re.search(r"^USER\s+(\d+)", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE)
    assert user and int(user.group(1)) == pod["securityContext"]["runAsUser"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "gpu-exporter"


def test_daemonset_probes_and_port(container: Doc) -> None:
    assert container["ports"] == [{"name": "metrics", "containerPort": 9445, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_daemonset_resources_follow_the_benchmark(container: Doc) -> None:
    res = container["resources"]
    assert res["requests"] == {"cpu": "50m", "memory": "64Mi"}
    assert res["limits"]["memory"] == "128Mi"
    # benchmarks/results/core.md: resident memory stays about 45 MiB; requests and limits leave room.
    rss = re.search(r"max: ([\d.]+) MiB", (ROOT / "benchmarks" / "results" / "core.md").read_text())
    assert rss and float(rss.group(1)) * 1.2 < 64 and 128 >= 2 * 64


def test_daemonset_volumes_and_config_argument(daemonset: Doc, container: Doc, base: list[Doc]) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}

    pr = mounts["/var/lib/kubelet/pod-resources"]
    assert pr["readOnly"] is True
    assert volumes[pr["name"]]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}

    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]

    args = container["args"]
    config_path = args[args.index("--config") + 1]
    directory, _, key = config_path.rpartition("/")
    config_mount = mounts[directory]
    assert config_mount["readOnly"] is True
    configmap_name = volumes[config_mount["name"]]["configMap"]["name"]
    configmap = next(c for c in of_kind(base, "ConfigMap") if c["metadata"]["name"] == configmap_name)
    assert key in configmap["data"]


def test_daemonset_scheduling_and_updates(daemonset: Doc, base: list[Doc]) -> None:
    spec = daemonset["spec"]
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    assert spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"]
    pod = spec["template"]["spec"]
    pc = one(base, "PriorityClass")
    assert pod["priorityClassName"] == pc["metadata"]["name"] == "gpu-exporter-node-critical"
    assert 0 < pc["value"] < 1_000_000_000  # above workloads, below the system-* classes
    assert pc["preemptionPolicy"] == "Never" and pc["globalDefault"] is False
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


# --- the config file ----------------------------------------------------------------------------


def config_text(base: list[Doc], container: Doc) -> tuple[str, str]:
    args = container["args"]
    path = args[args.index("--config") + 1]
    configmap = next(c for c in of_kind(base, "ConfigMap") if path.rpartition("/")[2] in c["data"])
    text: str = configmap["data"][path.rpartition("/")[2]]
    return path, text


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GPU_EXPORTER_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_config_is_accepted_by_the_exporter(base: list[Doc], container: Doc, tmp_path: Path) -> None:
    _, text = config_text(base, container)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    settings = load_settings(None, path)
    assert settings.listen_address.rpartition(":")[2] == str(container["ports"][0]["containerPort"])
    assert settings.log_format == "json"
    assert settings.node_name is None  # comes from $NODE_NAME (the downward API)
    assert settings.alerting.alertmanagers == [] and settings.alerting.webhooks == []
    assert isinstance(settings.rules, RulesSettings)


@pytest.mark.usefixtures("clean_env")
def test_commented_out_alerting_example_is_valid(base: list[Doc], container: Doc, tmp_path: Path) -> None:
    _, text = config_text(base, container)
    path = tmp_path / "config.yaml"
    path.write_text(uncomment_settings(text))
    settings = load_settings(None, path)
    assert [r.url for r in settings.alerting.alertmanagers] == ["http://alertmanager-operated.monitoring.svc:9093"]
    assert [r.label for r in settings.alerting.webhooks] == ["ops"]


@pytest.mark.usefixtures("clean_env")
def test_daemonset_command_line_runs(base: list[Doc], container: Doc, tmp_path: Path) -> None:
    """The container's args and env, with the ConfigMap's file, through the real CLI."""
    config_path, text = config_text(base, container)
    (tmp_path / "config.yaml").write_text(text)
    args = [str(tmp_path / "config.yaml") if a == config_path else a for a in container["args"]]
    env = dict(os.environ)
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    env["NODE_NAME"] = "gpu-node-1"
    out = subprocess.run(
        [tool("gpu-exporter"), *args, "--once", "--simulate", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode in (0, 1), out.stderr  # 1: the simulated GPUs have findings
    assert json.loads(out.stdout)["nvml_up"] is True


# --- prometheus-operator objects ----------------------------------------------------------------


def test_service_and_servicemonitor_fit_together(base: list[Doc], daemonset: Doc, container: Doc) -> None:
    service = one(base, "Service")
    assert service["spec"]["clusterIP"] == "None"
    (port,) = service["spec"]["ports"]
    assert port == {"name": "metrics", "port": 9445, "targetPort": "metrics", "protocol": "TCP"}
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()

    sm = one(base, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["metadata"]["name"]
    assert sm["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert "namespaceSelector" not in sm["spec"]  # its own namespace, where the Service is
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is False
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"} in (
        endpoint["relabelings"]
    )
    # The target's namespace/pod/container would clash with the workload labels of pod attribution.
    assert {"regex": "namespace|pod|container", "action": "labeldrop"} in endpoint["relabelings"]
    netpol = one(base, "NetworkPolicy")
    assert netpol["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert netpol["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]


def test_prometheusrule_structure(base: list[Doc]) -> None:
    rule = one(base, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["name"]
    groups = rule["spec"]["groups"]
    assert groups
    names = set()
    for group in groups:
        assert isinstance(group["name"], str) and group["name"]
        assert group["rules"]
        for r in group["rules"]:
            assert isinstance(r["expr"], str) and r["expr"].strip()
            if "record" in r:
                assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z_]+", r["record"]), r["record"]
                continue
            assert isinstance(r["alert"], str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", r["alert"])
            assert r["labels"]["severity"] in {"info", "warning", "critical"}
            names.add(r["alert"])
    assert {"GpuLost", "GpuXidError", "GpuMemoryHigh"} <= names


def prometheusrule_alerts(base: list[Doc]) -> set[str]:
    return {r["alert"] for g in one(base, "PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r}


def test_example_alertmanagerconfig_routes_every_alert(overlay: list[Doc], base: list[Doc]) -> None:
    amc = one(overlay, "AlertmanagerConfig")
    assert amc["apiVersion"] == "monitoring.coreos.com/v1alpha1" and amc["metadata"]["name"]
    assert amc["metadata"]["namespace"] == NAMESPACE
    route = amc["spec"]["route"]
    receivers = {r["name"]: r for r in amc["spec"]["receivers"]}
    assert route["receiver"] in receivers
    (hook,) = receivers[route["receiver"]]["webhookConfigs"]
    assert re.match(r"https?://", hook["url"])
    (matcher,) = route["matchers"]
    assert matcher["name"] == "alertname" and matcher["matchType"] == "=~"
    assert all(re.fullmatch(matcher["value"], a) for a in prometheusrule_alerts(base))
    # The example is not part of the base: it needs a cluster-specific webhook.
    assert not of_kind(base, "AlertmanagerConfig")


def test_example_alertmanager_yml_routes_gpu_alerts_to_the_webhook(base: list[Doc]) -> None:
    amtool = shutil.which("amtool")
    assert amtool is not None, "amtool (Debian package prometheus-alertmanager) is missing; run .ci/setup"
    config = EXAMPLES / "alertmanager.yml"
    check = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    def receiver(*labels: str) -> str:
        out = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={config}", *labels],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    for alert in sorted(prometheusrule_alerts(base)):
        assert receiver(f"alertname={alert}", "severity=critical", "node=n1") == "gpu-webhook", alert
    assert receiver("alertname=KubePodCrashLooping") == "default"


def test_example_overlay(overlay: list[Doc]) -> None:
    pod = one(overlay, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(overlay, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_example_root_fallback_keeps_everything_else_locked_down(tmp_path: Path) -> None:
    """The commented-out root patch of the example overlay, uncommented, still renders safely."""
    shutil.copytree(K8S, tmp_path / "k8s")
    kustomization = tmp_path / "k8s" / "examples" / "kustomization.yaml"
    kustomization.write_text(uncomment_settings(kustomization.read_text()))
    daemonset = one(kustomize(tmp_path / "k8s" / "examples"), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    sc = pod["containers"][0]["securityContext"]
    assert pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    assert sc["runAsNonRoot"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True


# --- checkov ------------------------------------------------------------------------------------


def checkov(target: Path, framework: str, cwd: Path) -> dict[str, Any]:
    env = dict(os.environ, CKV_SKIP_PACKAGE_UPDATE_CHECK="true")
    out = subprocess.run(
        [
            tool("checkov"),
            "-f",
            str(target),
            "--framework",
            framework,
            "--compact",
            "--skip-download",
            "--skip-results-upload",
            "-o",
            "json",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(out.stdout)
    assert isinstance(report, dict), f"checkov found nothing to scan in {target}: {out.stdout[:500]}"
    failed = report["results"]["failed_checks"]
    assert not failed, "\n".join(f"{c['check_id']} {c['check_name']} ({c['resource']})" for c in failed)
    assert not report["results"]["parsing_errors"]
    return report


@pytest.fixture(scope="module")
def checkov_manifests(base: list[Doc], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("checkov-k8s")
    path = tmp / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(base))
    return checkov(path, "kubernetes", tmp)


@pytest.fixture(scope="module")
def checkov_dockerfile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return checkov(ROOT / "Dockerfile", "dockerfile", tmp_path_factory.mktemp("checkov-docker"))


def skip_annotations(doc: Doc) -> dict[str, str]:
    """check id -> reason, from ``checkov.io/skipN: CKV_K8S_xx=reason`` annotations."""
    skips = {}
    for key, value in doc["metadata"].get("annotations", {}).items():
        if key.startswith("checkov.io/skip"):
            check, _, reason = value.partition("=")
            skips[check.strip()] = reason.strip()
    return skips


def test_checkov_passes_on_the_manifests(checkov_manifests: dict[str, Any], base: list[Doc]) -> None:
    results = checkov_manifests["results"]
    assert checkov_manifests["summary"]["passed"] >= 50
    scanned = {c["resource"].split(".")[0] for c in results["passed_checks"]}
    assert {"DaemonSet", "Service", "ServiceAccount"} <= scanned
    documented: dict[tuple[str, str], str] = {}
    for doc in base:
        for check, reason in skip_annotations(doc).items():
            documented[
                (f"{doc['kind']}.{doc['metadata'].get('namespace', 'default')}.{doc['metadata']['name']}", check)
            ] = reason
    skipped = {(c["resource"], c["check_id"]) for c in results["skipped_checks"]}
    assert skipped == set(documented), "every skip is annotated with a reason, and every annotation is used"
    for key, reason in documented.items():
        assert len(reason) >= 30, f"{key}: give the reason for the skip"


def test_checkov_passes_on_the_dockerfile(checkov_dockerfile: dict[str, Any]) -> None:
    results = checkov_dockerfile["results"]
    ids = {c["check_id"] for c in results["passed_checks"]}
    # HEALTHCHECK present, a USER, and that USER is not root.
    assert {"CKV_DOCKER_2", "CKV_DOCKER_3", "CKV_DOCKER_8"} <= ids
    for c in results["skipped_checks"]:
        assert c.get("suppress_comment"), f"{c['check_id']} is skipped without a reason"
