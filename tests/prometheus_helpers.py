"""A real Prometheus (Debian's package), started by a test on 127.0.0.1 to scrape the daemon; and a real
VictoriaMetrics (Debian's too), the second engine the report is checked against."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.alerting_helpers import free_port
from tests.timing import NEVER_S


@dataclass
class Prometheus:
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=NEVER_S) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; the result vector (or a one-element list for a scalar)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return result

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")


@contextmanager
def prometheus(targets: Sequence[str], workdir: Path, rule_files: Sequence[Path] = (),
               interval: str = "1s", labels: dict[str, str] | None = None,
               relabel_configs: Sequence[dict[str, Any]] = ()) -> Iterator[Prometheus]:  # fmt: skip
    """Prometheus scraping ``targets`` (host:port) and evaluating ``rule_files`` every ``interval``.

    ``labels`` are attached to every scraped series, as the ServiceMonitor's relabelling attaches
    ``node`` in a cluster; ``relabel_configs`` then apply to the targets, as a ServiceMonitor's
    ``relabelings`` do.
    """
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "gpu-exporter",
                "static_configs": [{"targets": list(targets), "labels": labels or {}}],
                "relabel_configs": list(relabel_configs),
            }
        ],
    }
    with prometheus_with_config(config, workdir) as prom:
        yield prom


@contextmanager
def prometheus_with_config(config: dict[str, Any], workdir: Path) -> Iterator[Prometheus]:
    """Prometheus started on 127.0.0.1 with ``config`` as its prometheus.yml."""
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is missing: apt-get install prometheus (bash .ci/setup does it)"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(workdir / "prometheus.log", "ab")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
        stdout=log, stderr=log,
    )  # fmt: skip
    prom = Prometheus(port, workdir, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(prom.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Prometheus did not start:\n{prom.log()}")
            time.sleep(0.1)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@dataclass
class VictoriaMetrics:
    """Debian's VictoriaMetrics single-node, started by a test on 127.0.0.1: a second engine that
    answers the same query API (``url``), fed by ``load`` (samples as OpenMetrics text, as promtool
    backfills Prometheus) or by scraping."""

    port: int
    workdir: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def load(self, openmetrics: str) -> None:
        """Samples written as ``name{labels} value unix_seconds`` lines; VictoriaMetrics imports the
        Prometheus text format with millisecond timestamps."""
        lines = []
        for line in openmetrics.splitlines():
            if not line or line.startswith("#"):
                continue
            head, ts = line.rsplit(" ", 1)
            lines.append(f"{head} {round(float(ts) * 1000)}")
        body = ("\n".join(lines) + "\n").encode()
        req = urllib.request.Request(self.url + "/api/v1/import/prometheus", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
        self.flush()

    def flush(self) -> None:
        with urllib.request.urlopen(self.url + "/internal/force_flush", timeout=60) as r:
            r.read()

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = urllib.parse.urlencode({"query": expr}).encode()
        with urllib.request.urlopen(urllib.request.Request(self.url + "/api/v1/query", data=data), timeout=60) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def log(self) -> str:
        return (self.workdir / "victoria-metrics.log").read_text(errors="replace")


@contextmanager
def victoria_metrics(workdir: Path, scrape_config: dict[str, Any] | None = None) -> Iterator[VictoriaMetrics]:
    """VictoriaMetrics on 127.0.0.1 keeping ten years (the tests' histories lie in the past), scraping
    ``scrape_config`` (a prometheus.yml) where one is given.  ``-search.latencyOffset=0s``: by default it
    hides the last 30 s from queries, which a test of the last minute would miss."""
    binary = shutil.which("victoria-metrics")
    assert binary, "VictoriaMetrics is missing: apt-get install victoria-metrics (bash .ci/setup does it)"
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = [binary, f"-storageDataPath={workdir / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=10y", "-search.latencyOffset=0s"]  # fmt: skip
    if scrape_config is not None:
        (workdir / "scrape.yml").write_text(yaml.safe_dump(scrape_config))
        args.append(f"-promscrape.config={workdir / 'scrape.yml'}")
    log = open(workdir / "victoria-metrics.log", "ab")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(args, stdout=log, stderr=log)
    vm = VictoriaMetrics(port, workdir, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(vm.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"VictoriaMetrics did not start:\n{vm.log()}")
            time.sleep(0.1)
        yield vm
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
