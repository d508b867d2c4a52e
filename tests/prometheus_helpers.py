"""A real Prometheus (Debian's package), started by a test on 127.0.0.1 to scrape the daemon."""

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
        with urllib.request.urlopen(url, timeout=10) as r:
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
