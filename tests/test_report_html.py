"""The report's HTML is one self-contained file whose charts a browser draws: opened in headless
Chromium with the network cut off, the screenshot shows the timeline, the top wasters and the
recommendation in their colours."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from gpu_exporter.report.catalogue import load_catalogue
from gpu_exporter.report.model import build
from gpu_exporter.report.queries import window_for
from gpu_exporter.report.render import COLOURS, as_html

GIB = 1024**3
END = 1_796_000_400.0  # a whole hour
START = END - 7 * 86400


def results() -> dict[str, Any]:
    """What the queries would answer for two H100s (one busy, one held but idle) and an idle L4."""
    h100 = {"node": "node-a", "instance": "node-a:9445", "name": "NVIDIA H100 80GB HBM3", "mig_mode": "disabled"}
    gpus = [
        ({**h100, "gpu": "0", "uuid": "GPU-0"}, {"busy": 168.0}, "ml", "train-a", 3.0, 60 * GIB, 0.8),
        ({**h100, "gpu": "1", "uuid": "GPU-1"}, {"busy": 20.0, "allocated_idle": 148.0}, "ml", "notebook-b", 3.0,
         11.2 * GIB, 0.18),
        ({"node": "node-b", "instance": "node-b:9445", "gpu": "0", "uuid": "GPU-2", "name": "NVIDIA L4",
          "mig_mode": "disabled"}, {"idle": 160.0, "down": 8.0}, "", "", 0.8, 0.0, None),
    ]  # fmt: skip
    out: dict[str, Any] = {k: [] for k in ("hours", "prices", "info", "memory_total", "memory_peak", "activity")}
    points = window_for(START, END).points
    for labels, states, ns, pod, price, peak, activity in gpus:
        key = {k: labels[k] for k in ("node", "instance", "gpu", "uuid")}
        for state, hours in states.items():
            holder = {"namespace": ns, "pod": pod} if state in ("busy", "allocated_idle") else {}
            out["hours"].append(({**key, **holder, "state": state}, hours))
        for stat, v in (("max", price), ("min", price), ("count", points)):  # one price all week
            out["prices"].append(({**key, "currency": "USD", "stat": stat}, v))
        out["info"].append((labels, 1.0))
        out["memory_total"].append((key, 80 * GIB if "H100" in labels["name"] else 22.5 * GIB))
        out["memory_peak"].append((key, peak))
        if activity is not None:
            out["activity"].append(({**key, "signal": "sm_active"}, activity))
    steps = [START + 3600 * (i + 1) for i in range(168)]
    out["timeline"] = [
        ({"state": "busy"}, [(t, 1.0 + (0.9 if i < 20 else 0.0)) for i, t in enumerate(steps)]),
        ({"state": "allocated_idle"}, [(t, 0.0 if i < 20 else 1.0) for i, t in enumerate(steps)]),
        ({"state": "idle"}, [(t, 1.0 if i < 160 else 0.0) for i, t in enumerate(steps)]),
        ({"state": "down"}, [(t, 0.0 if i < 160 else 1.0) for i, t in enumerate(steps)]),
    ]
    out["timeline_cost"] = [({"currency": "USD"}, [(t, 3.8) for t in steps])]
    return out


def test_the_html_is_self_contained() -> None:
    doc = build(window_for(START, END), results(), load_catalogue())
    html = as_html(doc)
    assert "<script" not in html.lower()
    # Nothing is fetched: no src, no stylesheet link, no URL but the SVG namespace.
    assert not re.search(r"\s(src|href)\s*=", html, re.IGNORECASE)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}
    assert html.count("<svg") == 3 + len(doc["recommendations"]) and doc["recommendations"]


def _pixels(image: Image.Image, colour: str, tolerance: int = 12) -> int:
    want = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    counted = 0
    for n, px in image.convert("RGB").getcolors(maxcolors=1 << 24) or []:
        assert isinstance(px, tuple)
        if all(abs(int(a) - b) <= tolerance for a, b in zip(px, want, strict=True)):
            counted += n
    return counted


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (bash .ci/setup installs it)")
def test_chromium_draws_the_charts(tmp_path: Path) -> None:
    doc = build(window_for(START, END), results(), load_catalogue())
    page = tmp_path / "report.html"
    page.write_text(as_html(doc))
    shot = tmp_path / "report.png"
    out = subprocess.run(
        ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1280,2400", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    image = Image.open(shot)
    assert image.size == (1280, 2400)
    area = image.size[0] * image.size[1]
    # Every state's colour is drawn in an area no text could fill: the charts rendered.
    for state in ("busy", "allocated_idle", "idle", "down"):
        assert _pixels(image, COLOURS[state]) > area * 0.002, state
    # The timeline is in the top part of the page, where the headline and the chart are.
    top = image.crop((0, 0, 1280, 700))
    assert _pixels(top, COLOURS["allocated_idle"]) > 5000 and _pixels(top, COLOURS["idle"]) > 5000
    (tmp_path / "keep").write_text(str(shot))


def test_the_scrape_interval_is_read_from_the_samples() -> None:
    from gpu_exporter.report.queries import scrape_interval

    assert scrape_interval(240, 5) == 15  # 15 s scrape, an hour of history
    assert scrape_interval(70, 60) == pytest.approx(60 / 59)  # 1 s scrape, but only 70 s of history
    assert scrape_interval(12, 1) == 300  # 5 min scrape
    assert scrape_interval(None, None) == 0.0
    # A step is at least three scrape intervals, so each one's increase() sees samples.
    assert window_for(START, END, 60).step == 900 and window_for(END - 3600, END, 60).step == 300


def test_money_is_never_summed_across_currencies_nor_made_up() -> None:
    r = results()
    r["prices"] = [
        ({**labels, "currency": "EUR"} if labels["uuid"] == "GPU-0" else labels, v) for labels, v in r["prices"]
    ]
    with pytest.raises(ValueError, match="several currencies \\(EUR, USD\\); pick one with --currency"):
        build(window_for(START, END), r, load_catalogue())
    doc = build(window_for(START, END), r, load_catalogue(), currency="EUR")
    priced = [g for g in doc["gpus"] if g["cost"] is not None]
    assert doc["currency"] == "EUR" and len(priced) == 1 and doc["totals"]["unpriced_gpus"] == 2
    unpriced = results()
    unpriced["prices"] = []
    doc = build(window_for(START, END), unpriced, load_catalogue())
    assert doc["totals"]["cost"] is None and all(g["cost"] is None for g in doc["gpus"])
    assert "No prices in Prometheus" in as_html(doc)
