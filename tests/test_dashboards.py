"""The Grafana dashboards under deploy/grafana/, checked without a Grafana server.

- Every query (and every PromQL selector in a template variable) parses with promql-parser once
  the dashboard variables are substituted, uses only metric names from docs/metrics.md's
  reference, and filters every selector by the node/gpu/namespace/pod variables.
- Every query returns data from a real Prometheus that scraped the real daemon running against
  the fake NVML on a scenario made to fill every panel.
- The JSON round-trips through grafana-foundation-sdk (the Grafana 11.x build) losing nothing.
- Units fit the metric family of each query, and the thresholds of the memory, PCIe and
  utilization panels are the alert rules' defaults from ``RulesSettings``.
- Every panel and target uses the ``datasource`` variable, and the provisioning files point
  Grafana at the dashboards' directory.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser as pp
import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.cog.runtime import Runtime
from grafana_foundation_sdk.models import prometheus as sdk_prometheus
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel, VariableModel

from gpu_exporter.alerting.settings import RulesSettings
from gpu_exporter.metric_defs import METRICS, series_names
from tests.alerting_helpers import webhook_receiver
from tests.exporter_helpers import run_daemon, wait_for
from tests.fake_kubelet import FakePod, fake_kubelet, pod
from tests.fakenvml import Counter, Scenario
from tests.fakenvml.presets import GIB, MIB, h100_activity, mig_uuid, preset
from tests.prometheus_helpers import Prometheus, prometheus
from tests.timing import LATE_S

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
OVERVIEWS = ("gpu-fleet.json", "gpu-node.json")
COST = "gpu-cost.json"  # Cost and waste: money in the currency its `currency` variable picks
NAMES = (*OVERVIEWS, COST)
GH200 = "NVIDIA GH200 480GB"  # a Grace Hopper: NVLink-C2C to its CPU
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FILTER_VARIABLES = ("node", "gpu", "namespace", "pod")
# Series Prometheus makes itself for each target: they carry the target's labels (node, from the
# relabelling), not a GPU's or a pod's.
TARGET_SERIES = {"up"}
UP_SELECTOR = 'up{job=~".*gpu-exporter.*",node=~"$node"}'  # as promql-parser prints it

# What Grafana would substitute, realistic for a 1 s scrape of one node with every GPU selected.
VALUES = {
    "datasource": "prometheus",
    "node": "node-a",
    "gpu": ".*",
    "namespace": ".*",
    "pod": ".*",
    "model": ".*",
    "currency": "USD",
    "__rate_interval": "15s",
    "__interval": "5s",
    "__range": "5m",
}
# Only the time variables: the label variables stay as "$node" etc. inside their strings.
TIME_VALUES = {k: v if k.startswith("__") else f"${k}" for k, v in VALUES.items()}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$", re.DOTALL)


# -- reading the dashboards ----------------------------------------------------------------------------
def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DASHBOARDS / name).read_text())
    return doc


def all_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels inside collapsed rows."""
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dash) if p["type"] != "row"]


