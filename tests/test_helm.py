"""deploy/helm/gpu-exporter: the Helm chart, checked by the real tools (helm 3.17.1 from .ci/setup).

- ``helm lint --strict`` on the default values and on every values file in deploy/helm/examples (the
  documented combinations), each rendered by ``helm template`` and held to the kustomize tests' own
  checks (tests/test_deploy_k8s.py's helpers): kubernetes-validate of every built-in object against
  Kubernetes 1.29 and the newest bundled schema, least privilege, Pod Security, scheduling, and the
  Service/ServiceMonitor/NetworkPolicy fit;
- each combination renders the same objects as its kustomize twin (the default: deploy/k8s/base),
  field for field apart from Helm's own labels, so that either one drifting fails;
- the config file each renders is accepted by the exporter's own settings code, and secrets come only
  from mounted Secrets;
- values.schema.json rejects a typo in a key, a negative duration and a bad choice, naming it;
- the PrometheusRules hold the groups of alerts/ (promtool checks them), the dashboards are those of
  deploy/grafana, the generated copies and versions are current (deploy/helm/generate.py --check),
  and ``helm package`` builds an archive that renders the same.

tests/test_dcgm_compat.py puts the chart's ServiceMonitor relabelling and rules in front of a real
Prometheus scraping the daemon.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from alerts.render_prometheusrule import groups as rule_groups
from gpu_exporter.settings.config import ConfigError, load_settings
from tests import assert_mentions
from tests.test_deploy_k8s import (
    CPU_NODE,
    GFD_NODE,
    GKE_NODE,
    LABELLED_NODE,
    NEWEST_BUNDLED,
    NFD_NODE,
    OLDEST_SUPPORTED,
    OPERATOR_NODE,
    PASSTHROUGH_NODE,
    POD_RESOURCES_MOUNT,
    assert_least_privilege,
    assert_scrape_objects_fit,
    clean_env,  # noqa: F401 - a fixture, used by name
    config_text,
    exporter,
    kustomize,
    of_kind,
    one,
    pod_spec,
    schedulable_on,
    validate_builtin_strictly,
    violates_baseline,
    violates_restricted,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
HELM = ROOT / "deploy" / "helm"
CHART = HELM / "gpu-exporter"
EXAMPLES = HELM / "examples"
K8S = ROOT / "deploy" / "k8s"
VENV_BIN = Path(sys.executable).parent
RELEASE = "gpu-exporter"
NAMESPACE = "gpu-exporter"

Doc = dict[str, Any]

# The documented combinations: the defaults, and each values file in deploy/helm/examples.
COMBINATIONS = ["default", *sorted(p.stem for p in EXAMPLES.glob("*.yaml"))]
# The kustomize build each combination reproduces; the others are the chart's own.
TWINS = {
    "default": "base",
    "kube-prometheus-stack": "examples",
    "nvidia-runtime": "examples/nvidia-runtime",
    "host-pid": "examples/host-pid",
    "non-root": "examples/non-root",
    "gpu-operator": "examples/gpu-operator",
    "k0s": "examples/k0s",
    "microk8s": "examples/microk8s",
    "all-nodes": "examples/all-nodes",
    "tls-auth": "examples/tls-auth",
}
CHART_ONLY = {"dcgm-exporter", "daemon-alerting"}
NAMESPACES = {"gpu-operator": "gpu-operator"}  # installed into the operator's namespace, as its overlay
# Labels Helm puts on every object, and kustomize's counterpart of managed-by.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/version", "app.kubernetes.io/managed-by")


def helm_binary() -> str:
    path = shutil.which("helm", path=str(VENV_BIN))
    assert path is not None, f"helm is not installed in {VENV_BIN}; run .ci/setup"
    return path


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)


def values_args(combination: str) -> list[str]:
    return [] if combination == "default" else ["-f", str(EXAMPLES / f"{combination}.yaml")]


def template(*args: str, namespace: str = NAMESPACE, chart: Path = CHART) -> list[Doc]:
    out = helm("template", RELEASE, str(chart), "--namespace", namespace, *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def refused(*args: str) -> str:
    """helm template's error for values it must refuse."""
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert out.returncode != 0, f"accepted: {args}"
    return out.stderr


