"""What Prometheus sees behind the Helm chart, and alerts/dcgm-compat.rules.yml (issue 29).

Real components: the daemon against the fake NVML (two H100s, one held by a pod, one with an XID, and
an A100 in MIG mode whose 1g.10gb device a pod holds) with pod attribution from a fake kubelet, and a
real Prometheus that scrapes it with the target labels the prometheus-operator gives a
ServiceMonitor target, then the chart's own ServiceMonitor relabelings, and evaluates both of the
chart's PrometheusRules (rendered by ``helm template`` with deploy/helm/examples/dcgm-exporter.yaml).

- The relabelling gives the labels the rules and dashboards expect: ``node`` on every series, the
  workload's namespace/pod/container, never the exporter pod's.
- NVIDIA's dashboard for dcgm-exporter (Grafana 12239) works unchanged: each series and label its
  panels and variables use returns data, in dcgm-exporter's units, equal to what the fake driver
  was told.
- Every row of docs/metrics.md's mapping table marked "dcgm-compat" holds: the DCGM series equals
  ours in the unit the table gives, with dcgm-exporter's labels; DCGM_FI_DEV_XID_ERRORS is the last
  XID's code. A row marked "not derived" has no rule, and every series of dcgm-exporter's default
  list has a row.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.metric_defs import METRICS
from tests.exporter_helpers import run_daemon, wait_for
from tests.fake_kubelet import fake_kubelet, pod
from tests.fakenvml import Scenario
from tests.fakenvml.presets import GIB, MIB, gpu_uuid, h100_activity, h100_sxm, mig_uuid, preset
from tests.prometheus_helpers import Prometheus, prometheus
from tests.test_dashboards import NAMES as DASHBOARDS
from tests.test_dashboards import VALUES, load, substitute, variable_selectors
from tests.test_deploy_k8s import of_kind, one
from tests.test_deploy_k8s_routing import EXPORTER_POD, NODE, operator_target_labels, relabel_configs
from tests.test_helm import EXAMPLES, config_of, template
from tests.timing import LATE_S

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
COMPAT_RULES = ROOT / "alerts" / "dcgm-compat.rules.yml"
METRICS_MD = ROOT / "docs" / "metrics.md"

# dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter, release 4.5.3-4.8.2): the fields it
# exports unless told otherwise. DCGM_FI_DRIVER_VERSION is a label on every series.
DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DRIVER_VERSION", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)  # fmt: skip
# dcgm-exporter's labels on a GPU's series (internal/pkg/rendermetrics), as the rules give them; the
# workload's with pod attribution, the GPU instance's on MIG devices.
DCGM_LABELS = {"gpu", "UUID", "device", "modelName", "pci_bus_id", "DCGM_FI_DRIVER_VERSION", "Hostname"}
# The target's, as scraped through a ServiceMonitor (dcgm-exporter's series get the same): job and
# instance, the operator's service and endpoint, and node from the chart's relabelling.
TARGET_LABELS = {"job", "instance", "service", "endpoint", "node"}
POD_LABELS = {"namespace", "pod", "container"}
MIG_LABELS = {"GPU_I_PROFILE", "GPU_I_ID"}


@dataclass(frozen=True)
class Panel:
    """A panel of Grafana dashboard 12239 (grafana/dcgm-exporter-dashboard.json in NVIDIA/dcgm-exporter):
    the series it queries (filtered by its `instance` and `gpu` variables), how it aggregates them,
    the unit it shows them in, and what that value is on the GPUs below."""

    title: str
    series: str
    aggregate: str  # "", "avg" or "sum" over the selected GPUs, or "scale" (x 1,000,000: MHz to Hz)
    unit: str  # Grafana's unit id in the dashboard
    field: str  # the key of GPUS holding the expected value, in that unit


DASHBOARD_12239 = (
    Panel("GPU temperature", "DCGM_FI_DEV_GPU_TEMP", "", "celsius", "temp_c"),
    Panel("GPU average temperature", "DCGM_FI_DEV_GPU_TEMP", "avg", "celsius", "temp_c"),
    Panel("GPU power usage", "DCGM_FI_DEV_POWER_USAGE", "", "watt", "power_w"),
    Panel("GPU power total", "DCGM_FI_DEV_POWER_USAGE", "sum", "watt", "power_w"),
    Panel("GPU SM clocks", "DCGM_FI_DEV_SM_CLOCK", "scale", "hertz", "sm_hz"),
    Panel("GPU utilization", "DCGM_FI_DEV_GPU_UTIL", "", "percent", "util_pct"),
    Panel("GPU framebuffer memory used", "DCGM_FI_DEV_FB_USED", "", "decmbytes", "fb_used_mib"),
    Panel("Tensor core utilization", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "", "percentunit", "tensor_ratio"),
)
# Its template variables: label_values() of this series, for these labels.
DASHBOARD_12239_VARIABLES = {"instance": "DCGM_FI_DEV_GPU_TEMP", "gpu": "DCGM_FI_DEV_GPU_TEMP"}

# What the fake driver is told, per GPU index, in dcgm-exporter's units. GPU 2 is in MIG mode: no
# whole-GPU utilization (as with DCGM), activity per GPU instance.
GPUS: dict[str, dict[str, float]] = {
    "0": {"util_pct": 50, "fb_used_mib": 20 * 1024, "temp_c": 61, "power_w": 350, "sm_hz": 1755e6,
          "tensor_ratio": 0.29},
    "1": {"util_pct": 90, "fb_used_mib": 70 * 1024, "temp_c": 77, "power_w": 620, "sm_hz": 1980e6,
          "tensor_ratio": 0.522},
    "2": {"fb_used_mib": 52 * 1024, "temp_c": 47, "power_w": 210, "sm_hz": 1410e6},
}  # fmt: skip
# GPU 2's MIG devices: GPU instance id -> (profile, memory used in MiB, tensor activity ratio).
MIG_DEVICES = {"1": ("3g.40gb", 30 * 1024, 0.20), "5": ("2g.20gb", 18 * 1024, 0.35), "13": ("1g.10gb", 4 * 1024, 0.5)}
XID_GPU, XID_CODE = "1", 79


def node_for_dcgm(path: Path) -> Scenario:
    s = Scenario(path)
    for i in ("0", "1"):
        want = GPUS[i]
        g = h100_sxm(s.add_gpu(), "dcgm", int(i), util=int(want["util_pct"]), mem_used=int(want["fb_used_mib"]) * MIB,
                     power_mw=int(want["power_w"] * 1000))  # fmt: skip
        g.temperature(int(want["temp_c"]), memory=int(want["temp_c"]) + 9)
        mhz = int(want["sm_hz"] / 1e6)
        g.clocks(graphics=mhz, sm=mhz, memory=2619, video=1755)
        g.gpm(**{**h100_activity(int(want["util_pct"])), "any_tensor_util": want["tensor_ratio"] * 100})
        g.violations(
            power=10**9,
            thermal=3 * 10**9,
            sync_boost=5 * 10**8,
            board_limit=7 * 10**8,
            low_utilization=2 * 10**10,
            reliability=10**6,
        )
    s.gpu(0).add_process(10_100, 18 * GIB, name="python3", sm=40, mem=10)
    s.gpu(int(XID_GPU)).add_xid(XID_CODE)
    # The A100 of the a100-mig preset, as a Hopper so that GPM gives each GPU instance its activity.
    mig = preset("a100-mig").gpu(0).minor_number(2).gpm_supported()
    mig.set("name", "NVIDIA H100 80GB HBM3")
    mig.temperature(int(GPUS["2"]["temp_c"]), memory=55).power(int(GPUS["2"]["power_w"] * 1000), 400_000)
    mig.memory(81920 * MIB, int(GPUS["2"]["fb_used_mib"]) * MIB, reserved=600 * MIB)
    mhz = int(GPUS["2"]["sm_hz"] / 1e6)
    mig.clocks(graphics=mhz, sm=mhz, memory=1593, video=1275)
    for inst in mig.migs:
        profile, used_mib, tensor = MIG_DEVICES[str(inst.values["gpu_instance_id"])]
        assert profile in str(inst.values["name"])
        inst.set("name", str(inst.values["name"]).replace("A100-SXM4-80GB", "H100 80GB HBM3"))
        inst.memory(int(str(inst.values["memory.total"])), used_mib * MIB, reserved=0)
        inst.gpm(sm_util=60, sm_occupancy=20, any_tensor_util=tensor * 100, dram_bw_util=15, graphics_util=70,
                 fp64_util=0, fp32_util=3, fp16_util=1)  # fmt: skip
    s.gpus.append(mig)
    return s


@dataclass
class Behind:
    prom: Prometheus
    scenario: Scenario

    def at(self, expr: str, when: float) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.prom.api("query", query=expr, time=f"{when:.3f}")["result"]
        return result


@pytest.fixture(scope="module")
def behind_the_chart(tmp_path_factory: pytest.TempPathFactory, fake_nvml_lib: Path) -> Iterator[Behind]:
    tmp = tmp_path_factory.mktemp("behind-the-chart")
    docs = template("-f", str(EXAMPLES / "dcgm-exporter.yaml"))
    rule_files = []
    for rule in of_kind(docs, "PrometheusRule"):
        path = tmp / f"{rule['metadata']['name']}.yml"
        path.write_text(yaml.safe_dump(rule["spec"]))
        rule_files.append(path)
    assert len(rule_files) == 2
    s = node_for_dcgm(tmp / "node.scn")
    s.write()
    config = yaml.safe_load(config_of(docs)[1])  # the config file the chart renders
    with fake_kubelet(tmp) as kubelet:
        kubelet.pods = [
            pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [gpu_uuid("dcgm", 0)])),
            pod("ml", "mig-job", ("main", "nvidia.com/mig-1g.10gb", [mig_uuid("mig", 0, 2)])),
        ]
        config["profiling_interval"] = "1s"  # GPM activity within seconds (default 10s)
        config["kubernetes"] = {"pod_attribution": "on", "pod_resources_socket": str(kubelet.socket_path),
                                "refresh_interval": "200ms"}  # fmt: skip
        config.pop("web_listen_address")
        (tmp / "config.yaml").write_text(yaml.safe_dump(config))
        with (
            run_daemon(s.path, "--config", str(tmp / "config.yaml"), "--poll.interval", "1s") as d,
            prometheus(
                [f"127.0.0.1:{d.port}"],
                tmp / "prom",
                rule_files=rule_files,
                labels=operator_target_labels(),
                relabel_configs=relabel_configs(one(docs, "ServiceMonitor")),
            ) as prom,  # fmt: skip
        ):

            def ready() -> bool:
                held = prom.query('DCGM_FI_DEV_GPU_UTIL{pod="trainer-0"}')
                xid = prom.query(f'DCGM_FI_DEV_XID_ERRORS{{gpu="{XID_GPU}"}} == {XID_CODE}')
                mig = prom.query('DCGM_FI_DEV_FB_USED{GPU_I_ID="13", pod="mig-job"}')
                rates = prom.query("count(DCGM_FI_PROF_PCIE_TX_BYTES) >= 3")
                gpm = prom.query('count(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{GPU_I_ID=""}) >= 2')
                gpm_mig = prom.query('count(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{GPU_I_ID!=""}) >= 3')
                return bool(held and xid and mig and rates and gpm and gpm_mig)

            wait_for(ready, timeout=60, interval=0.5, what="the DCGM series with pod labels and the XID")
            time.sleep(LATE_S)  # so that an evaluation in the past saw only scrapes already stored (see `settled`)
            yield Behind(prom, s)


LOOKBACK = "5m"  # Prometheus' default look-back of an instant query, which the rules' evaluations use


def settled(behind: Behind) -> float:
    """The time of a rule evaluation LATE_S ago: every scrape it could see was stored by now, so the
    raw series queried at that instant are exactly what the rules read."""
    (sample,) = behind.at("max(timestamp(DCGM_FI_DEV_GPU_TEMP))", time.time() - LATE_S)
    return float(sample["value"][1])


def by_gpu(result: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """(gpu, GPU instance id or "") -> value; each key once."""
    out: dict[tuple[str, str], float] = {}
    for r in result:
        m = r["metric"]
        key = (m.get("gpu", ""), m.get("GPU_I_ID", m.get("gpu_instance_id", "")))
        assert key not in out, f"two series for {key}: {result}"
        out[key] = float(r["value"][1])
    return out


def samples_by_gpu(result: list[dict[str, Any]]) -> dict[tuple[str, str], list[float]]:
    """As by_gpu, for a range query: each series' samples, oldest first.  Where a GPU has two series in
    the range (its holder's labels came with the kubelet's first answer), the one sampled last, which
    is the one an instant query at the range's end reads."""
    newest: dict[tuple[str, str], list[Any]] = {}
    for r in result:
        m = r["metric"]
        key = (m.get("gpu", ""), m.get("gpu_instance_id", ""))
        if key not in newest or float(r["values"][-1][0]) > float(newest[key][-1][0]):
            newest[key] = r["values"]
    return {key: [float(v) for _, v in values] for key, values in newest.items()}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# --- the labels the rules and dashboards expect ----------------------------------------------------


