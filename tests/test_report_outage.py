"""Issue 25: step-by-step pricing dropped the cost of steps that end during an exporter outage but kept
their hours ("one 30 s restart took 2.8% off the H100s' cost"). A real Prometheus and a real
VictoriaMetrics scrape the real daemon every second; the daemon is stopped for 10 s and started again
on the same port (both stores mark its series stale, as a restart makes them); the report over the
minute around the outage prices every hour it counts: each GPU's cost is its price x its hours."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerting_helpers import free_port
from tests.cost_helpers import H100_PRICE, L4_PRICE, PRICING, three_gpu_node
from tests.exporter_helpers import run_daemon, wait_for
from tests.prometheus_helpers import prometheus, victoria_metrics

pytestmark = pytest.mark.integration

POLL_S = 1.0
PRICES = {"0": H100_PRICE, "1": H100_PRICE, "2": L4_PRICE}


def report(url: str, start: int, end: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "gpu_exporter", "report", "--prometheus.url", url, "--start",
                          str(start), "--end", str(end), "--format", "json", "--quiet", "--selector",
                          '{node="node-a"}'], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory, fake_nvml_lib: Path) -> Any:
    tmp = tmp_path_factory.mktemp("outage")
    s = three_gpu_node(tmp / "node.scn")
    s.write()
    port = free_port()
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({"pricing": PRICING, "node_name": "node-a",
                                   "web_listen_address": f"127.0.0.1:{port}"}))  # fmt: skip
    scrape = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "gpu-exporter", "static_configs": [
                  {"targets": [f"127.0.0.1:{port}"], "labels": {"node": "node-a"}}]}]}  # fmt: skip
    daemon = ("--config", str(cfg), "--poll.interval", f"{POLL_S:g}s")
    with prometheus([f"127.0.0.1:{port}"], tmp / "prom", labels={"node": "node-a"}) as prom, \
            victoria_metrics(tmp / "vm", scrape) as vm:  # fmt: skip
        with run_daemon(s.path, *daemon, listen_flag=False):
            wait_for(lambda: len(prom.query('count by (gpu) (gpu_state_seconds_total{node="node-a"})')) == 3,
                     timeout=30, what="three GPUs in Prometheus")  # fmt: skip
            wait_for(lambda: len(vm.query('count by (gpu) (gpu_state_seconds_total{node="node-a"})')) == 3,
                     timeout=30, what="three GPUs in VictoriaMetrics")  # fmt: skip
            first = int(time.time()) + 1
            time.sleep(25)
        stopped = time.time()
        time.sleep(10)  # both stores fail their scrapes and mark the daemon's series stale
        with run_daemon(s.path, *daemon, listen_flag=False):
            resumed = time.time()  # serving again: on a loaded machine, well past the 10 s
            time.sleep(28)
            last = int(time.time()) - 1
        yield {"prometheus": prom.url, "victoriametrics": vm.url}, first, stopped, resumed, last


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_an_outage_drops_no_cost_where_it_keeps_hours(outage: Any, engine: str) -> None:
    urls, first, stopped, resumed, last = outage
    end = first + (last - first) // 5 * 5  # a whole number of 5 s steps
    doc = report(urls[engine], first, end)
    gpus = {g["gpu"]: g for g in doc["gpus"]}
    assert set(gpus) == set(PRICES), doc["gpus"]
    span_h = (end - first) / 3600
    for gpu, price in PRICES.items():
        g = gpus[gpu]
        # Up all the range but the outage, 10 s and the restart's (the time the new daemon took to serve),
        # and the daemon's first poll after it, which counts nothing, and a scrape either side.
        down = resumed - stopped
        assert span_h - (down + 4) / 3600 <= g["gpu_hours"] <= span_h - 8 / 3600, (gpu, g["gpu_hours"] * 3600, down)
        # Money is written to 4 decimals and hours to 6: within half of money's last digit, plus the price
        # times half of the hours' (49.5 s at 3.00/h is 0.04125 to the hour's digit, and 0.0413 as written).
        assert g["cost"] == pytest.approx(price * g["gpu_hours"], abs=5e-5 + price * 5e-7), (gpu, g)
        assert g["price_per_hour"] == pytest.approx(price, abs=5e-5 / g["gpu_hours"])
    assert doc["totals"]["cost"] == pytest.approx(sum(p * gpus[g]["gpu_hours"] for g, p in PRICES.items()), abs=2e-4)
    assert first < stopped < end