@pytest.fixture(scope="module")
def renders() -> dict[str, list[Doc]]:
    return {c: template(*values_args(c), namespace=NAMESPACES.get(c, NAMESPACE)) for c in COMBINATIONS}


@pytest.fixture(scope="module")
def twins() -> dict[str, list[Doc]]:
    return {c: kustomize(K8S / build) for c, build in TWINS.items()}


def test_every_example_is_a_documented_combination() -> None:
    assert set(COMBINATIONS) == {"default"} | set(TWINS) | CHART_ONLY
    reference = (ROOT / "docs" / "helm.md").read_text()
    for c in COMBINATIONS[1:]:
        assert f"deploy/helm/examples/{c}.yaml" in reference, f"docs/helm.md does not describe {c}.yaml"


def test_every_value_is_documented() -> None:
    """docs/helm.md names every key of values.yaml (maps of free content, such as `config`, as a whole)."""
    free = {"config", "resources", "updateStrategy", "affinity", "nodeSelector", "podAnnotations", "podLabels"}

    def keys(values: Doc, prefix: str = "") -> list[str]:
        out = []
        for k, v in values.items():
            if isinstance(v, dict) and v and k not in free:
                out += keys(v, f"{prefix}{k}.")
            else:
                out.append(f"{prefix}{k}")
        return out

    reference = (ROOT / "docs" / "helm.md").read_text()
    missing = [k for k in keys(yaml.safe_load((CHART / "values.yaml").read_text())) if f"`{k}`" not in reference]
    assert missing == [], f"not in docs/helm.md: {missing}"


# --- the generated parts and versions -----------------------------------------------------------


