"""Item 2 of issue 15: the example AlertmanagerConfig receives the alerts the shipped rules produce.

Real components all the way: the daemon (fake NVML, a fake kubelet holding two GPUs for pods),
and a real Prometheus that scrapes it with the target labels the prometheus-operator gives a
ServiceMonitor target (namespace, service, pod, container, endpoint, the node's name in
``__meta_kubernetes_pod_node_name``) followed by the rendered ServiceMonitor's own relabelings,
and evaluates the rendered PrometheusRule (its ``for`` and windows shortened). The alerts it
raises are routed by amtool through the Alertmanager configuration the operator builds from the
rendered AlertmanagerConfig: a sub-route with ``continue: true`` and, unless the Alertmanager's
``alertmanagerConfigMatcherStrategy`` lifts it, the matcher ``namespace="<its namespace>"``
(pkg/alertmanager/amcfg.go in prometheus-operator).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerting_helpers import free_port
from tests.exporter_helpers import run_daemon, wait_for
from tests.fake_kubelet import fake_kubelet, pod
from tests.fakenvml.presets import h100_sxm
from tests.fakenvml.values import fabric_health_mask
from tests.prometheus_helpers import prometheus
from tests.test_alert_rules import EXPECTED, GIB, parity_node, rules_of, short_daemon_config, short_rules_file
from tests.test_deploy_k8s import EXAMPLES, NAMESPACE, kustomize, one

pytestmark = pytest.mark.integration

Doc = dict[str, Any]
ALERTMANAGER_NAMESPACE = "monitoring"  # where the example puts the AlertmanagerConfig
EXPORTER_POD = "gpu-exporter-x7k2p"
NODE = "gpu-node-1"
DEFAULT = "default-receiver"


def operator_target_labels() -> dict[str, str]:
    """What the prometheus-operator puts on a ServiceMonitor target before its relabelings."""
    return {
        "__meta_kubernetes_pod_node_name": NODE,
        "namespace": NAMESPACE,
        "service": "gpu-exporter",
        "pod": EXPORTER_POD,
        "container": "gpu-exporter",
        "endpoint": "metrics",
    }


def relabel_configs(servicemonitor: Doc) -> list[Doc]:
    """The ServiceMonitor's relabelings in Prometheus's own spelling."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    (endpoint,) = servicemonitor["spec"]["endpoints"]
    assert endpoint.get("honorLabels", False) is False  # Prometheus's default, which the helper keeps
    return [{names.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]]


def operator_config(amc: Doc, *, strategy: str, alertmanager_namespace: str) -> Doc:
    """The Alertmanager configuration the operator generates around one AlertmanagerConfig."""
    ns, name = amc["metadata"]["namespace"], amc["metadata"]["name"]
    spec = amc["spec"]

    def receiver(r: str) -> str:
        return f"{ns}/{name}/{r}"

    r = spec["route"]
    matchers = [f"{m['name']}{m.get('matchType', '=')}{json.dumps(m['value'])}" for m in r.get("matchers", [])]
    enforce = strategy == "OnNamespace" or (
        strategy == "OnNamespaceExceptForAlertmanagerNamespace" and ns != alertmanager_namespace
    )
    if enforce:
        matchers.append(f'namespace="{ns}"')
    route = {"receiver": receiver(r["receiver"]), "matchers": matchers, "group_by": r["groupBy"],
             "group_wait": r["groupWait"], "group_interval": r["groupInterval"],
             "repeat_interval": r["repeatInterval"], "continue": True}  # fmt: skip
    receivers: list[Doc] = [{"name": DEFAULT}]
    for rec in spec["receivers"]:
        hooks = [{"url": w["url"], "send_resolved": w.get("sendResolved", True)} for w in rec["webhookConfigs"]]
        receivers.append({"name": receiver(rec["name"]), "webhook_configs": hooks})
    return {"route": {"receiver": DEFAULT, "routes": [route]}, "receivers": receivers}


def amtool() -> str:
    path = shutil.which("amtool")
    assert path, "amtool (Debian package prometheus-alertmanager) is missing; run .ci/setup"
    return path