def test_the_chart_relabelling_gives_the_labels_rules_and_dashboards_expect(behind_the_chart: Behind) -> None:
    prom = behind_the_chart.prom
    # Every series of the target, `up` included, carries the node; none names the exporter's own pod.
    assert {r["metric"].get("node") for r in prom.query('count by (node) ({job="gpu-exporter"})')} == {NODE}
    assert prom.query(f'{{pod="{EXPORTER_POD}"}} or {{namespace="gpu-exporter"}} or {{container="gpu-exporter"}}') == []
    holders = {r["metric"]["gpu"]: (r["metric"].get("namespace"), r["metric"].get("pod")) for r in prom.query("gpu_up")}
    assert holders == {"0": ("ml", "trainer-0"), "1": (None, None), "2": (None, None)}
    # A recording rule of the chart's PrometheusRule keeps them.  Its evaluation runs on its own clock:
    # one that came before the pod-labelled scrape wrote the series without them, so wait for the next
    # (a KeyError on a loaded machine, issue 51), and a stale one without them is gone by then.
    recorded = "namespace_pod:gpu_process_sm_utilization_ratio:sum"
    wait_for(lambda: prom.query(f'{recorded}{{namespace="ml"}}'), timeout=60, interval=0.5, what="the rule's next run")
    (rec,) = prom.query(f'{recorded}{{namespace!=""}}')
    assert {k: rec["metric"][k] for k in ("node", "namespace", "pod")} == {"node": NODE, "namespace": "ml",
                                                                            "pod": "trainer-0"}  # fmt: skip
    # The dashboards' variables find this node, its GPUs and the pod holding a whole GPU.
    values = VALUES | {"node": NODE}
    for name in DASHBOARDS:
        found = {var: {r["metric"].get(label) for r in prom.query(substitute(selector, values))} - {None}
                 for var, (selector, label) in variable_selectors(load(name)).items()}  # fmt: skip
        assert found["node"] == {NODE} and found["gpu"] == {"0", "1", "2"}, name
        assert found["namespace"] == {"ml"} and found["pod"] == {"trainer-0"}, name