def targets(dash: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for p in panels(dash):
        for t in p["targets"]:
            yield p, t


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def substitute(text: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"unknown dashboard variable ${name} in {text!r}"
        return values[name]

    return VARIABLE.sub(one, text)


def variable_selectors(dash: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Query variables: name -> (the PromQL selector inside label_values(), the label)."""
    out = {}
    for name, v in variables(dash).items():
        if v["type"] == "query":
            m = LABEL_VALUES.match(v["query"])
            assert m, f"variable {name}: expected label_values(SELECTOR, LABEL), got {v['query']!r}"
            out[name] = (m["selector"], m["label"])
    return out


# -- the metrics reference -------------------------------------------------------------------------------
def reference_labels() -> dict[str, set[str]]:
    """Metric name -> its labels, from the declarations (docs/metrics.md's table is generated from them)."""
    return {name: set(d.all_labels) for name, d in METRICS.items()}


def selectors(expr: pp.Expr) -> list[pp.VectorSelector]:
    found: list[pp.VectorSelector] = []

    def visit(e: pp.Expr) -> bool:
        if isinstance(e, pp.VectorSelector):
            found.append(e)
        return True

    pp.walk(expr, visit)
    return found


def metrics_of(expr: pp.Expr) -> set[str]:
    return {s.name or "" for s in selectors(expr)}


# -- units ---------------------------------------------------------------------------------------------
SUFFIX_FAMILIES = (
    ("_seconds_total", "s_total"),  # a count of seconds (GPU time): increase() is seconds, rate() GPUs
    ("_per_hour", "money_per_h"),
    ("_per_kwh", "money_per_kwh"),
    ("_bytes_per_second", "Bps"),
    ("_ratio", "percentunit"),
    ("_bytes_total", "bytes"),
    ("_bytes", "bytes"),
    ("_celsius", "celsius"),
    ("_watts", "watt"),
    ("_joules_total", "joule"),
    ("_hertz", "hertz"),
    ("_seconds_bucket", "s"),
    ("_seconds_sum", "s"),
    ("_seconds", "s"),
)
# The Grafana unit ids each family may be shown in.
UNITS = {
    "percentunit": {"percentunit"},
    "bytes": {"bytes"},
    "Bps": {"Bps", "binBps"},
    "celsius": {"celsius"},
    "watt": {"watt"},
    "joule": {"joule"},
    "kwatth": {"kwatth"},
    "hertz": {"hertz"},
    "s": {"s"},
    "cps": {"cps"},
    "short": {"short", "none"},
    "h": {"h"},
    # Grafana does not put variables into units: money is shown bare, its currency in the title.
    "money": {"none"},
    "money_per_h": {"none"},
    "money_per_kwh": {"none"},
}
COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}
SAME_UNIT_FUNCTIONS = {
    *("avg_over_time", "max_over_time", "min_over_time", "last_over_time"),
    *("abs", "clamp", "clamp_min", "clamp_max", "round", "ceil", "floor", "sort", "sort_desc", "label_replace"),
}
JOULES_PER_KWH = 3.6e6
SECONDS_PER_HOUR = 3600


def metric_family(name: str) -> str:
    return next((family for suffix, family in SUFFIX_FAMILIES if name.endswith(suffix)), "short")


def family(e: pp.Expr) -> str | None:
    """The unit family of what a PromQL expression computes; None for a bare number."""
    if isinstance(e, (pp.ParenExpr, pp.UnaryExpr)):
        return family(e.expr)
    if isinstance(e, pp.NumberLiteral):
        return None
    if isinstance(e, pp.MatrixSelector):
        return family(e.vector_selector)
    if isinstance(e, pp.VectorSelector):
        return metric_family(e.name or "")
    if isinstance(e, pp.AggregateExpr):
        return "short" if str(e.op) in ("count", "count_values", "group") else family(e.expr)
    if isinstance(e, pp.Call):
        name = e.func.name
        if name in ("vector", "time", "scalar"):
            return None
        if name == "histogram_quantile":
            return family(e.args[1])
        inner = family(e.args[0])
        if name in ("rate", "irate"):
            return {"bytes": "Bps", "joule": "watt", "s": "s", "s_total": "short"}.get(inner or "", "cps")
        if name in ("increase", "delta"):
            return {"bytes": "bytes", "joule": "joule", "s_total": "s"}.get(inner or "", "short")
        if name in ("count_over_time", "changes", "resets"):
            return "short"
        assert name in SAME_UNIT_FUNCTIONS, f"no unit rule for {name}()"
        return inner
    assert isinstance(e, pp.BinaryExpr), f"no unit rule for {type(e).__name__}"
    op, lhs, rhs = str(e.op), family(e.lhs), family(e.rhs)
    if op in COMPARISONS:
        return "short" if e.modifier is not None and e.modifier.return_bool else lhs or rhs
    if op in ("and", "unless"):
        return lhs
    if op in ("or", "+", "-"):
        assert lhs == rhs or None in (lhs, rhs), f"{op} mixes {lhs} and {rhs}"
        return lhs or rhs
    if op == "/":
        if rhs is None:
            if lhs == "joule" and isinstance(e.rhs, pp.NumberLiteral) and e.rhs.val == JOULES_PER_KWH:
                return "kwatth"
            if isinstance(e.rhs, pp.NumberLiteral) and e.rhs.val == SECONDS_PER_HOUR:
                return {"s": "h", "money_s": "money"}.get(lhs or "", lhs)
            return lhs
        if lhs == rhs:
            return "percentunit"
        if (lhs, rhs) == ("s", "cps"):  # a histogram's mean: rate(_sum) / rate(_count)
            return "s"
        raise AssertionError(f"no unit rule for {lhs} / {rhs}")
    assert op == "*", f"no unit rule for {lhs} {op} {rhs}"
    if metrics_of(e.rhs) and all(m.endswith("_info") for m in metrics_of(e.rhs)):
        return lhs  # a join with an info metric (value 1) only adds labels
    priced = {("s", "money_per_h"): "money_s", ("short", "money_per_h"): "money_per_h",
              ("h", "money_per_h"): "money", ("kwatth", "money_per_kwh"): "money"}  # fmt: skip
    if (lhs, rhs) in priced:
        return priced[(lhs, rhs)]  # type: ignore[index]
    assert None in (lhs, rhs), f"no unit rule for {lhs} {op} {rhs}"
    return lhs or rhs


def field_property(panel: dict[str, Any], ref_id: str, prop: str) -> Any:
    """A field property for one target's values: an override matching it, else the panel default.

    Overrides match a target by refId (``byFrameRefID``), or, in a table whose queries are
    merged, by the value column Grafana names ``Value #<refId>`` (``Value`` for a single query).
    """
    names = {f"Value #{ref_id}"} | ({"Value"} if len(panel["targets"]) == 1 else set())
    for o in panel["fieldConfig"]["overrides"]:
        matcher = o["matcher"]
        if (matcher["id"], matcher["options"]) in {("byFrameRefID", ref_id)} | {("byName", n) for n in names}:
            for p in o["properties"]:
                if p["id"] == prop:
                    return p["value"]
    return panel["fieldConfig"]["defaults"].get(prop)


def parsed(t: dict[str, Any], values: dict[str, str] = VALUES) -> pp.Expr:
    return pp.parse(substitute(t["expr"], values))


# -- static checks -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _sdk_plugins() -> None:
    register_default_plugins()


@pytest.mark.parametrize("name", NAMES)
def test_queries_parse_use_reference_metrics_and_filter_by_the_variables(name: str) -> None:
    dash = load(name)
    known = series_names()
    labels = reference_labels()
    assert labels.keys() == METRICS.keys()
    for panel, t in targets(dash):
        where = f"{name}: {panel['title']!r} {t['refId']}"
        expr = parsed(t)  # every variable substituted: raises on bad PromQL
        assert metrics_of(expr) <= known.keys() | TARGET_SERIES, f"{where}: unknown metric in {t['expr']}"
        # With the label variables left in place, each selector must filter by them.
        for sel in selectors(parsed(t, TIME_VALUES)):
            if sel.name in TARGET_SERIES:
                assert str(sel) == UP_SELECTOR, f"{where}: {sel} is not the gpu-exporter targets of $node"
                continue
            metric = known[sel.name or ""]
            wanted = [v for v in FILTER_VARIABLES if v != "gpu" or "gpu" in labels[metric]]
            have = {(m.name, m.value) for m in sel.matchers.matchers if m.op == pp.MatchOp.Re}
            missing = [v for v in wanted if (v, f"${v}") not in have]
            assert not missing, f"{where}: {sel} lacks a filter on {missing}"
    for var, (selector, _) in variable_selectors(dash).items():
        for sel in selectors(pp.parse(substitute(selector, VALUES))):
            assert sel.name in known, f"{name}: variable {var} selects unknown {sel.name}"


def test_the_node_dashboard_covers_every_metric_and_the_fleet_its_subjects() -> None:
    known = series_names()

    def used(name: str) -> set[str]:
        return {known[m] for _, t in targets(load(name)) for m in metrics_of(parsed(t)) - TARGET_SERIES}

    assert used("gpu-node.json") == METRICS.keys()
    assert {
        "gpu_up", "gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
        "gpu_process_memory_used_bytes", "gpu_exporter_alerts", "gpu_pcie_tx_bytes_per_second",
        "gpu_pcie_rx_bytes_per_second", "gpu_pcie_link_max_bytes_per_second", "gpu_energy_consumed_joules_total",
    } <= used("gpu-fleet.json")  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_the_datasource_variable_is_used_everywhere_and_the_filter_variables_exist(name: str) -> None:
    dash = load(name)
    vs = variables(dash)
    assert vs["datasource"]["type"] == "datasource" and vs["datasource"]["query"] == "prometheus"
    for var in FILTER_VARIABLES:
        v = vs[var]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE, var
        assert v["includeAll"] and v["allValue"] == ".*", (
            f"{var}: All must match any value, and series without the label"
        )
    # The cost dashboard also picks a currency: money is never summed across currencies.
    assert set(variable_selectors(dash)) == set(FILTER_VARIABLES) | {
        COST: {"currency"}, "gpu-fleet.json": {"model"}}.get(name, set())  # fmt: skip
    if name == COST:
        currency = vs["currency"]
        assert not currency["includeAll"] and not currency["multi"]
        assert variable_selectors(dash)["currency"] == (
            'gpu_price_per_hour{node=~"$node", namespace=~"$namespace", pod=~"$pod"}',
            "currency",
        )
        money = [p for p in panels(dash) if p["fieldConfig"]["defaults"]["unit"] == "none"]
        assert money and all("$currency" in p["title"] or "price" in p["title"].lower() for p in money)
    for p in all_panels(dash):
        if p["type"] == "row":
            assert not p.get("targets"), f"row {p['title']!r} has queries"
            continue
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE, (p["title"], t["refId"])
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
    ids = [p["id"] for p in all_panels(dash)]
    assert len(set(ids)) == len(ids), "panel ids must be unique"
    assert dash["schemaVersion"] == 39 and dash["uid"]


@pytest.mark.parametrize("name", NAMES)
def test_panels_fit_the_grid_without_overlapping(name: str) -> None:
    taken: dict[tuple[int, int], str] = {}
    for p in all_panels(load(name)):
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for cell in ((x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])):
            assert cell not in taken, f"{p['title']!r} overlaps {taken[cell]!r}"
            taken[cell] = p["title"]


def lost_keys(ours: Any, back: Any, path: str = "") -> list[str]:
    """Where ``back`` lacks a key of ``ours``, or holds another value; keys ``back`` adds are fine."""
    if isinstance(ours, dict):
        if not isinstance(back, dict):
            return [f"{path}: became {type(back).__name__}"]
        return [x for k, v in ours.items() for x in
                (lost_keys(v, back[k], f"{path}.{k}") if k in back else [f"{path}.{k}"])]  # fmt: skip
    if isinstance(ours, list):
        if not isinstance(back, list) or len(ours) != len(back):
            return [f"{path}: list changed"]
        return [x for i, (a, b) in enumerate(zip(ours, back, strict=True)) for x in lost_keys(a, b, f"{path}[{i}]")]
    return [] if ours == back else [f"{path}: {ours!r} became {back!r}"]


def round_trip(model: Any) -> Any:
    return json.loads(json.dumps(model, cls=JSONEncoder))


@pytest.mark.parametrize("name", NAMES)
def test_the_json_round_trips_through_grafana_foundation_sdk(name: str) -> None:
    """Load into grafana-foundation-sdk's typed models, dump back, and compare with what we wrote.

    Compared: the whole dashboard (``Dashboard.from_json`` then ``to_json``), and each panel and
    each template variable on its own (``Panel``/``RowPanel``/``VariableModel``), recursively:
    every key we wrote must come back with the same value; keys the SDK adds (its defaults) are
    allowed. The SDK keeps only the keys its model knows, so a lost key is an unknown one: in
    the dashboard, a panel, ``gridPos``, ``fieldConfig.defaults`` (and ``custom`` for panel types
    whose field config the SDK models: timeseries, table, state-timeline), overrides, thresholds,
    mappings, links, the panel's plugin ``options``, the Prometheus targets and the variables.
    ``transformations`` and override property values are free-form in the SDK too, so only
    their presence is checked there. Each target must also decode as the SDK's Prometheus
    query, which it does only when its panel names a Prometheus data source.
    """
    dash = load(name)
    assert lost_keys(dash, round_trip(Dashboard.from_json(dash))) == []
    panel_types = Runtime().panelcfg_variants
    for p in all_panels(dash):
        model = RowPanel.from_json(p) if p["type"] == "row" else Panel.from_json(p)
        assert lost_keys(p, round_trip(model), p.get("title", "")) == []
        if isinstance(model, Panel):
            assert model.type_val in panel_types, f"{model.title}: unknown panel type {model.type_val}"
            assert model.targets and all(isinstance(t, sdk_prometheus.Dataquery) for t in model.targets)
            assert not isinstance(model.options, dict), f"{model.title}: options not modelled"
    for v in dash["templating"]["list"]:
        assert lost_keys(v, round_trip(VariableModel.from_json(v)), v["name"]) == []


@pytest.mark.parametrize("name", NAMES)
def test_units_fit_each_metric_family(name: str) -> None:
    seen: set[str] = set()
    for panel, t in targets(load(name)):
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']!r}: no unit"
        fam = family(parsed(t))
        assert fam is not None, f"{panel['title']!r} {t['refId']}: a constant"
        unit = field_property(panel, t["refId"], "unit")
        assert unit in UNITS[fam], f"{panel['title']!r} {t['refId']}: {fam} shown as {unit!r}\n{t['expr']}"
        seen.add(fam)
    if name == COST:
        assert {"h", "money", "money_per_h", "short", "watt", "kwatth", "percentunit"} <= seen
        return
    assert {"percentunit", "bytes", "watt", "joule", "celsius"} <= seen
    if name == "gpu-node.json":
        assert {"hertz", "Bps", "s", "cps"} <= seen


def test_unit_rules() -> None:
    """The unit mapping itself, on the metric families the brief names."""
    cases = {
        "gpu_utilization_ratio": "percentunit",
        "gpu_memory_used_bytes / gpu_memory_total_bytes": "percentunit",
        "gpu_memory_used_bytes": "bytes",
        "gpu_temperature_celsius": "celsius",
        "gpu_power_usage_watts": "watt",
        "rate(gpu_energy_consumed_joules_total[1m])": "watt",
        "increase(gpu_energy_consumed_joules_total[1h])": "joule",
        "sum(increase(gpu_energy_consumed_joules_total[1h])) / 3.6e6": "kwatth",
        "gpu_clock_hertz": "hertz",
        "gpu_pcie_rx_bytes_per_second": "Bps",
        "rate(gpu_nvlink_tx_bytes_total[1m])": "Bps",
        "gpu_pcie_rx_bytes_per_second / gpu_pcie_link_max_bytes_per_second": "percentunit",
        "histogram_quantile(0.9, rate(gpu_exporter_poll_duration_seconds_bucket[1m]))": "s",
        "count(gpu_up == 0) or vector(0)": "short",
        "gpu_pcie_link_width": "short",
        "increase(gpu_state_seconds_total[1h]) / 3600": "h",
        "sum by (state) (rate(gpu_state_seconds_total[5m]))": "short",
        "sum(increase(gpu_state_seconds_total[1h]) * on (gpu) group_left () gpu_price_per_hour) / 3600": "money",
        "increase(gpu_energy_consumed_joules_total[1h]) / 3.6e6"
        " * on (gpu) group_left () gpu_energy_price_per_kwh": "money",
        "increase(gpu_state_seconds_total[1h]) * on (gpu) group_left (name) gpu_info / 3600": "h",
    }
    for expr, want in cases.items():
        assert family(pp.parse(expr)) == want, expr


def thresholds_of(panel: dict[str, Any], ref_id: str) -> list[float]:
    config = field_property(panel, ref_id, "thresholds")
    assert config and config["mode"] == "absolute", panel["title"]
    steps = config["steps"]
    assert steps[0]["value"] is None, f"{panel['title']!r}: the base step must be -Infinity (null)"
    return [float(s["value"]) for s in steps[1:]]


@pytest.mark.parametrize("name", OVERVIEWS)
def test_thresholds_are_the_alert_defaults(name: str) -> None:
    rules = RulesSettings()
    memory = [rules.GpuMemoryHigh.warning, rules.GpuMemoryHigh.critical]
    pcie = [rules.GpuPcieBottleneck.threshold]
    idle = [rules.GpuUnderutilized.threshold]
    checked = {"memory": 0, "pcie": 0, "utilization": 0}
    for panel, t in targets(load(name)):
        expr = parsed(t)
        if family(expr) != "percentunit":
            continue
        names = {m for m in metrics_of(expr) if not m.endswith("_info")}  # a join with gpu_info adds the model
        where = f"{panel['title']!r} {t['refId']}"
        if {"gpu_memory_used_bytes", "gpu_memory_total_bytes"} <= names:
            assert thresholds_of(panel, t["refId"]) == memory, where
            checked["memory"] += 1
        elif "gpu_pcie_link_max_bytes_per_second" in names:
            assert thresholds_of(panel, t["refId"]) == pcie, where
            checked["pcie"] += 1
        elif names == {"gpu_utilization_ratio"} or "gpu_process_memory_used_bytes" in names:
            assert thresholds_of(panel, t["refId"]) == idle, where
            checked["utilization"] += 1
    assert all(checked.values()), checked


@pytest.mark.parametrize("name", OVERVIEWS)
def test_allocated_but_idle_mirrors_the_underutilized_rule(name: str) -> None:
    """Averages of activity use the rule's window and signal (SM activity, else GPU-Util), and compare with its
    threshold."""
    rules = RulesSettings().GpuUnderutilized
    windows: list[float] = []
    cutoffs: list[float] = []

    def visit(e: pp.Expr) -> bool:
        if isinstance(e, pp.Call) and e.func.name == "avg_over_time":
            (m,) = e.args
            assert isinstance(m, pp.MatrixSelector)
            assert m.vector_selector.name in ("gpu_utilization_ratio", "gpu_sm_active_ratio")
            windows.append(m.range.total_seconds())
        if isinstance(e, pp.BinaryExpr) and str(e.op) == "<" and isinstance(e.rhs, pp.NumberLiteral):
            lhs = e.lhs.expr if isinstance(e.lhs, pp.ParenExpr) else e.lhs
            if isinstance(lhs, pp.BinaryExpr) and str(lhs.op) == "or":  # the rule's signal: SM activity, else GPU-Util
                assert [metrics_of(lhs.lhs), metrics_of(lhs.rhs)] == [
                    {"gpu_sm_active_ratio"},
                    {"gpu_utilization_ratio"},
                ]
                lhs = lhs.rhs
            if isinstance(lhs, pp.Call) and lhs.func.name == "avg_over_time":
                cutoffs.append(e.rhs.val)
        return True

    for _, t in targets(load(name)):
        pp.walk(parsed(t), visit)
    assert windows and set(windows) == {rules.window}
    if name == "gpu-fleet.json":
        assert cutoffs and set(cutoffs) == {rules.threshold}


def test_provisioning_points_grafana_at_the_dashboards() -> None:
    provider_doc = yaml.safe_load((GRAFANA / "provisioning" / "dashboards.yaml").read_text())
    assert provider_doc["apiVersion"] == 1
    (provider,) = provider_doc["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    # docker-compose.yaml mounts the dashboards' directory exactly there, and both provisioning files.
    compose = yaml.safe_load((GRAFANA / "docker-compose.yaml").read_text())
    mounts: dict[str, str] = {}  # target in the container -> source beside docker-compose.yaml
    for volume in compose["services"]["grafana"]["volumes"]:
        source, target = volume.removesuffix(":ro").split(":", 1)
        mounts[target] = source
    assert (GRAFANA / mounts[path]).resolve() == DASHBOARDS
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(NAMES)
    assert (GRAFANA / mounts["/etc/grafana/provisioning/dashboards/gpu-exporter.yaml"]).resolve() == (
        GRAFANA / "provisioning" / "dashboards.yaml"
    )
    sources_target = "/etc/grafana/provisioning/datasources/gpu-exporter.yaml"
    sources = yaml.safe_load((GRAFANA / mounts[sources_target]).read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "${PROMETHEUS_URL}"
    assert "PROMETHEUS_URL" in compose["services"]["grafana"]["environment"]
    assert compose["services"]["grafana"]["image"].startswith("grafana/grafana:11.")


# -- every query against a real Prometheus -------------------------------------------------------------
FAST_RULES = {
    name: {"for": "0s"}
    for name in ("GpuPcieLinkDegraded", "GpuPcieBottleneck", "GpuMemoryHigh", "GpuLost", "GpuThermalThrottling")
}


def node_with_everything(path: Path) -> Scenario:
    """A node that fills every panel: H100s busy, throttled, degraded and lost, a Grace Hopper
    idle-but-allocated as GPU 1 (whose NVLink-C2C link to its CPU replays), and an A100 in MIG mode
    (3g.40gb + 2g.20gb + 1g.10gb, a process on each) as GPU 5."""
    s = preset("h100-8x-training", path)
    s.driver_version = "580.82.07"  # the first driver with the clock event reason counters (fields 269-271)
    s.gpus = s.gpus[:5]
    s.gpu(0).memory(81559 * MIB, int(81559 * MIB * 0.985), reserved=512 * MIB).fans(45, 47)  # GpuMemoryHigh
    s.gpu(1).utilization(3, 0).gpm(**h100_activity(3))  # a process holds 70 GiB: allocated but idle
    s.gpu(1).identity(GH200, str(s.gpu(1).values["uuid"])).c2c(replay=Counter(3, 0.5))
    s.gpu(2).clocks_event_reasons("hw_thermal").clocks(graphics=1200, sm=1200).temperature(88, memory=93)
    s.gpu(2).violations(thermal=Counter(10**12, 6e8), power=Counter(5 * 10**11, 1e8))  # held back 60% and 10%
    s.gpu(2).clock_event_counters(hw_thermal=Counter(10**11, 3e8), sw_thermal=Counter(0, 0))  # slowed 30%
    s.gpu(2).add_xid(79)
    s.gpu(3).utilization(40, 10).pcie(gen=3, width=8, tx_kbps=7_600_000, rx_kbps=7_000_000, replay=Counter(3, 0.5))
    s.gpu(3).ecc(corrected=Counter(5, 0.5), uncorrected=1).remapped_rows(correctable=2, pending=True)
    s.gpu(4).lost()
    s.gpu(0).add_process(10_100, 2 * GIB, name="tritonserver")
    # The MIG GPU as a Hopper (H100 80GB has the same 3g.40gb/2g.20gb/1g.10gb profiles), so GPM gives
    # each instance its activity.
    mig = preset("a100-mig").gpu(0).minor_number(5).gpm_supported()
    mig.set("name", "NVIDIA H100 80GB HBM3")
    for m, inst in enumerate(mig.migs):
        inst.set("name", str(inst.values["name"]).replace("A100-SXM4-80GB", "H100 80GB HBM3"))
        inst.gpm(sm_util=30 + 20 * m, sm_occupancy=12, any_tensor_util=20, dram_bw_util=15, graphics_util=60,
                 fp64_util=0, fp32_util=3, fp16_util=1)  # fmt: skip
    s.gpus.append(mig)
    return s


def pods(s: Scenario) -> list[FakePod]:
    """A pod holding GPU 0 whole, and one holding the 1g.10gb MIG device of GPU 5."""
    return [
        pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [str(s.gpu(0).values["uuid"])])),
        pod("ml", "mig-job", ("main", "nvidia.com/mig-1g.10gb", [mig_uuid("mig", 0, 2)])),
    ]


def returns_data(prom: Prometheus, t: dict[str, Any], expr: str, now: float) -> bool:
    if t["instant"]:
        return bool(prom.query(expr))
    data = prom.api("query_range", query=expr, start=str(now - 20), end=str(now), step="2")
    return any(series["values"] for series in data["result"])


Run = tuple[str, dict[str, Any], str]  # where (dashboard, panel, refId), the target, the expression


def assert_every_query_returns_data(prom: Prometheus, runs: list[Run], within: float) -> None:
    """Waits (at most ``within`` + LATE_S seconds) until each query returns data; fails naming those
    that never did."""
    empty = runs
    deadline = time.monotonic() + within + LATE_S
    while empty and time.monotonic() < deadline:
        now = time.time()
        empty = [r for r in empty if not returns_data(prom, r[1], r[2], now)]
        if empty:
            time.sleep(0.5)
    assert not empty, "queries without data:\n" + "\n".join(f"{w}\n  {e}" for w, _, e in empty)


# Panels whose query part before `or vector(0)` is empty while every exporter answers: they count what
# only a dead exporter or a failing NVML makes (tests/test_fleet.py kills one and checks them).
EMPTY_WHILE_HEALTHY = {
    ("gpu-fleet.json", "GPUs lost", "B"),  # GPUs on a target that is down
    ("gpu-fleet.json", "Alerts firing", "B"),  # alerts last seen on a target that is down
    ("gpu-fleet.json", "Targets down", "A"),
    ("gpu-fleet.json", "Polls not fresh", "A"),
}


def queries_to_run(t: dict[str, Any]) -> list[str]:
    """The substituted query, and its left side when it ends in ``or vector(0)`` (which hides nothing)."""
    expr = substitute(t["expr"], VALUES)
    head, sep, _ = expr.rpartition(" or vector(0)")
    return [expr, head] if sep and expr.endswith(" or vector(0)") else [expr]


def panel_rows(prom: Prometheus, dash: dict[str, Any], title: str) -> dict[str, list[dict[str, str]]]:
    """refId -> the label sets its instant query returns now (``__name__`` left out)."""
    (panel,) = (p for p in panels(dash) if p["title"] == title)
    return {
        t["refId"]: [{k: v for k, v in r["metric"].items() if k != "__name__"}
                     for r in prom.query(substitute(t["expr"], VALUES))]
        for t in panel["targets"]
    }  # fmt: skip


def check_pods_and_mig_panels(prom: Prometheus, dash: dict[str, Any], s: Scenario) -> None:
    """The pods table names each holder and its device; the MIG table's queries merge into one row per device."""
    (holders,) = panel_rows(prom, dash, "Pods on this node").values()
    assert {(h["gpu"], h["namespace"], h["pod"], h["container"], h["device_uuid"]) for h in holders} == {
        ("0", "ml", "trainer-0", "main", str(s.gpu(0).values["uuid"])),
        ("5", "ml", "mig-job", "main", mig_uuid("mig", 0, 2)),
    }
    columns = panel_rows(prom, dash, "MIG devices")
    rows = [sorted(map(sorted, (r.items() for r in found))) for found in columns.values()]
    assert len(rows[0]) == 3 and all(r == rows[0] for r in rows), f"the MIG table's queries do not merge: {columns}"
    by_profile = {r["mig_profile"]: (r["gpu"], r["gpu_instance_id"], r.get("pod", "")) for r in columns["A"]}
    assert by_profile == {"3g.40gb": ("5", "1", ""), "2g.20gb": ("5", "5", ""), "1g.10gb": ("5", "13", "mig-job")}
    (procs,) = panel_rows(prom, dash, "MIG processes").values()
    assert {(r["mig_profile"], r["pid"]) for r in procs} == {("3g.40gb", "30001"), ("2g.20gb", "30002"),
                                                            ("1g.10gb", "30003")}  # fmt: skip


def test_every_query_returns_data_from_prometheus_scraping_the_daemon(fake_nvml_lib: Path, tmp_path: Path) -> None:
    s = node_with_everything(tmp_path / "node.scn")
    s.write()
    dashes = {name: load(name) for name in NAMES}
    with webhook_receiver() as hook, fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = pods(s)
        (tmp_path / "job-map").mkdir()
        (tmp_path / "job-map" / "1").write_text("4242\n")  # a Slurm job holds GPU 1 (holder panels)
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({
            "node_name": "node-a",
            "rules": FAST_RULES,
            "alerting": {"resend_interval": "1s", "webhooks": [{"url": hook.url, "name": "ops"}]},
            "kubernetes": {"pod_attribution": "on", "pod_resources_socket": str(kubelet.socket_path),
                           "refresh_interval": "200ms", "timeout": f"{LATE_S:.0f}s"},
            "pricing": {"currency": "USD", "models": {"H100": 2.5, "GH200": 3.5}, "energy_per_kwh": 0.2},
            "slurm": {"job_mapping_dir": str(tmp_path / "job-map")},
        }))  # fmt: skip
        with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "1s") as d, \
                prometheus([f"127.0.0.1:{d.port}"], tmp_path / "prom", labels={"node": "node-a"}) as prom:  # fmt: skip
            # A few scrapes, so that rate() and increase() have two samples in every window.
            scrapes = 'count_over_time(gpu_exporter_notifications_total{node="node-a"}[1m]) >= 4'
            wait_for(lambda: bool(prom.query(scrapes)), timeout=30, interval=0.2, what="four scrapes")
            runs = [(f"{n}: {p['title']!r} {t['refId']}", t, e) for n, dash in dashes.items()
                    for p, t in targets(dash) for e in queries_to_run(t)
                    if (n, p["title"], t["refId"]) not in EMPTY_WHILE_HEALTHY or e.endswith("vector(0)")]  # fmt: skip
            assert_every_query_returns_data(prom, runs, within=15)
            assert len(runs) > 80
            check_pods_and_mig_panels(prom, dashes["gpu-node.json"], s)
            # The variables' label_values() find this node, its GPUs and the pod holding a whole GPU
            # (the MIG device's pod is on the MIG series, not on gpu_up); "All" (.*) also matches
            # the series whose pod labels are empty, and those without them (the exporter's own).
            for dash in dashes.values():
                found = {var: {r["metric"].get(label) for r in prom.query(substitute(selector, VALUES))} - {None}
                         for var, (selector, label) in variable_selectors(dash).items()}  # fmt: skip
                gpus = {str(i) for i in range(6)}
                wanted = {"node": {"node-a"}, "gpu": gpus, "namespace": {"ml"}, "pod": {"trainer-0"}}
                extra = {"currency": {"USD"}, "model": {"NVIDIA H100 80GB HBM3", GH200}}
                assert found == wanted | {k: v for k, v in extra.items() if k in found}


