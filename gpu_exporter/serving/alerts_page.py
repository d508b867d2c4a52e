"""The daemon's own view of its alerts: JSON in the shape of Prometheus's /api/v1/alerts, and HTML."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence

from ..alerting.delivery import rfc3339
from ..alerting.engine import Alert
from ..snapshot import HolderLabels

# What the page looks for where the wiring does not say: the default pod labels, jobs and containers.
EVERY_HOLDER = HolderLabels(("namespace", "pod", "container"), jobs=True, containers=True, users=True)


def alerts_json(alerts: Sequence[Alert]) -> bytes:
    doc = {
        "status": "success",
        "data": {
            "alerts": [
                {
                    "labels": a.label_dict,
                    "annotations": dict(a.annotations),
                    "state": a.state,
                    "activeAt": rfc3339(a.active_at),
                    "value": "" if a.value is None else f"{a.value:g}",
                }
                for a in alerts
            ]
        },
    }
    return json.dumps(doc, indent=1).encode()


# An operator leaves the page open: it reloads itself, as often as Prometheus's default scrape.
REFRESH_SECONDS = 15


def held_by(labels: Mapping[str, str], holders: HolderLabels = EVERY_HOLDER) -> str:
    """Who holds the alert's GPU, in words, from its holder labels: pods, jobs, containers and users."""
    parts = []
    if holders.pods:
        namespace, pod, container = (labels.get(name, "") for name in holders.pods)
        if pod:
            parts.append(f"pod {namespace}/{pod}" + (f" ({container})" if container else ""))
    if holders.jobs and labels.get("hpc_job"):
        parts.append(f"job {labels['hpc_job']}")
    if holders.containers and labels.get("container_name"):
        parts.append(f"container {labels['container_name']}")
    if holders.users and labels.get("user"):
        parts.append(f"user {labels['user']}")
    return "; ".join(parts)


def alerts_html(alerts: Sequence[Alert], node: str = "", models: Mapping[str, str] | None = None,
                holders: HolderLabels = EVERY_HOLDER) -> bytes:  # fmt: skip
    """The alerts as a table: node, GPU, its model and who holds it, with a link back; ``models`` maps
    GPU UUIDs to names, ``holders`` says which holder labels the alerts carry."""
    models = models or {}

    def cells(a: Alert) -> tuple[str, ...]:
        labels = a.label_dict
        uuid = labels.get("uuid", "")
        return (
            labels["alertname"], a.state, labels["severity"], labels.get("node", node),
            f"{labels['gpu']} {uuid or '(uuid unknown)'}", models.get(uuid, "(model unknown)"),
            held_by(labels, holders) or "-", rfc3339(a.active_at), dict(a.annotations).get("description", ""),
        )  # fmt: skip

    rows = "".join(
        f"<tr class='{html.escape(a.state)}'>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(a)) + "</tr>"
        for a in alerts
    )
    body = rows or "<tr><td colspan='9'>No pending or firing alerts.</td></tr>"
    where = f" on {html.escape(node)}" if node else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{REFRESH_SECONDS}'>"
        f"<title>gpu-exporter alerts{where}</title>"
        "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #999;padding:4px 8px;text-align:left}th{background:#eee}"
        "tr.firing td:first-child{background:#f4b4b4}tr.pending td:first-child{background:#f8e0a0}</style>"
        f"</head><body><h1>Alerts{where}</h1>"
        f"<p><a href='/'>home</a> · <a href='/metrics'>metrics</a> · <a href='/api/v1/alerts'>JSON</a> · "
        f"reloads every {REFRESH_SECONDS} s; {len(alerts)} pending or firing</p>"
        "<table><tr><th>alert</th><th>state</th><th>severity</th><th>node</th><th>GPU</th><th>model</th>"
        f"<th>held by</th><th>active since</th><th>description</th></tr>{body}</table></body></html>\n"
    ).encode()
