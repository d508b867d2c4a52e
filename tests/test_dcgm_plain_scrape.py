"""dcgm-exporter's series behind a plain static scrape: no ServiceMonitor, no ``node`` label (issue 34, item 8).

A real Prometheus scrapes the daemon (two fake H100s) with nothing but ``static_configs`` and
evaluates alerts/dcgm-compat.rules.yml as it ships. dcgm-exporter puts the host's name on every
series as ``Hostname``; so must the rules, or a dashboard or alert that lists or groups by
``Hostname`` (``label_values(DCGM_FI_DEV_GPU_TEMP, Hostname)``) finds nothing. Without a ``node``
label the target's host stands in for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.exporter_helpers import run_daemon, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import GIB, h100_sxm
from tests.prometheus_helpers import prometheus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
COMPAT_RULES = ROOT / "alerts" / "dcgm-compat.rules.yml"


def test_hostname_is_the_targets_host_on_a_plain_static_scrape(tmp_path: Path, fake_nvml_lib: Path) -> None:
    s = Scenario(tmp_path / "node.scn")
    for i in range(2):
        h100_sxm(s.add_gpu(), "plain", i, util=50, mem_used=10 * GIB, power_mw=300_000)
    s.write()
    with (
        run_daemon(s.path, "--poll.interval", "1s") as d,
        prometheus([f"127.0.0.1:{d.port}"], tmp_path / "prom", rule_files=[COMPAT_RULES]) as prom,
    ):
        wait_for(lambda: len(prom.query("DCGM_FI_DEV_GPU_TEMP")) == 2, what="the recorded DCGM series")
        series = [r["metric"] for r in prom.query("DCGM_FI_DEV_GPU_TEMP")]
        assert all("node" not in m for m in series), series  # nothing set one: a plain scrape
        assert {m.get("Hostname") for m in series} == {"127.0.0.1"}, series
        # What a dashboard's Hostname variable asks: label_values(DCGM_FI_DEV_GPU_TEMP, Hostname).
        assert prom.api("label/Hostname/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"}) == ["127.0.0.1"]