def generate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("helm_generate", HELM / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_parts_are_current() -> None:
    """Rules, dashboards, versions and the config schema as deploy/helm/generate.py writes them."""
    out = subprocess.run([sys.executable, str(HELM / "generate.py"), "--check"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_the_chart_version_follows_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    assert exporter(template())["image"].endswith(f":{version}")
    # A release bump that forgets the chart is caught: the check names Chart.yaml.
    generate = generate_module()
    monkeypatch.setattr(generate, "project_version", lambda: "9.8.7")
    assert generate.CHART / "Chart.yaml" in generate.stale()
    assert "version: 9.8.7\n" in generate.chart_yaml((CHART / "Chart.yaml").read_text(), "9.8.7")


def test_a_stale_copy_is_caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A rule changed in alerts/ but not in the chart: the check names the chart's copy."""
    generate = generate_module()
    changed = tmp_path / "dcgm-compat.rules.yml"
    changed.write_text((ROOT / "alerts" / "dcgm-compat.rules.yml").read_text() + "\n# changed\n")
    monkeypatch.setattr(generate, "COMPAT_RULES", changed)
    assert generate.stale() == [CHART / "files" / "rules" / "dcgm-compat.rules.yml"]


# --- lint, schemas, least privilege, scheduling -------------------------------------------------


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_helm_lint_strict(combination: str) -> None:
    out = helm("lint", "--strict", str(CHART), *values_args(combination))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


@pytest.mark.parametrize("version", [OLDEST_SUPPORTED, NEWEST_BUNDLED])
@pytest.mark.parametrize("combination", COMBINATIONS)
def test_builtin_objects_validate_strictly(
    combination: str, version: str, renders: dict[str, list[Doc]], tmp_path: Path
) -> None:
    validate_builtin_strictly(renders[combination], version, tmp_path)


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_least_privilege_and_pod_security(combination: str, renders: dict[str, list[Doc]]) -> None:
    docs = renders[combination]
    assert_least_privilege(docs)
    pod = pod_spec(docs)
    assert pod["automountServiceAccountToken"] is False and "privileged" not in exporter(docs)["securityContext"]
    if combination == "non-root":
        assert violates_restricted(pod) == []
        env = {e["name"]: e.get("value") for e in exporter(docs)["env"]}
        assert env["GPU_EXPORTER_KUBERNETES__POD_ATTRIBUTION"] == "off"
    else:
        # What "baseline" would refuse, and why the docs ask for the privileged namespace label.
        expected = ["hostPath volume pod-resources"] + (["hostPID: true"] if combination == "host-pid" else [])
        assert violates_baseline(pod) == expected
        mount = next(m for m in exporter(docs)["volumeMounts"] if m["name"] == "pod-resources")
        assert mount == {"name": "pod-resources", "mountPath": POD_RESOURCES_MOUNT, "readOnly": True}


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_scheduling(combination: str, renders: dict[str, list[Doc]]) -> None:
    docs = renders[combination]
    pod = pod_spec(docs)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"
    quota = one(docs, "ResourceQuota")
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}
    ]
    assert quota["metadata"]["namespace"] == one(docs, "DaemonSet")["metadata"]["namespace"]
    gpu_nodes = (GFD_NODE, NFD_NODE, GKE_NODE, LABELLED_NODE)
    if combination == "all-nodes":
        assert all(schedulable_on(pod, n) for n in (*gpu_nodes, CPU_NODE))
    elif combination == "gpu-operator":
        assert schedulable_on(pod, OPERATOR_NODE) and not schedulable_on(pod, PASSTHROUGH_NODE)
        assert not schedulable_on(pod, {**OPERATOR_NODE, "nvidia.com/gpu.deploy.operands": "false"})
        # The operator's driver manager pauses the label before unloading the driver: the pod goes,
        # and as the driver manager waits only for pods with the key in their nodeSelector, it is there.
        assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.client": "true"}
        assert not schedulable_on(pod, {**OPERATOR_NODE, "nvidia.com/gpu.deploy.client": "paused-for-driver-upgrade"})
        assert pod["runtimeClassName"] == "nvidia"
    else:
        assert all(schedulable_on(pod, n) for n in gpu_nodes) and not schedulable_on(pod, CPU_NODE)
    resources = exporter(docs)["resources"]
    assert "nvidia.com/gpu" not in resources.get("limits", {})  # the toolkit injects the GPUs
    assert resources == exporter(kustomize(K8S / "base"))["resources"]


@pytest.mark.parametrize("combination", [c for c in COMBINATIONS if c != "daemon-alerting"])
def test_scrape_objects_fit(combination: str, renders: dict[str, list[Doc]]) -> None:
    assert_scrape_objects_fit(renders[combination])


def test_a_podmonitor_selects_the_pods_with_the_same_relabelling(renders: dict[str, list[Doc]]) -> None:
    docs = renders["daemon-alerting"]
    assert not of_kind(docs, "ServiceMonitor")
    pm = one(docs, "PodMonitor")
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    sm_endpoint = one(renders["default"], "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint == sm_endpoint


# --- the same objects as kustomize --------------------------------------------------------------


def normalized(doc: Doc) -> Doc:
    """``doc`` less what tells a Helm render from a kustomize build of the same thing:
    - Helm's own labels (helm.sh/chart, app.kubernetes.io/version, managed-by: Helm vs kustomize);
    - the config ConfigMap's content hash (kustomize's and the chart's hash functions differ);
    - the order of env entries and volumes, which kustomize's strategic merge patches reorder;
    - the ServiceMonitor's selector, where the chart also matches app.kubernetes.io/instance, so
      that two releases in one namespace do not scrape each other's pods."""
    d = copy.deepcopy(doc)
    for labels in (d["metadata"].get("labels", {}),):
        for key in HELM_LABELS:
            labels.pop(key, None)
    if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {}):
        d["metadata"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", d["metadata"]["name"])
        d["data"]["config.yaml"] = yaml.safe_load(d["data"]["config.yaml"])
    if d["kind"] == "DaemonSet":
        pod = d["spec"]["template"]["spec"]
        for v in pod["volumes"]:
            if "configMap" in v:
                v["configMap"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", v["configMap"]["name"])
        pod["volumes"].sort(key=lambda v: v["name"])
        for c in pod["containers"]:
            c["env"].sort(key=lambda e: e["name"])
    if d["kind"] == "ServiceMonitor":
        d["spec"]["selector"]["matchLabels"].pop("app.kubernetes.io/instance", None)
    return d


# Kinds both render; the Namespace is the one object the chart leaves to `kubectl create namespace`.
COMPARED = ("DaemonSet", "Service", "ServiceAccount", "ConfigMap", "NetworkPolicy", "ResourceQuota", "ServiceMonitor")


@pytest.mark.parametrize("combination", sorted(TWINS))
def test_the_render_equals_its_kustomize_build(
    combination: str, renders: dict[str, list[Doc]], twins: dict[str, list[Doc]]
) -> None:
    mine, theirs = renders[combination], twins[combination]

    def configmaps(docs: list[Doc]) -> list[Doc]:
        return [d for d in of_kind(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]

    for kind in COMPARED:
        a = configmaps(mine) if kind == "ConfigMap" else of_kind(mine, kind)
        b = configmaps(theirs) if kind == "ConfigMap" else of_kind(theirs, kind)
        assert [normalized(d) for d in a] == [normalized(d) for d in b], f"{combination}: {kind} differs"
    # The rules: the same groups as the kustomize base ships, from the same files.
    rule = next(d for d in of_kind(mine, "PrometheusRule") if d["metadata"]["name"] == RELEASE)
    assert rule["spec"]["groups"] == rule_groups()
    if of_kind(theirs, "AlertmanagerConfig"):
        amc, their_amc = one(mine, "AlertmanagerConfig"), one(theirs, "AlertmanagerConfig")
        assert amc["spec"] == their_amc["spec"]
        assert amc["metadata"]["namespace"] == their_amc["metadata"]["namespace"] == "monitoring"
    # Only the Namespace is left out; everything else of the build is rendered.
    assert {d["kind"] for d in theirs} - {"Namespace"} <= {d["kind"] for d in mine}


def test_drift_in_either_fails(renders: dict[str, list[Doc]], twins: dict[str, list[Doc]]) -> None:
    """The comparison sees one changed field on either side (here the memory limit, a toleration)."""
    base = normalized(one(twins["default"], "DaemonSet"))
    chart = normalized(one(renders["default"], "DaemonSet"))
    assert chart == base
    changed = template("--set", "resources.limits.memory=161Mi")
    assert normalized(one(changed, "DaemonSet")) != base
    changed = template("--set", "tolerations[0].effect=NoExecute")
    assert normalized(one(changed, "DaemonSet")) != base


# --- the exporter's configuration ---------------------------------------------------------------


def config_of(docs: list[Doc]) -> tuple[str, str]:
    """(the path the container reads, the file), as tests/test_deploy_k8s.py reads the base's."""
    return config_text(docs, exporter(docs))


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("combination", COMBINATIONS)
def test_the_config_file_is_accepted_by_the_exporter(
    combination: str, renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = renders[combination]
    _, text = config_of(docs)
    # The Secrets' files where the pod would have them: a directory per secretMount.
    for mount in exporter(docs)["volumeMounts"]:
        if mount["mountPath"].startswith("/etc/gpu-exporter/secrets/"):
            local = tmp_path / mount["name"]
            local.mkdir()
            (local / "token").write_text("s3cr3t-token\n")
            (local / "url").write_text("https://hooks.slack.example/services/T000/B000/XXXX\n")
            text = text.replace(mount["mountPath"], str(local))
    for e in exporter(docs)["env"]:
        if e["name"].startswith("GPU_EXPORTER_"):
            monkeypatch.setenv(e["name"], e["value"])
    (tmp_path / "config.yaml").write_text(text)
    settings = load_settings(None, tmp_path / "config.yaml")
    assert settings.web_listen_address == f":{exporter(docs)['ports'][0]['containerPort']}"
    if combination == "daemon-alerting":
        assert [r.label for r in settings.alerting.webhooks] == ["slack"]
        assert settings.alerting.alertmanagers[0].bearer_token is not None
        assert settings.pricing is not None and settings.pricing.currency == "USD"
        assert settings.kubernetes.pod_attribution == "on" and "nvlink" in settings.collectors.disabled()


def test_secrets_come_from_mounted_secrets_only(renders: dict[str, list[Doc]]) -> None:
    docs = renders["daemon-alerting"]
    _, text = config_of(docs)
    assert "bearer_token_file: /etc/gpu-exporter/secrets/alertmanager/token" in text
    assert "url_file: /etc/gpu-exporter/secrets/slack/url" in text
    secrets = {v["name"]: v["secret"] for v in pod_spec(docs)["volumes"] if "secret" in v}
    assert secrets == {
        "alertmanager-token": {"secretName": "alertmanager-token", "defaultMode": 0o400},
        "slack-webhook": {"secretName": "slack-webhook", "defaultMode": 0o400},
    }
    mounts = {m["name"]: m for m in exporter(docs)["volumeMounts"]}
    assert all(mounts[name]["readOnly"] is True for name in secrets)
    # As uid 65532 the files must be readable by its group: mode 0440 and the pod's fsGroup.
    non_root = template("-f", str(EXAMPLES / "daemon-alerting.yaml"), "--set", "nonRoot=true")
    assert {v["secret"]["defaultMode"] for v in pod_spec(non_root)["volumes"] if "secret" in v} == {0o440}
    assert pod_spec(non_root)["securityContext"]["fsGroup"] == 65532
    # An inline secret in the config is refused, naming it: it would be written into a ConfigMap.
    error = refused("-f", str(EXAMPLES / "daemon-alerting.yaml"),
                    "--set", "config.alerting.alertmanagers[0].bearer_token=hunter2")  # fmt: skip
    assert "bearer_token" in error and "hunter2" not in error


def test_web_config_and_https(renders: dict[str, list[Doc]]) -> None:
    docs = renders["tls-auth"]
    assert "--web.config.file=/etc/gpu-exporter/web/web.yml" in exporter(docs)["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert exporter(docs)[probe]["httpGet"]["scheme"] == "HTTPS"
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["basicAuth"]["password"]["name"] == "gpu-exporter-scrape"


def test_image_and_extras() -> None:
    digest = "sha256:" + "c" * 64
    docs = template("--set", "image.repository=registry.internal/ops/gpu-exporter", "--set", "image.tag=9.9.9",
                    "--set", f"image.digest={digest}", "--set", "extraArgs[0]=--no-collector.nvlink",
                    "--set", "extraEnv[0].name=GPU_EXPORTER_LOG_LEVEL", "--set", "extraEnv[0].value=debug",
                    "--set", "podAnnotations.team=ml", "--set", "podLabels.tier=monitoring",
                    "--set", "nodeSelector.pool=gpu", "--set", "priorityClassName=gpu-monitor")  # fmt: skip
    c, pod = exporter(docs), pod_spec(docs)
    assert c["image"] == f"registry.internal/ops/gpu-exporter:9.9.9@{digest}"
    assert c["args"][-1] == "--no-collector.nvlink"
    assert {"name": "GPU_EXPORTER_LOG_LEVEL", "value": "debug"} in c["env"]
    template_meta = one(docs, "DaemonSet")["spec"]["template"]["metadata"]
    assert template_meta["annotations"] == {"team": "ml"} and template_meta["labels"]["tier"] == "monitoring"
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["priorityClassName"] == "gpu-monitor"
    assert not of_kind(docs, "ResourceQuota")  # only the system-* classes need one


def test_a_changed_config_rolls_the_pods() -> None:
    """The ConfigMap's name carries a hash of the file, as kustomize's generator does."""
    before = pod_spec(template())["volumes"][0]["configMap"]["name"]
    after = pod_spec(template("--set", "config.log_level=debug"))["volumes"][0]["configMap"]["name"]
    assert before != after
    assert yaml.safe_load(config_of(template("--set", "config.log_level=debug"))[1])["log_level"] == "debug"


# --- values.schema.json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # A typo in a key, at the top, in the chart's own settings and in the exporter's.
        (["--set", "hostPid=true"], "hostPid"),
        (["--set", "serviceMonitor.intervall=30s"], "intervall"),
        (["--set", "config.pol_interval=5s"], "pol_interval"),
        (["--set", "config.rules.GpuMemoryHihg.warning=0.9"], "GpuMemoryHihg"),
        (["--set", "config.rules.GpuMemoryHigh.warnign=0.9"], "warnign"),
        # A negative interval or duration.
        (["--set", "config.poll_interval=-5s"], "poll_interval"),
        (["--set", "config.poll_interval=-5"], "poll_interval"),
        (["--set", "config.rules.GpuMemoryHigh.for=-1m"], "for"),
        (["--set", "serviceMonitor.interval=-15s"], "interval"),
        (["--set", "alertmanagerConfig.repeatInterval=-4h"], "repeatInterval"),
        # A value outside its choices.
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "nodeSelection=gpu"], "nodeSelection"),
        (["--set", "serviceMonitor.kind=Probe"], "kind"),
        (["--set", "config.log_level=verbose"], "log_level"),
        (["--set", "config.kubernetes.pod_attribution=maybe"], "pod_attribution"),
        (["--set", "config.rules.GpuMemoryHigh.warning=1.5"], "warning"),
        # What the chart sets itself.
        (["--set", "config.web_listen_address=:9100"], "web_listen_address"),
        (["--set", "config.listen_address=:9100"], "listen_address"),  # its old name
    ],
)
def test_the_schema_refuses_a_bad_value_naming_it(args: list[str], named: str) -> None:
    error = refused(*args)
    assert "values don't meet the specifications of the schema" in error, error
    assert re.search(rf"\b{re.escape(named)}\b", error), error


def test_the_schema_accepts_what_the_daemon_accepts() -> None:
    """Durations as numbers or the daemon's strings; a webhook whose URL comes from a file."""
    for value in ("2.5", "500ms", "1h"):
        template("--set", f"config.poll_interval={value}")
    template("--set", "config.alerting.webhooks[0].url_file=/etc/gpu-exporter/secrets/hook/url")
    template("--set", "config.rules.GpuXidError.codes={48,79}", "--set", "config.collectors.profiling=false")


# Issue 38, item 8: each passed the schema and then crash-looped the pods, as the daemon refuses it.
OUT_OF_BOUNDS = [("poll_interval", "0s"), ("poll_interval", "2h"), ("poll_gpu_timeout", "15m"),
                 ("kubernetes.keep_last_good_for", "2d"), ("accounting.holder_retention", "0s")]  # fmt: skip
IN_BOUNDS = [("poll_interval", "1h"), ("poll_interval", "0.5s"), ("poll_gpu_timeout", "10m"),
             ("poll_gpu_timeout", "9.5m"), ("kubernetes.keep_last_good_for", "24h"),
             ("accounting.holder_retention", "1ms")]  # fmt: skip


def nested(key: str, value: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"config": {}}
    here = doc["config"]
    *parents, last = key.split(".")
    for part in parents:
        here = here.setdefault(part, {})
    here[last] = value
    return doc


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(("key", "value"), OUT_OF_BOUNDS, ids=[f"{k}={v}" for k, v in OUT_OF_BOUNDS])
def test_helm_lint_refuses_a_duration_the_daemon_refuses(key: str, value: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(nested(key, value)))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(nested(key, value)["config"]))
    with pytest.raises(ConfigError):
        load_settings(None, tmp_path / "config.yaml")  # the daemon's verdict, which the chart must share
    out = helm("lint", "--strict", str(CHART), "-f", str(values))
    assert out.returncode != 0, out.stdout
    assert_mentions(out.stdout + out.stderr, key.rsplit(".", 1)[-1], "schema")


@pytest.mark.usefixtures("clean_env")
def test_durations_within_their_bounds_pass_in_any_unit(tmp_path: Path) -> None:
    for key, value in IN_BOUNDS:
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(nested(key, value)))
        out = helm("lint", "--strict", str(CHART), "-f", str(values))
        assert out.returncode == 0, (key, value, out.stdout)
        (tmp_path / "config.yaml").write_text(config_of(template("-f", str(values)))[1])
        load_settings(None, tmp_path / "config.yaml")  # and the daemon takes what the chart wrote


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("keys", [("poll_gpu_timeout", "poll_static_refresh_interval"),
                                  ("gpu_timeout", "static_refresh_interval")])  # fmt: skip