# -- dashboards that scale -------------------------------------------------------------------------------
def test_the_fleet_scales_lists_the_top_ten_and_names_the_holder_and_model() -> None:
    dash = load("gpu-fleet.json")
    by_title = {p["title"]: p for p in panels(dash)}
    # No bar gauge with a bar per GPU or per node: lists of GPUs are tables, cut to ten where not a full list.
    assert not [p["title"] for p in panels(dash) if p["type"] == "bargauge"]
    for title in (
        "Least utilized GPUs (10)",
        "Fullest GPUs (10)",
        "PCIe load (10 busiest)",
        "Utilization per pod (top 10)",
    ):
        (t,) = by_title[title]["targets"]
        assert re.match(r"(topk|bottomk)\(10,", t["expr"]), title
    # The tables of idle and near-OOM GPUs show namespace, pod and model.
    for title in ("Allocated but idle (30m)", "Near OOM", "Least utilized GPUs (10)", "Fullest GPUs (10)"):
        p = by_title[title]
        organize = p["transformations"][-1]["options"]
        shown = set(organize["indexByName"]) - set(organize["excludeByName"])
        assert {"node", "gpu", "name", "namespace", "pod"} <= shown, title
        assert organize["renameByName"] == {"name": "model"}
        for t in p["targets"]:
            grouped = [e for e in agg_groupings(parsed(t)) if "node" in e and "name" not in e]  # not the gpu_info join
            assert grouped and all({"namespace", "pod"} <= g for g in grouped), (title, t["refId"])
            assert "group_left (name)" in t["expr"] and 'gpu_info{name=~"$model"' in t["expr"], (title, t["refId"])
    # Counts of GPUs near OOM and PCIe-bound, at the alert rules' thresholds.
    rules = RulesSettings()
    assert f">= {rules.GpuMemoryHigh.warning}" in by_title["Near OOM"]["targets"][0]["expr"]
    assert f">= {rules.GpuPcieBottleneck.threshold}" in by_title["PCIe-bound"]["targets"][0]["expr"]
    # The model variable narrows every query over per-GPU series, and lists gpu_info's model names.
    assert variable_selectors(dash)["model"][1] == "name"
    for panel, t in targets(dash):
        names = {m for m in metrics_of(parsed(t)) if m in reference_labels() and "gpu" in reference_labels()[m]}
        if names and panel["title"] not in ("GPUs up and lost", "Lost GPUs", "GPUs lost", "Alerts firing"):
            assert "$model" in t["expr"], f"{panel['title']!r} {t['refId']} ignores the model variable"


