"""The report as a table, Markdown, or one self-contained HTML file, all rendered from its JSON.

The HTML draws its charts as inline SVG: no script, no library, nothing fetched, so the file opens
anywhere, offline and under any Content-Security-Policy (a week at 15-minute steps is about 250 KiB,
mostly the timeline's bars and their tooltips).  A plotting library would add a megabyte of
JavaScript, or a Python dependency, for three simple charts.  The page reads whole from 1,000 px
wide: the charts scale to the column, and the GPU table wraps its long cells.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

from ..accounting.states import STATES
from .gaps import lines as gap_lines
from .paths import recorded_lines
from .queries import LINK_BOUND
from .rightsizing import HOURS_PER_MONTH, gpu_order, money

GIB = 1024**3
COLOURS = {"busy": "#2e7d32", "allocated_idle": "#ef6c00", "allocated_unknown": "#1565c0", "idle": "#c62828",
           "down": "#757575"}  # fmt: skip
LABELS = {"busy": "busy", "allocated_idle": "allocated but idle", "allocated_unknown": "held, activity unknown",
          "idle": "idle", "down": "down"}  # fmt: skip
TOP = 10
MERGED_LINES = 5  # groups of GPUs seen through several targets named in the headline; the JSON has all


def printable(v: Any) -> Any:
    """The report with every character that is no printable text (a control character, an escape
    sequence's ESC, a line break, a bidirectional override) in a label value replaced: names that
    tenants choose (pods, users, GPU models from a hostile exporter) never drive a terminal or a page."""
    if isinstance(v, str):
        return "".join(c if c.isprintable() else "\ufffd" for c in v)
    if isinstance(v, dict):
        return {printable(k): printable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [printable(x) for x in v]
    return v


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _num(v: float | None, digits: int = 1) -> str:
    """Hours to a useful precision: 168.0, 2.35, 0.017."""
    if v is None:
        return "-"
    if v == 0 or abs(v) >= 10:
        return f"{v:,.{digits}f}"
    return f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.3f}"


def _cash(v: float | None, currency: str | None) -> str:
    return "-" if v is None else money(v, currency)


def _gib(v: float | None) -> str:
    return "-" if v is None else f"{v / GIB:.1f} GiB"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _wasted_h(row: dict[str, Any]) -> float:
    return float(row["allocated_idle_hours"] + row.get("idle_hours", 0.0))


def headline(doc: dict[str, Any]) -> list[str]:
    t, cur, r = doc["totals"], doc["currency"], doc["range"]
    wasted = _wasted_h(t)
    share = f" ({wasted / t['gpu_hours'] * 100:.0f}% of GPU time)" if t["gpu_hours"] else ""
    lines = [f"GPU cost and waste from {r['start']} to {r['end']} ({_num(r['hours'])} h)"]
    if r.get("requested_end"):
        lines.append(f"The range asked for ended at {r['requested_end']}, in the future: it is cut to now, {r['end']}")
    if doc.get("status", "ok") in ("no_data", "no_match"):
        return [*lines, f"Nothing to report: {doc['status_reason']}"]
    lines.append(
        f"{plural(t['gpus'], 'GPU')}, {_num(t['gpu_hours'])} GPU-hours: busy {_num(t['busy_hours'])}, allocated but "
        f"idle {_num(t['allocated_idle_hours'])}, idle {_num(t['idle_hours'])}, down {_num(t['down_hours'])}; "
        f"wasted {_num(wasted)}{share}"
    )
    if unknown := t.get("allocated_unknown_hours"):  # held where the driver gives no activity: neither
        lines.append(f"Held, activity unknown: {_num(unknown)} GPU-hours (MIG slices without GPM: A100, A30), "
                     "counted neither busy nor wasted")  # fmt: skip
    lines += counted_once(doc)
    if t["cost"] is not None:
        unpriced = (f" ({plural(t['unpriced_gpus'], 'GPU')} without a price, {_num(t['unpriced_hours'])} GPU-hours "
                    "not in these figures)" if t["unpriced_gpus"] else "")  # fmt: skip
        lines.append(f"Cost {_cash(t['cost'], cur)}, of which wasted {_cash(t['wasted_cost'], cur)}{unpriced}")
    else:
        lines.append(f"Hours only: {doc.get('status_reason') or 'no prices'}")
    if t.get("link_bound_hours"):  # bus-starved time, beside the wasted (idle) time
        cost = f", which cost {_cash(t['link_bound_cost'], cur)}" if t.get("link_bound_cost") is not None else ""
        lines.append(
            f"Link-bound {_num(t['link_bound_hours'])} GPU-hours (held with the PCIe link "
            f"{LINK_BOUND * 100:.0f}% full or more){cost}"
        )
    if doc["recommendations"]:
        saving = t.get("advised_saving_per_month") or 0
        monthly = f"; together they save about {_cash(saving, cur)}/month" if saving else ""
        lines.append(f"{plural(len(doc['recommendations']), 'recommendation')}{monthly}")
    return lines


def _target(labels: dict[str, str], shown: set[str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k in shown) + "}"


def counted_once(doc: dict[str, Any]) -> list[str]:
    """The GPUs seen through several targets (two scrape jobs, Prometheus replicas, federation) and
    counted once, by node and targets: each target by its job and instance, and by any other label its
    targets differ in (a replica label)."""
    groups: dict[tuple[str, str, int], list[str]] = {}
    for g in doc["gpus"]:
        targets: list[dict[str, str]] = g.get("targets") or []
        if len(targets) < 2:
            continue
        shown = {"job", "instance"} | {k for t in targets for k in t if len({u.get(k) for u in targets}) > 1}
        named = ", ".join(_target(t, shown) for t in targets)
        groups.setdefault((_place(g), named, len(targets)), []).append(g["gpu"])
    lines = []
    for (node, named, n), gpus in list(groups.items())[:MERGED_LINES]:
        which = f"GPU {gpus[0]} on {node}, seen" if len(gpus) == 1 else f"GPUs {', '.join(gpus)} on {node}, each seen"
        lines.append(f"Counted once: {which} through {n} targets: {named}")
    if rest := sum(len(gpus) for gpus in list(groups.values())[MERGED_LINES:]):
        lines.append(f"Counted once: {plural(rest, 'more GPU')} seen through several targets (the JSON's targets "
                     "name them)")  # fmt: skip
    return lines


def _gpu_rows(doc: dict[str, Any]) -> list[list[str]]:
    cur = doc["currency"]
    rows = sorted(doc["gpus"], key=lambda g: (-_wasted_h(g), g["node"], gpu_order(g["gpu"])))
    return [[_place(g), g["gpu"], g["model"] or "?", _num(g["busy_hours"]), _num(g["allocated_idle_hours"]),
             _num(g["idle_hours"]), _num(g["down_hours"]), _cash(g["cost"], cur), _cash(g["wasted_cost"], cur),
             _gib(g["memory_peak_bytes"]), _pct(g["activity_p95"]), g["holder"] or "-"] for g in rows]  # fmt: skip


GPU_HEAD = ["node", "gpu", "model", "busy h", "alloc-idle h", "idle h", "down h", "cost", "wasted", "peak mem",
            "activity p95", "main holder"]  # fmt: skip
HOLDER_HEAD = ["holder", "gpus", "held h", "alloc-idle h", "cost", "wasted"]


def _holder_cost(h: dict[str, Any], key: str, cur: str | None) -> str:
    """A holder's cost, and the hours it held GPUs that have no price (not in the figure), never silently."""
    unpriced = h.get("unpriced_hours") or 0.0
    if h[key] is None:
        return "unpriced" if unpriced else "-"
    return _cash(h[key], cur) + (f" (+{_num(unpriced)} h unpriced)" if unpriced and key == "cost" else "")


def _holder_rows(doc: dict[str, Any]) -> list[list[str]]:
    cur = doc["currency"]
    return [[h["holder"], str(h["gpus"]), _num(h["gpu_hours"]), _num(h["allocated_idle_hours"]),
             _holder_cost(h, "cost", cur), _holder_cost(h, "wasted_cost", cur)] for h in doc["holders"]]  # fmt: skip


def _grid(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*[h.upper() for h in head]).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def _notes(doc: dict[str, Any]) -> list[str]:
    return [f"GPU {g['gpu']} on {g.get('shown_as') or g['node']}: {n}" for g in doc["gpus"] for n in g["notes"]]


def store_sections(doc: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """What the report says about the store's history itself: its scrape gaps, and where the recorded
    series were missing hours that were read raw instead."""
    sections = []
    if found := gap_lines(doc):
        sections.append(("Scrape gaps", found))
    if found := recorded_lines(doc):
        sections.append(("Recorded series", found))
    return sections


def saving_text(r: dict[str, Any], currency: str | None) -> str:
    """What a recommendation saves, as its title says it."""
    if r["kind"] == "slower":
        return f"slower ({r['slowdown']:.1f}x as long), cheaper for the same work"
    if r["saving_per_month"] is None:
        return {"no price": "no price, so no figure", "a link to fix": "then size it again"}.get(
            r["no_saving_figure"], "no monthly figure yet"
        )
    return f"saves about {_cash(r['saving_per_month'], currency)}/month"


def _title(r: dict[str, Any]) -> str:
    n = r.get("gpus", 1)
    if n > 1:  # a job's GPUs, advised together
        return f"{n} GPUs ({r['gpu']}) on {_place(r)}: {r['current_model'] or '?'} -> {n} x {r['suggested']}"
    if r.get("gpu_instance_id"):
        return (f"MIG slice {r['gpu_instance_id']} of GPU {r['gpu']} on {_place(r)}: {r['current_model'] or '?'} "
                f"-> {r['suggested']}")  # fmt: skip
    return f"GPU {r['gpu']} on {_place(r)}: {r['current_model'] or '?'} -> {r['suggested']}"


def _place(r: dict[str, Any]) -> str:
    """Its node, or what tells it apart from another GPU of its index under that node label."""
    return str(r.get("shown_as") or r["node"])


SLICE_HEAD = ["node", "gpu", "slice", "share", "busy h", "alloc-idle h", "unknown h", "idle h", "cost", "wasted",
              "holder"]  # fmt: skip


def _slice_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The MIG slices of each card in MIG mode, each with its own books (hours at its share of the card)."""
    cur = doc["currency"]
    return [[_place(g), g["gpu"], x["gpu_instance_id"], f"{x['share'] * 100:.0f}%", _num(x["busy_hours"]),
             _num(x["allocated_idle_hours"]), _num(x["allocated_unknown_hours"]), _num(x["idle_hours"]),
             _cash(x["cost"], cur), _cash(x["wasted_cost"], cur), x["holder"] or "-"]
            for g in doc["gpus"] for x in g.get("slices") or []]  # fmt: skip


def as_table(doc: dict[str, Any]) -> str:
    doc = printable(doc)
    out = [*headline(doc)]
    if doc["gpus"]:
        out += ["", "GPUs, most wasted first", *_grid(GPU_HEAD, _gpu_rows(doc))]
    if slices := _slice_rows(doc):
        out += ["", "MIG slices (hours at each slice's share of its card)", *_grid(SLICE_HEAD, slices)]
    if doc["holders"]:
        out += ["", "Holders, most allocated-but-idle first", *_grid(HOLDER_HEAD, _holder_rows(doc))]
    if doc["gpus"]:
        out += ["", "Recommendations" if doc["recommendations"] else "Recommendations: none"]
    for r in doc["recommendations"]:
        out += [f"  {_title(r)}, {saving_text(r, doc['currency'])}", f"    {r['reason']}"]
    if notes := _notes(doc):
        out += ["", "Notes", *(f"  {n}" for n in notes)]
    for title, found in store_sections(doc):
        out += ["", title, *(f"  {n}" for n in found)]
    return "\n".join(out) + "\n"


# What names and sentences may hold that Markdown reads as markup: HTML (``<script>``), links,
# emphasis, code, entities.  A table cell's ``|`` is the table's own (``_md_table``).
_MD_MARKUP = re.compile(r"([\\`*_\[\]<>&~#!])")
# The report's fields that carry names (from labels, the pricing, the catalogue) or sentences made of
# them; the others are numbers, or words the renderer compares (a status, a kind).
_MD_TEXT = frozenset({"node", "shown_as", "gpu", "uuid", "model", "holder", "namespace", "pod", "hpc_job",
                      "container", "user", "current_model", "suggested", "reason", "notes", "status_reason",
                      "currency", "gpu_instance_id", "instance"})  # fmt: skip


def markdown_text(v: Any, key: str = "") -> Any:
    """The report with every name and sentence made plain text to Markdown: its markup characters
    backslash-escaped, so that a tenant's name is shown as written and never as HTML or a link."""
    if isinstance(v, dict) and key == "targets":  # a target's labels, names and values, from the store
        return {_MD_MARKUP.sub(r"\\\1", k): _MD_MARKUP.sub(r"\\\1", str(x)) for k, x in v.items()}
    if isinstance(v, dict):
        return {k: markdown_text(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [markdown_text(x, key) for x in v]
    if isinstance(v, str) and key in _MD_TEXT:
        return _MD_MARKUP.sub(r"\\\1", v)
    return v


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    def cell(x: str) -> str:
        return x.replace("|", "\\|")

    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(cell(x) for x in r) + " |" for r in rows)]  # fmt: skip


def as_markdown(doc: dict[str, Any]) -> str:
    doc = markdown_text(printable(doc))
    h = headline(doc)
    out = [f"# {h[0]}", "", *(f"- {line}" for line in h[1:])]
    if doc["gpus"]:
        out += ["", "## GPUs", "", *_md_table(GPU_HEAD, _gpu_rows(doc))]
    if doc["holders"]:
        out += ["", "## Holders", "", *_md_table(HOLDER_HEAD, _holder_rows(doc))]
    if doc["gpus"]:
        out += ["", "## Recommendations", ""]
        out += [f"- **{_title(r).replace(' -> ', ' → ')}** ({saving_text(r, doc['currency'])}): {r['reason']}"
                for r in doc["recommendations"]] or ["None."]  # fmt: skip
    if notes := _notes(doc):
        out += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    for title, found in store_sections(doc):
        out += ["", f"## {title}", "", *(f"- {n}" for n in found)]
    return "\n".join(out) + "\n"


# -- HTML ----------------------------------------------------------------------------------------------
WIDTH = 860  # the charts' drawing width; they scale down to the column


def _svg_timeline(doc: dict[str, Any], width: int = WIDTH, height: int = 240) -> str:
    points = doc["timeline"]
    pad_l, pad_b, pad_t = 56, 28, 10
    inner_w, inner_h = width - pad_l - 10, height - pad_b - pad_t
    if not points:
        return '<p class="empty">No data in the range.</p>'
    peak = max(sum(p[f"{s}_hours"] for s in STATES) for p in points) or 1.0
    n = len(points)
    bar = inner_w / n
    width_of = bar - 0.5 if bar >= 4 else bar + 0.2  # narrow bars touch, or antialiasing pales them
    parts = [f'<svg class="chart" id="timeline" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="GPU-hours by state over time" '
             'shape-rendering="crispEdges">']  # fmt: skip
    for i, p in enumerate(points):
        y: float = pad_t + inner_h
        for s in STATES:
            h = p[f"{s}_hours"] / peak * inner_h
            if h > 0:
                y -= h
                parts.append(f'<rect x="{pad_l + i * bar:.2f}" y="{y:.2f}" width="{width_of:.2f}" '
                             f'height="{h:.2f}" fill="{COLOURS[s]}"><title>{escape(p["time"])} {LABELS[s]}: '
                             f'{p[f"{s}_hours"]:.3f} GPU-h</title></rect>')  # fmt: skip
    for frac in (0.0, 0.5, 1.0):
        y = pad_t + inner_h * (1 - frac)
        parts.append(f'<line x1="{pad_l}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ccc"/>'
                     f'<text x="{pad_l - 6}" y="{y + 4:.1f}" text-anchor="end">{peak * frac:.3g}</text>')  # fmt: skip
    parts.append(f'<text x="{pad_l}" y="{height - 8}">{escape(points[0]["time"])}</text>'
                 f'<text x="{width - 10}" y="{height - 8}" text-anchor="end">{escape(points[-1]["time"])}</text>'
                 "</svg>")  # fmt: skip
    return "".join(parts)


def _svg_bars(items: list[tuple[str, list[tuple[str, float]]]], unit: str, chart_id: str, width: int = WIDTH,
              label_w: int = 300) -> str:  # fmt: skip
    """Horizontal stacked bars: (label, [(colour, value), ...]) each."""
    if not items:
        return '<p class="empty">Nothing to show.</p>'
    row = 26
    height = row * len(items) + 10
    peak = max(sum(v for _, v in segs) for _, segs in items) or 1.0
    scale = (width - label_w - 150) / peak
    parts = [f'<svg class="chart" id="{chart_id}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img">']  # fmt: skip
    for i, (label, segs) in enumerate(items):
        y = 5 + i * row
        # Right-aligned at the bars, a long label would run off the chart's left edge, cutting off its
        # start (the node's address): shortened at its end to what 11 px type fits, whole on hover.
        fits = (label_w - 12) // 7
        shown = label if len(label) <= fits else label[: fits - 1] + "\u2026"
        parts.append(f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end"><title>{escape(label)}</title>'
                     f"{escape(shown)}</text>")  # fmt: skip
        x = float(label_w)
        for colour, v in segs:
            if v > 0:
                parts.append(f'<rect x="{x:.2f}" y="{y + 3}" width="{max(v * scale, 1):.2f}" height="{row - 8}" '
                             f'fill="{colour}"/>')  # fmt: skip
                x += v * scale
        parts.append(f'<text x="{x + 6:.2f}" y="{y + 16}">{escape(unit.format(sum(v for _, v in segs)))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _html_table(head: list[str], rows: list[list[str]], cls: str) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f'<div class="wide"><table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;padding:0 16px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}table{border-collapse:collapse;font-size:12.5px;width:100%}
td,th{border-bottom:1px solid #e3e3e3;padding:3px 6px;text-align:left;vertical-align:top}
td{overflow-wrap:anywhere}th{white-space:nowrap}
table.gpus td:nth-child(n+4):nth-child(-n+11){white-space:nowrap;text-align:right}
table.gpus td:first-child{white-space:nowrap;overflow-wrap:normal}
.wide{max-width:100%;overflow-x:auto}
.chart{display:block;max-width:100%;height:auto}.chart text{font:11px system-ui,sans-serif;fill:#333}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
.rec{border-left:4px solid #ef6c00;padding:4px 10px;margin:10px 0;background:#fff8f0}
.rec p{margin:4px 0}.rec .bars{margin-top:6px}
.note{border-left:4px solid #757575;padding:4px 10px;margin:8px 0;background:#f6f6f6}
.why{border-left:4px solid #c62828;padding:4px 10px;background:#fdf0f0}"""


def _rec_bars(r: dict[str, Any], i: int, cur: str | None) -> str:
    """What the GPU costs a month now and on the suggestion: only where both are known, never for a GPU
    without a price, a saving without a monthly figure, or a slower card (whose saving is no rate)."""
    if r["saving_per_month"] is None or r["kind"] == "slower":
        return ""
    n = r.get("gpus", 1)  # a job's GPUs: the saving is for all of them, and so are both bars
    now = r["saving_per_month"] + (r["suggested_price_per_hour"] or 0.0) * HOURS_PER_MONTH * n
    if r["kind"] in ("release", "reclaim"):
        return ""  # the saving is the waste's cost, not the difference of two prices: the sentence says it
    count = f"{n} x " if n > 1 else ""
    bars = _svg_bars([(f"now: {count}{r['current_model']}", [(COLOURS["idle"], now)]),
                      (f"{count}{r['suggested']}", [(COLOURS["busy"], now - r["saving_per_month"])])],
                     "{:,.0f} " + _literal(cur or "") + "/month", f"rec-{i}", width=640, label_w=240)  # fmt: skip
    return f'<div class="bars">{bars}</div>'


def _literal(text: str) -> str:
    """Text put into a format string as itself: a brace from a label is no placeholder."""
    return text.replace("{", "{{").replace("}", "}}")


def as_html(doc: dict[str, Any]) -> str:
    doc = printable(doc)
    cur = doc["currency"]
    h = headline(doc)
    legend = "".join(f'<span><i style="background:{COLOURS[s]}"></i>{LABELS[s]}</span>' for s in STATES)
    wasters = sorted(doc["gpus"], key=lambda g: -_wasted_h(g))[:TOP]
    gpu_bars = [(f"{_place(g)} GPU {g['gpu']} ({g['model'] or '?'})",
                 [(COLOURS["allocated_idle"], g["allocated_idle_hours"]), (COLOURS["idle"], g["idle_hours"])])
                for g in wasters if _wasted_h(g) > 0]  # fmt: skip
    holder_bars = [(x["holder"], [(COLOURS["allocated_idle"], x["allocated_idle_hours"])])
                   for x in doc["holders"][:TOP] if x["allocated_idle_hours"] > 0]  # fmt: skip
    recs = []
    for i, r in enumerate(doc["recommendations"]):
        title = _title(r).replace(" -> ", " → ")
        recs.append(f'<div class="rec"><p><b>{escape(title)}</b>, {escape(saving_text(r, cur))}</p>'
                    f"<p>{escape(r['reason'])}</p>{_rec_bars(r, i, cur)}</div>")  # fmt: skip
    notes = "".join(f'<div class="note">{escape(n)}</div>' for n in _notes(doc))
    store = "".join(f"<h2>{t}</h2>" + "".join(f'<div class="note">{escape(n)}</div>' for n in found)
                    for t, found in store_sections(doc))  # fmt: skip
    why = f'<p class="why">{escape(doc["status_reason"])}</p>' if doc.get("status", "ok") != "ok" else ""
    body = ""
    if doc["gpus"]:
        body = f"""<h2>Waste over time (GPU-hours per step of {doc["range"]["step_seconds"]} s)</h2>
<div class="legend">{legend}</div>
{_svg_timeline(doc)}
<h2>Top wasters: GPUs (wasted GPU-hours)</h2>
{_svg_bars(gpu_bars, "{:,.2f} h", "top-gpus")}
<h2>Top wasters: holders (allocated-but-idle GPU-hours)</h2>
{_svg_bars(holder_bars, "{:,.2f} h", "top-holders")}
<h2>Recommendations</h2>
{"".join(recs) or "<p>None.</p>"}
{"<h2>Notes</h2>" + notes if notes else ""}
{store}
<h2>GPUs</h2>
{_html_table(GPU_HEAD, _gpu_rows(doc), "gpus")}
<h2>Holders</h2>
{_html_table(HOLDER_HEAD, _holder_rows(doc), "holders")}"""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(h[0])}</title>
<meta name="generator" content="gpu-exporter report ({escape(doc["schema"])})"><style>{CSS}</style></head>
<body>
<h1>{escape(h[0])}</h1>
{"".join(f"<p>{escape(line)}</p>" for line in h[1:])}
{why}
{body}
</body></html>
"""