def test_a_renamed_setting_passes_under_its_name_and_its_old_one(keys: tuple[str, str], tmp_path: Path) -> None:
    """Values files written before the rename still install, and the daemon reads what they set."""
    docs = template("--set", f"config.{keys[0]}=5s", "--set", f"config.{keys[1]}=10m")
    (tmp_path / "config.yaml").write_text(config_of(docs)[1])
    settings = load_settings(None, tmp_path / "config.yaml")
    assert (settings.poll_gpu_timeout, settings.poll_static_refresh_interval) == (5.0, 600.0)


def test_alertmanagerconfig_without_a_webhook_says_what_is_missing() -> None:
    error = refused("--set", "alertmanagerConfig.enabled=true")
    assert "alertmanagerConfig.webhook.url" in error
    docs = template("--set", "alertmanagerConfig.enabled=true",
                    "--set", "alertmanagerConfig.webhook.urlSecret.name=hook",
                    "--set", "alertmanagerConfig.webhook.urlSecret.key=url")  # fmt: skip
    (hook,) = one(docs, "AlertmanagerConfig")["spec"]["receivers"][0]["webhookConfigs"]
    assert hook == {"urlSecret": {"name": "hook", "key": "url"}, "sendResolved": True}


# --- rules and dashboards ---------------------------------------------------------------------------