# --- NVIDIA's dashboard 12239, unchanged -----------------------------------------------------------


def test_the_dcgm_dashboard_finds_its_variables(behind_the_chart: Behind) -> None:
    prom = behind_the_chart.prom
    for label, series in DASHBOARD_12239_VARIABLES.items():
        values = {r["metric"].get(label) for r in prom.query(series)}
        want = {"0", "1", "2"} if label == "gpu" else {r["metric"]["instance"] for r in prom.query("up")}
        assert values == want, label


@pytest.mark.parametrize("panel", DASHBOARD_12239, ids=lambda p: p.title)
def test_each_dcgm_dashboard_panel_returns_data_in_dcgms_unit(panel: Panel, behind_the_chart: Behind) -> None:
    behind = behind_the_chart
    (instance,) = {r["metric"]["instance"] for r in behind.prom.query("up")}
    selector = f'{panel.series}{{instance=~"{instance}", gpu=~".*"}}'
    expr = {"": selector, "avg": f"avg({selector})", "sum": f"sum({selector})", "scale": f"{selector} * 1000000"}
    found = by_gpu(behind.at(expr[panel.aggregate], settled(behind)))
    assert found, f"{panel.title}: no data"
    want = {(gpu, ""): v[panel.field] for gpu, v in GPUS.items() if panel.field in v}
    if panel.series == "DCGM_FI_DEV_FB_USED":
        want |= {("2", gi): mib for gi, (_, mib, _) in MIG_DEVICES.items()}
    if panel.series == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE":
        want |= {("2", gi): ratio for gi, (_, _, ratio) in MIG_DEVICES.items()}
        found.pop(("2", ""), None)  # the whole MIG-mode GPU's, where the driver gives one
    if panel.aggregate in ("avg", "sum"):
        values = list(want.values())
        want = {("", ""): sum(values) / (len(values) if panel.aggregate == "avg" else 1)}
    assert found.keys() == want.keys(), panel.title
    for key, value in want.items():
        assert close(found[key], value), (panel.title, key, found[key], value)


