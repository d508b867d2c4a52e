"""A simulated fleet: N daemons with 8 simulated GPUs each, scraped by a real Prometheus.

Prometheus (Debian's package) scrapes every daemon on 127.0.0.1, attaches a ``node`` label per
target as the ServiceMonitor does, and evaluates alerts/gpu-exporter.rules.yml. Measured: series
per node and per GPU, samples ingested per second, rule evaluation time, Prometheus's memory and
CPU, and the fleet dashboard's queries (deploy/grafana/dashboards/gpu-fleet.json) over the HTTP API.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.parse
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import yaml
from benchlib import (
    ROOT,
    Children,
    cpu_seconds,
    free_port,
    get,
    listening_port,
    log,
    median,
    parse_samples,
    rss_mib,
    spawn_gpu_exporter,
    value,
)

RULES = ROOT / "alerts" / "gpu-exporter.rules.yml"
RECORDING_RULES = ROOT / "benchmarks" / "fleet-recording-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "gpu-fleet.json"
GPUS_PER_NODE = 8
# Grafana's variables, as "All" and a short time range would set them.
VARIABLES = {"__rate_interval": "1m", "__interval": "1m", "__range": "5m", "__range_s": "300"}


def dashboard_queries(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, PromQL with the variables substituted) for every panel target."""
    doc = json.loads(path.read_text())
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                expr = t.get("expr")
                if expr:
                    expr = re.sub(r"\$\{?(\w+)\}?", lambda m: VARIABLES.get(m.group(1), ".*"), expr)
                    out.append((str(p.get("title", "")), expr))

    walk(doc.get("panels", []))
    return out


ALL = 'node=~".*", gpu=~".*", namespace=~".*", pod=~".*"'
# A dashboard panel's query (its first target) and the same answer from fleet-recording-rules.yml.
RECORDED = {
    "Allocated but idle": f"sum(gpu:allocated_idle:bool{{{ALL}}}) or vector(0)",
    "Memory used by GPU": f"gpu:memory_used:ratio{{{ALL}}}",
    "PCIe load": f"gpu:pcie_load:ratio{{{ALL}}}",
    "PCIe links below their maximum": f"max by (node, gpu, uuid) (gpu_pcie_link_generation{{{ALL}}}) and on "
    f"(node, gpu, uuid) (max by (node, gpu, uuid) (gpu:pcie_link_degraded:bool{{{ALL}}}) == 1)",
    "Power by node": f"sum by (node) (gpu:power_watts:rate1m{{{ALL}}})",
}


