"""Three nodes scraped by a real Prometheus configured with the docs' own prometheus.yml (docs/deploying.md).

The scrape config is read from the docs' block, so the docs cannot drift from what is tested:
every series and every alert of the rule files gets `node` from the relabelling, the dashboards'
`node` variable lists the three nodes, every dashboard query returns data, power falls back to
gpu_power_usage_watts on cards without an energy counter, and killing one exporter shows on the
exporter-health row instead of making the fleet look healthier.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerting_helpers import webhook_receiver
from tests.exporter_helpers import RunningDaemon, run_daemon, wait_for
from tests.fake_kubelet import fake_kubelet
from tests.fakenvml.presets import preset
from tests.prometheus_helpers import Prometheus, prometheus_with_config
from tests.test_dashboards import (
    EMPTY_WHILE_HEALTHY,
    FAST_RULES,
    NAMES,
    VALUES,
    assert_every_query_returns_data,
    load,
    node_with_everything,
    panels,
    pods,
    substitute,
    targets,
    variable_selectors,
)  # fmt: skip

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
RULES = [ROOT / "alerts" / "gpu-exporter.rules.yml", ROOT / "alerts" / "gpu-cost.rules.yml"]
NODES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")  # one loopback address per "host": node = the target's host
FLEET = VALUES | {"node": ".*"}  # the fleet as Grafana shows it with every node selected


def readme_prometheus_config() -> dict[str, Any]:
    text = (ROOT / "docs" / "deploying.md").read_text()
    m = re.search(r"```yaml\n(# prometheus\.yml \(outside Kubernetes.*?)```", text, re.DOTALL)
    assert m, "docs/deploying.md lost its prometheus.yml block"
    config: dict[str, Any] = yaml.safe_load(m.group(1))
    return config


def configured(readme: dict[str, Any], target_list: list[str]) -> dict[str, Any]:
    """The docs' config with this test's targets, rule files and a 1 s interval; nothing else changed."""
    (job,) = readme["scrape_configs"]
    (static,) = job["static_configs"]
    assert static.keys() == {"targets"}, "the docs' targets carry no hand-written labels"
    static["targets"] = target_list
    readme["rule_files"] = [str(p) for p in RULES]
    readme["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    return readme


def query(prom: Prometheus, dash: str, title: str, values: dict[str, str] = FLEET) -> dict[str, list[dict[str, Any]]]:
    (panel,) = (p for p in panels(load(dash)) if p["title"] == title)
    return {t["refId"]: prom.query(substitute(t["expr"], values)) for t in panel["targets"]}


def number(prom: Prometheus, title: str, ref: str = "A") -> float:
    (row,) = query(prom, "gpu-fleet.json", title)[ref]
    return float(row["value"][1])


def test_three_nodes_with_the_readme_config(fake_nvml_lib: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    a = node_with_everything(tmp_path / "a.scn")
    a.write()
    b = preset("pcie-degraded", tmp_path / "b.scn")
    b.write()
    c = preset("workstation-2x-consumer", tmp_path / "c.scn")  # no energy counter on either card
    c.write()
    with webhook_receiver() as hook, fake_kubelet(tmp_path) as kubelet:
        kubelet.pods = pods(a)
        cfg = tmp_path / "a.yaml"
        cfg.write_text(yaml.safe_dump({
            "rules": FAST_RULES,
            "alerting": {"resend_interval": "1s", "webhooks": [{"url": hook.url, "name": "ops"}]},
            "kubernetes": {"pod_attribution": "on", "pod_resources_socket": str(kubelet.socket_path),
                           "refresh_interval": "200ms", "timeout": "500ms"},
            "pricing": {"currency": "USD", "models": {"H100": 2.5, "GH200": 3.5}, "energy_per_kwh": 0.2},
            "slurm": {"job_mapping_dir": str(tmp_path)},  # a Slurm node too: the holder panels have data
        }))  # fmt: skip
        common = ("--poll.interval", "1s")
        at = "--web.listen-address"
        with run_daemon(a.path, "--config", str(cfg), at, f"{NODES[0]}:0", *common,
                        listen_flag=False) as da, \
                run_daemon(b.path, at, f"{NODES[1]}:0", *common, listen_flag=False) as db, \
                run_daemon(c.path, at, f"{NODES[2]}:0", *common, listen_flag=False) as dc:  # fmt: skip
            daemons: list[RunningDaemon] = [da, db, dc]
            config = configured(
                readme_prometheus_config(), [f"{n}:{d.port}" for n, d in zip(NODES, daemons, strict=True)]
            )
            with prometheus_with_config(config, tmp_path / "prom") as prom:
                wait_for(
                    lambda: len(prom.query("count_over_time(up[1m]) >= 4")) == 3,
                    timeout=30,
                    interval=0.2,
                    what="four scrapes of each target",
                )
                check_every_series_has_a_node(prom)
                check_every_panel_has_data(prom)
                check_power_falls_back(prom)
                check_model_variable(prom)
                check_alerts_carry_node(prom)
                check_no_panel_draws_dozens_of_lines(prom)
                # One exporter dies: its node and GPUs must show as unwatched, not vanish.
                assert number(prom, "Targets down") == 0 and number(prom, "Nodes") == 3
                lost_before = number(prom, "GPUs lost")
                db.proc.kill()
                db.proc.wait(timeout=10)
                wait_for(lambda: number(prom, "Targets down") == 1, timeout=20, interval=0.2, what="target down")
                assert number(prom, "Nodes") == 3
                assert number(prom, "GPUs lost") == lost_before, "lost GPUs of live nodes still count"
                assert number(prom, "GPUs lost", "B") == 1, "the dead exporter's GPU is unwatched"
                rows = {
                    r["metric"]["node"]: float(r["value"][1]) for r in query(prom, "gpu-fleet.json", "Exporters")["A"]
                }
                assert rows == {NODES[0]: 1, NODES[1]: 0, NODES[2]: 1}
                # NVML stops answering on node c: its polls are no longer fresh.
                assert number(prom, "Polls not fresh") == 0
                c.init_error = "DRIVER_NOT_LOADED"
                c.write()
                wait_for(lambda: number(prom, "Polls not fresh") == 1, timeout=30, interval=0.3, what="stale polls")
                wait_for(
                    lambda: any(a["labels"]["alertname"] == "GpuExporterDown" for a in prom.alerts()),
                    timeout=20,
                    interval=0.3,
                    what="GpuExporterDown pending",
                )
                down = [a for a in prom.alerts() if a["labels"]["alertname"] == "GpuExporterDown"]
                assert {a["labels"]["node"] for a in down} == {NODES[1]}
    print(f"three-node fleet test: {time.monotonic() - started:.1f} s")


def check_every_series_has_a_node(prom: Prometheus) -> None:
    assert prom.query('count({job="gpu-exporter", node=""})') == []
    for dash in NAMES:
        selector, label = variable_selectors(load(dash))["node"]
        found = {r["metric"][label] for r in prom.query(substitute(selector, FLEET))}
        assert found == set(NODES), f"{dash}: node variable lists {found}"
    # Legends and tables tell the hosts apart: three GPU 0s, on three nodes.
    zeros = {r["metric"]["node"] for r in prom.query('gpu_up{gpu="0"}')}
    assert zeros == set(NODES)


def check_every_panel_has_data(prom: Prometheus) -> None:
    runs = []
    for name in NAMES:
        for p, t in targets(load(name)):
            expr = substitute(t["expr"], FLEET)
            head, sep, _ = expr.rpartition(" or vector(0)")
            exprs = [expr] + ([head] if sep and expr.endswith(" or vector(0)") else [])
            healthy_empty = (name, p["title"], t["refId"]) in EMPTY_WHILE_HEALTHY
            where = f"{name}: {p['title']!r} {t['refId']}"
            runs += [(where, t, e) for e in exprs if not healthy_empty or e.endswith("vector(0)")]
    assert_every_query_returns_data(prom, runs, within=20)


def check_power_falls_back(prom: Prometheus) -> None:
    """Node c's cards have no energy counter: the fleet's power uses their gpu_power_usage_watts."""
    watts = {r["metric"]["node"]: float(r["value"][1]) for r in query(prom, "gpu-fleet.json", "Power by node")["A"]}
    assert watts.keys() == set(NODES)
    drawn = sum(float(r["value"][1]) for r in prom.query(f'gpu_power_usage_watts{{node="{NODES[2]}"}}'))
    assert drawn > 0 and watts[NODES[2]] == drawn
    assert not prom.query(f'gpu_energy_consumed_joules_total{{node="{NODES[2]}"}}')
    assert number(prom, "Power draw") > watts[NODES[2]]


def check_model_variable(prom: Prometheus) -> None:
    models = {
        r["metric"]["name"]
        for r in prom.query(substitute(variable_selectors(load("gpu-fleet.json"))["model"][0], FLEET))
    }
    assert {"NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3"} <= models
    one = FLEET | {"model": "NVIDIA GeForce RTX 4090"}
    rows = query(prom, "gpu-fleet.json", "GPUs by utilization and memory", one)["A"]
    assert {(r["metric"]["node"], r["metric"]["name"]) for r in rows} == {(NODES[2], "NVIDIA GeForce RTX 4090")}
    (up,) = query(prom, "gpu-fleet.json", "GPUs up", one)["A"]
    assert float(up["value"][1]) == 1


def check_alerts_carry_node(prom: Prometheus) -> None:
    wait_for(lambda: bool(prom.alerts()), timeout=20, interval=0.3, what="an alert from the rule files")
    alerts = prom.alerts()
    assert all(a["labels"].get("node") in NODES for a in alerts), alerts
    assert NODES[0] in {a["labels"]["node"] for a in alerts}


MOST_LINES = 16  # two lines per GPU of an 8-GPU node


def check_no_panel_draws_dozens_of_lines(prom: Prometheus) -> None:
    """Node a (6 GPUs, 18 NVLinks, 2 fans, several sensors and clocks each): the node dashboard's
    time series draw at most 16 lines each; those in the row repeated per GPU, for one GPU."""
    dash = load("gpu-node.json")
    per_gpu = False
    counts = {}
    for p in dash["panels"]:
        if p["type"] == "row":
            per_gpu = p.get("repeat") == "gpu"
            continue
        if p["type"] != "timeseries":
            continue
        values = VALUES | {"node": NODES[0], "gpu": "0" if per_gpu else ".*"}
        counts[p["title"]] = sum(len(prom.query(substitute(t["expr"], values))) for t in p["targets"])
    assert counts["Clocks vs max (this GPU)"] > 2, counts  # it does draw, for one GPU
    too_many = {title: n for title, n in counts.items() if n > MOST_LINES}
    assert not too_many, f"panels drawing more than {MOST_LINES} lines on one node: {too_many}"
