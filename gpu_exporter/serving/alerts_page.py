"""The daemon's own view of its alerts: JSON in the shape of Prometheus's /api/v1/alerts, and HTML."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence

from ..alerting.delivery import rfc3339
from ..alerting.engine import Alert


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


def alerts_html(alerts: Sequence[Alert]) -> bytes:
    rows = "".join(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
            *(html.escape(x) for x in (
                a.label_dict["alertname"], a.state, a.label_dict["severity"],
                f"{a.label_dict['gpu']} {a.label_dict.get('uuid', '(uuid unknown)')}", rfc3339(a.active_at),
                dict(a.annotations).get("description", ""),
            ))
        )
        for a in alerts
    )  # fmt: skip
    body = rows or "<tr><td colspan='6'>No pending or firing alerts.</td></tr>"
    return (
        "<!doctype html><html><head><title>gpu-exporter alerts</title></head><body><h1>Alerts</h1>"
        "<table border='1' cellpadding='4'><tr><th>alert</th><th>state</th><th>severity</th><th>GPU</th>"
        f"<th>active since</th><th>description</th></tr>{body}</table></body></html>\n"
    ).encode()
