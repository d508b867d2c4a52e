"""The report's HTML is one self-contained file whose charts a browser draws: opened in headless
Chromium with the network cut off, the screenshot shows the timeline, the top wasters and the
recommendation in their colours; and at 1,000 and 1,400 px wide the page reads whole: nothing runs
off its side, no recommendation's sentence is split by its chart."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from gpu_exporter.report.catalogue import load_catalogue
from gpu_exporter.report.model import Options, build
from gpu_exporter.report.queries import window_for
from gpu_exporter.report.render import COLOURS, as_html, as_markdown, as_table
from tests import assert_mentions

pytestmark = pytest.mark.integration

GIB = 1024**3
END = 1_796_000_400.0  # a whole hour
START = END - 7 * 86400


def results() -> dict[str, Any]:
    """What the queries would answer for two H100s (one busy, one held but idle) and an idle L4."""
    h100 = {"node": "node-a", "instance": "node-a:9445", "name": "NVIDIA H100 80GB HBM3", "mig_mode": "disabled"}
    gpus = [
        ({**h100, "gpu": "0", "uuid": "GPU-0"}, {"busy": 168.0}, "ml", "train-a", 3.0, 60 * GIB, 0.8),
        ({**h100, "gpu": "1", "uuid": "GPU-1"}, {"busy": 120.0, "allocated_idle": 48.0}, "ml", "notebook-b", 3.0,
         11.2 * GIB, 0.18),
        ({"node": "node-b", "instance": "node-b:9445", "gpu": "0", "uuid": "GPU-2", "name": "NVIDIA L4",
          "mig_mode": "disabled"}, {"idle": 160.0, "down": 8.0}, "", "", 0.8, 0.0, None),
    ]  # fmt: skip
    out: dict[str, Any] = {k: [] for k in ("hours", "prices", "seen", "info", "memory_total", "memory_peak",
                                           "activity")}  # fmt: skip
    points = window_for(START, END).points
    for labels, states, ns, pod, price, peak, activity in gpus:
        key = {k: labels[k] for k in ("node", "instance", "gpu", "uuid")}
        for state, hours in states.items():
            holder = {"namespace": ns, "pod": pod} if state in ("busy", "allocated_idle") else {}
            out["hours"].append(({**key, **holder, "state": state}, hours))
        w = window_for(START, END)  # one price all week, at every step
        out["prices"].append(({**key, "currency": "USD"}, [(w.start + (k + 1) * w.step, price) for k in range(points)]))
        out["seen"].append((key, points))
        out["info"].append((labels, 1.0))
        out["memory_total"].append((key, 80 * GIB if "H100" in labels["name"] else 22.5 * GIB))
        out["memory_peak"].append((key, peak))
        if activity is not None:
            # An H100 with GPM: its pipes, DRAM and NVLink as well (unknown ones would be taken as busy).
            for signal, v in (
                ("sm_active", activity),
                ("dram_active", 0.05),
                ("tensor_active", activity / 2),
                ("fp64_active", 0.0),
                ("fp32_active", 0.0),
                ("fp16_active", 0.0),
                ("nvlink_tx", 0.0),
            ):
                out["activity"].append(({**key, "signal": signal}, v))
    steps = [START + 3600 * (i + 1) for i in range(168)]
    out["timeline"] = [
        ({"state": "busy"}, [(t, 1.0 + (0.9 if i < 120 else 0.0)) for i, t in enumerate(steps)]),
        ({"state": "allocated_idle"}, [(t, 0.0 if i < 120 else 1.0) for i, t in enumerate(steps)]),
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
    # The three charts, and a bar pair for each recommendation with two monthly prices to compare.
    compared = [r for r in doc["recommendations"] if r["kind"] in ("card", "mig") and r["saving_per_month"]]
    assert compared and html.count("<svg") == 3 + len(compared)


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

    assert scrape_interval(240, 4) == 15  # 15 s scrape, an hour of history
    assert scrape_interval(70, 60) == 1  # 1 s scrape, but only 70 s of history
    assert scrape_interval(12, 1) == 300  # 5 min scrape
    assert scrape_interval(None, None) == 0.0
    # A step is at least three scrape intervals, so each one's increase() sees samples.
    assert window_for(START, END, 60).step == 840 and window_for(END - 3600, END, 60).step == 180


def test_money_is_never_summed_across_currencies_nor_made_up() -> None:
    r = results()
    r["prices"] = [
        ({**labels, "currency": "EUR"} if labels["uuid"] == "GPU-0" else labels, v) for labels, v in r["prices"]
    ]
    doc = build(window_for(START, END), r, load_catalogue())  # most GPUs are priced in USD: it is the report's
    assert doc["currency"] == "USD" and doc["totals"]["unpriced_gpus"] == 1
    doc = build(window_for(START, END), r, load_catalogue(), Options(currency="EUR"))
    priced = [g for g in doc["gpus"] if g["cost"] is not None]
    assert doc["currency"] == "EUR" and len(priced) == 1 and doc["totals"]["unpriced_gpus"] == 2
    (line,) = [line for line in as_table(doc).splitlines() if line.startswith("Cost ")]
    assert_mentions(line, "€504", "wasted €0.00", "2 GPUs without a price", "336.0 GPU-hours")
    unpriced = results()
    unpriced["prices"] = []
    doc = build(window_for(START, END), unpriced, load_catalogue())
    assert doc["totals"]["cost"] is None and all(g["cost"] is None for g in doc["gpus"])
    why = "no prices: the store has no gpu_price_per_hour for these GPUs in the range"
    assert why in as_html(doc) and why in as_table(doc) and why in as_read(as_markdown(doc))


def as_read(text: str) -> str:
    """Text as a reader sees it: Markdown's backslash escapes of markup characters undone (the report
    escapes them in names and sentences so that a name is never read as markup)."""
    return re.sub(r"\\([\\`*_\[\]<>&~#!])", r"\1", text)


# What Chromium measures of the laid-out page, written into it for --dump-dom to print: the page's
# width against the window's, each wide block's (charts, tables) against its own box, and each
# recommendation's sentence against its chart (the chart starts below the sentence's last line).
LAYOUT_PROBE = """<script>
addEventListener('load', () => {
  const out = {page: [document.documentElement.scrollWidth, innerWidth], wide: [], recs: []};
  for (const el of document.querySelectorAll('.wide, .chart, .rec, table'))
    out.wide.push([el.tagName + '.' + el.className.baseVal + el.className, el.getBoundingClientRect().right,
                   document.body.getBoundingClientRect().right, el.scrollWidth, el.clientWidth]);
  for (const rec of document.querySelectorAll('.rec')) {
    const walker = document.createTreeWalker(rec, NodeFilter.SHOW_TEXT);
    let bottom = 0;
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (n.parentElement.closest('svg')) continue;
      const range = document.createRange(); range.selectNodeContents(n);
      for (const r of range.getClientRects()) bottom = Math.max(bottom, r.bottom);
    }
    const chart = rec.querySelector('svg');
    out.recs.push([bottom, chart ? chart.getBoundingClientRect().top : null]);
  }
  // Each chart label against its chart's left edge: a label that starts left of it is cut off there.
  out.labels = [];
  for (const t of document.querySelectorAll('svg.chart text'))
    out.labels.push([t.textContent, t.getBoundingClientRect().left - t.closest('svg').getBoundingClientRect().left]);
  // The lines each node cell's text is laid out on: an address is read whole, never across lines.
  out.nodes = [];
  for (const td of document.querySelectorAll('table.gpus tbody td:first-child')) {
    const range = document.createRange(); range.selectNodeContents(td);
    out.nodes.push([td.textContent, new Set([...range.getClientRects()].map(r => Math.round(r.top))).size]);
  }
  const pre = document.createElement('pre'); pre.id = 'layout'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def layout(html: str, width: int, tmp_path: Path) -> dict[str, Any]:
    import json

    page = tmp_path / f"probe-{width}.html"
    page.write_text(html.replace("</body>", LAYOUT_PROBE + "</body>"))
    out = subprocess.run(
        ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--window-size={width},1200", "--virtual-time-budget=5000",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    m = re.search(r'<pre id="layout">(.*?)</pre>', out.stdout, re.DOTALL)
    assert m, out.stdout[-2000:]
    found: dict[str, Any] = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return found


# Nodes as a store names them where no node label is set: an instance's address, a cloud host name.
ADDRESSES = {"node-a": "10.128.14.203:9445", "node-b": "ip-10-0-3-17.ec2.internal"}


def crowded() -> dict[str, Any]:
    """The example week, with what makes a page wide or tempts a chart into a line of text: long pod
    names, nodes named by their address, and a recommendation with its bars whose sentence ends on a
    short line (the old page put the chart beside it, splitting the sentence)."""
    r = results()
    for labels, _ in r["hours"]:
        if labels.get("pod"):
            labels["pod"] = labels["pod"] + "-with-a-name-as-long-as-kubernetes-deployments-make-them-7f9c8d6b5"
    doc = build(window_for(START, END), r, load_catalogue())
    for g in doc["gpus"]:
        g["node"] = g["shown_as"] = ADDRESSES.get(g["node"], g["node"])
    with_bars = next(x for x in doc["recommendations"] if x["kind"] in ("card", "mig") and x["saving_per_month"])
    doc["recommendations"].append({**with_bars, "reason": "A short sentence."})
    return doc


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (bash .ci/setup installs it)")
@pytest.mark.parametrize("width", [1000, 1400])
def test_the_page_reads_whole_at_1000_and_1400_px(width: int, tmp_path: Path) -> None:
    """Issue 25: at 1,400 px the recommendation's inline bar chart split its sentence in two; at 1,000 px
    the GPU table ran off the page. Laid out by Chromium at both widths: the page is no wider than the
    window, no table or chart is wider than the column it sits in, and each recommendation's sentence
    is whole, its chart below it."""
    doc = crowded()
    assert any(r["kind"] in ("card", "mig") and r["saving_per_month"] for r in doc["recommendations"])
    got = layout(as_html(doc), width, tmp_path)
    scroll, inner = got["page"]
    assert scroll <= inner, f"the page is {scroll} px wide in a {inner} px window"
    for name, right, body_right, scroll_w, client_w in got["wide"]:
        assert right <= body_right + 1, (name, right, body_right)
        assert scroll_w <= client_w + 1, (name, scroll_w, client_w)
    assert got["recs"], got
    for text_bottom, chart_top in got["recs"]:
        assert chart_top is None or chart_top >= text_bottom, got["recs"]
    # A node's address broke across lines at 1,000 px ("10.128.14" / ".203:9445"): each is on one line.
    assert {node for node, _ in got["nodes"]} == set(ADDRESSES.values()), got["nodes"]
    assert all(lines == 1 for _, lines in got["nodes"]), got["nodes"]
    # The top wasters' labels start with the node: "0.128.14.203:9445 GPU 1 (...)" was cut at the chart's edge.
    assert got["labels"] and all(left >= -0.5 for _, left in got["labels"]), [x for x in got["labels"] if x[1] < 0]
    assert any(label.startswith(ADDRESSES["node-a"]) for label, _ in got["labels"]), got["labels"]


def test_names_a_tenant_chooses_never_drive_a_terminal_or_a_page() -> None:
    """A pod named with an escape sequence, a line break or a right-to-left override: every format shows
    a replacement character where they were, so no name can recolour a terminal, forge a row or turn a
    sentence round; the JSON keeps the name as it is (escaped by JSON itself)."""
    r = results()
    hostile = "evil\x1b[31m\nforged row\u202e"
    for labels, _ in r["hours"]:
        if labels.get("pod") == "notebook-b":
            labels["pod"] = hostile
    doc = build(window_for(START, END), r, load_catalogue())
    for text in (as_table(doc), as_markdown(doc), as_html(doc)):
        assert "\x1b" not in text and "\u202e" not in text and "\nforged row" not in text
        assert "evil\ufffd[31m\ufffdforged row\ufffd" in as_read(text)
    assert any(h["pod"] == hostile for h in doc["holders"])


def test_a_mig_slice_id_and_a_gap_instance_are_plain_text_in_markdown() -> None:
    """Label values from the store that the merged MIG and scrape-gap parts print: a GPU instance id in a
    recommendation's title and a target's instance in a gap line were Markdown and HTML as sent."""
    from gpu_exporter.report.render import _title, markdown_text

    hostile = "<img src=x onerror=alert(1)>"
    rec = {"gpus": 1, "gpu": "0", "node": "n1", "shown_as": "n1", "current_model": "H100", "suggested": "reclaim",
           "gpu_instance_id": hostile}  # fmt: skip
    raw = re.compile(r"(?<!\\)<img")  # a tag Markdown would pass to HTML: "<" without its escape
    assert not raw.search(_title(markdown_text(rec))), _title(markdown_text(rec))
    assert not raw.search(markdown_text({"store_gaps": [{"instance": hostile}]})["store_gaps"][0]["instance"])