def promtool_check(spec: Doc, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (bash .ci/setup does it)"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(spec))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_prometheusrules_pass_promtool(renders: dict[str, list[Doc]], tmp_path: Path) -> None:
    docs = renders["dcgm-exporter"]
    rules = {d["metadata"]["name"]: d for d in of_kind(docs, "PrometheusRule")}
    assert set(rules) == {RELEASE, f"{RELEASE}-dcgm-compat"}
    assert rules[RELEASE]["spec"]["groups"] == rule_groups()
    compat = yaml.safe_load((ROOT / "alerts" / "dcgm-compat.rules.yml").read_text())
    assert rules[f"{RELEASE}-dcgm-compat"]["spec"] == compat
    for name, rule in rules.items():
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack", name
        promtool_check(rule["spec"], tmp_path)
    # Off by default; the rules' own toggle.
    assert [d["metadata"]["name"] for d in of_kind(renders["default"], "PrometheusRule")] == [RELEASE]
    assert not of_kind(renders["daemon-alerting"], "PrometheusRule")


def test_the_dashboards_are_those_of_deploy_grafana(renders: dict[str, list[Doc]]) -> None:
    sources = {p.name: json.loads(p.read_text()) for p in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")}
    for combination, namespace in (("default", NAMESPACE), ("kube-prometheus-stack", "monitoring")):
        maps = [d for d in of_kind(renders[combination], "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
        found = {}
        for cm in maps:
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
            assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
            assert cm["metadata"]["namespace"] == namespace
            (name,) = cm["data"]
            found[name] = json.loads(cm["data"][name])
        assert found == sources
    docs = template("--set", "dashboards.label=my_dashboards", "--set", "dashboards.labelValue=yes",
                    "--set", "dashboards.folderAnnotation=k8s-sidecar-target-directory",
                    "--set", "dashboards.folder=/tmp/dashboards/gpu")  # fmt: skip
    labelled = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("my_dashboards") == "yes"]
    assert len(labelled) == len(sources)
    assert all(d["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "/tmp/dashboards/gpu"}
               for d in labelled)  # fmt: skip
    assert not [d for d in of_kind(template("--set", "dashboards.enabled=false"), "ConfigMap")
                if "config.yaml" not in d["data"]]  # fmt: skip


# --- helm package -----------------------------------------------------------------------------------


def test_helm_package_builds_the_archive(tmp_path: Path) -> None:
    """deploy/helm/generate.py --package: the archive, named for the version, renders as the directory does."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    # --package writes what is stale first; a test must not rewrite the checkout, so it packages only
    # a current chart (test_the_generated_parts_are_current says what is stale otherwise).
    check = subprocess.run([sys.executable, str(HELM / "generate.py"), "--check"], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stderr
    out = subprocess.run([sys.executable, str(HELM / "generate.py"), "--package", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    archive = tmp_path / f"gpu-exporter-{version}.tgz"
    assert archive.exists(), list(tmp_path.iterdir())
    with tarfile.open(archive) as tgz:
        names = set(tgz.getnames())
    for wanted in ("Chart.yaml", "values.yaml", "values.schema.json", "templates/daemonset.yaml",
                   "files/rules/gpu-exporter.rules.yml", "files/rules/dcgm-compat.rules.yml",
                   "files/dashboards/gpu-fleet.json"):  # fmt: skip
        assert f"gpu-exporter/{wanted}" in names, wanted
    lint = helm("lint", "--strict", str(archive))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    args = ["-f", str(EXAMPLES / "dcgm-exporter.yaml")]
    assert template(*args, chart=archive) == template(*args)
