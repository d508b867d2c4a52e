"""The /alerts page names a lost GPU by what the daemon knew of it: issue 25 saw "(model unknown)"
beside GpuLost for a GPU the daemon had identified minutes earlier, because the page read the model
from the latest poll, which has none for a GPU that no longer answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.exporter_helpers import http_get, run_daemon, wait_for
from tests.fakenvml.presets import preset

pytestmark = pytest.mark.integration


def alerts(url: str) -> list[dict[str, object]]:
    status, _, body = http_get(url + "/api/v1/alerts")
    assert status == 200
    found: list[dict[str, object]] = json.loads(body)["data"]["alerts"]
    return found


def rows(url: str) -> list[list[str]]:
    status, _, body = http_get(url + "/alerts")
    assert status == 200
    return [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr class='firing'>(.*?)</tr>", body.decode())]


def test_a_lost_gpu_keeps_its_model_and_uuid_on_the_alerts_page(fake_nvml_lib: Path, tmp_path: Path) -> None:
    s = preset("h100-8x-training", tmp_path / "node.scn")
    s.gpus = s.gpus[:2]
    s.gpu(1).lost(after_s=4)  # identified at start, then off the bus
    s.write()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"node_name": "gpu-node-7", "rules": {"GpuLost": {"for": "0s"}}}))
    with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "1s") as d:
        wait_for(lambda: any(a["labels"]["alertname"] == "GpuLost" and a["state"] == "firing"  # type: ignore[index]
                             for a in alerts(d.url)), timeout=30, what="GpuLost firing")  # fmt: skip
        (lost,) = [a for a in alerts(d.url) if a["labels"]["alertname"] == "GpuLost"]  # type: ignore[index]
        uuid = lost["labels"]["uuid"]  # type: ignore[index]
        assert uuid.startswith("GPU-")
        (row,) = [r for r in rows(d.url) if r[0] == "GpuLost"]
    assert row[3:6] == ["gpu-node-7", f"1 {uuid}", "NVIDIA H100 80GB HBM3"], row