class Prom:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def instant_ms(self, expr: str, reps: int = 5) -> tuple[float, int]:
        """Median wall time of an instant query, and how many series it returned."""
        walls, n = [], 0
        for _ in range(reps):
            t0 = time.perf_counter()
            n = len(self.api("query", query=expr)["result"])
            walls.append(time.perf_counter() - t0)
        return median(walls) * 1000, n

    def api(self, path: str, timeout: float = 60, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc = json.loads(r.read())
        if doc.get("status") != "success":
            raise RuntimeError(f"{path}: {doc}")
        return doc["data"]

    def scalar(self, expr: str) -> float:
        result = self.api("query", query=expr)["result"]
        return float(result[0]["value"][1]) if result else float("nan")

    def self_metric(self, name: str) -> float:
        return value(parse_samples(get(f"{self.url}/metrics")[0]), name)


def start_prometheus(children: Children, tmp: Path, targets: list[int], scrape_s: int) -> tuple[Prom, int]:
    config = {
        "global": {"scrape_interval": f"{scrape_s}s", "evaluation_interval": f"{scrape_s}s",
                   "scrape_timeout": f"{min(scrape_s, 10)}s"},
        "rule_files": [str(RULES), str(RECORDING_RULES)],
        "scrape_configs": [{
            "job_name": "gpu-exporter",
            "static_configs": [{"targets": [f"127.0.0.1:{p}"], "labels": {"node": f"node-{i:03d}"}}
                               for i, p in enumerate(targets)],
        }],
    }  # fmt: skip
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp / "prometheus.log", "wb") as f:
        proc = children.start(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=2h"],
            stdout=f, stderr=f,
        )  # fmt: skip
    prom = Prom(port)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(prom.url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return prom, proc.pid
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("Prometheus did not start:\n" + (tmp / "prometheus.log").read_text()[-3000:])
        time.sleep(0.2)


def time_query(prom: Prom, expr: str, start: float, end: float, step: int, reps: int) -> dict[str, Any]:
    walls, evals, series = [], [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        data = prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=str(step), stats="all")
        walls.append(time.perf_counter() - t0)
        timings = data.get("stats", {}).get("timings", {})
        evals.append(float(timings.get("evalTotalTime", float("nan"))))
        series = len(data["result"])
    samples = data.get("stats", {}).get("samples", {}).get("totalQueryableSamples")
    return {"wall_ms": median(walls) * 1000, "eval_ms": median(evals) * 1000, "result_series": series,
            "samples": samples}  # fmt: skip


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def backfill(tmp: Path, daemons: list[tuple[subprocess.Popen[bytes], int]], hours: float, step_s: int,
             until: float) -> dict[str, Any]:  # fmt: skip
    """An hour (or ``hours``) of history for every series the fleet exports, as Prometheus would have it.

    Each daemon is scraped once; its series get the labels Prometheus attaches (job, instance,
    node) and ``hours`` of samples every ``step_s`` up to ``until``: counters rising to their
    current value, gauges wobbling a few percent around theirs. promtool turns that into TSDB
    blocks, so that range queries, ``[30m]`` windows and ``offset 15m`` in the rules and the
    dashboard touch as much data as in a Prometheus that has run for a while.
    """
    t0 = time.monotonic()
    families: dict[str, list[tuple[str, float]]] = {}
    for i, (_, port) in enumerate(daemons):
        for s in parse_samples(get(f"http://127.0.0.1:{port}/metrics")[0]):
            labels = {**s.labels, "job": "gpu-exporter", "instance": f"127.0.0.1:{port}", "node": f"node-{i:03d}"}
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            families.setdefault(s.name, []).append((text, s.value))
    span = hours * 3600
    times = [until - span + k * step_s for k in range(int(span // step_s))]
    om = tmp / "history.om"
    samples = 0
    with open(om, "w") as f:
        for name, members in families.items():
            counter = name.endswith(("_total", "_count", "_sum", "_bucket"))
            for text, v in members:
                phase = zlib.crc32(text.encode()) % 628 / 100
                flat = v in (0.0, 1.0) or name.endswith("_info") or not math.isfinite(v)
                lines = []
                for t in times:
                    if counter:
                        x = max(0.0, v - v * (until - t) / (2 * span))
                    elif flat:
                        x = v
                    else:
                        x = v * (1 + 0.03 * math.sin(t / 300 + phase))
                    lines.append(f"{name}{{{text}}} {x!r} {t:.0f}\n")
                f.writelines(lines)
                samples += len(lines)
        f.write("# EOF\n")
    generated = time.monotonic() - t0
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp / "tsdb")],
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    om.unlink()
    if r.returncode != 0:
        raise RuntimeError(f"promtool could not backfill: {r.stderr[-2000:]}")
    return {"hours": hours, "step_s": step_s, "samples": samples, "series": sum(len(m) for m in families.values()),
            "generate_s": generated, "promtool_s": time.monotonic() - t0 - generated}  # fmt: skip


def run(tmp: Path, *, nodes: int, scrape_s: int, window_s: float, history_h: float) -> dict[str, Any]:
    res: dict[str, Any] = {"nodes": nodes, "gpus": nodes * GPUS_PER_NODE, "scrape_interval_s": scrape_s}
    with Children() as children:
        daemons: list[tuple[subprocess.Popen[bytes], int]] = []
        t0 = time.monotonic()
        batch = 4  # two cores: starting 50 interpreters at once would only make each start slower
        for first in range(0, nodes, batch):
            started = []
            for i in range(first, min(nodes, first + batch)):
                log_path = tmp / f"node-{i:03d}.log"
                args = ["--simulate", "--simulate.gpus", str(GPUS_PER_NODE), "--node.name", f"node-{i:03d}"]
                started.append((spawn_gpu_exporter(children, args, None, log_path), log_path))
            daemons += [(proc, listening_port(proc, log_path, timeout=120)) for proc, log_path in started]
        res["daemon_start_s"] = time.monotonic() - t0
        log(f"fleet: {nodes} daemons up in {res['daemon_start_s']:.0f} s; backfilling {history_h:g} h of history")
        res["backfill"] = backfill(tmp, daemons, history_h, scrape_s, until=time.time() - 1)
        log(f"fleet: {res['backfill']['samples']} samples backfilled; starting Prometheus")
        prom, prom_pid = start_prometheus(children, tmp, [port for _, port in daemons], scrape_s)
        deadline = time.monotonic() + 3 * scrape_s + 30
        while time.monotonic() < deadline:
            active = prom.api("targets")["activeTargets"]
            if len(active) == nodes and all(t["health"] == "up" for t in active):
                break
            time.sleep(1)
        else:
            raise RuntimeError("not every target came up")
        time.sleep(scrape_s)  # one full round of scrapes, so every series exists

        a0, c0 = prom.self_metric("prometheus_tsdb_head_samples_appended_total"), cpu_seconds(prom_pid)
        d0 = sum(cpu_seconds(p.pid) for p, _ in daemons)
        t_window = time.monotonic()
        group_times: dict[str, list[float]] = {}
        log(f"fleet: measuring for {window_s:g} s (scrape and rule interval {scrape_s} s)")
        while time.monotonic() - t_window < window_s:
            time.sleep(scrape_s)
            for g in prom.api("rules")["groups"]:
                group_times.setdefault(g["name"], []).append(float(g["evaluationTime"]))
        elapsed = time.monotonic() - t_window
        a1, c1 = prom.self_metric("prometheus_tsdb_head_samples_appended_total"), cpu_seconds(prom_pid)
        d1 = sum(cpu_seconds(p.pid) for p, _ in daemons)

        # What the exporters send: not the recorded series (names with a colon) nor ALERTS.
        exported = '__name__!~".+:.+|ALERTS|ALERTS_FOR_STATE"'
        total_series = prom.scalar(f'count({{job="gpu-exporter", {exported}}})')
        gpu_series = prom.scalar('count({job="gpu-exporter", __name__=~"gpu_.+", __name__!~"gpu_exporter_.+"})')
        scraped = prom.scalar('sum(scrape_samples_scraped{job="gpu-exporter"})')
        n_recorded = prom.scalar('count({__name__=~".+:.+"})')
        res.update(
            series_total=total_series,
            series_per_node=total_series / nodes,
            series_per_gpu=gpu_series / (nodes * GPUS_PER_NODE),
            recorded_series=n_recorded,
            samples_per_scrape_round=scraped,
            samples_per_second_measured=(a1 - a0) / elapsed,
            samples_per_second_from_scrapes=scraped / scrape_s,
            window_s=elapsed,
            prometheus_cpu_cores=(c1 - c0) / elapsed,
            prometheus_rss_mib=rss_mib(prom_pid),
            prometheus_head_series=prom.self_metric("prometheus_tsdb_head_series"),
            daemon_cpu_s_per_min=(d1 - d0) * 60 / elapsed / nodes,
            daemon_rss_mib_median=median([rss_mib(p.pid) for p, _ in daemons]),
        )
        top_metrics = prom.api("query", query='topk(8, count by (__name__) ({job="gpu-exporter"}))')["result"]
        res["top_metrics"] = [(r["metric"]["__name__"], int(float(r["value"][1]))) for r in top_metrics]
        res["rule_groups"] = {k: {"median_ms": median(v) * 1000, "max_ms": max(v) * 1000, "evaluations": len(v)}
                              for k, v in group_times.items()}  # fmt: skip
        rules = []
        for g in prom.api("rules")["groups"]:
            for r in g["rules"]:
                rules.append((f"{g['name']}/{r.get('name', '?')}", float(r.get("evaluationTime", 0)) * 1000))
        res["slowest_rules_ms"] = sorted(rules, key=lambda x: -x[1])[:5]

        log("fleet: timing the fleet dashboard's queries")
        end = time.time()
        queries = []
        for title, expr in dashboard_queries():
            q = time_query(prom, expr, end - history_h * 3600, end, scrape_s, reps=3)
            queries.append({"panel": title, "expr": expr, **q})
        res["dashboard"] = {
            "range_s": history_h * 3600,
            "step_s": scrape_s,
            "queries": len(queries),
            "total_wall_ms": sum(q["wall_ms"] for q in queries),
            "heaviest": sorted(queries, key=lambda q: -q["wall_ms"])[:6],
        }
        res["dashboard"]["samples"] = sum(q["samples"] or 0 for q in queries)

        log("fleet: panels against their recorded equivalents (instant queries)")
        panels: dict[str, str] = {}
        for title, expr in dashboard_queries():
            panels.setdefault(title, expr)
        res["recorded"] = []
        for title, recorded in RECORDED.items():
            if title not in panels:
                continue
            orig_ms, orig_n = prom.instant_ms(panels[title])
            rec_ms, rec_n = prom.instant_ms(recorded)
            res["recorded"].append({"panel": title, "original_ms": orig_ms, "recorded_ms": rec_ms,
                                    "original_series": orig_n, "recorded_series": rec_n})  # fmt: skip
    return res


def extrapolate(res: dict[str, Any], gpus: int = 10_000) -> dict[str, float]:
    nodes = gpus / GPUS_PER_NODE
    per_node_other = res["series_per_node"] - res["series_per_gpu"] * GPUS_PER_NODE
    series = gpus * res["series_per_gpu"] + nodes * per_node_other
    return {
        "gpus": gpus,
        "series": series,
        "samples_per_s_15s": series / 15,
        "samples_per_s_30s": series / 30,
        "per_node_other_series": per_node_other,
    }


def markdown(res: dict[str, Any], note: str) -> list[str]:
    x = extrapolate(res)
    d = res["dashboard"]
    lines = [
        "## Simulated fleet",
        "",
        f"{res['nodes']} daemons x {GPUS_PER_NODE} simulated GPUs ({res['gpus']} GPUs) on 127.0.0.1, one real "
        f"Prometheus scraping every {res['scrape_interval_s']} s and evaluating alerts/gpu-exporter.rules.yml at the "
        f"same interval, measured over {res['window_s']:.0f} s. Before Prometheus started, promtool backfilled "
        f"{res['backfill']['hours']:g} h of history for every series ({res['backfill']['samples']:,} samples at "
        f"{res['backfill']['step_s']} s), so `[30m]` windows, `offset 15m` and range queries read as much data as "
        f"on a Prometheus that has been running. {note}",
        "",
        "| figure | value |",
        "|---|---|",
        f"| series per node (all, incl. `up`/`scrape_*`) | {res['series_per_node']:.0f} |",
        f"| series per GPU (`gpu_*`) | {res['series_per_gpu']:.1f} |",
        f"| series in Prometheus's head (of which recorded by fleet-recording-rules.yml) | "
        f"{res['prometheus_head_series']:.0f} ({res.get('recorded_series', 0):.0f}) |",
        f"| samples ingested per second, measured (`prometheus_tsdb_head_samples_appended_total`) | "
        f"{res['samples_per_second_measured']:.0f} |",
        f"| samples per second from the scrapes (`sum(scrape_samples_scraped)` / interval) | "
        f"{res['samples_per_second_from_scrapes']:.0f} |",
        *[f"| rule group `{k}`, evaluation median / max | {v['median_ms']:.1f} / {v['max_ms']:.1f} ms |"
          for k, v in res["rule_groups"].items()],
        f"| slowest rule | `{res['slowest_rules_ms'][0][0]}` {res['slowest_rules_ms'][0][1]:.1f} ms |",
        f"| Prometheus CPU / RSS | {res['prometheus_cpu_cores']:.3f} cores / {res['prometheus_rss_mib']:.0f} MiB |",
        f"| one simulated daemon: CPU per minute / RSS | {res['daemon_cpu_s_per_min']:.2f} s / "
        f"{res['daemon_rss_mib_median']:.0f} MiB |",
        f"| fleet dashboard: {d['queries']} range queries over {d['range_s'] / 3600:g} h, step {d['step_s']} s, one "
        f"after another | {d['total_wall_ms']:.0f} ms |",
        "",
        f"Heaviest dashboard queries (range queries over {d['range_s'] / 3600:g} h, median of 3; variables as All, "
        "`$__rate_interval` 1m, `$__range` 5m). The last column scales the evaluation time by series, to 10,000 GPUs "
        "on one Prometheus:",
        "",
        "| panel | wall | eval | samples read | query | eval at 10,000 GPUs |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for q in d["heaviest"]:
        expr = " ".join(q["expr"].split())
        expr = expr if len(expr) <= 110 else expr[:107] + "..."
        expr = expr.replace("|", "\\|")
        scaled = q["eval_ms"] * 10_000 / res["gpus"] / 1000
        lines.append(f"| {q['panel']} | {q['wall_ms']:.1f} ms | {q['eval_ms']:.1f} ms | {q['samples']:,} | `{expr}` | "
                     f"~{scaled:.1f} s |")  # fmt: skip
    if res.get("recorded"):
        lines += [
            "",
            "The same panels from the recording rules in `benchmarks/fleet-recording-rules.yml` (instant queries, "
            "median of 5; the recorded series must give as many series as the original):",
            "",
            "| panel | original | recorded | series (original / recorded) |",
            "|---|---|---|---|",
        ]
        for r in res["recorded"]:
            lines.append(f"| {r['panel']} | {r['original_ms']:.1f} ms | {r['recorded_ms']:.1f} ms | "
                         f"{r['original_series']} / {r['recorded_series']} |")  # fmt: skip
    lines += [
        "",
        "Series by metric (top): " + ", ".join(f"`{n}` {c}" for n, c in res["top_metrics"]) + ".",
        "",
        f"At {x['gpus']:,} GPUs ({x['gpus'] // GPUS_PER_NODE:,} nodes of 8) with these series per GPU: "
        f"{x['series']:,.0f} series, {x['samples_per_s_15s']:,.0f} samples/s at a 15 s scrape, "
        f"{x['samples_per_s_30s']:,.0f} at 30 s.",
    ]
    return lines