# --- every row of the mapping table -----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    dcgm: tuple[str, ...]
    unit: str
    ours: tuple[str, ...]
    labels: dict[str, str]
    note: str


def mapping_rows() -> list[Row]:
    section = METRICS_MD.read_text().split("## Coming from dcgm-exporter", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in [ln for ln in section.splitlines() if ln.startswith("|")][2:]:
        dcgm, _, ours, note = (c.strip() for c in line.split("|")[1:5])
        names = tuple(re.findall(r"`(DCGM_FI_\w+)`", dcgm))
        if not names:
            continue
        unit = re.search(r"\(([^)]*)\)\s*$", dcgm)
        metrics = tuple(re.findall(r"`([a-z_0-9]+)(?:\{[^}]*\})?`", ours))
        labels = dict(re.findall(r'(\w+)="([^"]*)"', ours + " " + note.split(";")[0]))
        rows.append(Row(names, unit.group(1) if unit else "", metrics, labels, note))
    return rows


def recorded() -> dict[str, str]:
    doc = yaml.safe_load(COMPAT_RULES.read_text())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if r["record"].startswith("DCGM_FI_")}


# dcgm-exporter's unit of a row -> ours (base units) times this.
FACTORS = {"%": 100.0, "MiB": 2.0**-20, "MHz": 1e-6, "mJ": 1e3, "ns": 1e9, "B/s": 1.0, "": 1.0}


