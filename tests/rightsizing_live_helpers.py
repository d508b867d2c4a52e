"""A minute of a fake node in a real Prometheus and a real VictoriaMetrics, and ``gpu-exporter report``
asking each: what issue 37's live tests (test_rightsizing_live, test_rightsizing_cards_live) share."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from tests.exporter_helpers import run_daemon, wait_for
from tests.prometheus_helpers import Prometheus, VictoriaMetrics, prometheus, victoria_metrics
from tests.timing import NEVER_S

ME = pwd.getpwuid(os.getuid()).pw_name
ENGINES = ("prometheus", "victoriametrics")
NODE = "node-a"
HISTORY_S = 60
SETTLE_S = 5  # seconds before the last scrape a store shows where the range ends
# Polls twice a second, scraped once: the highest poll of a burst is shown for a second or more, so
# some scrape reads it, however the two clocks fall.  GPM is re-sampled at every poll: at a profiling
# interval equal to the poll's, a poll a little early would skip its sample and span two polls.
POLL, PROFILING = "0.5s", "0.25s"


def config(tmp: Path, pricing: dict[str, Any], jobs: dict[str, str]) -> Path:
    """The daemon's config: the node's name, its prices, and the Slurm job of each GPU in ``jobs``."""
    (tmp / "job-map").mkdir()
    for gpu, job in jobs.items():
        (tmp / "job-map" / gpu).write_text(f"{job}\n")
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({"node_name": NODE, "pricing": pricing,
                                   "slurm": {"job_mapping_dir": str(tmp / "job-map")}}))  # fmt: skip
    return cfg


def _every_gpu(store: Prometheus | VictoriaMetrics, gpus: int) -> bool:
    return len(store.query("count by (gpu) (gpu_sm_active_ratio or gpu_utilization_ratio)")) == gpus


@contextmanager
def a_minute_in_both_stores(scenario: Path, cfg: Path, tmp: Path, gpus: int,
                            history_done: Callable[[], None] = lambda: None) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The daemon on ``scenario`` scraped every second by both stores until each has every GPU and a
    minute of history: each engine's URL, the end of the range to report on (``ends``) and the config.
    ``history_done`` is called once the minute is in."""
    with run_daemon(scenario, "--config", str(cfg), "--poll.interval", POLL, "--profiling.interval", PROFILING) as d:
        target = f"127.0.0.1:{d.port}"
        scrape = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                  "scrape_configs": [{"job_name": "gpu-exporter", "static_configs": [
                      {"targets": [target], "labels": {"node": NODE}}]}]}  # fmt: skip
        with prometheus([target], tmp / "prom", labels={"node": NODE}) as prom, \
                victoria_metrics(tmp / "vm", scrape) as vm:  # fmt: skip
            for store in (prom, vm):
                wait_for(partial(_every_gpu, store, gpus), timeout=NEVER_S, what="every GPU's activity in the store")
            started = time.time()
            # A minute and some seconds more, so that the minute reported lies wholly within the run.
            wait_for(lambda: time.time() - started >= HISTORY_S + 2 * SETTLE_S, timeout=HISTORY_S + NEVER_S,
                     interval=1, what="a minute of history")  # fmt: skip
            ends = {}
            for engine, store in (("prometheus", prom), ("victoriametrics", vm)):
                (last,) = store.query(f'max(timestamp(gpu_state_seconds_total{{node="{NODE}"}}))')
                # Not up to the last scrape: a store may show one GPU's samples of it and not yet
                # another's (its price missing at the end, the GPU goes unpriced and unadvised).
                ends[engine] = int(float(last["value"][1])) - SETTLE_S
            history_done()
            yield {"urls": {"prometheus": prom.url, "victoriametrics": vm.url}, "ends": ends, "config": cfg}


def printed(live: dict[str, Any], engine: str, *args: str) -> str:
    """What ``gpu-exporter report`` prints for the minute ``live`` holds, as the engine answers it."""
    end = live["ends"][engine]
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", live["urls"][engine],
                          "--start", str(end - HISTORY_S), "--end", str(end), "--config", str(live["config"]),
                          "--min-history", "30s", "--quiet", "--selector", f'{{node="{NODE}"}}', *args],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def report(live: dict[str, Any], engine: str, *args: str) -> dict[str, Any]:
    """The report as JSON (``printed`` with ``--format json``)."""
    doc: dict[str, Any] = json.loads(printed(live, engine, "--format", "json", *args))
    return doc


def advice(doc: dict[str, Any], gpu: str) -> dict[str, Any] | None:
    """The recommendation that covers ``gpu`` (a job's names all its GPUs), else None."""
    found = [r for r in doc["recommendations"] if gpu in re.split(r",\s*", r["gpu"])]
    assert len(found) <= 1, found
    return found[0] if found else None


def reasons(doc: dict[str, Any]) -> str:
    return "\n".join(r["reason"] for r in doc["recommendations"])
