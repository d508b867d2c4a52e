"""The daemon's /alerts page, as an operator leaves it open: node, GPU model, auto-refresh, links back.

Checked in headless Chromium against the real daemon on the fake NVML: the DOM Chromium builds,
and a screenshot in which the firing alert's row is drawn.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from PIL import Image

from gpu_exporter.serving.alerts_page import REFRESH_SECONDS
from tests.exporter_helpers import http_get, run_daemon, wait_for
from tests.fakenvml.presets import MIB, preset
from tests.test_report_html import _pixels

pytestmark = pytest.mark.integration

CHROMIUM = ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]  # fmt: skip
FIRING_CELL = "#f4b4b4"


def firing(url: str) -> list[dict[str, object]]:
    status, _, body = http_get(url + "/api/v1/alerts")
    assert status == 200
    alerts: list[dict[str, object]] = json.loads(body)["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (bash .ci/setup installs it)")
def test_the_alerts_page_in_chromium(fake_nvml_lib: Path, tmp_path: Path) -> None:
    s = preset("h100-8x-training", tmp_path / "node.scn")
    s.gpus = s.gpus[:2]
    s.gpu(0).memory(81559 * MIB, int(81559 * MIB * 0.99), reserved=512 * MIB)  # GpuMemoryHigh, critical
    s.write()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"node_name": "gpu-node-7", "rules": {"GpuMemoryHigh": {"for": "0s"}}}))
    with run_daemon(s.path, "--config", str(cfg), "--poll.interval", "1s") as d:
        wait_for(lambda: bool(firing(d.url)), timeout=20, what="a firing alert")
        dom = subprocess.run([*CHROMIUM, "--dump-dom", d.url + "/alerts"], capture_output=True, text=True, timeout=120)
        assert dom.returncode == 0, dom.stderr[-2000:]
        page = dom.stdout
        assert re.search(rf"<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">", page), page[:500]
        assert 5 <= REFRESH_SECONDS <= 60
        assert "<title>gpu-exporter alerts on gpu-node-7</title>" in page
        assert 'href="/"' in page and 'href="/metrics"' in page
        rows = re.findall(r"<tr class=\"firing\">(.*?)</tr>", page)
        assert rows, page
        cells = [re.findall(r"<td>(.*?)</td>", r) for r in rows]
        assert ["GpuMemoryHigh", "firing", "critical", "gpu-node-7"] in [c[:4] for c in cells]
        assert all(c[3] == "gpu-node-7" and c[5] == "NVIDIA H100 80GB HBM3" for c in cells), cells
        shot = tmp_path / "alerts.png"
        out = subprocess.run([*CHROMIUM, "--window-size=1280,600", f"--screenshot={shot}", d.url + "/alerts"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    image = Image.open(shot)
    assert image.size == (1280, 600)
    # Rendered, not blank: text and borders in dark pixels, and the firing row's cell in its colour.
    colours = image.convert("L").getcolors(maxcolors=1 << 16) or []
    dark = sum(n for n, level in colours if isinstance(level, int) and level < 100)
    assert dark > 2000, "the page looks blank"
    assert _pixels(image, FIRING_CELL, tolerance=8) > 500, "the firing alert's row is not drawn"