def test_the_table_says_which_series_are_recorded_and_covers_dcgms_defaults() -> None:
    rows = mapping_rows()
    rules = recorded()
    derived = {n for r in rows if r.note.startswith("dcgm-compat") and r.unit != "label" for n in r.dcgm}
    not_derived = {n for r in rows if r.note.startswith("not derived") for n in r.dcgm}
    assert derived == set(rules), "a DCGM series recorded without its row, or a row without its rule"
    assert not derived & not_derived
    assert set(DEFAULT_COUNTERS) <= {n for r in rows for n in r.dcgm}, "a default DCGM series has no row"
    assert {n for r in rows for n in r.dcgm} == derived | not_derived | {"DCGM_FI_DRIVER_VERSION"}
    for r in rows:
        assert all(m in METRICS for m in r.ours), r
        if r.note.startswith("dcgm-compat") and r.unit != "label" and "last XID" not in r.unit:
            assert r.unit in FACTORS, r
            (name,) = r.dcgm
            assert r.ours[0] in rules[name], f"{name}'s rule does not read {r.ours[0]}"


def test_every_recorded_series_equals_ours_in_dcgms_unit(behind_the_chart: Behind) -> None:
    """Both sides queried at one rule evaluation's instant, so they read the same samples."""
    behind = behind_the_chart
    when = settled(behind)
    checked = set()
    for row in mapping_rows():
        if not row.note.startswith("dcgm-compat") or row.unit in ("label", "last XID"):
            continue
        (name,) = row.dcgm
        theirs = by_gpu(behind.at(name, when))
        assert theirs, f"{name}: no data"
        matchers = ", ".join(f'{k}="{v}"' for k, v in row.labels.items())
        # The samples of ours up to that instant: the rule read the last one stored when it ran, which
        # a scrape begun just before it may have followed (energy and PCIe rates change every poll).  It
        # looks back as far as any instant query does (5 minutes): on a busy machine a scrape of the 1 s
        # interval can time out, and the last sample the rule read is then older than a few seconds.
        ours: dict[tuple[str, str], list[float]] = {}
        for metric in row.ours:
            ours |= samples_by_gpu(behind.at(f"{metric}{{{matchers}}}[{LOOKBACK}]", when))
        factor = FACTORS[row.unit]
        assert theirs.keys() == ours.keys(), name
        for key, values in ours.items():
            assert any(close(theirs[key], v * factor) for v in values[-2:]), (name, key, theirs[key], values, factor)
        checked.add(name)
    assert checked == set(recorded()) - {"DCGM_FI_DEV_XID_ERRORS"}