def routed_to(config: Path, labels: dict[str, str]) -> str:
    args = [f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())]
    out = subprocess.run([amtool(), "config", "routes", "test", f"--config.file={config}", *args],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


def closed_port() -> int:
    """A port nothing listens on: a target that is down, for GpuExporterDown."""
    port = free_port()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return port


@pytest.fixture(scope="module")
def alerts(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    """The label sets of the alerts Prometheus raises from the shipped objects."""
    tmp = tmp_path_factory.mktemp("routing")
    docs = kustomize(EXAMPLES)
    spec = tmp / "prometheusrule.yml"
    spec.write_text(yaml.safe_dump(one(docs, "PrometheusRule")["spec"]))
    rules = short_rules_file(tmp / "rules.yml", src=spec)
    s = parity_node(tmp / "node.scn")
    s.gpu(5).remapped_rows(failure=True)  # the GPU alerts the parity scenario leaves out
    s.gpu(5).gpm(sm_util=10)  # GPU-Util 95%, SMs mostly idle: GpuLowSmActivity
    s.driver(580)  # the driver's own verdict (field 230) exists from 565 on
    s.gpu(4).recovery_action(4)  # GpuRecoveryRequired: drain and reset
    h100_sxm(s.add_gpu(), "parity", 6, util=95, mem_used=40 * GIB, power_mw=500_000).reset_required()
    s.gpu(0).fabric("completed", health_mask=fabric_health_mask(DEGRADED_BW="TRUE"))  # GpuFabricUnhealthy
    s.gpu(5).fabric("in_progress")  # GpuFabricNotReady: the fabric manager has not registered it
    s.write()
    expected = {*EXPECTED, ("GpuRowRemapFailure", "5"), ("GpuLowSmActivity", "5"), ("GpuRecoveryRequired", "4"),
                ("GpuResetRequired", "6"), ("GpuFabricUnhealthy", "0"), ("GpuFabricNotReady", "5")}  # fmt: skip
    cfg = yaml.safe_load(short_daemon_config(tmp / "daemon.yml").read_text())
    with fake_kubelet(tmp) as kubelet:
        # GPU 1 (GpuMemoryHigh, GpuRowRemapPending) and GPU 2 (GpuXidError, GpuThermalThrottling)
        # are held by pods; the others are not.
        kubelet.pods = [
            pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [str(s.gpu(1).values["uuid"])])),
            pod("infer", "triton-0", ("server", "nvidia.com/gpu", [str(s.gpu(2).values["uuid"])])),
        ]
        cfg["kubernetes"] = {"pod_attribution": "on", "pod_resources_socket": str(kubelet.socket_path),
                             "refresh_interval": "200ms"}  # fmt: skip
        (tmp / "daemon.yml").write_text(yaml.safe_dump(cfg))
        with run_daemon(s.path, "--config", str(tmp / "daemon.yml"), "--poll.interval", "1s") as d:
            targets = [f"127.0.0.1:{d.port}", f"127.0.0.1:{closed_port()}"]
            with prometheus(targets, tmp / "prom", rule_files=[rules], labels=operator_target_labels(),
                            relabel_configs=relabel_configs(one(docs, "ServiceMonitor"))) as prom:  # fmt: skip

                def firing() -> list[dict[str, str]]:
                    return [a["labels"] for a in prom.alerts() if a["state"] == "firing"]

                def complete() -> bool:
                    got = {(a["alertname"], a.get("gpu", "")) for a in firing()}
                    return got >= expected and any(a["alertname"] == "GpuExporterDown" for a in firing())

                wait_for(complete, timeout=90, what="the GPU alerts and GpuExporterDown firing in Prometheus")
                wait_for(lambda: any(a.get("pod") == "trainer-0" for a in firing()), timeout=30,
                         what="pod labels on the alerts of held GPUs")  # fmt: skip
                return firing()


def test_the_alerts_carry_the_labels_the_relabelling_leaves(alerts: list[dict[str, str]]) -> None:
    names = {a["alertname"] for a in alerts}
    shipped = {r["alert"] for r in rules_of(one(kustomize(EXAMPLES), "PrometheusRule")["spec"]) if "alert" in r}
    assert {n for n in shipped if not n.startswith("GpuExporter")} <= names and "GpuExporterDown" in names
    for a in alerts:
        assert a["node"] == NODE and a["job"] == "gpu-exporter", a
        # The target's own namespace/pod/container are gone; only a workload's may appear.
        assert a.get("namespace") != NAMESPACE and a.get("pod") != EXPORTER_POD, a
    held = {(a["alertname"], a.get("namespace"), a.get("pod")) for a in alerts if a.get("gpu") in ("1", "2")}
    assert ("GpuMemoryHigh", "ml", "trainer-0") in held and ("GpuXidError", "infer", "triton-0") in held
    assert any("namespace" not in a for a in alerts)  # free GPUs and the health alerts carry none


def write(tmp_path: Path, name: str, config: Doc) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    check = subprocess.run([amtool(), "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    return path


def test_the_example_alertmanagerconfig_receives_every_alert(alerts: list[dict[str, str]], tmp_path: Path) -> None:
    amc = one(kustomize(EXAMPLES), "AlertmanagerConfig")
    assert amc["metadata"]["namespace"] == ALERTMANAGER_NAMESPACE
    webhook = f"{ALERTMANAGER_NAMESPACE}/{amc['metadata']['name']}/{amc['spec']['route']['receiver']}"
    # As its comment asks: the Alertmanager, in the same namespace, lifts the namespace matcher there.
    strategy = "OnNamespaceExceptForAlertmanagerNamespace"
    config = operator_config(amc, strategy=strategy, alertmanager_namespace=ALERTMANAGER_NAMESPACE)
    documented = write(tmp_path, "documented.yml", config)
    for a in alerts:
        assert routed_to(documented, a) == webhook, a
    # The older operators' alternative that the comment names.
    lifted = write(tmp_path, "none.yml", operator_config(amc, strategy="None", alertmanager_namespace="elsewhere"))
    for a in alerts:
        assert routed_to(lifted, a) == webhook, a
    # Something else still goes to the default receiver.
    assert routed_to(documented, {"alertname": "KubePodCrashLooping", "namespace": "ml"}) == DEFAULT


def test_with_the_operators_default_strategy_no_alert_would_arrive(
    alerts: list[dict[str, str]], tmp_path: Path
) -> None:
    """Why the example moved: an AlertmanagerConfig in the exporter's namespace (as shipped before),
    or any namespace under the default strategy, routes none of the alerts the rules produce."""
    amc = one(kustomize(EXAMPLES), "AlertmanagerConfig")
    for ns in (NAMESPACE, ALERTMANAGER_NAMESPACE):
        moved = {**amc, "metadata": {**amc["metadata"], "namespace": ns}}
        config = write(tmp_path, f"{ns}.yml", operator_config(
            moved, strategy="OnNamespace", alertmanager_namespace=ALERTMANAGER_NAMESPACE))  # fmt: skip
        assert {routed_to(config, a) for a in alerts} == {DEFAULT}, ns