def agg_groupings(expr: pp.Expr) -> list[set[str]]:
    found: list[set[str]] = []

    def visit(e: pp.Expr) -> bool:
        if isinstance(e, pp.AggregateExpr) and e.modifier is not None and str(e.op) in ("max", "sum"):
            found.append(set(e.modifier.labels))
        return True

    pp.walk(expr, visit)
    return found


def test_the_node_dashboard_repeats_by_gpu_with_a_gauge_row() -> None:
    dash = load("gpu-node.json")
    top = dash["panels"]
    (i,) = [n for n, p in enumerate(top) if p["type"] == "row" and p.get("repeat") == "gpu"]
    repeated = []
    for p in top[i + 1 :]:
        if p["type"] == "row":
            break
        repeated.append(p)
    gauges = {p["title"] for p in repeated if p["type"] == "gauge"}
    assert {"Utilization", "Memory used", "Temperature", "Power vs limit"} <= gauges
    assert variables(dash)["gpu"]["multi"] and variables(dash)["gpu"]["includeAll"]
    # Clocks (7 clocks x 2 lines per GPU) are drawn per GPU, in the repeated row; process memory is cut to ten.
    assert "Clocks vs max (this GPU)" in {p["title"] for p in repeated}
    (proc,) = [p for p in panels(dash) if p["title"] == "Process memory (10 largest)"]
    assert proc["targets"][0]["expr"].startswith("topk(10,")