def test_the_dcgm_series_carry_dcgms_labels(behind_the_chart: Behind) -> None:
    prom, s = behind_the_chart.prom, behind_the_chart.scenario
    for name in recorded():
        for r in prom.query(name):
            m = {k: v for k, v in r["metric"].items() if k != "__name__"}
            gpu = s.gpu(int(m["gpu"]))
            extra = (POD_LABELS if "pod" in m else set()) | (MIG_LABELS if "GPU_I_ID" in m else set())
            assert set(m) == TARGET_LABELS | DCGM_LABELS | extra, (name, m)
            assert m["UUID"] == gpu.values["uuid"] and m["modelName"] == gpu.values["name"], (name, m)
            assert m["Hostname"] == NODE and m["DCGM_FI_DRIVER_VERSION"] == s.driver_version, (name, m)
            assert m["pci_bus_id"] == gpu.values["pci.bus_id"], (name, m)
            assert m["device"] == f"nvidia{gpu.values['minor_number']}", (name, m)  # /dev/nvidiaN, as dcgm's
            if "pod" in m:
                holder = (m["gpu"], m.get("GPU_I_ID"), m["namespace"], m["pod"], m["container"])
                assert holder in {("0", None, "ml", "trainer-0", "main"), ("2", "13", "ml", "mig-job", "main")}, m
            if "GPU_I_ID" in m:
                assert (m["GPU_I_ID"], m["GPU_I_PROFILE"]) in {(gi, p) for gi, (p, _, _) in MIG_DEVICES.items()}
    held = prom.query('DCGM_FI_DEV_GPU_UTIL{gpu="0"}')
    assert [r["metric"].get("pod") for r in held] == ["trainer-0"]


def test_xid_errors_is_the_last_xids_code(behind_the_chart: Behind) -> None:
    found = by_gpu(behind_the_chart.prom.query("DCGM_FI_DEV_XID_ERRORS"))
    assert found == {("0", ""): 0, (XID_GPU, ""): XID_CODE, ("2", ""): 0}
